"""Prefix-aware routing through the cluster simulator: prefix hit rate, TTFT and prefill GPU-hours.

One run prints a table per scenario, each routing policy of the prompt's pod against load-only:
- **prefix-aware**: `tandem.routing.prefix.choose_prefill`, the router's own code, with a `PrefixIndex`
  learnt from its own choices (capacity: the pod's KV cache in 16-token keys), keys one per 16 tokens
  (the router's 64-character chunks are about that);
- **load-only**: power of two choices on outstanding requests + prompt tokens / 512, as the router's
  `LeastLoaded` policy does (a strict least-loaded choice, `routing="least-loaded"`, keeps more of a
  conversation on one pod: 61.8% hits against 54.8% on the live bench's sessions);
- **round-robin**;
- **oracle**: the pod whose simulated cache holds the longest prefix of the prompt, load ignored (ties,
  among them "no prefix anywhere", to the least loaded, then the first pod), the issue's reference;
- **oracle, bounded**: `choose_prefill` with the simulated caches in place of its learnt index (the
  balancer with perfect knowledge of the caches; what the index's estimate costs).
Decode pods are picked by power-of-two choices in every case.

Scenarios (Llama-3.1-8B on H100, TP1, 450,911 KV tokens per replica, vLLM's 16-token blocks, prefix
caching on every pod, `max_model_len` 131,072 = the model's context, which holds Mooncake's longest
request, 126,527 tokens of prompt and output):
1. **Mooncake conversation**, the whole trace (12,031 requests, 59 min, 3 s ticks spread uniformly,
   seed 0), its hash ids expanded into 16-token blocks; 4 prefill + 3 decode; SLO TTFT 5 s, TPOT 50 ms.
2. **Multi-turn sessions** from the Azure conversation trace at 4x its rate (all 19,366 requests, the
   sessions starting over its 15 min): 4 turns per session, exponential think time of mean 60 s between
   turns, a 2,000-token system prompt out of 8, each turn resending the conversation so far; 4 prefill
   + 6 decode; SLO TTFT 1 s, TPOT 50 ms.
3. **Hot prefix**: the same sessions at 6x with one system prompt on 50% of the sessions (so about half
   the requests share it); 4 prefill + 8 decode: TTFT p90 prefix-aware vs load-only.
4. **Load bound** (not in `--quick`): scenario 3 under prefix-aware routing with `load_bound` 1, 1.25
   (the default), 2 and 1000 (no bound): what keeps a hot prefix off an overloaded pod.
5. **Autoscaled** (not in `--quick`): scenario 3's load under tandem's autoscaler with prefix-aware
   routing, the autoscaler sizing prefill from the uncached prompt tokens (the engines' prefix-cache
   hit/query counters) against the same autoscaler with those counters hidden: prefill GPU-hours held.

"Prefill GPU-hours" in the tables is the prefill pods' busy time (GPU time spent in steps), since the
layout is static; the autoscaled rows give GPU-hours held. Hit rate = prefix-cache hits / queries over
the prefill pods (tokens). Targets (issue 15): hit rate >= the oracle's - 10 points; under the hot
prefix, TTFT p90 no worse than load-only.

    .venv/bin/python bench/prefix_routing.py [--quick] [--max-blocks N] [--load-bound C] [--live]

`--quick` (the unit test's) plays 2-minute windows of scenarios 1-3 and skips 4 and 5. `--live` then
runs the live half in the same invocation (`bench/prefix_routing_live.py`: the three policies through
the local cluster, each request sent to all three at once, beside the simulator's figures for the
same requests).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from tandem.perf import load_profile  # noqa: E402
from tandem.routing.prefix import PrefixKnobs  # noqa: E402
from tandem.signals import Snapshot  # noqa: E402
from tandem.sim import SLO, Layout, PoolSpec, ReplicaSpec, Request, SimConfig, simulate  # noqa: E402
from tandem.sim.layout import Routing  # noqa: E402
from tandem.sim.results import Summary  # noqa: E402
from tandem.sim.tandem_policy import TandemPolicy, autoscaled_spec  # noqa: E402
from tandem.sim.traces import read_azure, read_mooncake, scale_rate, spread_ticks, window  # noqa: E402
from tandem.sim.traces.prefix import SessionParams, sessions, with_mooncake_prefix  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MAX_MODEL_LEN = 131_072
MOONCAKE = ROOT / "traces" / "mooncake-fast25" / "conversation_trace.jsonl.gz"
AZURE_CONV = ROOT / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
POLICIES: tuple[tuple[str, Routing], ...] = (
    ("prefix-aware", "prefix"),
    ("load-only", "power-of-two"),
    ("round-robin", "round-robin"),
    ("oracle", "oracle"),
    ("oracle, bounded", "oracle-bounded"),
)
SESSIONS = SessionParams(turns=4, think_seconds=60.0, system_prompt_tokens=2000, system_prompts=8, seed=0)


@dataclass(frozen=True)
class Scenario:
    name: str
    requests: list[Request]
    prefill: int
    decode: int
    slo: SLO
    what: str


def _replica() -> ReplicaSpec:
    return ReplicaSpec.from_profile(load_profile(MODEL, "H100", 1), max_model_len=MAX_MODEL_LEN)


def _layout(prefill: int, decode: int) -> Layout:
    replica = _replica()
    return Layout(
        pools={
            "prefill": PoolSpec(replica=replica, replicas=prefill),
            "decode": PoolSpec(replica=replica, replicas=decode),
        }
    )


def _sessions(rate: float, hot: float | None, seconds: float) -> list[Request]:
    base = scale_rate(read_azure(AZURE_CONV), rate)
    params = dataclasses.replace(SESSIONS, hot_share=hot, max_prompt_tokens=MAX_MODEL_LEN)
    return window(sessions(base, params), 0.0, seconds)


def _minutes(requests: Sequence[Request]) -> str:
    return f"{requests[-1].arrival / 60:.0f} min"


def scenarios(quick: bool) -> list[Scenario]:
    seconds = 120.0 if quick else 1800.0
    mooncake = with_mooncake_prefix(spread_ticks(read_mooncake(MOONCAKE), 3.0, 0))
    if quick:
        mooncake = window(mooncake, 0.0, seconds)
    return [
        Scenario(
            "Mooncake conversation",
            mooncake,
            4,
            3,
            SLO(ttft_ms=5000, tpot_ms=50),
            f"{len(mooncake):,} requests, {'first 2 min' if quick else 'whole trace (59 min)'}, 4P+3D",
        ),
        Scenario(
            "Multi-turn sessions (Azure conversation x4)",
            (s := _sessions(4.0, None, seconds)),
            4,
            6,
            SLO(ttft_ms=1000, tpot_ms=50),
            f"{len(s):,} requests over {_minutes(s)}, 4 turns, think 60 s, system prompt 2,000 tokens of 8, "
            "4P+6D",
        ),
        Scenario(
            "Hot prefix (sessions x6, one system prompt on 50% of sessions)",
            (h := _sessions(6.0, 0.5, seconds)),
            4,
            8,
            SLO(ttft_ms=1000, tpot_ms=50),
            f"{len(h):,} requests ({sum(r.tenant == 'system-0' for r in h) / len(h):.0%} on the hot prompt), "
            f"over {_minutes(h)}, 4P+8D",
        ),
    ]


@dataclass(frozen=True)
class Row:
    policy: str
    summary: Summary
    seconds: float

    @property
    def hit_rate(self) -> float:
        queries = self.summary.prefix_queries.get("prefill", 0)
        return self.summary.prefix_hits.get("prefill", 0) / queries if queries else 0.0

    @property
    def prefill_gpu_hours(self) -> float:
        return self.summary.busy_gpu_hours.get("prefill", 0.0)


def run_scenario(scenario: Scenario, knobs: PrefixKnobs) -> list[Row]:
    layout = _layout(scenario.prefill, scenario.decode)
    rows = []
    for name, routing in POLICIES:
        config = SimConfig(slo=scenario.slo, routing=routing, prefix_knobs=knobs)
        start = time.perf_counter()
        result = simulate(scenario.requests, layout, config)
        rows.append(Row(name, result.summary, time.perf_counter() - start))
    return rows


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "-"


def print_table(scenario: Scenario, rows: Sequence[Row]) -> None:
    base = next(r for r in rows if r.policy == "load-only")
    print(f"\n### {scenario.name}: {scenario.what}")
    print(f"SLO TTFT {scenario.slo.ttft_ms:g} ms, TPOT {scenario.slo.tpot_ms:g} ms\n")
    print(
        "| routing | prefix hit rate | vs load-only | TTFT p50 ms | TTFT p90 ms | p50 / p90 vs load-only "
        "| prefill GPU-h (busy) | vs load-only | attainment | sim s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r.summary
        print(
            f"| {r.policy} | {r.hit_rate:.1%} | {(r.hit_rate - base.hit_rate) * 100:+.1f} pts "
            f"| {s.ttft_p50 * 1e3:,.0f} | {s.ttft_p90 * 1e3:,.0f} "
            f"| {_ratio(s.ttft_p50, base.summary.ttft_p50)} / {_ratio(s.ttft_p90, base.summary.ttft_p90)} "
            f"| {r.prefill_gpu_hours:.3f} | {_ratio(r.prefill_gpu_hours, base.prefill_gpu_hours)} "
            f"| {s.attainment:.1%} | {r.seconds:.1f} |"
        )


def check_targets(scenario: Scenario, rows: Sequence[Row], hot: bool) -> list[str]:
    by = {r.policy: r for r in rows}
    aware, oracle, load = by["prefix-aware"], by["oracle"], by["load-only"]
    lines = []
    ok = aware.hit_rate >= oracle.hit_rate - 0.10
    lines.append(
        f"{'PASS' if ok else 'MISS'} hit rate: prefix-aware {aware.hit_rate:.1%}"
        f" >= oracle {oracle.hit_rate:.1%} - 10 points"
    )
    if hot:
        ok = aware.summary.ttft_p90 <= load.summary.ttft_p90
        lines.append(
            f"{'PASS' if ok else 'MISS'} hot prefix TTFT p90: prefix-aware"
            f" {aware.summary.ttft_p90 * 1e3:,.0f} ms <= load-only {load.summary.ttft_p90 * 1e3:,.0f} ms"
        )
    return lines


@dataclass
class CacheBlind:
    """tandem's policy with the engines' prefix-cache counters hidden (it sizes prefill for every token)."""

    inner: TandemPolicy
    interval_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.interval_seconds = self.inner.interval_seconds

    def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
        pools = {
            role: dataclasses.replace(p, prefix_cache_queries_rate=0.0, prefix_cache_hits_rate=0.0)
            for role, p in snapshot.pools.items()
        }
        return self.inner.decide(dataclasses.replace(snapshot, pools=pools), now)


def autoscaled(scenario: Scenario, knobs: PrefixKnobs) -> None:
    initial = {"prefill": scenario.prefill, "decode": scenario.decode}
    spec = autoscaled_spec(
        MODEL,
        ttft_ms=int(scenario.slo.ttft_ms),
        tpot_ms=int(scenario.slo.tpot_ms),
        max_gpus=32,
        initial=initial,
    )
    layout = _layout(scenario.prefill, scenario.decode)
    config = SimConfig(slo=scenario.slo, routing="prefix", prefix_knobs=knobs)
    print(f"\n### Autoscaled: {scenario.name}, prefix-aware routing, tandem's autoscaler from 4P+8D\n")
    print(
        "| autoscaler | prefill GPU-h held | decode GPU-h held | prefix hit rate | TTFT p90 ms | attainment |"
    )
    print("|---|---|---|---|---|---|")
    for name, policy in (
        ("counts uncached tokens", TandemPolicy(spec)),
        ("blind to the prefix cache", CacheBlind(TandemPolicy(spec))),
    ):
        result = simulate(scenario.requests, layout, config, policy)
        s = result.summary
        held = _held_gpu_hours(result)
        hit = s.prefix_hits.get("prefill", 0) / max(1, s.prefix_queries.get("prefill", 0))
        print(
            f"| {name} | {held['prefill']:.2f} | {held['decode']:.2f} | {hit:.1%} | {s.ttft_p90 * 1e3:,.0f} "
            f"| {s.attainment:.1%} |"
        )


def _held_gpu_hours(result: object) -> dict[str, float]:
    """GPU-hours each pool held, from the scrape series (replicas x GPUs at each scrape x interval)."""
    series = result.series  # type: ignore[attr-defined]
    held: dict[str, float] = {"prefill": 0.0, "decode": 0.0}
    for a, b in itertools.pairwise(series):
        for role in held:
            held[role] += a.replicas.get(role, 0) * (b.time - a.time) / 3600
    return held


def load_bounds(scenario: Scenario, knobs: PrefixKnobs) -> None:
    layout = _layout(scenario.prefill, scenario.decode)
    print(f"\n### Load bound: {scenario.name}, prefix-aware routing\n")
    print("| load_bound | prefix hit rate | TTFT p50 ms | TTFT p90 ms | prefill GPU-h (busy) | attainment |")
    print("|---|---|---|---|---|---|")
    for bound in (1.0, 1.25, 2.0, 1000.0):
        config = SimConfig(
            slo=scenario.slo, routing="prefix", prefix_knobs=dataclasses.replace(knobs, load_bound=bound)
        )
        row = Row(f"{bound:g}", simulate(scenario.requests, layout, config).summary, 0.0)
        s = row.summary
        print(
            f"| {row.policy} | {row.hit_rate:.1%} | {s.ttft_p50 * 1e3:,.0f} | {s.ttft_p90 * 1e3:,.0f} "
            f"| {row.prefill_gpu_hours:.3f} | {s.attainment:.1%} |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2-minute windows, scenarios 1-3 only")
    parser.add_argument("--max-blocks", type=int, default=None, help="PrefixKnobs.max_blocks to pass in")
    parser.add_argument("--load-bound", type=float, default=None, help="PrefixKnobs.load_bound to pass in")
    parser.add_argument(
        "--live", action="store_true", help="then the live half (bench/prefix_routing_live.py)"
    )
    args = parser.parse_args(argv)
    knobs = PrefixKnobs()
    if args.max_blocks is not None:
        knobs = dataclasses.replace(knobs, max_blocks=args.max_blocks)
    if args.load_bound is not None:
        knobs = dataclasses.replace(knobs, load_bound=args.load_bound)
    start = time.perf_counter()
    print(
        f"Prefix-aware routing in the simulator ({MODEL} on H100 TP1, prefix caching on, 16-token blocks); "
        f"balancer knobs: max_blocks {knobs.max_blocks}, load_bound {knobs.load_bound:g}, "
        f"tokens_per_request {knobs.tokens_per_request:g}"
    )
    verdicts: list[str] = []
    built = scenarios(args.quick)
    for i, scenario in enumerate(built):
        rows = run_scenario(scenario, knobs)
        print_table(scenario, rows)
        verdicts += [f"{scenario.name}: {line}" for line in check_targets(scenario, rows, hot=i == 2)]
    if not args.quick:
        load_bounds(built[2], knobs)
        autoscaled(built[2], knobs)
    print("\n" + "\n".join(verdicts))
    if args.live:
        sys.path.insert(0, str(ROOT / "bench"))
        import prefix_routing_live

        print("\n## Live\n", flush=True)
        prefix_routing_live.main([])
    print(f"\nwhole bench: {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
