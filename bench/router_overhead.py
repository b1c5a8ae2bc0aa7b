"""Router overhead: two-phase requests through the router vs the same stream straight from a worker.

Starts a prefill and a decode engine (the sim engine with zero model latency, or the zero-cost
stub in `router_stub_engine.py`) and a router, all on 127.0.0.1, then drives each target with N
concurrent keep-alive streams for a fixed time, in the same run:
- direct: client -> decode engine (one streamed request: "direct-to-worker");
- pd-client: the client itself runs prefill then decode against the engines (the same engine work
  as the router's path, without the router's hop);
- router: client -> router -> prefill leg -> decode leg, streamed back.
It prints p50/p99 of time to first token (first body bytes) and of whole answers, throughput, the
router's added latency and throughput ratio against both baselines, and the router's requests per
CPU-second and CPU use (its process CPU time over the run: the "requests per second on one core"
figure, robust to other load on the machine).

    .venv/bin/python bench/router_overhead.py [--engine sim|stub] [--concurrency 1 64 256]
        [--seconds 6] [--rounds 3] [--rate REQ_PER_S] [--itl-ms MS] [--tokens 16]
        [--event-loop auto|asyncio|uvloop] [--slo TTFT_MS TPOT_MS] [--admission] [--prefix]
        [--router-core 0] [--engine-core 1]

The `router` arm runs the load-only choice (`--no-prefix-aware`). `--prefix` adds a second router
with the prefix-aware choice (the default) as arm `prefix`, gives the routers two prefill engines
(`--prefill-pods`; with 1 every router places every request alike, so the prefix arm's difference
is the choice's own cost) and sends ~7 KB chat prompts (a shared system prompt and a document:
~108 chunks of 64 characters, 13 sampled keys, every one a hit after a stream's first request, the
most index work a prompt of that size can cost); stream i sends document i % `--prefix-documents`
(default 256: each stream its own conversation, resent; 1: every stream the same prompt, one hot prefix). It
prints the prefix router's added latency and its throughput and req/cpu-s against the load-only
router of the same run, and beside it the same figures for `control`, a second load-only router:
the difference two identical arms show on this machine in this run (noise, the arms' order),
against which the prefix arm's difference is read. The arms take turns in rounds, each round starting one arm
later: use a multiple of the arm count for `--rounds` (5 with `--prefix`). Besides the pooled figures it
prints each router arm's TTFT p50 minus direct's round by round (median and range over the rounds): a
slow spell of the machine, which moves a pooled p50, lands on both sides of a round's difference.

The router always records the length-bucketed, per-tenant metrics (docs/observability.md);
`--admission` also runs its admission control with limits no request reaches.

The router runs pinned to `--router-core`; the engines and this load generator to `--engine-core`.
The load generator is a lean raw-asyncio HTTP/1.1 client so that it, not the router, stays cheap.
No assertions: it prints figures.

Three loads, three questions:
- closed loop, no pacing (default): capacity. With zero model latency every stream sends again at
  once, the slowest hop saturates, and latency there is N / throughput (Little's law): "added"
  latency at 64 or 256 streams is queueing behind the router's capacity (req/cpu-s), not its
  per-request cost.
- open loop (`--rate`): per-request cost below saturation, at a fixed request rate shared by N
  connections (latency counts from the scheduled send time).
- paced streams (`--engine stub --itl-ms 20 --tokens 32`): 256 streams really in flight at once,
  as in a decode pool: the stub spends nothing per token but sends one every ITL, and the streams'
  starts are spread over one answer's duration. This is the regime the router is for; its
  per-token relay cost shows here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MODEL = "bench-model"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log() -> int:
    """Children's stderr goes to one file (a pipe nobody reads would block them)."""
    return os.open("/tmp/tandem-router-bench.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _pinned(command: list[str], core: int | None) -> list[str]:
    if core is None or shutil.which("taskset") is None:
        return command
    return ["taskset", "-c", str(core), *command]


def start_engine(kind: str, port: int, args: argparse.Namespace, core: int | None) -> subprocess.Popen[bytes]:
    if kind == "stub":
        command = [PYTHON, str(ROOT / "bench" / "router_stub_engine.py"), "--port", str(port)]
        command += ["--model", MODEL, "--tokens", str(args.tokens), "--itl-ms", str(args.itl_ms)]
    else:
        command = [PYTHON, "-m", "tandem.cli", "engine", "serve", MODEL, "--host", "127.0.0.1"]
        command += ["--port", str(port), "--max-model-len", "8192"]
    env = {**os.environ, "TANDEM_SIM_TIME_SCALE": "0"}
    return subprocess.Popen(_pinned(command, core), env=env, stdout=subprocess.DEVNULL, stderr=_log())


def start_router(
    prefill: list[str], decode: str, port: int, args: argparse.Namespace, extra: list[str]
) -> subprocess.Popen[bytes]:
    command = [PYTHON, "-m", "tandem.cli", "router", "--host", "127.0.0.1", "--port", str(port)]
    for url in prefill:
        command += ["--prefill", url]
    command += ["--decode", decode, "--log-level", "WARNING", *extra]
    command += ["--event-loop", args.event_loop]
    if args.slo:
        command += ["--slo-ttft-ms", str(args.slo[0]), "--slo-tpot-ms", str(args.slo[1])]
    if args.admission:
        command += ["--gateway", str(_gateway_file())]
    core = args.router_core
    return subprocess.Popen(_pinned(command, core), stdout=subprocess.DEVNULL, stderr=_log())


# `--admission`: limits no request reaches (so every request pays for the checks and none is refused).
GATEWAY = {
    "admission": {
        "defaultLimits": {
            "requestsPerSecond": 1_000_000, "requestBurst": 1_000_000,
            "promptTokensPerSecond": 1_000_000_000, "promptTokenBurst": 1_000_000_000,
        },
        "longPrompts": {"minTokens": 4096, "maxConcurrent": 100_000},
    }
}  # fmt: skip


def _gateway_file() -> Path:
    path = Path("/tmp/tandem-router-bench-gateway.json")
    path.write_text(json.dumps(GATEWAY))  # JSON is YAML
    return path


async def wait_ready(port: int, path: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.close()
            if data.startswith(b"HTTP/1.1 200"):
                return
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"nothing ready on port {port}{path}")


class Connection:
    """One keep-alive HTTP/1.1 connection that posts a body and reads a whole (chunked) answer."""

    def __init__(self, port: int, request: bytes) -> None:
        self.port = port
        self.request = request
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def exchange(self, request: bytes) -> tuple[bool, bytes, float]:
        """(status is 200, body, when the first body bytes arrived)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            first = await self.reader.read(65536)
            first_at = time.perf_counter()
            parts, tail = [first], first[-7:]
            while not tail.endswith(b"\r\n0\r\n\r\n"):  # the last chunk of a chunked body
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("stream ended early")
                parts.append(data)
                tail = (tail + data)[-7:]
            body = b"".join(parts)
        else:
            at = lower.find(b"content-length:")
            length = int(lower[at + 15 : lower.find(b"\r\n", at)])
            body = await self.reader.readexactly(length)
            first_at = time.perf_counter()
        return head.startswith(b"HTTP/1.1 200"), body, first_at

    async def call(self) -> float | None:
        """When the first answer bytes came, or None when the answer was not a whole success."""
        ok, body, first_at = await self.exchange(self.request)
        return first_at if ok and b"[DONE]" in body and b'"error"' not in body else None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class ClientTwoPhase:
    """The two-phase protocol run by the client itself, straight to the engines: the same engine
    work as through the router, without the router's hop."""

    def __init__(
        self, prefill_port: int, decode_port: int, body: dict[str, object], path: str = "/v1/completions"
    ) -> None:
        self.prefill = Connection(prefill_port, b"")
        self.decode = Connection(decode_port, b"")
        self.body = body
        self.path = path
        kv = {"do_remote_decode": True, "do_remote_prefill": False}
        prefill = {**body, "stream": False, "max_tokens": 1, "kv_transfer_params": kv}
        self.prefill_request = post(path, prefill)

    async def call(self) -> float | None:
        ok, answer, _ = await self.prefill.exchange(self.prefill_request)
        if not ok:
            return None
        params = json.loads(answer).get("kv_transfer_params")
        ok, body, first_at = await self.decode.exchange(
            post(self.path, {**self.body, "kv_transfer_params": params})
        )
        return first_at if ok and b"[DONE]" in body and b'"error"' not in body else None

    def close(self) -> None:
        self.prefill.close()
        self.decode.close()


@dataclass
class Result:
    latencies: list[float]  # whole answers
    ttfts: list[float]  # to the first bytes of the answer's body (the first token when streamed)
    errors: int
    seconds: float
    cpu_s: float | None

    def merged(self, other: Result) -> Result:
        cpu = self.cpu_s + other.cpu_s if self.cpu_s is not None and other.cpu_s is not None else None
        return Result(
            self.latencies + other.latencies,
            self.ttfts + other.ttfts,
            self.errors + other.errors,
            self.seconds + other.seconds,
            cpu,
        )

    def quantile(self, q: float, ttft: bool = False) -> float:
        ordered = sorted(self.ttfts if ttft else self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(
    make: Callable[[int], Connection | ClientTwoPhase],
    concurrency: int,
    seconds: float,
    pid: int | None,
    rate: float | None = None,
    stagger_s: float = 0.0,
) -> Result:
    """Closed loop (each stream sends again as soon as it has its answer) or, with `rate`, open loop:
    the streams share `rate` requests/s on a fixed schedule and latency counts from the scheduled
    time, so a late answer also delays (and is charged to) the next request of its stream.
    `stagger_s` spreads the closed loop's first requests over that time, so that paced streams do
    not run in lockstep (all arriving, and all sending a token, in the same instant).
    """
    connections = [make(i) for i in range(concurrency)]
    await asyncio.gather(*(connection.call() for connection in connections))  # open and warm each
    latencies: list[float] = []
    ttfts: list[float] = []
    errors = 0
    stop_at = 0.0
    interval = concurrency / rate if rate else 0.0

    async def worker(index: int, connection: Connection | ClientTwoPhase) -> None:
        nonlocal errors
        next_at = time.perf_counter() + interval * index / concurrency
        if stagger_s and not interval:
            await asyncio.sleep(stagger_s * index / concurrency)
        while next_at < stop_at:
            if interval:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                started = next_at
                next_at += interval
            else:
                started = time.perf_counter()
                next_at = started
            first_at = await connection.call()
            if first_at is not None:
                latencies.append(time.perf_counter() - started)
                ttfts.append(first_at - started)
            else:
                errors += 1

    cpu_before = cpu_seconds(pid) if pid else None
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(worker(i, c) for i, c in enumerate(connections)))
    elapsed = time.perf_counter() - started
    cpu_after = cpu_seconds(pid) if pid else None
    for connection in connections:
        connection.close()
    cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    return Result(latencies, ttfts, errors, elapsed, cpu)


def post(path: str, body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    return head.encode() + f"Content-Length: {len(data)}\r\n\r\n".encode() + data


def ms(seconds: float, width: int = 8) -> str:
    return f"{seconds * 1000:{width}.2f}"


# `--prefix`: a chat prompt of ~6 KB, a shared system prompt and a document.
PREFIX_SYSTEM = "You are a careful assistant. Answer from the documents below and cite them. " * 8
PREFIX_DOCUMENT = " ".join(f"word{i}" for i in range(800))


async def run(args: argparse.Namespace) -> None:
    ports = {"prefill": free_port(), "decode": free_port(), "router": free_port()}
    engines = ["prefill", "decode"]
    if args.prefix:
        ports |= {"prefix": free_port(), "control": free_port()}
        for n in range(2, args.prefill_pods + 1):
            ports[f"prefill{n}"] = free_port()
            engines.append(f"prefill{n}")
    processes = [start_engine(args.engine, ports[name], args, args.engine_core) for name in engines]
    try:
        for name in engines:
            await wait_ready(ports[name], "/health")
        prefills = [f"http://127.0.0.1:{ports[name]}" for name in engines if name != "decode"]
        decode_url = f"http://127.0.0.1:{ports['decode']}"
        router = start_router(prefills, decode_url, ports["router"], args, ["--no-prefix-aware"])
        processes.append(router)
        await wait_ready(ports["router"], "/health")
        prefix_router = control_router = None
        if args.prefix:
            prefix_router = start_router(prefills, decode_url, ports["prefix"], args, [])
            control_router = start_router(prefills, decode_url, ports["control"], args, ["--no-prefix-aware"])
            processes += [prefix_router, control_router]
            await wait_ready(ports["prefix"], "/health")
            await wait_ready(ports["control"], "/health")
        await asyncio.sleep(1.5)  # the router learns the model list
        body: dict[str, object] = {
            "model": MODEL,
            "prompt": "the quick brown fox jumps over the lazy dog",
            "stream": True,
        }
        path = "/v1/completions"
        if args.prefix:
            path = "/v1/chat/completions"
            body = {"model": MODEL, "stream": True, "messages": [
                {"role": "system", "content": PREFIX_SYSTEM},
                {"role": "user", "content": "Summarise this document: " + PREFIX_DOCUMENT},
            ]}  # fmt: skip
        body["max_tokens"] = args.tokens
        if args.prefix:
            print(prefix_choice_cost(body), flush=True)
        # Every arm's streams take the same bodies in the same order: with `--prefix`, stream i
        # sends document i % --prefix-documents (its own conversation, resent), else one body.
        bodies = [body] if not args.prefix else [
            {**body, "messages": [
                {"role": "system", "content": PREFIX_SYSTEM},
                {"role": "user", "content": f"Summarise document {doc}: " + PREFIX_DOCUMENT},
            ]} for doc in range(args.prefix_documents)
        ]  # fmt: skip
        requests = [post(path, each) for each in bodies]
        load = f"open loop {args.rate:g} req/s" if args.rate else "closed loop"
        print(
            f"engine={args.engine} itl_ms={args.itl_ms:g} tokens/answer={args.tokens} "
            f"event_loop={args.event_loop} "
            f"seconds/point={args.seconds} in {args.rounds} rounds "
            f"router core={args.router_core} engines core={args.engine_core} "
            f"cpus={os.cpu_count()} load={load} prompt={len(json.dumps(body))} B"
        )
        print(
            f"{'streams':>7} {'target':>9} | {'ttft p50':>8} {'p99':>7} | {'e2e p50':>8} {'p99':>7} | "
            f"{'req/s':>7} {'errors':>6} || router added, ms: {'ttft p50':>8} {'p99':>6} "
            f"{'e2e p50':>7} {'p99':>6} {'tput':>5} | router {'req/cpu-s':>9} {'cpu%':>5}"
        )
        pd_ports = (ports["prefill"], ports["decode"])

        def to(port: int) -> Callable[[int], Connection]:
            return lambda i: Connection(port, requests[i % len(requests)])

        arms: list[tuple[str, Callable[[int], Connection | ClientTwoPhase], int | None]] = [
            ("direct", to(ports["decode"]), None),
            ("pd-client", lambda i: ClientTwoPhase(*pd_ports, bodies[i % len(bodies)], path), None),
            ("router", to(ports["router"]), router.pid),
        ]
        if prefix_router is not None and control_router is not None:
            # `control`: a second load-only router, the same as `router`: its difference from
            # `router` is what this machine's noise alone makes of two identical arms.
            arms.append(("prefix", to(ports["prefix"]), prefix_router.pid))
            arms.append(("control", to(ports["control"]), control_router.pid))
        stagger = args.tokens * args.itl_ms / 1000
        for concurrency in args.concurrency:
            # The arms take turns in short rounds, so a burst of noise on this shared machine lands
            # on all of them rather than on whichever happened to be running.
            # Each round starts one arm later, so no arm always runs in the same place: in a fixed
            # order the prefix arm, run last, trailed the load-only router by 3-12 ms at p50 and led
            # it by 8 ms when run before it (a loaded machine: the order is part of the figure).
            results: dict[str, Result] = {}
            rounds: dict[str, list[Result]] = {}
            for turn in range(args.rounds):
                shift = turn % len(arms)
                for name, make, pid in arms[shift:] + arms[:shift]:
                    part = await drive(make, concurrency, args.seconds / args.rounds, pid, args.rate, stagger)
                    results[name] = results[name].merged(part) if name in results else part
                    rounds.setdefault(name, []).append(part)
            for name, _, _ in arms:
                result = results[name]
                print(
                    f"{concurrency:>7} {name:>9} | {ms(result.quantile(0.5, True))} "
                    f"{ms(result.quantile(0.99, True), 7)} | {ms(result.quantile(0.5))} "
                    f"{ms(result.quantile(0.99), 7)} | {result.throughput:7.0f} {result.errors:>6}",
                    flush=True,
                )
            router_result = results["router"]
            for base in ("direct", "pd-client"):
                other = results[base]
                line = f"{concurrency:>7} {'vs ' + base:>12}" + " " * 47 + "   "
                line += f"{ms(router_result.quantile(0.5, True) - other.quantile(0.5, True))} "
                line += f"{ms(router_result.quantile(0.99, True) - other.quantile(0.99, True), 6)} "
                line += f"{ms(router_result.quantile(0.5) - other.quantile(0.5), 7)} "
                line += f"{ms(router_result.quantile(0.99) - other.quantile(0.99), 6)} "
                line += f"{router_result.throughput / other.throughput:5.2f}"
                if base == "direct" and router_result.cpu_s:
                    served = router_result.throughput * router_result.seconds
                    line += f" | {served / router_result.cpu_s:16.0f} "
                    line += f"{100 * router_result.cpu_s / router_result.seconds:5.0f}"
                print(line, flush=True)
            if "prefix" in results:
                print(vs_load_only("prefix", concurrency, results["prefix"], router_result), flush=True)
                print(vs_load_only("control", concurrency, results["control"], router_result), flush=True)
            if args.rounds > 1:
                print(per_round_added(concurrency, rounds), flush=True)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def prefix_choice_cost(body: dict[str, object], pods: int = 2, number: int = 2000) -> str:
    """The prefix-aware choice's CPU per request, in this process: the text, its keys, the choice
    among `pods` pods (the first holding the whole prompt: the longest match), the record."""
    import timeit

    from tandem.routing.prefix import (
        PodLoad,
        PrefixIndex,
        PrefixKnobs,
        choose_prefill,
        prompt_text,
        text_keys,
    )

    knobs = PrefixKnobs()
    text = prompt_text(body)
    keys = text_keys(text, knobs)
    index = PrefixIndex(32768)
    index.record("pod0", keys)
    loads = [PodLoad(f"pod{i}", i, 0) for i in range(pods)]
    parts = {
        "text": lambda: prompt_text(body),
        "keys": lambda: text_keys(text, knobs),
        "choice": lambda: choose_prefill(loads, keys, index, knobs),
        "record": lambda: index.record("pod0", keys),
    }
    us = {name: timeit.timeit(fn, number=number) / number * 1e6 for name, fn in parts.items()}
    detail = ", ".join(f"{name} {value:.1f}" for name, value in us.items())
    total = sum(us.values())
    return f"prefix choice in-process: {total:.1f} us/request ({len(keys)} keys, {pods} pods: {detail})"


def per_round_added(concurrency: int, rounds: dict[str, list[Result]]) -> str:
    """Each router arm's TTFT p50 minus direct's, round by round (the arms of a round run within
    seconds of each other, so a slow spell of the machine lands on both sides of each difference):
    the median over rounds and the range."""
    direct = rounds["direct"]
    parts = []
    for name in ("router", "prefix", "control"):
        if name not in rounds:
            continue
        added = sorted(
            (arm.quantile(0.5, True) - base.quantile(0.5, True)) * 1000
            for arm, base in zip(rounds[name], direct, strict=True)
        )
        parts.append(f"{name} {statistics.median(added):+.2f} ({added[0]:+.2f}..{added[-1]:+.2f})")
    return f"{concurrency:>7} per round, ttft p50 added vs direct (ms), median (range): " + ", ".join(parts)


def vs_load_only(name: str, concurrency: int, prefix: Result, load: Result) -> str:
    """An arm's added TTFT/e2e (ms) and its throughput and req/cpu-s as ratios of the load-only
    router's, in the same run."""
    line = f"{concurrency:>7} {name + ' vs load-only router':>28}" + " " * 34
    line += f"{ms(prefix.quantile(0.5, True) - load.quantile(0.5, True))} "
    line += f"{ms(prefix.quantile(0.99, True) - load.quantile(0.99, True), 6)} "
    line += f"{ms(prefix.quantile(0.5) - load.quantile(0.5), 7)} "
    line += f"{ms(prefix.quantile(0.99) - load.quantile(0.99), 6)} "
    line += f"{prefix.throughput / load.throughput:5.2f}"
    if prefix.cpu_s and load.cpu_s:
        per_cpu = (prefix.throughput * prefix.seconds / prefix.cpu_s) / (
            load.throughput * load.seconds / load.cpu_s
        )
        line += f" | req/cpu-s x{per_cpu:.2f}"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["sim", "stub"], default="sim")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--seconds", type=float, default=6.0, help="per arm and stream count, all rounds")
    parser.add_argument("--rounds", type=int, default=3, help="turns each arm takes, interleaved")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument(
        "--itl-ms", type=float, default=0.0, help="stub engine: gap between token events (streams last)"
    )
    parser.add_argument("--event-loop", choices=["auto", "asyncio", "uvloop"], default="auto")
    parser.add_argument("--rate", type=float, help="open loop: total requests/s shared by the streams")
    parser.add_argument(
        "--slo",
        type=float,
        nargs=2,
        metavar=("TTFT_MS", "TPOT_MS"),
        help="the router counts within-SLO requests",
    )
    parser.add_argument(
        "--admission", action="store_true", help="router with admission control (--gateway), never refusing"
    )
    parser.add_argument(
        "--prefix",
        action="store_true",
        help="add a prefix-aware router (arm `prefix`) beside the load-only one",
    )
    parser.add_argument(
        "--prefix-documents",
        type=int,
        default=256,
        help="with --prefix: stream i sends document i %% N (1: every stream the same prompt)",
    )
    parser.add_argument(
        "--prefill-pods",
        type=int,
        default=2,
        help="with --prefix: prefill engines behind the routers (1: the choice's cost alone)",
    )
    parser.add_argument("--router-core", type=int, default=0)
    parser.add_argument("--engine-core", type=int, default=1)
    args = parser.parse_args()
    if args.itl_ms and args.engine != "stub":
        parser.error("--itl-ms paces the stub engine; the sim engine runs with zero model latency")
    if args.engine_core < 0:
        args.engine_core = None
    if args.router_core < 0:
        args.router_core = None
    if args.engine_core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.engine_core})  # the load generator stays off the router's core
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
