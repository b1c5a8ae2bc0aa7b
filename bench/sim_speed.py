"""How fast the cluster simulator runs: requests simulated per second of wall time, on one core.

The Azure 2023 conversation trace, rate-scaled and repeated back to back up to `--requests` requests
(1,000,000 by default), through a P/D layout of 8 single-GPU replicas (4 prefill + 4 decode, Llama-3.1-8B
on H100), with a static policy consulted every 15 s (so the windows and the Snapshot are built as in a
policy run). Prints the wall time, requests/s, the time 1M requests take at that pace and its ratio to
the 60 s target, and the run's summary (so a speed-up that changed the results shows). `--profile`
prints the top of a cProfile of the run instead.

    .venv/bin/python bench/sim_speed.py [--requests N] [--rate-scale X] [--profile] [--no-prefix-caching]
        [--sessions]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from tandem.perf import load_profile  # noqa: E402
from tandem.sim import SLO, Layout, PoolSpec, ReplicaSpec, SimConfig, StaticPolicy, simulate  # noqa: E402
from tandem.sim.results import SimResult  # noqa: E402
from tandem.sim.traces import read_azure, repeat, scale_rate  # noqa: E402
from tandem.sim.traces.prefix import SessionParams, sessions  # noqa: E402

TARGET_SECONDS_PER_MILLION = 60.0
TRACE = ROOT / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--rate-scale", type=float, default=16.0, help="arrival rate multiplier (default 16)")
    parser.add_argument("--prefill", type=int, default=4)
    parser.add_argument("--decode", type=int, default=4)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the run")
    parser.add_argument(
        "--no-prefix-caching", action="store_true", help="replicas without prefix caching (vLLM's flag)"
    )
    parser.add_argument(
        "--sessions",
        action="store_true",
        help="multi-turn sessions from the trace (4 turns, 2,000-token system prompts): prefixes to cache",
    )
    args = parser.parse_args()

    base = scale_rate(read_azure(TRACE), args.rate_scale)
    if args.sessions:
        base = sessions(base, SessionParams(turns=4, think_seconds=60.0, system_prompt_tokens=2000))
    requests = repeat(base, -(-args.requests // len(base)))[: args.requests]
    replica = ReplicaSpec.from_profile(
        load_profile("meta-llama/Llama-3.1-8B-Instruct", "H100", 1),
        enable_prefix_caching=not args.no_prefix_caching,
    )
    layout = Layout(
        pools={
            "prefill": PoolSpec(replica=replica, replicas=args.prefill),
            "decode": PoolSpec(replica=replica, replicas=args.decode),
        }
    )
    config = SimConfig(slo=SLO(ttft_ms=2000, tpot_ms=50))
    policy = StaticPolicy(interval_seconds=15.0)

    def run() -> SimResult:
        return simulate(requests, layout, config, policy)

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        run()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    start = time.process_time()
    wall_start = time.perf_counter()
    result = run()
    wall = time.perf_counter() - wall_start
    cpu = time.process_time() - start
    n = len(requests)
    per_million = wall * 1_000_000 / n
    s = result.summary
    caching = "off" if args.no_prefix_caching else "on (no shared prefixes in this trace)"
    if args.sessions:
        caching = caching.split(" ")[0] + ", multi-turn sessions"
    shape = f"Azure conv x{args.rate_scale:g} rate, {args.prefill}P+{args.decode}D TP1 H100"
    shape += f", prefix caching {caching}"
    ratio = per_million / TARGET_SECONDS_PER_MILLION
    print(f"requests        {n:,} ({shape})")
    print(f"virtual time    {s.duration_seconds:,.0f} s ({n / s.duration_seconds:,.1f} req/s offered)")
    print(f"wall time       {wall:.2f} s (CPU {cpu:.2f} s)")
    print(f"speed           {n / wall:,.0f} requests/s")
    print(f"1M requests     {per_million:.1f} s = {ratio:.2f} x the 60 s target")
    ttft = "/".join(f"{x * 1e3:.0f}" for x in (s.ttft_p50, s.ttft_p90, s.ttft_p99))
    tpot = "/".join(f"{x * 1e3:.1f}" for x in (s.tpot_p50, s.tpot_p90))
    print(
        f"summary         attainment {s.attainment:.3f}, TTFT p50/p90/p99 {ttft} ms, TPOT p50/p90 {tpot} ms, "
        f"{s.gpu_hours:.2f} GPU-hours, {s.preemptions} preemptions"
    )


if __name__ == "__main__":
    main()
