"""Remote or local prefill per request (spec.router.disaggregation): Always, Auto and Threshold side
by side on the same sim engine processes, as clients see it.

One prefill and two decode sim engines (`tandem engine serve`, time scale 1: Llama-3.1-8B on H100 TP1
at the simulated GPU's speed, the KV link at `--kv-gbps`), one router process per mode
(`tandem router --disaggregation MODE`). Every arm gets its own prompts (no arm finds another's in a
cache), requests one at a time, the arms taking turns request by request so the machine's load falls
on each alike. Workloads:

- short: a prompt of `--short` words (max_tokens 16);
- long: `--long` words (max_tokens 16), past Auto's maxLocalTokens;
- turns: conversations of 3 turns, the first `--first-turn` words, each reply `--reply` tokens, each
  later turn `--next-turn` more words (the conversation resent: the decode pod that served the turn
  before holds it).

Before measuring, each router sends a few long prompts (the NIXL handshakes of the engines, and Auto's
measurements of its prefill legs and pulls). Prints client TTFT p50 / p90 per arm and workload (turns:
per turn), the routers' choices by reason, and the engines' prompt tokens by source.

    .venv/bin/python bench/disaggregation_choice.py [--rounds 20] [--kv-gbps 25]

Loopback only (127.0.0.1); nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any

import aiohttp

from tandem.devcluster.procs import free_port
from tandem.perf.stats import nearest_rank

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HOST = "127.0.0.1"
NAME = "bench"
ARMS: dict[str, list[str]] = {
    "Always": [],
    "Auto": ["--disaggregation", "Auto"],
    "Threshold 256": ["--disaggregation", "Threshold", "--threshold-tokens", "256"],
}


def wait(port: int, path: str) -> None:
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing ready on port {port}")


def engine(role: str, kv_gbps: float) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "TANDEM_SIM_TIME_SCALE": "1", "VLLM_NIXL_SIDE_CHANNEL_HOST": HOST}
    env |= {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()), "TANDEM_SIM_KV_BANDWIDTH_GBPS": str(kv_gbps)}
    cmd = [sys.executable, "-m", "tandem.cli", "engine", "serve", MODEL, "--host", HOST, "--port", str(port)]
    cmd += ["--served-model-name", NAME, "--max-model-len", "16384"]
    cmd += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": role})]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait(port, "/health")
    return proc, port


def router(prefill: list[int], decode: list[int], extra: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [sys.executable, "-m", "tandem.cli", "router", "--host", HOST, "--port", str(port)]
    for p in prefill:
        cmd += ["--prefill", f"http://{HOST}:{p}"]
    for d in decode:
        cmd += ["--decode", f"http://{HOST}:{d}"]
    cmd += ["--model", NAME, "--log-level", "WARNING", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait(port, "/ready")
    return proc, port


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}w{i}" for i in range(count))


async def ttft(session: aiohttp.ClientSession, port: int, body: dict[str, Any]) -> tuple[float, str]:
    """(client TTFT, the answer's text) of one streamed chat request."""
    started = time.monotonic()
    first: float | None = None
    text: list[str] = []
    async with session.post(f"http://{HOST}:{port}/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            delta = json.loads(line[6:])["choices"]
            content = delta[0]["delta"].get("content") if delta else None
            if content:
                if first is None:
                    first = time.monotonic()
                text.append(content)
    assert first is not None
    return first - started, "".join(text)


def chat(messages: list[dict[str, str]], tokens: int) -> dict[str, Any]:
    return {"model": NAME, "messages": messages, "max_tokens": tokens}


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def samples(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            if float(value):
                out[labels] = out.get(labels, 0.0) + float(value)
    return out


async def run(args: argparse.Namespace) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        p, pp = engine("kv_producer", args.kv_gbps)
        procs.append(p)
        decode = []
        for _ in range(2):
            d, dp = engine("kv_consumer", args.kv_gbps)
            procs.append(d)
            decode.append(dp)
        routers: dict[str, int] = {}
        for arm, extra in ARMS.items():
            r, rp = router([pp], decode, extra)
            procs.append(r)
            routers[arm] = rp
        before = {port: metrics(port) for port in (pp, *decode)}
        timeout = aiohttp.ClientTimeout(total=600)
        results: dict[tuple[str, str], list[float]] = {}
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for index, port in enumerate(routers.values()):  # warm-up: handshakes, Auto's costs
                for k in range(6):
                    await ttft(
                        session, port, chat([{"role": "user", "content": words(f"warm{index}x{k}", 1500)}], 4)
                    )
            for rnd in range(args.rounds):
                for index, (arm, port) in enumerate(routers.items()):
                    tag = f"r{rnd}a{index}"
                    short, _ = await ttft(
                        session, port, chat([{"role": "user", "content": words(tag + "s", args.short)}], 16)
                    )
                    results.setdefault((arm, "short"), []).append(short)
                    long, _ = await ttft(
                        session, port, chat([{"role": "user", "content": words(tag + "l", args.long)}], 16)
                    )
                    results.setdefault((arm, "long"), []).append(long)
                    messages = [{"role": "user", "content": words(tag + "t", args.first_turn)}]
                    for turn in range(3):
                        seconds, reply = await ttft(session, port, chat(messages, args.reply))
                        results.setdefault((arm, f"turn {turn + 1}"), []).append(seconds)
                        messages += [
                            {"role": "assistant", "content": reply},
                            {"role": "user", "content": words(f"{tag}n{turn}", args.next_turn)},
                        ]
        print(f"{args.rounds} rounds, KV link {args.kv_gbps:g} Gb/s; client TTFT p50 / p90 (ms)")
        workloads = ["short", "long", "turn 1", "turn 2", "turn 3"]
        print("| arm | " + " | ".join(workloads) + " |")
        print("|---|" + "---|" * len(workloads))
        for arm in routers:
            cells = []
            for w in workloads:
                xs = sorted(results[(arm, w)])
                cells.append(f"{nearest_rank(xs, 0.5) * 1000:.0f} / {nearest_rank(xs, 0.9) * 1000:.0f}")
            print(f"| {arm} | " + " | ".join(cells) + " |")
        for arm, port in routers.items():
            print(arm, "choices:", samples(metrics(port), "tandem_router_disaggregation_total"))
        for port in (pp, *decode):
            after = samples(metrics(port), "vllm:prompt_tokens_by_source_total")
            was = samples(before[port], "vllm:prompt_tokens_by_source_total")
            role = "prefill" if port == pp else f"decode {decode.index(port)}"
            print(role, "prompt tokens by source:", {k: v - was.get(k, 0.0) for k, v in after.items()})
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--kv-gbps", type=float, default=25.0)
    parser.add_argument("--short", type=int, default=60)
    parser.add_argument("--long", type=int, default=3000)
    parser.add_argument("--first-turn", type=int, default=1500)
    parser.add_argument("--reply", type=int, default=64)
    parser.add_argument("--next-turn", type=int, default=40)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
