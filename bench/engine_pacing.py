"""Engine pacing benchmark: N concurrent streams against one sim engine process at real-time pace.

Prints the timing error of what clients observe against the perf model (the same workload replayed
through the pure scheduler in virtual time), and the engine process' CPU seconds per 1,000 tokens.

    .venv/bin/python bench/engine_pacing.py [--streams 256] [--prompt-tokens 200] [--max-tokens 200]

Loopback only (127.0.0.1). Figures depend on the machine's load; nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

from tandem.devcluster.procs import free_port
from tandem.engine.args import parse_serve_args
from tandem.engine.blocks import BlockPool
from tandem.engine.config import resolve
from tandem.engine.scheduler import Scheduler, Sequence
from tandem.engine.settings import SimSettings

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HOST = "127.0.0.1"


def engine_args(port: int, model: str, tp: int) -> list[str]:
    return [
        model,
        "--tensor-parallel-size",
        str(tp),
        "--host",
        HOST,
        "--port",
        str(port),
        "--served-model-name",
        "bench",
        "--max-model-len",
        "16384",
    ]


def modelled(
    streams: int, prompt_tokens: int, max_tokens: int, argv: list[str]
) -> tuple[list[float], list[float]]:
    """(ttft, e2e) per request from the pure scheduler in virtual time, all arriving at t=0."""
    config = resolve(parse_serve_args(argv), SimSettings())
    sched = Scheduler(
        BlockPool(config.num_gpu_blocks),
        config.block_size,
        config.max_num_seqs,
        config.max_num_batched_tokens,
        config.chunked_prefill,
    )
    seqs = [Sequence(f"r{i}", prompt_tokens, max_tokens, 0.0) for i in range(streams)]
    for seq in seqs:
        sched.add(seq)
    now = 0.0
    while sched.has_work:
        step = sched.schedule(now)
        now += config.profile.step_seconds(*step.perf_inputs())
        sched.complete(step, now)
    return [s.first_token or 0.0 for s in seqs], [s.finished_at or 0.0 for s in seqs]


def runqueue_wait_seconds(pid: int) -> float:
    """Time the process was runnable but not running (CPU starvation), from /proc/PID/schedstat."""
    total = 0.0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[1]) / 1e9
    return total


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


async def one_stream(port: int, body: bytes) -> tuple[float, float, int]:
    """(TTFT, e2e, tokens) of one streamed request, read with a minimal raw-socket HTTP client.

    A lean client matters here: on a small machine an aiohttp client reading 256 streams can lag
    the engine and show its own delay as timing error.
    """
    start = time.monotonic()
    reader, writer = await asyncio.open_connection(HOST, port)
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
    writer.write(head.encode() + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    first = 0.0
    tokens = 0
    tail = b""
    while True:
        data = await reader.read(1 << 16)
        if not data:
            break
        window = tail + data
        tokens += window.count(b"data: {") - tail.count(b"data: {")
        if tokens and not first:
            first = time.monotonic() - start
        if b"data: [DONE]" in window:
            break
        tail = window[-16:]
    writer.close()
    return first, time.monotonic() - start, tokens


async def run_streams(
    port: int, streams: int, prompt_tokens: int, max_tokens: int
) -> list[tuple[float, float, int]]:
    prompts = [" ".join(f"s{i}w{j}" for j in range(prompt_tokens)) for i in range(streams)]
    bodies = [
        json.dumps({"model": "bench", "prompt": p, "max_tokens": max_tokens, "stream": True}).encode()
        for p in prompts
    ]
    return await asyncio.gather(*(one_stream(port, b) for b in bodies))


def wait_healthy(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"engine exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("engine did not start")


def scrape_mean(port: int, histogram: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return float(values[histogram + "_sum"] / values[histogram + "_count"])


def compare(label: str, observed: float, model: float) -> None:
    print(
        f"{label}: observed {observed:.3f} s, model {model:.3f} s, error {abs(observed - model) / model:.2%}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument(
        "--model", default=MODEL, help="HF id with a profile (e.g. meta-llama/Llama-3.1-70B-Instruct)"
    )
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="runs, each with a fresh engine process")
    ns = parser.parse_args()
    for run in range(ns.repeat):
        if ns.repeat > 1:
            print(f"--- run {run + 1}/{ns.repeat}")
        run_once(ns)
    return 0


def run_once(ns: argparse.Namespace) -> None:
    port = free_port()
    argv = engine_args(port, ns.model, ns.tp)
    env = {**os.environ, "TANDEM_SIM_TIME_SCALE": str(ns.time_scale)}
    proc = subprocess.Popen([sys.executable, "-m", "tandem.cli", "engine", "serve", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_healthy(port, proc)
        cpu_before = cpu_seconds(proc.pid)
        wait_before = runqueue_wait_seconds(proc.pid)
        client_before = time.process_time()
        wall_start = time.monotonic()
        results = asyncio.run(run_streams(port, ns.streams, ns.prompt_tokens, ns.max_tokens))
        wall = time.monotonic() - wall_start
        cpu_after = cpu_seconds(proc.pid)
        user, system = (after - before for after, before in zip(cpu_after, cpu_before, strict=True))
        cpu = user + system
        starved = runqueue_wait_seconds(proc.pid) - wait_before
        client_cpu = time.process_time() - client_before
        engine_e2e_mean = scrape_mean(port, "vllm:e2e_request_latency_seconds")
        with urllib.request.urlopen(f"http://{HOST}:{port}/debug/state", timeout=10) as r:
            state = json.loads(r.read())
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    model_ttft, model_e2e = modelled(ns.streams, ns.prompt_tokens, ns.max_tokens, argv)
    tokens = sum(r[2] for r in results)
    scale = ns.time_scale
    print(
        f"{ns.model} TP{ns.tp}: streams={ns.streams} prompt={ns.prompt_tokens} "
        f"max_tokens={ns.max_tokens} time_scale={scale}"
    )
    print(f"tokens received: {tokens} (expected {ns.streams * ns.max_tokens})")
    if scale > 0:
        compare("makespan", wall, max(model_e2e) * scale)
        compare("client mean e2e", statistics.mean(r[1] for r in results), statistics.mean(model_e2e) * scale)
        compare(
            "engine mean e2e (vllm:e2e_request_latency)", engine_e2e_mean, statistics.mean(model_e2e) * scale
        )
        compare(
            "client mean TTFT", statistics.mean(r[0] for r in results), statistics.mean(model_ttft) * scale
        )
        ranked = zip(sorted(r[1] for r in results), sorted(model_e2e), strict=True)
        errors = [abs(o - m * scale) / (m * scale) for o, m in ranked]
        print(
            f"engine: {state['steps']} steps, modelled busy {state['modelled_busy_seconds'] * scale:.3f} s; "
            f"step lag behind the model clock: mean {state['mean_step_lag_seconds'] * 1000:.2f} ms, "
            f"max {state['max_step_lag_seconds'] * 1000:.2f} ms"
        )
        print(
            f"per-request e2e error (rank-matched): mean {statistics.mean(errors):.2%}, max {max(errors):.2%}"
        )
    print(
        f"engine CPU: {cpu:.2f} s over {wall:.2f} s wall ({cpu / wall:.0%} of one core); "
        f"{cpu / (tokens / 1000):.3f} CPU s per 1,000 tokens (user {user / (tokens / 1000):.3f}, "
        f"system {system / (tokens / 1000):.3f})"
    )
    print(f"engine waited {starved:.2f} s for a CPU while runnable (other processes on this machine)")
    # The client's own lag shows up in the client-side figures; the engine-side e2e is the engine's pacing.
    print(
        f"client CPU: {client_cpu:.2f} s ({client_cpu / wall:.0%} of one core); "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    sys.exit(main())
