"""tandem's autoscaler against the baselines, on every trace in the repository, in the cluster simulator.

Definitions: `shared/reference/autoscaler-evaluation.md` (and `docs/simulator.md`, "Baselines"). Every
policy replays the same requests (same rate scale, same seed) through the same profile (Llama-3.1-8B on
H100, TP1, model load 120 s), SLO and GPU budget:
- static peak: the fixed P/D layout with the fewest GPUs reaching 95% attainment over the whole trace;
- static colocated: the same over colocated layouts (chunked prefill);
- HPA: the Kubernetes HPA per pool (prefill: queued prompt tokens per replica, decode: KV usage),
  targets tuned once on the Azure traces (`--tune-hpa`) and fixed in `tandem.sim.baselines`;
- Dynamo-style planner: 180 s interval (its default), constant and trend predictors (60-s intervals
  with `--policies dynamo-60s,dynamo-60s-trend`: worse on both Azure traces, not in the default table);
- the fair planner baseline: the 180-s planner, and Dynamo's 5-s load-based loop with it as its floor
  (`dynamo-180s+load`), each also given TTFT/ITL targets tighter than the SLO (`PLANNER_FACTORS`), their
  curves of GPU-hours against attainment, and per trace a row "<planner> @ tandem's attainment": the
  planner's GPU-hours read off its curve at tandem's attainment and tandem's ratio to them
  (`docs/simulator.md`, "The fair planner baseline"); the load-based loop alone is `dynamo-load`;
- tandem: `autoscale.decide()` itself, with its state carried as the operator carries it;
- the hindsight oracle (`tandem.sim.oracle`, issue 25): per 60-s interval the cheapest P/D layout on the
  grid that keeps the target for that interval's requests (greedy forward, knowing the future), replayed
  in the same simulator with each replica ordered one model load ahead ("oracle") and with no load time
  ("oracle-instant"); every row's GPU-hours are also given as a ratio to "oracle", an online policy
  meeting the target more than 2% under it is flagged, and tandem's ratio is checked against 1.2x.
Dynamic policies start from the same size: the static-peak layout (provisioned for the trace; the
question is what each policy does from there).

`--decode-dp D` runs the chosen traces (named `<trace>-dp<D>`) with decode a pool of data-parallel groups
(`parallelism.data` = D, Internal balancing, one pod of D x TP GPUs; the simulator's groups): every
policy sizes decode in whole groups and every GPU figure counts the group's GPUs. Static peak searches
groups; the HPA's decode metric (KV usage, a fraction) reads per group as per engine; the planners size
decode as groups of D engines' throughput (`PlannerConfig.decode_ranks`), the load-based loop steps one
group with its thresholds per engine; the oracle's grid counts decode groups; tandem sizes the pool as
the operator does (groups of D engines, `autoscale`). Prefill stays one engine a replica.

Prints the table (one row per trace x policy), the seed, each trace's rate scale, which traces the
policies were tuned on, the whole bench's wall time and the simulator's speed (1M requests,
`bench/sim_speed.py`); writes a time-series PNG per trace under `.tandem/bench/autoscale/` and the
table as JSON there.

    .venv/bin/python bench/autoscale.py                 # everything (47 min measured on two busy cores
                                                        # before the oracle, which adds 35-125 s per
                                                        # hour-long trace and ~30 min for the 4x day)
    .venv/bin/python bench/autoscale.py --quick         # a small fixed-seed run (tests/unit/sim)
    .venv/bin/python bench/autoscale.py --traces azure-conv --policies tandem,hpa
    .venv/bin/python bench/autoscale.py --scale         # the realistic-scale day: ServeGen m-mid day 1 at
                                                        # its real pace, 70B TP4, 5.2M requests
    .venv/bin/python bench/autoscale.py --quick --scale # one hour of it (~2 min on two busy cores)
    .venv/bin/python bench/autoscale.py --traces servegen-70b-days --policies tandem,tandem+forecast
                                                        # three days of it (15.4M requests, 447 s at
                                                        # --jobs 2), the forecast learning
    .venv/bin/python bench/autoscale.py --tune-hpa      # the HPA targets' grid on the Azure traces
    .venv/bin/python bench/autoscale.py --trace my.csv --format plain --rate-scale 4 --window 0:3600
                                                        # everything on your own trace (docs/simulator.md)
    .venv/bin/python bench/autoscale.py --traces azure-conv-reasoning --decode-dp 4
                                                        # the same comparison with decode in DP4 groups
    .venv/bin/python bench/autoscale.py --traces azure-code --policies tandem --start 5P+1D
                                                        # a dynamic policy from your own starting layout
    .venv/bin/python bench/autoscale.py --traces azure-conv --policies tandem,oracle --decisions DIR
                                                        # every tandem pass (per pool: size, recommendation,
                                                        # limit, reason, figures) and the oracle's schedule
                                                        # as JSON lines; with --tune-tandem, per knob value
    .venv/bin/python bench/autoscale.py --docs          # also copy the plots to docs/img/
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))

from tandem.api.models import ForecastSpec, PDDeploymentSpec  # noqa: E402
from tandem.autoscale.decide import Decision  # noqa: E402
from tandem.autoscale.knobs import KNOBS, Knobs  # noqa: E402
from tandem.perf import kv_cache_tokens, load_profile  # noqa: E402
from tandem.routing.disaggregation import DisaggregationKnobs  # noqa: E402
from tandem.sim import SLO, SimConfig, simulate  # noqa: E402
from tandem.sim.advise import layout_of_spec, load_trace, trace_format  # noqa: E402
from tandem.sim.baselines import (  # noqa: E402
    HPAConfig,
    HPAPolicy,
    LoadPlannerConfig,
    LoadPlannerPolicy,
    PlannerConfig,
    PlannerPolicy,
    SearchResult,
    StaticLayout,
    peak_size,
    search_static_colocated,
    search_static_pd,
)
from tandem.sim.layout import Layout  # noqa: E402
from tandem.sim.oracle import (  # noqa: E402
    OracleGrid,
    OracleSchedule,
    SchedulePolicy,
    hindsight_schedule,
    replay_layout,
    schedule_sizes,
)
from tandem.sim.policy import Policy  # noqa: E402
from tandem.sim.report import (  # noqa: E402
    DYNAMO_180,
    ORACLE,
    ORACLE_INSTANT,
    ORACLE_NOISE,
    STATIC_PEAK,
    CurvePoint,
    DerivedRow,
    Row,
    beats_oracle,
    gpu_hours_at,
    oracle_cost_verdict,
    plot_trace,
    table,
)
from tandem.sim.requests import Request  # noqa: E402
from tandem.sim.results import SimResult, Summary, TickSample  # noqa: E402
from tandem.sim.tandem_policy import TandemPolicy, autoscaled_spec  # noqa: E402
from tandem.sim.traces import TraceError, scale_time, servegen  # noqa: E402
from tandem.sim.traces.readers import numbered_lines  # noqa: E402
from tandem.sim.traces.reasoning import reasoning_mix  # noqa: E402

OUT = ROOT / ".tandem" / "bench" / "autoscale"
DOCS_IMG = ROOT / "docs" / "img"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GPU = "H100"
TP = 1
SEED = 20261130
ATTAINMENT = 0.95
STATIC_COLOCATED = "static colocated"
TANDEM = "tandem"
HPA = "hpa"
DYNAMO_LOAD = "dynamo-load"  # Dynamo's load-based loop alone, every 5 s
DYNAMO_BOTH = "dynamo-180s+load"  # the load-based loop with the 180-s throughput planner as its floor
DYNAMIC = (HPA, DYNAMO_180, "dynamo-180s-trend", DYNAMO_LOAD, DYNAMO_BOTH, TANDEM)
# The hindsight oracle (`tandem.sim.oracle`): one search per trace, its schedule replayed twice, with the
# model load time (row "oracle") and without ("oracle-instant"); every table's "vs oracle" divides by the
# first. Decision interval 60 s; grid 1..budget/2 replicas per pool (TP1), at most the budget.
ORACLES = (ORACLE, ORACLE_INSTANT)
ALL_POLICIES = (STATIC_PEAK, STATIC_COLOCATED, *DYNAMIC, ORACLE)
ORACLE_INTERVAL = 60.0
# The search holds target + margin in every interval; if the replay of the schedule misses the target (the
# search follows each interval's requests with its layout held and no later arrivals, the replay does not),
# the search runs again with the next margin. The row says which margin it took.
ORACLE_MARGINS = (0.0, 0.01, 0.02)
TANDEM_FORECAST = (
    "tandem+forecast"  # tandem with spec.autoscaling.forecast on (docs/autoscaling.md, Forecast)
)
EXTRA_POLICIES = ("dynamo-60s", "dynamo-60s-trend", TANDEM_FORECAST)  # on request only (--policies)
PLOTTED = (STATIC_PEAK, HPA, DYNAMO_180, DYNAMO_LOAD, TANDEM, ORACLE)
# The fair planner baseline: each planner in SWEPT given TTFT/ITL targets = SLO x factor (`tightness`),
# each factor one run; with factor 1 (the plain row) they draw the planner's curve of GPU-hours against
# attainment. From 0.8 of the SLO down to a quarter of it (at a fifth the 30-ms ITL target, 6 ms, is under
# one decode step of the profile, 6.7 ms: the throughput planner would fall back to one decode replica);
# `--planner-factors` changes them, the quick run has one.
PLANNER_FACTORS = (0.8, 0.6, 0.45, 0.3, 0.25)
QUICK_PLANNER_FACTORS = (0.5,)
SWEPT = (DYNAMO_180, DYNAMO_BOTH)  # the policies the factors apply to


def swept_name(policy: str, factor: float) -> str:
    return f"{policy}@{factor:g}"


def at_tandem_name(policy: str) -> str:
    return f"{policy} @ tandem's attainment"


@dataclass(frozen=True)
class Case:
    """One trace as the bench runs it."""

    name: str
    title: str
    loader: str  # a key of LOADERS
    rate_scale: float
    ttft_ms: int
    tpot_ms: int
    max_gpus: int
    tuned: bool  # the policies were tuned on it (Azure, the decode-heavy mix); the others are held out
    seconds: float | None = None  # replay only this much of the trace (None: all of it)
    start: float = 0.0
    compress: float = 1.0  # virtual time = trace time / compress (ServeGen's day, or --compression)
    path: str = ""  # a trace file (loader "file"): --trace
    fmt: str = ""  # its format: azure, mooncake, plain or servegen
    # spec.router.disaggregation the simulated router runs (--disaggregation): Always, Auto, Threshold:N
    disaggregation: str = "Always"
    model: str = MODEL  # served by every replica, on GPU at TP `tp` (perf's calibrated profile)
    tp: int = TP
    load_seconds: float = 120.0  # model load: a requested replica is ready this long after
    # The decision interval of tandem (spec.autoscaling.intervalSeconds), the HPA (its sync period) and
    # the oracle; None: each its own default (30 s, 15 s, 60 s). The planners keep their own.
    interval_seconds: int | None = None
    # A policy run still going after this much wall time is stopped (`WallClockGuard`); a day at scale
    # takes minutes of CPU, more on a busy machine.
    wall_limit_seconds: float = 600.0  # JOB_WALL_LIMIT_SECONDS
    # Data-parallel ranks per decode replica (--decode-dp): decode is a pool of groups of this many
    # engines, each at TP `tp` (module docstring).
    decode_dp: int = 1

    @property
    def gpus_per_replica(self) -> dict[str, int]:
        return {"prefill": self.tp, "decode": self.tp * self.decode_dp}


def layout_text(case: Case, layout: StaticLayout) -> str:
    """`1P+4D`, with decode's group when it has more than one rank: `1P+4D(DP4)`."""
    if case.decode_dp == 1 or layout.colocated:
        return str(layout)
    return f"{layout}(DP{case.decode_dp})"


def with_decode_dp(case: Case, ranks: int) -> Case:
    """`case` with decode in groups of `ranks` data-parallel engines (itself for 1)."""
    if ranks == 1:
        return case
    return replace(
        case, name=f"{case.name}-dp{ranks}", title=f"{case.title}, decode DP{ranks} groups", decode_dp=ranks
    )


# Rate scales put static peak at 8 GPUs or more (the evaluation's rule); the SLOs are per trace (Mooncake's
# prompts average 12k tokens: a 1 s TTFT is out of reach for its long tail at any size).
# ServeGen: a day at 8+ GPUs is ~19M requests at its real pace, 6+ minutes of simulation per policy run on
# one core and 5-12 runs for the static search: over the bench's 30 minutes. The day is compressed 4x into
# 6 hours of virtual time (each hour of the curve lasts 15 minutes, so a 120-s model load weighs 4x more
# against its swings than live), at the rate scale that keeps the load per virtual second (static peak
# 8 GPUs), stated in the report. `--servegen-compress X` changes the compression and scales the rate so the
# load per second stays (1: the real pace, 24: one hour, the bench's earlier setting).
CASES: tuple[Case, ...] = (
    Case("azure-code", "Azure LLM 2023 code (1 h)", "azure-code", 10.0, 1000, 30, 48, tuned=True),
    Case("azure-conv", "Azure LLM 2023 conversation (1 h)", "azure-conv", 16.0, 1000, 30, 48, tuned=True),
    Case("mooncake", "Mooncake FAST'25 conversation (1 h)", "mooncake", 2.0, 5000, 50, 48, tuned=False),
    Case(
        "servegen-day",
        "ServeGen language m-mid, day 1 compressed 4x into 6 h",
        "servegen-day",
        0.039,
        1000,
        30,
        48,
        tuned=False,
        seconds=86400.0,
        compress=4.0,
    ),
    # Decode-heavy (issue 25, item 4): the conversation trace's arrivals and prompts, outputs drawn
    # log-uniform in 1k-8k tokens (`traces.reasoning`); at x2 static peak is 1P+13D (14 GPUs) over
    # the hour, decode-bound. Tuned on since decode's running context (autoscale.recommend,
    # `running_context_tokens`) was chosen on it (issue 25 names the mix among the traces to tune on).
    Case(
        "azure-conv-reasoning",
        "Azure conversation arrivals, reasoning outputs 1k-8k tokens (1 h)",
        "azure-conv-reasoning",
        2.0,
        1000,
        30,
        48,
        tuned=True,
    ),
)
# On request only (--traces): ServeGen m-mid over three days each, for the forecast's seasonal profile (it
# learns from earlier days). Compressed 24x (a day in one virtual hour) at the rate scale that keeps the
# load per virtual second of `servegen-day` (0.039 x 4 / 24): 0.75M requests a day instead of 4.5M. Days 1-3
# are tuned on, days 4-6 held out.
SERVEGEN_DAYS = 3 * 86400.0
EXTRA_CASES: tuple[Case, ...] = (
    Case(
        "servegen-d1-3",
        "ServeGen language m-mid, days 1-3 compressed 24x into 3 h",
        "servegen-day",
        0.039 * 4 / 24,
        1000,
        30,
        48,
        tuned=True,
        seconds=SERVEGEN_DAYS,
        compress=24.0,
    ),
    Case(
        "servegen-d4-6",
        "ServeGen language m-mid, days 4-6 compressed 24x into 3 h",
        "servegen-day",
        0.039 * 4 / 24,
        1000,
        30,
        48,
        tuned=False,
        seconds=SERVEGEN_DAYS,
        start=SERVEGEN_DAYS,
        compress=24.0,
    ),
)
QUICK = Case(
    "azure-conv-quick", "Azure conversation, 10 min (quick)", "azure-conv", 8.0, 1000, 30, 16, True, 600.0
)

# Realistic scale (issue 25, item 2): ServeGen m-mid at its real pace (no compression), Llama-3.1-70B on
# H100 at TP4 (perf's calibrated `h100-llama-3.1-70b-tp4`), rate x0.045: 5.2M requests a day, chosen for
# issue 25's peak of at least 32 GPUs from the static search's guess (7P+2D, 36 GPUs). Measured: static
# peak 5P+2D (28 GPUs) holds 95% over the day, the curve's busiest minutes take tandem to 56 GPUs and the
# oracle to 60 (x0.03: static peak 24 GPUs; docs/simulator.md). On request (--traces, or --scale). Issue
# 25 lets policies tune on ServeGen m-mid's first days; none was tuned at this scale (frozen before these
# rows ran).
SCALE_MODEL = "meta-llama/Llama-3.1-70B-Instruct"
SCALE_TP = 4
SCALE_RATE = 0.045
SCALE_GPUS = 128
SCALE_CASES: tuple[Case, ...] = (
    Case(
        "servegen-70b-day",
        "ServeGen language m-mid, day 1 at its real pace, Llama-3.1-70B TP4",
        "servegen-day",
        SCALE_RATE,
        1000,
        30,
        SCALE_GPUS,
        tuned=False,
        seconds=86400.0,
        model=SCALE_MODEL,
        tp=SCALE_TP,
        wall_limit_seconds=4 * 3600.0,
    ),
    # Several days, so that the forecast's seasonal profile learns from the earlier ones (tandem+forecast).
    Case(
        "servegen-70b-days",
        "ServeGen language m-mid, days 1-3 at their real pace, Llama-3.1-70B TP4",
        "servegen-day",
        SCALE_RATE,
        1000,
        30,
        SCALE_GPUS,
        tuned=False,
        seconds=SERVEGEN_DAYS,
        model=SCALE_MODEL,
        tp=SCALE_TP,
        wall_limit_seconds=12 * 3600.0,
    ),
)
# --quick --scale: one hour of the same day and scale (the morning rise, 08:00-09:00), under 5 minutes.
SCALE_QUICK = replace(
    SCALE_CASES[0],
    name="servegen-70b-quick",
    title="ServeGen language m-mid, day 1 08:00-09:00 at its real pace, Llama-3.1-70B TP4 (quick)",
    seconds=3600.0,
    start=8 * 3600.0,
)


# --- traces ----------------------------------------------------------------------------------------------


TRACES = ROOT / "traces"
SERVEGEN = TRACES / "servegen-alibaba"


def _azure(kind: str) -> Callable[[Case], list[Request]]:
    def load(case: Case) -> list[Request]:
        path = TRACES / "azure-llm-2023" / f"AzureLLMInferenceTrace_{kind}.csv"
        return load_trace(path, "azure", case.rate_scale, case.start, case.seconds, SEED)

    return load


def _reasoning(case: Case) -> list[Request]:
    """The Azure conversation trace with reasoning-length outputs (`traces.reasoning.reasoning_mix`)."""
    return reasoning_mix(_azure("conv")(case), seed=SEED)


def _mooncake(case: Case) -> list[Request]:
    path = TRACES / "mooncake-fast25" / "conversation_trace.jsonl.gz"
    return load_trace(path, "mooncake", case.rate_scale, case.start, case.seconds, SEED)


def _servegen(case: Case) -> list[Request]:
    """One day of ServeGen's per-client curve (`traces.generate`), each client's rate x `rate_scale`,
    then the day compressed `compress` times in virtual time (see CASES)."""
    data = servegen.load(
        SERVEGEN / "language_m-mid_client_rates.csv.gz", SERVEGEN / "language_m-mid_client_lengths.csv.gz"
    )
    day = servegen.generate(
        data, start=case.start, duration=case.seconds or 86400.0, rate_scale=case.rate_scale, seed=SEED
    )
    return scale_time(day, 1.0 / case.compress) if case.compress != 1 else day


TRACE_FORMATS = ("azure", "mooncake", "plain", "servegen")
SERVEGEN_DEFAULT_SECONDS = 86400.0  # a ServeGen curve spans 14 days: without --window, its first day


def servegen_lengths_path(rates: Path) -> Path:
    """A ServeGen rates file's lengths file: `<tag>_client_rates.csv[.gz]` -> `<tag>_client_lengths...`
    in the same folder (both as `traces/servegen-alibaba/` has them)."""
    if "client_rates" not in rates.name:
        raise TraceError(
            f"{rates}: a ServeGen trace is given by its rates file, named <tag>_client_rates.csv[.gz], "
            "with <tag>_client_lengths.csv[.gz] beside it"
        )
    stem = rates.name.replace("client_rates", "client_lengths")
    for name in (stem, stem.removesuffix(".gz"), stem + ".gz"):
        if (rates.parent / name).exists():
            return rates.parent / name
    raise TraceError(f"{rates}: no lengths file {stem} beside it (ServeGen needs both)")


def detect_format(path: Path) -> str:
    """azure, mooncake, servegen or plain, from the first non-blank line (as `advise.trace_format`)."""
    for _, line in numbered_lines(path):
        if line.strip().startswith("client_id,window_start_s,rate_rps"):
            return "servegen"
        if line.strip():
            break
    return trace_format(path)


def _file(case: Case) -> list[Request]:
    """A trace the bench does not know (`--trace`): read in its format, the window [start, start +
    seconds) re-based to 0, its rate x `rate_scale` (`advise.load_trace`: copies superposed, the duration
    kept; for ServeGen each client's rate), then time compressed `compress` times."""
    path = Path(case.path)
    if case.fmt == "servegen":
        data = servegen.load(path, servegen_lengths_path(path))
        requests = servegen.generate(
            data,
            start=case.start,
            duration=case.seconds or SERVEGEN_DEFAULT_SECONDS,
            rate_scale=case.rate_scale,
            seed=SEED,
        )
    else:
        requests = load_trace(path, case.fmt, case.rate_scale, case.start, case.seconds, SEED)
    return scale_time(requests, 1.0 / case.compress) if case.compress != 1 else requests


LOADERS: dict[str, Callable[[Case], list[Request]]] = {
    "azure-code": _azure("code"),
    "azure-conv": _azure("conv"),
    "azure-conv-reasoning": _reasoning,
    "mooncake": _mooncake,
    "servegen-day": _servegen,
    "file": _file,
}


@cache
def requests_of(case: Case) -> list[Request]:
    return LOADERS[case.loader](case)


# --- policies ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What every policy of one case shares."""

    case: Case
    slo: SLO
    layout_pd: Layout  # the P/D pools, sized by `initial`
    layout_colocated: Layout
    initial: dict[str, int]
    config: SimConfig


def setup_of(case: Case, initial: dict[str, int] | None = None) -> Setup:
    slo = SLO(ttft_ms=case.ttft_ms, tpot_ms=case.tpot_ms)
    if initial is None:
        initial = guess_size(case)
    spec = case_spec(case, initial)
    co_spec = case_spec(case, {"colocated": max(initial.values())})
    return Setup(
        case=case,
        slo=slo,
        layout_pd=layout_of_spec(spec, case.load_seconds).layout,
        layout_colocated=layout_of_spec(co_spec, case.load_seconds).layout,
        initial=initial,
        config=SimConfig(slo=slo, seed=SEED, disaggregation=disaggregation_knobs(case.disaggregation)),
    )


def case_spec(case: Case, initial: dict[str, int]) -> PDDeploymentSpec:
    """The autoscaled PDDeployment spec of `case` (its model, TP, SLO, budget, decision interval)."""
    return autoscaled_spec(
        case.model,
        ttft_ms=case.ttft_ms,
        tpot_ms=case.tpot_ms,
        max_gpus=case.max_gpus,
        initial=initial,
        gpu=GPU,
        tp=case.tp,
        interval_seconds=case.interval_seconds or 30,
        data={"decode": case.decode_dp},
    )


def disaggregation_knobs(text: str) -> DisaggregationKnobs:
    """`Always`, `Auto` or `Threshold:N` (N uncached tokens) as the router's knobs."""
    mode, _, tokens = text.partition(":")
    if mode == "Threshold":
        return DisaggregationKnobs(mode="Threshold", threshold_tokens=int(tokens or 512))
    if mode in ("Always", "Auto") and not tokens:
        return DisaggregationKnobs(mode=mode)  # type: ignore[arg-type]
    raise ValueError(f"--disaggregation {text!r}: Always, Auto or Threshold:N")


def planner_config(case: Case, interval: float, predictor: str, tightness: float = 1.0) -> PlannerConfig:
    profile = load_profile(case.model, GPU, case.tp)
    return PlannerConfig(
        prefill_profile=profile,
        decode_profile=profile,
        ttft_seconds=case.ttft_ms / 1e3,
        itl_seconds=case.tpot_ms / 1e3,
        decode_kv_capacity_tokens=kv_cache_tokens(profile),
        adjustment_interval_seconds=interval,
        predictor=predictor,  # type: ignore[arg-type]
        max_gpu_budget=case.max_gpus,
        tightness=tightness,
        decode_ranks=case.decode_dp,
    )


def load_planner_config(case: Case, with_throughput: bool, tightness: float = 1.0) -> LoadPlannerConfig:
    profile = load_profile(case.model, GPU, case.tp)
    return LoadPlannerConfig(
        prefill_profile=profile,
        decode_profile=profile,
        ttft_seconds=case.ttft_ms / 1e3,
        itl_seconds=case.tpot_ms / 1e3,
        decode_kv_capacity_tokens=kv_cache_tokens(profile),
        max_gpu_budget=case.max_gpus,
        tightness=tightness,
        throughput=planner_config(case, 180.0, "constant", tightness) if with_throughput else None,
        decode_ranks=case.decode_dp,
    )


def make_policy(name: str, setup: Setup, knobs: Knobs = KNOBS, hpa: HPAConfig | None = None) -> Policy:
    case = setup.case
    if name in (TANDEM, TANDEM_FORECAST):
        spec = case_spec(case, setup.initial)
        if name == TANDEM_FORECAST:
            spec = with_forecast(spec, case)
        return TandemPolicy(spec, knobs=knobs)
    if name == HPA:
        hpa_config = hpa or HPAConfig()
        if case.interval_seconds is not None:
            hpa_config = replace(hpa_config, sync_seconds=float(case.interval_seconds))
        return HPAPolicy(hpa_config, gpus_per_replica=case.gpus_per_replica, max_gpus=case.max_gpus)
    name, _, factor = name.partition("@")
    tightness = float(factor) if factor else 1.0
    if name in (DYNAMO_LOAD, DYNAMO_BOTH):
        config = load_planner_config(case, name == DYNAMO_BOTH, tightness)
        return LoadPlannerPolicy(config, setup.config.window_seconds)
    if name.startswith("dynamo-"):
        parts = name.split("-")
        interval = float(parts[1].rstrip("s"))
        predictor = "trend" if name.endswith("-trend") else "constant"
        config = planner_config(case, interval, predictor, tightness)
        return PlannerPolicy(config, setup.config.window_seconds)
    raise ValueError(f"unknown policy {name!r}")


def with_forecast(spec: PDDeploymentSpec, case: Case) -> PDDeploymentSpec:
    """`spec` with the forecast on: a day's period in the case's virtual time, the model load as the
    horizon until the pools' start-to-ready time is measured."""
    period = max(600, round(86400 / case.compress))
    forecast = ForecastSpec(
        enabled=True, season_period_seconds=period, horizon_seconds=round(case.load_seconds)
    )
    return spec.model_copy(update={"autoscaling": spec.autoscaling.model_copy(update={"forecast": forecast})})


# --- one job -----------------------------------------------------------------------------------------------

JOB_WALL_LIMIT_SECONDS = 600.0  # `Case.wall_limit_seconds` by default: a run still going then is stopped


class JobTooSlow(Exception):
    def __init__(self, now: float, attainment: str) -> None:
        super().__init__(f"stopped at virtual {now:.0f} s")
        self.now = now
        self.attainment = attainment


class WallClockGuard:
    """Wraps a policy: past `limit` seconds of wall time since `started`, its next tick stops the run
    (an overloaded simulation can take many times longer than a healthy one; the row says so)."""

    def __init__(
        self, policy: Policy, started: float, limit: float, log: list[dict[str, Any]] | None = None
    ) -> None:
        self.policy = policy
        self.interval_seconds = policy.interval_seconds
        self.started = started
        self.limit = limit
        self.log = log  # with a tandem policy, each pass's `decision_lines` go here

    def decide(self, snapshot: Any, now: float) -> dict[str, int]:
        if time.perf_counter() - self.started > self.limit:
            total = snapshot.total()
            share = total.attainment
            raise JobTooSlow(now, "n/a" if share is None else f"{share:.1%}")
        wanted = self.policy.decide(snapshot, now)
        if self.log is not None and isinstance(self.policy, TandemPolicy) and self.policy.last is not None:
            self.log.extend(decision_lines(now, self.policy.last))
        return wanted


def decision_lines(now: float, decision: Decision) -> list[dict[str, Any]]:
    """One record per pool of one tandem pass (`--decisions`): what it ran at, what it asked for and
    why, with the figures the decision used."""
    return [
        {
            "time": now,
            "pool": role,
            "held": decision.held,
            "current": pool.current,
            "target": pool.target,
            "recommendation": pool.recommendation,
            "limitedBy": pool.limited_by,
            "cause": pool.cause,
            "reason": pool.reason,
            "figures": dict(pool.figures),
        }
        for role, pool in decision.pools.items()
    ]


def oracle_lines(outcome: Outcome) -> list[dict[str, Any]]:
    """The oracle's schedule (`--decisions`): one record per decision interval, the layout its search
    chose and the share of that interval's requests within the SLO in the search."""
    interval = float(outcome.extra.get("interval_seconds", ORACLE_INTERVAL))
    sizes = outcome.extra.get("schedule", [])
    shares = outcome.extra.get("search_attainment", [])
    return [
        {"time": k * interval, "prefill": p, "decode": d, "attainment": share}
        for k, ((p, d), share) in enumerate(zip(sizes, shares, strict=True))
    ]


def write_decisions(directory: Path, name: str, lines: Sequence[dict[str, Any]]) -> Path:
    """`lines` as JSON lines in `directory`/`name`.jsonl (the directory made if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{re.sub(r'[^A-Za-z0-9_.=,+-]', '_', name)}.jsonl"
    path.write_text("".join(json.dumps(line, default=str) + "\n" for line in lines))
    return path


@dataclass
class Outcome:
    """What a job sends back (no per-request records: they stay in the worker)."""

    case: str
    policy: str
    summary: Summary | None
    series: list[TickSample] = field(default_factory=list)
    note: str = ""
    wall_seconds: float = 0.0
    simulations: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


def _static(
    setup: Setup, colocated: bool
) -> tuple[SearchResult, dict[StaticLayout, tuple[Summary, list[TickSample]]]]:
    requests = requests_of(setup.case)
    results: dict[StaticLayout, tuple[Summary, list[TickSample]]] = {}

    def evaluate(layout: StaticLayout) -> Summary:
        base = setup.layout_colocated if colocated else setup.layout_pd
        pools = {
            role: pool.model_copy(update={"replicas": layout.replicas()[role]})
            for role, pool in base.pools.items()
        }
        result = simulate(requests, base.model_copy(update={"pools": pools}), setup.config)
        results[layout] = (result.summary, result.series)  # not the records: a search keeps many
        return result.summary

    case = setup.case
    guess = peak_size(planner_config(case, 60.0, "constant"), requests)  # decode in groups
    gpus = case.gpus_per_replica
    if colocated:
        co_guess = guess["prefill"] + guess["decode"] * case.decode_dp  # colocated: one engine a replica
        found = search_static_colocated(evaluate, case.max_gpus, case.tp, ATTAINMENT, guess=co_guess)
    else:
        pd_guess = (guess["prefill"], guess["decode"])
        found = search_static_pd(
            evaluate, case.max_gpus, gpus["prefill"], gpus["decode"], ATTAINMENT, guess=pd_guess
        )
    return found, results


def run_job(
    case: Case,
    policy: str,
    initial: dict[str, int] | None,
    knobs: Knobs = KNOBS,
    hpa: HPAConfig | None = None,
    decisions: bool = False,
) -> Outcome:
    """One policy on one case. `decisions`: a tandem run's per-pass `decision_lines` come back in
    `extra["decision_lines"]`."""
    started = time.perf_counter()
    setup = setup_of(case, initial)
    if policy in (STATIC_PEAK, STATIC_COLOCATED):
        found, results = _static(setup, colocated=policy == STATIC_COLOCATED)
        wall = time.perf_counter() - started
        tried = ", ".join(f"{layout}: {outcome.attainment:.1%}" for layout, outcome in found.tried.items())
        if found.layout is None:
            return Outcome(case.name, policy, None, [], found.note, wall, found.simulations, {"tried": tried})
        summary, series = results[found.layout]
        extra: dict[str, Any] = {"tried": tried}
        if found.layout.prefill:
            extra["layout"] = {"prefill": found.layout.prefill, "decode": found.layout.decode}
        text = layout_text(case, found.layout)
        return Outcome(case.name, policy, summary, series, text, wall, found.simulations, extra)
    if policy == ORACLE:
        return run_oracle(setup, started)
    instance = make_policy(policy, setup, knobs, hpa)
    layout = setup.layout_pd
    note = f"from {layout_text(case, StaticLayout(setup.initial['prefill'], setup.initial['decode']))}"
    log: list[dict[str, Any]] | None = [] if decisions else None
    guarded = WallClockGuard(instance, started, case.wall_limit_seconds, log)
    try:
        result = simulate(requests_of(case), layout, setup.config, guarded)
    except JobTooSlow as exc:
        wall = time.perf_counter() - started
        span = requests_of(case)[-1].arrival
        note = (
            f"{note}; stopped after {wall:.0f} s of wall time at {exc.now:.0f} of {span:.0f} s virtual: "
            f"a deep overload (the simulator slows down as its queues grow); last window's attainment "
            f"{exc.attainment}"
        )
        return Outcome(case.name, policy, None, [], note, wall, 1, {"stopped_at": exc.now})
    extra: dict[str, Any] = {}
    if isinstance(instance, TandemPolicy):
        extra["decisions"] = len(instance.decisions)
        extra["held"] = instance.held
        extra["forecast_drove"] = sum("one model load ahead" in e.reason for e in instance.decisions)
        extra["down_sooner"] = sum("scale-down window x" in e.reason for e in instance.decisions)
        if log is not None:
            extra["decision_lines"] = log
    return Outcome(
        case.name, policy, result.summary, result.series, note, time.perf_counter() - started, 1, extra
    )


def oracle_grid(case: Case, margin: float = 0.0) -> OracleGrid:
    """Up to half the budget per pool (decode in whole groups), at most the budget in all."""
    gpus = case.gpus_per_replica
    return OracleGrid(
        max_prefill=max(1, case.max_gpus // (2 * gpus["prefill"])),
        max_decode=max(1, case.max_gpus // (2 * gpus["decode"])),
        max_gpus=case.max_gpus,
        target=ATTAINMENT,
        interval_seconds=float(case.interval_seconds or ORACLE_INTERVAL),
        margin=margin,
    )


def run_oracle(setup: Setup, started: float) -> Outcome:
    """The hindsight oracle on one case: the greedy search (`hindsight_schedule`), its schedule replayed
    in the full simulator with the model load time (each replica ordered one load time ahead) and with
    none; the search again at the next margin while the loaded replay misses the target."""
    case = setup.case
    requests = requests_of(case)
    searches = 0
    schedule: OracleSchedule | None = None
    loaded: SimResult | None = None
    margin = 0.0
    for margin in ORACLE_MARGINS:
        grid = oracle_grid(case, margin)
        schedule = hindsight_schedule(requests, setup.layout_pd, setup.config, grid)
        searches += schedule.simulations
        loaded = _replay(requests, setup, schedule, setup.layout_pd.model_load_seconds)
        if loaded.summary.attainment >= ATTAINMENT:
            break
    assert schedule is not None
    assert loaded is not None
    instant = _replay(requests, setup, schedule, 0.0)
    sizes = [(c.prefill, c.decode) for c in schedule.choices]
    grid = oracle_grid(case)
    per = case.gpus_per_replica
    used = [p * per["prefill"] + d * per["decode"] for p, d in sizes]
    missed = "" if loaded.summary.attainment >= ATTAINMENT else "; REPLAY MISSES THE TARGET"
    note = (
        f"{schedule.interval_seconds:g}-s intervals, grid 1-{grid.max_prefill} x 1-{grid.max_decode} "
        f"<= {case.max_gpus} GPUs, "
        f"margin {margin:g}; {len(sizes)} intervals, {schedule.infeasible} beyond the grid; "
        f"{min(used)}-{max(used)} GPUs{missed}"
    )
    extra: dict[str, Any] = {
        "margin": margin,
        "search_simulations": searches,
        "schedule": sizes,
        "interval_seconds": schedule.interval_seconds,
        "search_attainment": [c.attainment for c in schedule.choices],
        "infeasible_intervals": schedule.infeasible,
        "instant_summary": instant.summary,
        "instant_series": instant.series,
    }
    return Outcome(
        case.name, ORACLE, loaded.summary, loaded.series, note, time.perf_counter() - started, searches, extra
    )


def _replay(requests: Sequence[Request], setup: Setup, schedule: OracleSchedule, load: float) -> SimResult:
    policy = SchedulePolicy(schedule_sizes(schedule), schedule.interval_seconds, load)
    return simulate(requests, replay_layout(setup.layout_pd, policy), setup.config, policy)


def split_oracle(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Each oracle outcome followed by its instant replay's own row (the job returns both)."""
    split: list[Outcome] = []
    for o in outcomes:
        split.append(o)
        if o.policy != ORACLE or "instant_summary" not in o.extra:
            continue
        summary = o.extra.pop("instant_summary")
        series = o.extra.pop("instant_series")
        note = f"the oracle's schedule with no model load time ({o.note.split(';')[0]})"
        split.append(Outcome(o.case, ORACLE_INSTANT, summary, series, note, 0.0, 1, {}))
    return split


def oracle_checks(cases: Sequence[Case], outcomes: Sequence[Outcome]) -> list[str]:
    """Per trace: the oracle's replay against the target; every online policy that beats the oracle
    beyond `ORACLE_NOISE` while meeting the target (flagged); tandem's GPU-hours against 1.2x the
    oracle's (issue 25), and by how much it misses."""
    lines: list[str] = []
    for case in cases:
        mine = {o.policy: o for o in outcomes if o.case == case.name and o.summary is not None}
        oracle = mine.get(ORACLE)
        if oracle is None or oracle.summary is None:
            continue
        hours = oracle.summary.gpu_hours
        met = "meets" if oracle.summary.attainment >= ATTAINMENT else "MISSES"
        lines.append(
            f"{case.name}: oracle replay {oracle.summary.attainment:.1%} ({met} {ATTAINMENT:.0%}), "
            f"{hours:.2f} GPU-h; instant {_hours(mine.get(ORACLE_INSTANT))}"
        )
        for policy, o in mine.items():
            s = o.summary
            if policy in (*ORACLES, STATIC_PEAK, STATIC_COLOCATED) or s is None:
                continue
            if beats_oracle(s.gpu_hours, s.attainment, hours, ATTAINMENT):
                lines.append(
                    f"  FLAG {case.name}: {policy} meets the target ({s.attainment:.1%}) with "
                    f"{s.gpu_hours:.2f} GPU-h, {1 - s.gpu_hours / hours:.1%} under the hindsight oracle "
                    f"(beyond the {ORACLE_NOISE:.0%} tolerance): a bug, or a limit of the oracle"
                )
        tandem = mine.get(TANDEM)
        if tandem is not None and tandem.summary is not None:
            lines.append(f"  {case.name}: tandem {oracle_cost_verdict(tandem.summary.gpu_hours, hours)}")
    return lines


def _hours(o: Outcome | None) -> str:
    if o is None or o.summary is None:
        return "-"
    return f"{o.summary.attainment:.1%}, {o.summary.gpu_hours:.2f} GPU-h"


# --- the bench --------------------------------------------------------------------------------------------


def parse_start(text: str) -> dict[str, int]:
    """`--start 5P+1D`: the P/D layout every dynamic policy starts from."""
    match = re.fullmatch(r"\s*(\d+)\s*P\s*\+\s*(\d+)\s*D\s*", text, flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"--start {text!r}: a P/D layout such as 5P+1D")
    prefill, decode = int(match.group(1)), int(match.group(2))
    if prefill < 1 or decode < 1:
        raise ValueError(f"--start {text!r}: each pool needs at least one replica")
    return {"prefill": prefill, "decode": decode}


def run_all(
    cases: Sequence[Case],
    policies: Sequence[str],
    jobs: int,
    start: dict[str, int] | None = None,
    decisions: bool = False,
) -> list[Outcome]:
    """Every (case, policy) job, `jobs` at a time. The static-peak searches run first: their layout is
    every dynamic policy's initial size (without them, the planner's arithmetic on the busiest minute;
    with `start`, that layout on every case instead). The jobs that need no initial size (the static
    colocated search, the oracle, whose schedule sets its own) run beside them, so a long sequential
    search does not leave the other processes idle."""
    independent = (STATIC_PEAK, STATIC_COLOCATED, ORACLE) if STATIC_PEAK in policies else ()
    first = [(case, policy) for policy in independent for case in cases if policy in policies]
    rest = [(case, policy) for case in cases for policy in policies if policy not in independent]
    initial = {case.name: guess_size(case) for case in cases}
    outcomes = _run(first, initial, jobs, decisions)
    for outcome in outcomes:
        layout = outcome.extra.get("layout")
        if layout is not None:
            initial[outcome.case] = layout
    if start is not None:
        initial = {case.name: dict(start) for case in cases}
    outcomes += _run(rest, initial, jobs, decisions)
    order = [(case.name, policy) for case in cases for policy in policies]
    return split_oracle(sorted(outcomes, key=lambda o: order.index((o.case, o.policy))))


def _run(
    work: Sequence[tuple[Case, str]], initial: dict[str, dict[str, int]], jobs: int, decisions: bool = False
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    if jobs <= 1 or len(work) <= 1:
        for case, policy in work:
            outcomes.append(run_job(case, policy, initial[case.name], decisions=decisions))
            _progress(outcomes[-1])
        return outcomes
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [
            pool.submit(run_job, case, policy, initial[case.name], decisions=decisions)
            for case, policy in work
        ]
        for future in futures:
            outcomes.append(future.result())
            _progress(outcomes[-1])
    return outcomes


def guess_size(case: Case) -> dict[str, int]:
    """The planner's arithmetic on the trace's busiest minute (`baselines.peak_size`)."""
    return peak_size(planner_config(case, 60.0, "constant"), requests_of(case))


def _progress(outcome: Outcome) -> None:
    s = outcome.summary
    figures = "no layout" if s is None else f"attainment {s.attainment:.1%}, {s.gpu_hours:.1f} GPU-h"
    print(
        f"  {outcome.case:<18} {outcome.policy:<18} {figures} ({outcome.simulations} sims, "
        f"{outcome.wall_seconds:.0f} s)",
        file=sys.stderr,
        flush=True,
    )


def planner_curve(case: Case, outcomes: Sequence[Outcome], policy: str) -> list[CurvePoint]:
    """A swept planner's runs on one trace (factor 1 is its plain row) as points of its curve."""
    points = []
    for o in outcomes:
        if o.case != case.name or o.summary is None:
            continue
        if o.policy == policy:
            points.append(CurvePoint("1", o.summary.attainment, o.summary.gpu_hours))
        elif o.policy.startswith(policy + "@"):
            label = o.policy.partition("@")[2]
            points.append(CurvePoint(label, o.summary.attainment, o.summary.gpu_hours))
    return sorted(points, key=lambda p: -float(p.label))


def planner_at_tandem(case: Case, outcomes: Sequence[Outcome], policy: str) -> DerivedRow | None:
    """The row "<planner> @ tandem's attainment": the swept planner's GPU-hours at tandem's attainment,
    read off its curve (`report.gpu_hours_at`), and tandem's ratio to them; None without both."""
    tandem = next((o for o in outcomes if o.case == case.name and o.policy == TANDEM), None)
    points = planner_curve(case, outcomes, policy)
    if tandem is None or tandem.summary is None or len(points) < 2:
        return None
    target = tandem.summary.attainment
    at = gpu_hours_at(points, target)
    curve = ", ".join(f"x{p.label}: {p.attainment:.1%} {p.gpu_hours:.1f}" for p in points)
    if at.gpu_hours is None:
        best = at.between[0] if at.between else None
        reach = f"best x{best.label} {best.attainment:.1%}" if best else "no point"
        note = f"not reached ({reach}); curve {curve}"
    else:
        first = at.between[0]
        if at.how == "interpolated":
            how = f"between x{first.label} and x{at.between[1].label}"
        elif at.how == "at most":
            how = f"at most: x{first.label} already reaches {first.attainment:.1%}"
        else:
            how = f"at x{first.label}"
        note = f"tandem / planner = {tandem.summary.gpu_hours / at.gpu_hours:.2f} ({how}); curve {curve}"
    return DerivedRow(case.name, at_tandem_name(policy), target, at.gpu_hours, note, case.tuned)


def report(cases: Sequence[Case], outcomes: Sequence[Outcome], out: Path, docs: bool) -> str:
    rows: list[Row | DerivedRow] = []
    derived: dict[str, dict[str, Any]] = {}
    for case in cases:
        for o in outcomes:
            if o.case == case.name:
                rows.append(Row(case.name, o.policy, o.summary, o.note, case.tuned, o.wall_seconds))
        for policy in SWEPT:
            extra = planner_at_tandem(case, outcomes, policy)
            if extra is not None:
                rows.append(extra)
                derived.setdefault(case.name, {})[policy] = {
                    "attainment": extra.attainment,
                    "gpu_hours": extra.gpu_hours,
                    "note": extra.note,
                }
    text = table(rows)
    out.mkdir(parents=True, exist_ok=True)
    for case in cases:
        plotted = {
            o.policy: o.series for o in outcomes if o.case == case.name and o.policy in PLOTTED and o.series
        }
        if not plotted:
            continue
        path = plot_trace(
            out / f"{case.name}.png",
            f"{case.title}, rate x{case.rate_scale:g}",
            plotted,
            case.ttft_ms / 1e3,
            case.tpot_ms / 1e3,
        )
        if docs:
            DOCS_IMG.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, DOCS_IMG / f"autoscale-{case.name}.png")
    (out / "table.md").write_text(text + "\n", encoding="utf-8")
    (out / "planner_at_tandem.json").write_text(json.dumps(derived, indent=1), encoding="utf-8")
    (out / "results.json").write_text(
        json.dumps(
            [
                {
                    "trace": o.case,
                    "policy": o.policy,
                    "summary": o.summary.model_dump() if o.summary else None,
                    "note": o.note,
                    "wall_seconds": o.wall_seconds,
                    "simulations": o.simulations,
                    **o.extra,
                }
                for o in outcomes
            ],
            indent=1,
        ),
        encoding="utf-8",
    )
    return text


def speed_figure() -> str:
    """The simulator's speed on 1M Azure-conversation requests: `bench/sim_speed.py` (the simulator's own
    bench) run in this process, its `speed` and `1M requests` lines."""
    import contextlib
    import io

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import sim_speed  # type: ignore[import-not-found]

        captured = io.StringIO()
        argv, sys.argv = sys.argv, ["sim_speed.py"]
        try:
            with contextlib.redirect_stdout(captured):
                sim_speed.main()
        finally:
            sys.argv = argv
    except Exception as exc:  # the speed bench is another module's; its failure must not stop this one
        return f"unavailable ({type(exc).__name__}: {exc})"
    lines = [line for line in captured.getvalue().splitlines() if line.startswith(("speed", "1M requests"))]
    return "; ".join(" ".join(line.split()) for line in lines) or captured.getvalue().strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small fixed-seed run (10 min of Azure conv)")
    parser.add_argument("--traces", default="", help="comma-separated trace names (default: all)")
    parser.add_argument("--policies", default="", help=f"comma-separated, from {', '.join(ALL_POLICIES)}")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel processes")
    parser.add_argument("--out", default=str(OUT), help="where plots and the table go")
    parser.add_argument("--docs", action="store_true", help="also copy the plots to docs/img/ (final run)")
    parser.add_argument("--no-speed", action="store_true", help="skip the 1M-request speed figure")
    parser.add_argument(
        "--servegen-compress",
        type=float,
        default=None,
        help="ServeGen's day compressed this many times, its rate scaled to keep the load per second "
        "(default 4; 1 is its real pace, 4x the requests)",
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="the realistic-scale day instead (ServeGen m-mid day 1 at its real pace, 70B TP4, up to 60 "
        "GPUs; with --quick one hour of it)",
    )
    parser.add_argument("--tune-hpa", action="store_true", help="grid of HPA targets on the Azure traces")
    parser.add_argument(
        "--decisions",
        metavar="DIR",
        help="write every tandem run's passes (per pool: size, recommendation, limit, reason, figures) and "
        "the oracle's schedule to DIR/<trace>-<policy>.jsonl, one JSON object a line",
    )
    parser.add_argument(
        "--tune-tandem",
        action="append",
        default=[],
        metavar="KNOB=V1,V2",
        help="tandem with autoscale.Knobs overridden, on the chosen traces (repeatable; proposals only)",
    )
    parser.add_argument(
        "--planner-factors",
        default=None,
        metavar="F1,F2",
        help="the planner's targets as shares of the SLO, one run each besides factor 1 (default "
        f"{_listed(PLANNER_FACTORS)}; quick {_listed(QUICK_PLANNER_FACTORS)}; empty: no sweep)",
    )
    mine = parser.add_argument_group("your own trace (docs/simulator.md, 'Your own trace')")
    mine.add_argument("--trace", default=None, metavar="FILE", help="run the whole comparison on this trace")
    mine.add_argument(
        "--format",
        default=None,
        choices=TRACE_FORMATS,
        help="its format (default: recognised from its first line)",
    )
    mine.add_argument("--rate-scale", type=float, default=1.0, help="arrival rate x this (default 1)")
    mine.add_argument(
        "--window",
        default=None,
        metavar="START:SECONDS",
        help="replay only [START, START+SECONDS) of the trace, in its own seconds (ServeGen default 0:86400)",
    )
    mine.add_argument(
        "--compression",
        type=float,
        default=1.0,
        help="virtual time = trace time / this, after the rate scale (default 1: the trace's own pace)",
    )
    mine.add_argument("--ttft-ms", type=int, default=1000, help="the SLO's TTFT (default 1000)")
    mine.add_argument("--tpot-ms", type=int, default=30, help="the SLO's TPOT (default 30)")
    mine.add_argument("--max-gpus", type=int, default=48, help="the GPU budget (default 48)")
    parser.add_argument(
        "--decode-dp",
        type=int,
        default=1,
        metavar="D",
        help="decode in data-parallel groups of D engines (parallelism.data; the traces named <trace>-dpD; "
        "default 1: one engine a replica)",
    )
    parser.add_argument(
        "--disaggregation",
        default="Always",
        help="the simulated router's spec.router.disaggregation: Always (default), Auto or Threshold:N "
        "(prefill on the decode replica at most N uncached tokens); P/D layouts only",
    )
    parser.add_argument(
        "--start",
        default=None,
        metavar="NP+MD",
        help="every dynamic policy starts from this P/D layout (e.g. 5P+1D) instead of static peak's",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        disaggregation_knobs(args.disaggregation)
        start = parse_start(args.start) if args.start is not None else None
    except ValueError as exc:
        parser.error(str(exc))
    started = time.perf_counter()
    factors = _factors(parser, args.planner_factors, QUICK_PLANNER_FACTORS if args.quick else PLANNER_FACTORS)
    if args.trace is not None:
        if args.traces:
            parser.error("--trace runs one file; leave out --traces")
        cases = [_file_case(parser, args)]
    elif args.quick:
        cases = [SCALE_QUICK if args.scale else QUICK]
    elif args.scale and not args.traces:
        cases = [SCALE_CASES[0]]
    else:
        names = [n for n in args.traces.split(",") if n]
        known = (*CASES, *EXTRA_CASES, *SCALE_CASES)
        cases = [c for c in known if c.name in names or (not names and c in CASES)]
        if names and len(cases) != len(names):
            parser.error(f"unknown trace in {args.traces!r}; known: {', '.join(c.name for c in known)}")
        if args.servegen_compress is not None:
            if not args.servegen_compress > 0:
                parser.error("--servegen-compress must be positive")
            cases = [
                replace(
                    c,
                    compress=args.servegen_compress,
                    rate_scale=c.rate_scale * c.compress / args.servegen_compress,
                    title=f"ServeGen language m-mid, day 1 compressed {args.servegen_compress:g}x",
                )
                if c.loader == "servegen-day" and c.model == MODEL
                else c
                for c in cases
            ]
    if args.decode_dp < 1:
        parser.error("--decode-dp must be at least 1")
    cases = [with_decode_dp(replace(c, disaggregation=args.disaggregation), args.decode_dp) for c in cases]
    if args.quick:
        policies = [STATIC_PEAK, HPA, DYNAMO_180, DYNAMO_LOAD, DYNAMO_BOTH, TANDEM, ORACLE]
    else:
        policies = [p for p in args.policies.split(",") if p] or list(ALL_POLICIES)
        unknown = [p for p in policies if p not in (*ALL_POLICIES, *EXTRA_POLICIES)]
        if unknown:
            parser.error(f"unknown policy {unknown}; known: {', '.join((*ALL_POLICIES, *EXTRA_POLICIES))}")
    for swept in SWEPT:
        if swept in policies:
            at = policies.index(swept) + 1
            policies[at:at] = [swept_name(swept, f) for f in factors]
    if args.trace is not None:
        try:
            requests_of(cases[0])
        except (TraceError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.tune_hpa:
        return tune_hpa(args.jobs)
    if args.tune_tandem:
        return tune_tandem(cases, args.tune_tandem, Path(args.decisions) if args.decisions else None)
    models = sorted({(c.model, c.tp, c.load_seconds, c.interval_seconds) for c in cases}, key=str)
    served = "; ".join(
        f"model {m} on {GPU} TP{tp}, model load {load:g} s"
        + (f", decision interval {interval} s" if interval is not None else "")
        for m, tp, load, interval in models
    )
    print(f"seed {SEED}; {served}; attainment target {ATTAINMENT:.0%}")
    swept = [p for p in SWEPT if p in policies and factors]
    if swept:
        print(f"  planner sweep: {', '.join(swept)}, TTFT/ITL targets = SLO x {_listed((1, *factors), ', ')}")
    for case in cases:
        n = len(requests_of(case))
        held = "tuned on" if case.tuned else "NOT tuned on (held out)"
        span = requests_of(case)[-1].arrival / 3600
        pace = f", time compressed {case.compress:g}x" if case.compress != 1 else ""
        if case.disaggregation != "Always":
            pace += f", router disaggregation {case.disaggregation}"
        if case.decode_dp > 1:
            pace += f", decode in DP{case.decode_dp} groups ({case.gpus_per_replica['decode']} GPUs each)"
        if case.loader == "file":
            window = (
                f"[{case.start:g}, {case.start + case.seconds:g}) s"
                if case.seconds
                else f"from {case.start:g} s"
            )
            pace += f"; {case.fmt} trace {case.path}, window {window}"
        print(
            f"  {case.name}: {n:,} requests over {span:.2f} h, rate x{case.rate_scale:g}{pace}, "
            f"SLO TTFT {case.ttft_ms} ms / TPOT {case.tpot_ms} ms, budget {case.max_gpus} GPUs; "
            f"policies {held}"
        )
    if start is not None:
        layout = StaticLayout(start["prefill"], start["decode"])
        print(f"  every dynamic policy from {layout} (--start), not static peak's layout")
    outcomes = run_all(cases, policies, args.jobs, start, decisions=bool(args.decisions))
    if args.decisions:
        for outcome in outcomes:
            lines = outcome.extra.pop("decision_lines", None)
            if lines is None and outcome.policy == ORACLE:
                lines = oracle_lines(outcome)
            if lines is not None:
                path = write_decisions(Path(args.decisions), f"{outcome.case}-{outcome.policy}", lines)
                print(f"decisions: {path}")
    text = report(cases, outcomes, Path(args.out), args.docs)
    print(text)
    for case in cases:
        peak = next((o for o in outcomes if o.case == case.name and o.policy == STATIC_PEAK), None)
        if peak is not None and peak.summary is not None and peak.summary.peak_gpus < 8:
            print(
                f"note: {case.name}: static peak needs {peak.summary.peak_gpus} GPUs (< 8): "
                "raise its rate scale"
            )
        if peak is not None:
            print(f"  {case.name} static peak search: {peak.extra.get('tried', '')}")
    for line in oracle_checks(cases, outcomes):
        print(line)
    print(f"plots and table: {args.out}")
    if not args.quick and not args.no_speed:
        print(f"simulator speed: {speed_figure()}")
    print(f"whole bench: {time.perf_counter() - started:.0f} s wall")
    return 0


def _listed(values: Sequence[float], sep: str = ",") -> str:
    return sep.join(f"{v:g}" for v in values)


def _factors(parser: argparse.ArgumentParser, text: str | None, default: tuple[float, ...]) -> list[float]:
    if text is None:
        return list(default)
    factors = []
    for item in (t for t in text.split(",") if t.strip()):
        try:
            value = float(item)
        except ValueError:
            parser.error(f"--planner-factors: {item!r} is not a number")
        if not 0 < value < 1:
            parser.error(f"--planner-factors: {item} is not within (0, 1) (1 is the plain planner's row)")
        factors.append(value)
    return sorted(set(factors), reverse=True)


def _file_case(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Case:
    """The `--trace` options as a Case (loader "file")."""
    path = Path(args.trace).resolve()
    if not args.rate_scale > 0 or not args.compression > 0:
        parser.error("--rate-scale and --compression must be positive")
    if args.ttft_ms < 1 or args.tpot_ms < 1 or args.max_gpus < 2:
        parser.error("--ttft-ms and --tpot-ms must be >= 1 and --max-gpus >= 2")
    start, seconds = 0.0, None
    if args.window is not None:
        first, sep, length = args.window.partition(":")
        try:
            start, seconds = float(first), float(length)
        except ValueError:
            parser.error(f"--window must be START:SECONDS (e.g. 0:600), got {args.window!r}")
        if not sep or start < 0 or not seconds > 0:
            parser.error(
                f"--window must be START:SECONDS with START >= 0 and SECONDS > 0, got {args.window!r}"
            )
    try:
        fmt = args.format or detect_format(path)
    except TraceError as exc:
        parser.error(str(exc))
    if fmt == "servegen" and seconds is None:
        seconds = SERVEGEN_DEFAULT_SECONDS
    name = path.name.split(".")[0]
    return Case(
        name,
        f"{path.name} ({fmt})",
        "file",
        args.rate_scale,
        args.ttft_ms,
        args.tpot_ms,
        args.max_gpus,
        tuned=False,
        seconds=seconds,
        start=start,
        compress=args.compression,
        path=str(path),
        fmt=fmt,
    )


HPA_GRID = {"prefill": (1024.0, 2048.0, 4096.0), "decode": (0.2, 0.3, 0.4, 0.5)}


def tune_hpa(jobs: int) -> int:
    """The HPA's targets, tuned once on the training traces (Azure code and conversation), from the same
    start as the bench (static peak's layout): the joint grid `HPA_GRID`; the pick is the fewest
    GPU-hours summed over both traces among targets reaching the attainment target on both (else the
    best worst-case attainment, then the fewest GPU-hours). Prints every point; the values are then
    fixed in `tandem.sim.baselines`."""
    training = [c for c in CASES if c.tuned]
    peaks = _run([(c, STATIC_PEAK) for c in training], {c.name: guess_size(c) for c in training}, jobs)
    initial = {
        o.case: o.extra.get("layout") or guess_size(next(c for c in training if c.name == o.case))
        for o in peaks
    }
    configs = [
        replace(HPAConfig(), targets={"prefill": p, "decode": d, "colocated": d})
        for p in HPA_GRID["prefill"]
        for d in HPA_GRID["decode"]
    ]
    print(f"HPA tuning on {', '.join(c.name for c in training)} from {initial}", flush=True)
    work = [(cfg, c) for cfg in configs for c in training]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_job, c, HPA, initial[c.name], KNOBS, cfg) for cfg, c in work]
        outcomes = [f.result() for f in futures]
    scored = []
    for k, cfg in enumerate(configs):
        rows = outcomes[k * len(training) : (k + 1) * len(training)]
        summaries = [o.summary for o in rows if o.summary is not None]
        ok = len(summaries) == len(rows) and all(s.attainment >= ATTAINMENT for s in summaries)
        hours = sum(s.gpu_hours for s in summaries)
        worst = min((s.attainment for s in summaries), default=0.0)
        figures = "; ".join(
            f"{o.case} {o.summary.attainment:.1%} {o.summary.gpu_hours:.1f} GPU-h" for o in rows if o.summary
        )
        print(
            f"  prefill {cfg.targets['prefill']:g}, decode {cfg.targets['decode']:g}: {figures}", flush=True
        )
        scored.append(((0, hours) if ok else (1, -worst, hours), cfg))
    best = min(scored, key=lambda t: t[0])[1]
    print(
        f"tuned: prefill {best.targets['prefill']:g} queued prompt tokens per replica, "
        f"decode {best.targets['decode']:g} KV usage",
        flush=True,
    )
    return 0


def tune_tandem(cases: Sequence[Case], overrides: Sequence[str], decisions: Path | None = None) -> int:
    """tandem's policy with one knob changed at a time (`autoscale.Knobs`), to propose tuning: the
    policy itself is frozen in `tandem.autoscale`, this only measures. With `decisions`, each run's
    passes go to `decisions`/<trace>-tandem[-<knob>=<value>].jsonl."""
    print("tandem, defaults: " + _tandem_figures(cases, KNOBS, decisions, "tandem"), flush=True)
    for item in overrides:
        name, _, values = item.partition("=")
        if not hasattr(KNOBS, name):
            print(f"unknown knob {name!r}", file=sys.stderr)
            return 2
        for value in values.split(","):
            kind = type(getattr(KNOBS, name))
            parsed = value.strip().lower() in ("1", "true", "on") if kind is bool else kind(value)
            knobs = replace(KNOBS, **{name: parsed})
            label = f"tandem-{name}={value}"
            print(f"tandem, {name}={value}: " + _tandem_figures(cases, knobs, decisions, label), flush=True)
    return 0


def _tandem_figures(
    cases: Sequence[Case], knobs: Knobs, decisions: Path | None = None, label: str = "tandem"
) -> str:
    parts = []
    for case in cases:
        o = run_job(case, TANDEM, None, knobs=knobs, decisions=decisions is not None)
        if decisions is not None:
            write_decisions(decisions, f"{case.name}-{label}", o.extra.pop("decision_lines", []))
        assert o.summary is not None
        s = o.summary
        parts.append(f"{case.name} {s.attainment:.1%} {s.gpu_hours:.2f} GPU-h {s.scale_actions} actions")
    return "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
