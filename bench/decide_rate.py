"""Decisions per second of `tandem.autoscale.decide()` on a P/D deployment, one CPU.

Each pass feeds decide() the state the previous pass returned and a snapshot whose load varies
(a daily-like curve with bursts of queued prompt tokens), so windows, corrections and the budget
all do work. `decide_rate(passes)` returns the figures for bench/autoscale_reaction.py to import.

    .venv/bin/python bench/decide_rate.py [--passes 20000] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass

from tandem.api.models import PDDeploymentSpec
from tandem.api.status import AutoscalingStatus
from tandem.autoscale.decide import decide
from tandem.signals import PathSignals, PoolSignals, PoolSize, Snapshot

SPEC = {
    "model": {"name": "llama", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
    "engine": {"image": "vllm/vllm-openai:v0.21.0"},
    "prefill": {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 32}},
    "decode": {"replicas": 2, "tensorParallelSize": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 32}},
    "slo": {"ttftMs": 500, "tpotMs": 50},
    "maxGPUs": 48,
    "autoscaling": {"enabled": True, "intervalSeconds": 30},
}


@dataclass(frozen=True)
class DecideRate:
    passes: int
    seconds: float
    decisions_per_second: float
    microseconds_per_decision: float
    scale_changes: int


def snapshot_at(i: int, now: float, sizes: dict[str, int]) -> Snapshot:
    """Pass i of a synthetic day: a sine of load with every 17th pass a burst of queued prompts."""
    load = 0.55 + 0.45 * math.sin(i / 120.0)
    burst = 400_000.0 if i % 17 == 0 else 0.0
    prompt_rate = 160_000.0 * load
    running = 1200.0 * load
    return Snapshot(
        observed_at=now,
        window_seconds=60,
        sizes={role: PoolSize(replicas=n, ready=n) for role, n in sizes.items()},
        pools={
            "prefill": PoolSignals(
                scraped_targets=sizes["prefill"],
                prompt_tokens_rate=prompt_rate,
                queued_prompt_tokens=burst,
                waiting_requests=burst / 1000.0,
                mean_prompt_tokens=1000.0,
                mean_output_tokens=1.0,
                request_rate=prompt_rate / 1000.0,
            ),
            "decode": PoolSignals(
                scraped_targets=sizes["decode"],
                running_requests=running,
                kv_usage_mean=min(1.0, running * 1100.0 / (sizes["decode"] * 900_000.0)),
                mean_prompt_tokens=1000.0,
                mean_output_tokens=200.0,
                request_rate=prompt_rate / 1000.0,
            ),
        },
        paths={
            "disaggregated": PathSignals(
                request_rate=prompt_rate / 1000.0,
                within_slo_rate=prompt_rate / 1000.0 * (0.9 if burst else 0.99),
                ttft_seconds=0.8 if burst else 0.3,
                tpot_seconds=0.03,
            )
        },
    )


def decide_rate(passes: int = 20_000) -> DecideRate:
    """Run `passes` decisions back to back and time them (snapshot building excluded)."""
    spec = PDDeploymentSpec.model_validate(SPEC)
    state = AutoscalingStatus()
    sizes = {"prefill": 2, "decode": 2}
    now = 1_800_000_000.0
    snapshots = []
    for i in range(min(passes, 2000)):  # build a cycle of snapshots up front; sizes are patched below
        snapshots.append(snapshot_at(i, 0.0, sizes))
    changes = 0
    elapsed = 0.0
    for i in range(passes):
        base = snapshots[i % len(snapshots)]
        snapshot = Snapshot(
            observed_at=now,
            window_seconds=base.window_seconds,
            sizes={role: PoolSize(replicas=n, ready=n) for role, n in sizes.items()},
            pools={
                role: PoolSignals(**{**asdict(signals), "scraped_targets": sizes[role]})
                for role, signals in base.pools.items()
            },
            paths=base.paths,
        )
        start = time.perf_counter()
        decision = decide(spec, snapshot, state, now)
        elapsed += time.perf_counter() - start
        state = decision.state
        for role, pool in decision.pools.items():
            if pool.target != pool.current:
                changes += 1
                sizes[role] = pool.target
        now += 30.0
    return DecideRate(
        passes=passes,
        seconds=elapsed,
        decisions_per_second=passes / elapsed,
        microseconds_per_decision=elapsed / passes * 1e6,
        scale_changes=changes,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=20_000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = decide_rate(args.passes)
    if args.json:
        print(json.dumps(asdict(result)))
        return
    print(
        f"decide(): {result.decisions_per_second:,.0f} decisions/s "
        f"({result.microseconds_per_decision:.0f} us each) over {result.passes} passes, "
        f"{result.scale_changes} size changes"
    )


if __name__ == "__main__":
    main()
