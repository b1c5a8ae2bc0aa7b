"""Prefill/decode interference: what P/D removes, shown with real sim engine processes.

Steady streams decode while long prompts keep arriving. Colocated, each long prompt's prefill
chunks share engine steps with the decodes and stretch their inter-token gaps; disaggregated, the
long prompts prefill on a prefill engine and the decode engine only pulls their KV.

    .venv/bin/python bench/engine_interference.py [--streams 32] [--long-prompt 8000] [--every 0.25]

Prints the steady streams' inter-token latency (p50, p99, max) per mode, as clients observe it.
Loopback only (127.0.0.1); figures depend on machine load; nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

import aiohttp

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def start(*args: str, role: str | None = None) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "TANDEM_SIM_TIME_SCALE": "1", "VLLM_NIXL_SIDE_CHANNEL_HOST": HOST}
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port())
    cmd = [sys.executable, "-m", "tandem.cli", "engine", "serve", MODEL, "--host", HOST, "--port", str(port)]
    cmd += ["--served-model-name", "bench", "--max-model-len", "16384", *args]
    if role:
        cmd += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": role})]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.1)
    raise SystemExit("engine did not start")


async def steady_stream(session: aiohttp.ClientSession, port: int, i: int, tokens: int) -> list[float]:
    body = {"model": "bench", "prompt": f"steady stream {i}", "max_tokens": tokens, "stream": True}
    gaps: list[float] = []
    last = None
    async with session.post(f"http://{HOST}:{port}/v1/completions", json=body) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {"):
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
    return gaps


async def long_prompts(
    session: aiohttp.ClientSession, send: Any, length: int, every: float, until: float
) -> int:
    sent = 0
    tasks = []
    while time.monotonic() < until:
        prompt = " ".join(f"l{sent}w{j}" for j in range(length))
        tasks.append(asyncio.create_task(send(session, prompt)))
        sent += 1
        await asyncio.sleep(every)
    await asyncio.gather(*tasks)
    return sent


async def run(mode: str, ports: dict[str, int], ns: argparse.Namespace) -> tuple[list[float], int]:
    async def colocated(session: aiohttp.ClientSession, prompt: str) -> None:
        body = {"model": "bench", "prompt": prompt, "max_tokens": 1}
        async with session.post(f"http://{HOST}:{ports['colocated']}/v1/completions", json=body) as r:
            await r.read()

    async def disaggregated(session: aiohttp.ClientSession, prompt: str) -> None:
        leg = {
            "model": "bench",
            "prompt": prompt,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True},
        }
        async with session.post(f"http://{HOST}:{ports['prefill']}/v1/completions", json=leg) as r:
            params = (await r.json())["kv_transfer_params"]
        body = {"model": "bench", "prompt": prompt, "max_tokens": 1, "kv_transfer_params": params}
        async with session.post(f"http://{HOST}:{ports['decode']}/v1/completions", json=body) as r:
            await r.read()

    decode_port = ports["colocated"] if mode == "colocated" else ports["decode"]
    send = colocated if mode == "colocated" else disaggregated
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        streams = [
            asyncio.create_task(steady_stream(session, decode_port, i, ns.tokens)) for i in range(ns.streams)
        ]
        await asyncio.sleep(0.3)  # let the steady streams reach decode
        until = time.monotonic() + ns.duration
        sent = await long_prompts(session, send, ns.long_prompt, ns.every, until)
        gaps = [g for s in await asyncio.gather(*streams) for g in s]
    return gaps, sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=400, help="output tokens per steady stream")
    parser.add_argument("--long-prompt", type=int, default=8000)
    parser.add_argument("--every", type=float, default=0.25, help="seconds between long prompts")
    parser.add_argument("--duration", type=float, default=2.0)
    ns = parser.parse_args()
    procs = []
    try:
        colocated, colocated_port = start("--enable-chunked-prefill")
        prefill, prefill_port = start(role="kv_producer")
        decode, decode_port = start(role="kv_consumer")
        procs = [colocated, prefill, decode]
        ports = {"colocated": colocated_port, "prefill": prefill_port, "decode": decode_port}
        print(
            f"{ns.streams} steady streams; a {ns.long_prompt}-token prompt every {ns.every} s "
            f"for {ns.duration} s"
        )
        for mode in ("colocated", "disaggregated"):
            gaps, sent = asyncio.run(run(mode, ports, ns))
            gaps.sort()
            p99 = gaps[int(len(gaps) * 0.99) - 1]
            print(
                f"{mode:>13}: ITL p50 {statistics.median(gaps) * 1000:6.1f} ms, p99 {p99 * 1000:6.1f} ms, "
                f"max {gaps[-1] * 1000:6.1f} ms ({len(gaps)} gaps, {sent} long prompts)"
            )
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
