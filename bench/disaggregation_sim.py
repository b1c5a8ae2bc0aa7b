"""Remote or local prefill (spec.router.disaggregation) in the cluster simulator: Always, Auto and a sweep
of fixed thresholds on the same requests and the same layout, per trace (issue 26, item 4).

Traces (Llama-3.1-8B on H100 TP1, prefix caching and prefix-aware routing on every pod, vLLM's 16-token
blocks, seed 0):
- **sessions**: multi-turn sessions (`sim/traces/prefix.py`) from the Azure conversation trace at x4:
  4 turns, think time 60 s, a 2,000-token system prompt out of 8, each turn resending the conversation
  (the decode pod that served the turn before holds it, its reply included); SLO TTFT 1 s, TPOT 50 ms;
- **azure-code** (x10) and **azure-conv** (x16): the Azure LLM 2023 traces at `bench/autoscale.py`'s rate
  scales, here by compressing time (`traces.scale_rate`: the hour lasts 6 and 3.75 minutes, so both
  windows hold the whole trace); SLO TTFT 1 s, TPOT 30 ms;
- **short**: the Azure conversation trace's arrivals (x16) and outputs with every prompt drawn
  log-uniform in 16..512 tokens (seeded); SLO TTFT 1 s, TPOT 30 ms.

Per trace, the layout is Always's static peak: the P/D layout with the fewest GPUs where Always reaches
95% attainment (`sim.baselines.search_static_pd`); every arm then replays the same requests on it. Arms:
Always, Auto (default knobs, the same on every trace) and Threshold N for N in `THRESHOLDS`; the best
threshold is the one with the highest attainment (ties: lower TTFT p90). Then Always and Auto again with
vLLM's bidirectional mode (`SimConfig.bidirectional_kv`: a remote prefill reads the earlier turns' KV
back from the decode replica instead of computing it; only prompts with a prefix can gain). Figures
per arm: attainment, TTFT p50 / p90, TPOT p90, the share of P/D requests prefilled on their decode pod,
and busy GPU-hours (GPU time in steps; at one static layout the GPU-hours held are the same for every
arm), with TTFT p90 and busy GPU-hours as ratios to Always and to the best threshold. Then a verdict per trace
against the issue's target: Auto's attainment within 0.5 points of the best threshold's, its TTFT p90
and busy GPU-hours no worse (1% allowed for GPU-hours), and on the sessions better than Always.

    .venv/bin/python bench/disaggregation_sim.py            # whole traces (docs/simulator.md)
    .venv/bin/python bench/disaggregation_sim.py --quick    # their first 5 minutes (tests/unit/sim)

Each trace, compressed as above, ends within 30 minutes, so the full run replays every trace whole
(sessions: 19,366 requests over 27.6 min; azure-code 8,819 over 5.7; azure-conv and short 19,366 over
3.7); `--quick` replays the first 5 minutes (the whole of azure-conv and short). Each table's header
says which.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from tandem.perf import load_profile  # noqa: E402
from tandem.routing.disaggregation import DisaggregationKnobs  # noqa: E402
from tandem.sim import SLO, Layout, PoolSpec, ReplicaSpec, Request, SimConfig, simulate  # noqa: E402
from tandem.sim.baselines import StaticLayout, search_static_pd  # noqa: E402
from tandem.sim.results import Summary  # noqa: E402
from tandem.sim.traces import read_azure, scale_rate, window  # noqa: E402
from tandem.sim.traces.prefix import SessionParams, sessions  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MAX_MODEL_LEN = 131_072
AZURE = ROOT / "traces" / "azure-llm-2023"
THRESHOLDS = (64, 256, 512, 1024, 2048, 4096, 8192)
ATTAINMENT = 0.95
MAX_GPUS = 32
SESSIONS = SessionParams(turns=4, think_seconds=60.0, system_prompt_tokens=2000, system_prompts=8, seed=0)


@dataclass(frozen=True)
class Trace:
    name: str
    requests: list[Request]
    slo: SLO
    what: str


def _short(base: Sequence[Request], seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    low, high = math.log(16), math.log(512)
    return [r._replace(prompt_tokens=round(math.exp(rng.uniform(low, high)))) for r in base]


def replayed(full: Sequence[Request], seconds: float) -> tuple[list[Request], str]:
    """The requests of `full` arriving in its first `seconds`, and what that is: the whole trace (the
    full runs: every trace here ends within 30 minutes once compressed) or its first minutes."""
    kept = window(full, 0.0, seconds)
    span = full[-1].arrival / 60 if full else 0.0
    if len(kept) == len(full):
        return kept, f"the whole trace, {len(full):,} requests over {span:.1f} min"
    return kept, f"its first {seconds / 60:g} min of {span:.1f}, {len(kept):,} of {len(full):,} requests"


def traces(seconds: float) -> list[Trace]:
    conv = read_azure(AZURE / "AzureLLMInferenceTrace_conv.csv")
    code = read_azure(AZURE / "AzureLLMInferenceTrace_code.csv")
    params = dataclasses.replace(SESSIONS, max_prompt_tokens=MAX_MODEL_LEN)
    session_requests, session_what = replayed(sessions(scale_rate(conv, 4.0), params), seconds)
    code_requests, code_what = replayed(scale_rate(code, 10.0), seconds)
    conv_requests, conv_what = replayed(scale_rate(conv, 16.0), seconds)
    return [
        Trace(
            "sessions",
            session_requests,
            SLO(ttft_ms=1000, tpot_ms=50),
            f"multi-turn sessions from Azure conversation x4 (compressed in time), {session_what}",
        ),
        Trace(
            "azure-code",
            code_requests,
            SLO(ttft_ms=1000, tpot_ms=30),
            f"Azure code x10 (compressed in time), {code_what}",
        ),
        Trace(
            "azure-conv",
            conv_requests,
            SLO(ttft_ms=1000, tpot_ms=30),
            f"Azure conversation x16 (compressed in time), {conv_what}",
        ),
        Trace(
            "short",
            _short(conv_requests),
            SLO(ttft_ms=1000, tpot_ms=30),
            "Azure conversation x16 arrivals and outputs, prompts log-uniform 16..512 tokens, " + conv_what,
        ),
    ]


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


BIDIRECTIONAL = ", bidirectional"


def arms() -> list[tuple[str, DisaggregationKnobs]]:
    """Always, Auto, each threshold, then Always and Auto with vLLM's bidirectional mode (the prefill
    replica reads earlier turns' KV back from the decode replica: `SimConfig.bidirectional_kv`)."""
    always, auto = DisaggregationKnobs(), DisaggregationKnobs(mode="Auto")
    out = [("Always", always), ("Auto", auto)]
    out += [(f"Threshold {t}", DisaggregationKnobs(mode="Threshold", threshold_tokens=t)) for t in THRESHOLDS]
    out += [("Always" + BIDIRECTIONAL, always), ("Auto" + BIDIRECTIONAL, auto)]
    return out


def _run(trace: Trace, layout: Layout, knobs: DisaggregationKnobs, bidirectional: bool = False) -> Summary:
    config = SimConfig(slo=trace.slo, routing="prefix", disaggregation=knobs, bidirectional_kv=bidirectional)
    return simulate(trace.requests, layout, config).summary


def always_peak(trace: Trace) -> StaticLayout:
    """Always's static peak: the fewest GPUs where Always reaches `ATTAINMENT`."""

    def evaluate(layout: StaticLayout) -> Summary:
        return _run(trace, _layout(layout.prefill, layout.decode), DisaggregationKnobs())

    found = search_static_pd(evaluate, MAX_GPUS, 1, 1, ATTAINMENT)
    if found.layout is None:
        raise SystemExit(f"{trace.name}: Always reaches {ATTAINMENT:.0%} on no layout within {MAX_GPUS} GPUs")
    return found.layout


@dataclass(frozen=True)
class Row:
    arm: str
    summary: Summary

    @property
    def busy(self) -> float:
        return sum(self.summary.busy_gpu_hours.values())

    @property
    def local_share(self) -> float:
        local = sum(n for reason, n in self.summary.prefill_choices.items() if reason in LOCAL_REASONS)
        total = sum(self.summary.prefill_choices.values())
        return local / total if total else 0.0


LOCAL_REASONS = ("no_prefill_ready", "below_threshold", "local_faster")


def best_threshold(rows: Sequence[Row]) -> Row:
    return max(
        (r for r in rows if r.arm.startswith("Threshold")),
        key=lambda r: (r.summary.attainment, -r.summary.ttft_p90),
    )


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "-"


def print_table(trace: Trace, layout: StaticLayout, rows: Sequence[Row]) -> None:
    always, best = rows[0], best_threshold(rows)
    print(f"\n### {trace.name}: {trace.what}")
    print(
        f"Layout {layout.prefill}P+{layout.decode}D (Always's static peak); "
        f"SLO TTFT {trace.slo.ttft_ms:g} ms, TPOT {trace.slo.tpot_ms:g} ms; best threshold: {best.arm}\n"
    )
    print(
        "| arm | attainment | TTFT p50 ms | TTFT p90 ms | TPOT p90 ms | local | busy GPU-h "
        "| TTFT p90 vs Always / best | GPU-h vs Always / best |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r.summary
        print(
            f"| {r.arm} | {s.attainment:.2%} | {s.ttft_p50 * 1e3:,.0f} | {s.ttft_p90 * 1e3:,.0f} "
            f"| {s.tpot_p90 * 1e3:.1f} | {r.local_share:.0%} | {r.busy:.3f} "
            f"| {_ratio(s.ttft_p90, always.summary.ttft_p90)} / {_ratio(s.ttft_p90, best.summary.ttft_p90)} "
            f"| {_ratio(r.busy, always.busy)} / {_ratio(r.busy, best.busy)} |"
        )
    auto = next(r for r in rows if r.arm == "Auto")
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(auto.summary.prefill_choices.items()))
    print(f"\nAuto's choices by reason: {reasons}")
    back = {r.arm: r.summary.pulled_back_tokens for r in rows if r.arm.endswith(BIDIRECTIONAL)}
    print(
        "Prompt tokens read back from decode (bidirectional): "
        + ", ".join(f"{k} {v:,}" for k, v in back.items())
    )


def verdicts(trace: Trace, rows: Sequence[Row]) -> list[str]:
    by = {r.arm: r for r in rows}
    auto, always, best = by["Auto"], by["Always"], best_threshold(rows)
    a, b = auto.summary, best.summary
    points = (b.attainment - a.attainment) * 100
    out = [
        f"{'PASS' if points <= 0.5 else 'MISS'} attainment: Auto {a.attainment:.2%} vs {best.arm} "
        f"{b.attainment:.2%} ({-points:+.2f} points, target >= -0.5)",
        f"{'PASS' if a.ttft_p90 <= b.ttft_p90 else 'MISS'} TTFT p90: Auto {a.ttft_p90 * 1e3:,.0f} ms vs "
        f"{best.arm} {b.ttft_p90 * 1e3:,.0f} ms ({_ratio(a.ttft_p90, b.ttft_p90)})",
        f"{'PASS' if auto.busy <= best.busy * 1.01 else 'MISS'} busy GPU-h: Auto {auto.busy:.3f} vs "
        f"{best.arm} {best.busy:.3f} ({_ratio(auto.busy, best.busy)})",
    ]
    if trace.name == "sessions":
        better = a.attainment >= always.summary.attainment and a.ttft_p90 < always.summary.ttft_p90
        out.append(
            f"{'PASS' if better else 'MISS'} better than Always: attainment {a.attainment:.2%} vs "
            f"{always.summary.attainment:.2%}, TTFT p90 {_ratio(a.ttft_p90, always.summary.ttft_p90)}"
        )
    return [f"{trace.name}: {line}" for line in out]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first 5 minutes (the unit test's run)")
    parser.add_argument("--traces", default="", help="comma-separated names (default: all)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    seconds = 300.0 if args.quick else 1800.0
    print(
        f"Remote or local prefill in the simulator ({MODEL} on H100 TP1, prefix-aware routing); "
        f"Auto's knobs: {DisaggregationKnobs(mode='Auto')}"
    )
    chosen = [t for t in traces(seconds) if not args.traces or t.name in args.traces.split(",")]
    lines: list[str] = []
    for trace in chosen:
        layout = always_peak(trace)
        pd = _layout(layout.prefill, layout.decode)
        rows = [Row(name, _run(trace, pd, knobs, name.endswith(BIDIRECTIONAL))) for name, knobs in arms()]
        print_table(trace, layout, rows)
        lines += verdicts(trace, rows)
    print("\n" + "\n".join(lines))
    print(f"\nwhole bench: {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
