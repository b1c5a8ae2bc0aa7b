"""`tandem advise`, pure: should this model be served P/D, at what P:D ratio, on how many GPUs?

From a model (or its KV bytes per token), a GPU profile, the KV link bandwidth, a load (a trace's
requests, or a length distribution and a rate) and an SLO:
- the KV transfer's share of an idle P/D request's TTFT at the p50 and p90 input length
  (`perf.kv_transfer_seconds`: each TP rank moves its slice over its own NIC, as the simulator does);
- the fewest-GPU P/D and colocated layouts meeting the SLO over the load, with their goodput per GPU,
  from the simulator (`baselines.search_static_pd` / `search_static_colocated`);
- a P:D ratio sweep: for each ratio a:b, the smallest k with k*a prefill and k*b decode replicas meeting
  the SLO, and the GPUs that takes (each ratio starts at the per-pool lower bounds the search found);
- a ready-to-apply PDDeployment of the winner: P/D, or colocated when P/D needs at least as many GPUs;
- on the P/D layout found, spec.router.disaggregation's modes side by side on the same requests (Always,
  Auto, Threshold at `DEFAULT_THRESHOLDS`) and colocated on as many GPUs (`compare_modes`), and which to
  use (`best_mode`: the highest attainment, then the lowest TTFT p90, then the simplest mode); a P/D
  deployment carries the chosen mode.
When no layout within the GPU budget meets the SLO, the report says "not achievable" and why.

`layout_of_spec` maps a PDDeployment onto the simulator's pools; `tandem sim` uses it too, so an advised
deployment can be replayed (`tests/unit/sim/test_advise.py` does).
Bad input raises `AdviseError` (the CLI prints it and exits 2).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tandem.api.models import PDDeployment, PDDeploymentSpec
from tandem.api.shape import MAX_GPUS_PER_POD, Shape
from tandem.autoscale.capacity import engine_limits, pool_gpu
from tandem.perf import (
    ACTIVATION_RESERVE_BYTES,
    ProfileNotFoundError,
    UnknownModelError,
    available_profiles,
    estimate_profile,
    kv_transfer_seconds,
    model_arch,
)
from tandem.perf.stats import nearest_rank
from tandem.routing.disaggregation import DisaggregationKnobs
from tandem.sim.baselines import (
    DEFAULT_ATTAINMENT_TARGET,
    PlannerConfig,
    SearchResult,
    StaticLayout,
    peak_size,
    search_static_colocated,
    search_static_pd,
)
from tandem.sim.cluster import simulate
from tandem.sim.layout import SLO, Layout, PoolSpec, ReplicaSpec, SimConfig
from tandem.sim.requests import Request
from tandem.sim.results import Summary
from tandem.sim.traces import TraceError, read_azure, read_mooncake, read_plain, spread_ticks, window
from tandem.sim.traces.readers import numbered_lines
from tandem.versions import VLLM_IMAGE

GIB = 1 << 30
DEFAULT_RATIOS: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (1, 3), (2, 1), (3, 1))
DEFAULT_ENGINE_IMAGE = VLLM_IMAGE
DEFAULT_THRESHOLDS: tuple[int, ...] = (256, 512, 1024, 2048)
COLOCATED = "Colocated"


class AdviseError(ValueError):
    """Input advise (or `tandem sim`) cannot work with; the message says what to change."""


# --- the model and its replicas ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What advise knows of the model: its id, KV bytes per token, and how its latency was obtained."""

    model: str
    kv_bytes_per_token: int
    known: bool  # an architecture in perf's models.yaml
    notes: tuple[str, ...] = ()


def resolve_model(model: str | None, kv_bytes_per_token: int | None) -> ModelInfo:
    """A known model (its KV bytes from the architecture unless given), or any name with its KV bytes."""
    name = (model or "").strip()
    if name.startswith("hf://"):
        name = name[len("hf://") :].split("@", 1)[0]
    if kv_bytes_per_token is not None and kv_bytes_per_token < 1:
        raise AdviseError(f"--kv-bytes-per-token must be >= 1, got {kv_bytes_per_token}")
    try:
        arch = model_arch(name) if name else None
    except UnknownModelError:
        arch = None
    if arch is not None:
        kv = kv_bytes_per_token or arch.kv_bytes_per_token
        return ModelInfo(arch.model_id, kv, True)
    if kv_bytes_per_token is None:
        known = ", ".join(sorted({p.model for p in available_profiles()}))
        what = f"unknown model {name!r}" if name else "no model given"
        raise AdviseError(f"{what}: give --kv-bytes-per-token (known models: {known})")
    return ModelInfo(name or "custom-model", kv_bytes_per_token, False)


def default_load_seconds(model: str) -> float:
    """The evaluation's model load time per profile: 120 s for 8B-class models, 300 s from 30B up."""
    try:
        return 300.0 if model_arch(model).params_b >= 30 else 120.0
    except UnknownModelError:
        return 120.0


def replica_spec(
    info: ModelInfo,
    gpu: str,
    tp: int,
    bandwidth_gbps: float,
    gpu_memory_utilization: float = 0.9,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 1024,
) -> tuple[ReplicaSpec, tuple[str, ...]]:
    """One replica of the model on `tp` GPUs of type `gpu`, and notes on how its figures were derived.

    A known model takes perf's profile (calibrated, or scaled from the nearest calibrated one). A model
    known only by its KV bytes borrows the step times of the smallest calibrated model on that GPU, with the
    decode KV-read term scaled by the KV ratio, and that model's weights for the KV capacity (stated).
    """
    if tp not in (1, 2, 4, 8):
        raise AdviseError(f"tensor parallel size must be 1, 2, 4 or 8, got {tp}")
    if bandwidth_gbps <= 0:
        raise AdviseError(f"link bandwidth must be positive, got {bandwidth_gbps} Gb/s")
    notes: list[str] = []
    base_model = info.model if info.known else _first_model_on(gpu)
    try:
        profile = estimate_profile(base_model, gpu, tp)
    except ProfileNotFoundError as exc:
        raise AdviseError(str(exc)) from None
    if profile.derived_from:
        notes.append(f"TP{tp} on {gpu}: scaled from {profile.derived_from} (no calibrated profile)")
    arch = model_arch(profile.model)
    heads_share = max(1, arch.kv_heads // tp) / arch.kv_heads if not arch.mla else 1.0
    per_gpu = max(1, math.ceil(info.kv_bytes_per_token * heads_share))
    if not info.known:
        scale = info.kv_bytes_per_token / arch.kv_bytes_per_token
        d = profile.decode
        profile = profile.model_copy(
            update={"decode": d.model_copy(update={"per_context_token_ms": d.per_context_token_ms * scale})}
        )
        notes.append(
            f"{info.model}: step times of {arch.model_id} on {gpu} (its weights too), "
            f"decode KV read scaled x{scale:.2f} for {info.kv_bytes_per_token} KV bytes/token"
        )
    weights = arch.params_b * 1e9 * arch.dtype_bytes / tp
    available = profile.gpu_memory_gib * GIB * gpu_memory_utilization - weights - ACTIVATION_RESERVE_BYTES
    tokens = int(available // per_gpu) if available > 0 else 0
    if tokens <= 0:
        raise AdviseError(f"{info.model} does not fit on {gpu} at TP{tp}: no memory left for the KV cache")
    spec = ReplicaSpec(
        profile=profile,
        kv_capacity_tokens=tokens,
        kv_bandwidth_gbps=bandwidth_gbps,
        kv_bytes_per_token_per_gpu=per_gpu,
        max_num_batched_tokens=max(max_num_batched_tokens, max_num_seqs),
        max_num_seqs=max_num_seqs,
    )
    return spec, tuple(notes)


def _first_model_on(gpu: str) -> str:
    """The smallest calibrated model on `gpu` (the one an unknown model borrows step times from)."""
    on_gpu = [p.model for p in available_profiles() if p.gpu.lower() == gpu.lower()]
    if on_gpu:
        return min(on_gpu, key=lambda m: model_arch(m).params_b)
    known = sorted({p.gpu for p in available_profiles()})
    raise AdviseError(f"no profile on GPU {gpu!r}; known: {', '.join(known)}")


# --- the load ---------------------------------------------------------------------------------------------


def synthetic_requests(
    input_mean: float,
    output_mean: float,
    rate: float,
    duration_seconds: float,
    cv: float = 1.0,
    seed: int = 0,
) -> list[Request]:
    """Poisson arrivals at `rate` for `duration_seconds`, lengths lognormal with these means and
    coefficient of variation `cv` (0: every request the same), at least one token each."""
    if input_mean < 1 or output_mean < 1:
        raise AdviseError("input and output lengths must be at least 1 token")
    if rate <= 0 or duration_seconds <= 0:
        raise AdviseError("the rate and the duration must be positive")
    if cv < 0:
        raise AdviseError("the length CV must be >= 0")
    rng = random.Random(seed)
    sigma = math.sqrt(math.log1p(cv * cv))

    def length(mean: float) -> int:
        if cv == 0:
            return max(1, round(mean))
        return max(1, round(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)))

    requests: list[Request] = []
    t = rng.expovariate(rate)
    while t < duration_seconds:
        requests.append(Request(t, length(input_mean), length(output_mean)))
        t += rng.expovariate(rate)
    if not requests:
        raise AdviseError(f"no request arrives in {duration_seconds:g} s at {rate:g} req/s")
    return requests


TRACE_FORMATS = ("azure", "mooncake", "plain")
MOONCAKE_TICK_SECONDS = 3.0  # Mooncake's timestamps are quantised to ~3 s ticks (traces/ README)
SUPERPOSE_SHIFT_SECONDS = 60.0


def superpose(requests: Sequence[Request], factor: float, seed: int = 0) -> list[Request]:
    """The arrival rate times `factor`, the trace's duration kept: `factor` copies of the trace laid
    over each other (the last copy keeps each request with probability `factor`'s fraction), each copy
    but the first shifted by a seeded uniform offset within a minute, cyclically within the trace's span.
    The trace's swings over minutes and hours stay where they are, which is what an autoscaler is judged
    on; compressing timestamps (`traces.scale_rate`) would shorten an hour-long trace to minutes."""
    if not factor > 0:
        raise AdviseError(f"a rate scale must be positive, got {factor}")
    if not requests:
        return []
    if factor == 1:
        return list(requests)
    rng = random.Random(seed)
    span = requests[-1].arrival - requests[0].arrival or 1.0
    whole, fraction = int(factor), factor - int(factor)
    out: list[Request] = []
    for copy in range(whole + (1 if fraction > 0 else 0)):
        keep = 1.0 if copy < whole else fraction
        shift = 0.0 if copy == 0 else rng.uniform(0.0, min(SUPERPOSE_SHIFT_SECONDS, span))
        for r in requests:
            if keep < 1.0 and rng.random() >= keep:
                continue
            out.append(r._replace(arrival=(r.arrival + shift) % span if shift else r.arrival))
    out.sort(key=lambda r: r.arrival)
    return out


def trace_format(path: Path) -> str:
    """`azure`, `mooncake` or `plain`, from the first non-blank line (gzip or not)."""
    for _, line in numbered_lines(path):
        text = line.strip()
        if not text:
            continue
        if text.replace(" ", "").startswith("TIMESTAMP,ContextTokens"):
            return "azure"
        if text.startswith("{") and '"input_length"' in text:
            return "mooncake"
        return "plain"
    raise TraceError(f"{path}: the trace has no requests")


def load_trace(
    path: str | Path,
    fmt: str | None = None,
    rate_scale: float = 1.0,
    start: float = 0.0,
    seconds: float | None = None,
    seed: int = 0,
) -> list[Request]:
    """A trace file's requests (`traces` readers; Mooncake's ticks spread), the window [start, start +
    seconds) re-based to 0, its rate scaled by `superpose`. Raises `TraceError` for a bad file or window."""
    path = Path(path)
    kind = fmt or trace_format(path)
    if kind not in TRACE_FORMATS:
        raise TraceError(f"unknown trace format {kind!r}; one of {', '.join(TRACE_FORMATS)}")
    if kind == "azure":
        requests = read_azure(path)
    elif kind == "mooncake":
        requests = spread_ticks(read_mooncake(path), MOONCAKE_TICK_SECONDS, seed)
    else:
        requests = read_plain(path)
    if start < 0 or (seconds is not None and seconds <= 0):
        raise TraceError("the window needs --start >= 0 and a positive --seconds")
    if start or seconds is not None:
        requests = window(requests, start, seconds if seconds is not None else math.inf)
        if not requests:
            raise TraceError(
                f"{path}: no request in the window [{start:g}, {start + (seconds or math.inf):g}) s"
            )
    return superpose(requests, rate_scale, seed)


# --- transfer arithmetic ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransferPoint:
    """An idle P/D request of `input_tokens`: prefill, KV transfer, and the decode pod's first step."""

    label: str
    input_tokens: int
    prefill_ms: float
    transfer_ms: float
    first_decode_ms: float

    @property
    def ttft_ms(self) -> float:
        return self.prefill_ms + self.transfer_ms + self.first_decode_ms

    @property
    def share(self) -> float:
        return self.transfer_ms / self.ttft_ms if self.ttft_ms > 0 else 0.0


def transfer_point(label: str, tokens: int, prefill: ReplicaSpec, decode: ReplicaSpec) -> TransferPoint:
    bandwidth = min(prefill.kv_bandwidth_gbps, decode.kv_bandwidth_gbps)
    return TransferPoint(
        label=label,
        input_tokens=tokens,
        prefill_ms=prefill.profile.prefill_seconds(tokens) * 1e3,
        transfer_ms=kv_transfer_seconds(tokens, prefill.kv_bytes_per_token_per_gpu, bandwidth) * 1e3,
        first_decode_ms=decode.profile.decode_step_seconds(1, tokens) * 1e3,
    )


# --- the advice -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdviseRequest:
    model: ModelInfo
    gpu: str
    bandwidth_gbps: float
    slo: SLO
    requests: Sequence[Request]
    attainment_target: float = DEFAULT_ATTAINMENT_TARGET
    prefill_tp: int = 1
    decode_tp: int = 1
    colocated_tp: int = 1
    # data-parallel ranks per replica (`parallelism.data`, Internal balancing, one pod): a replica is a
    # group of that many engines at the pool's TP, TP x DP GPUs
    prefill_dp: int = 1
    decode_dp: int = 1
    colocated_dp: int = 1
    max_gpus: int = 64
    ratios: tuple[tuple[int, int], ...] = DEFAULT_RATIOS
    seed: int = 0
    load_description: str = ""
    thresholds: tuple[int, ...] = DEFAULT_THRESHOLDS  # Threshold values compare_modes runs

    def shapes(self) -> dict[str, Shape]:
        """Each pool's replica: TP x DP GPUs in one pod, its ranks balanced by the group's API server."""
        return {
            "prefill": Shape(tensor=self.prefill_tp, data=self.prefill_dp),
            "decode": Shape(tensor=self.decode_tp, data=self.decode_dp),
            "colocated": Shape(tensor=self.colocated_tp, data=self.colocated_dp),
        }

    def gpus_per_replica(self) -> dict[str, int]:
        return {role: shape.gpus_per_instance for role, shape in self.shapes().items()}


@dataclass(frozen=True, slots=True)
class ModeRow:
    """One way to serve the load on the P/D layout's GPUs: a disaggregation mode on that layout
    (`knobs`), or colocated on as many GPUs (`knobs` None)."""

    name: str  # Always, Auto, Threshold N, Colocated
    knobs: DisaggregationKnobs | None
    summary: Summary


@dataclass(frozen=True, slots=True)
class Candidate:
    layout: StaticLayout
    gpus: int
    summary: Summary

    @property
    def goodput_per_gpu(self) -> float:
        """Within-SLO requests per second per GPU."""
        s = self.summary
        return s.within_slo / s.duration_seconds / self.gpus if s.duration_seconds > 0 and self.gpus else 0.0


@dataclass(frozen=True, slots=True)
class RatioRow:
    prefill: int
    decode: int
    found: Candidate | None
    note: str = ""


@dataclass(slots=True)
class Advice:
    request: AdviseRequest
    prefill_spec: ReplicaSpec
    decode_spec: ReplicaSpec
    colocated_spec: ReplicaSpec
    transfer: list[TransferPoint]
    pd: Candidate | None
    colocated: Candidate | None
    ratios: list[RatioRow]
    notes: list[str] = field(default_factory=list)
    simulations: int = 0
    modes: list[ModeRow] = field(default_factory=list)  # compare_modes on the P/D layout (none without one)

    @property
    def mode(self) -> ModeRow | None:
        """Which of `modes` to use (`best_mode`)."""
        return best_mode(self.modes) if self.modes else None

    @property
    def recommended(self) -> Candidate | None:
        """P/D when it needs fewer GPUs than colocated; colocated when it needs as many or fewer."""
        if self.colocated is not None and (self.pd is None or self.colocated.gpus <= self.pd.gpus):
            return self.colocated
        return self.pd

    @property
    def achievable(self) -> bool:
        return self.recommended is not None


def planner_config(prefill: ReplicaSpec, decode: ReplicaSpec, slo: SLO) -> PlannerConfig:
    """The static planner's view of a prefill and a decode replica under `slo`: where a layout
    search starts (`peak_size`)."""
    return PlannerConfig(
        prefill_profile=prefill.profile,
        decode_profile=decode.profile,
        ttft_seconds=slo.ttft_ms / 1e3,
        itl_seconds=slo.tpot_ms / 1e3,
        decode_kv_capacity_tokens=decode.kv_capacity_tokens,
        max_num_batched_tokens=prefill.max_num_batched_tokens,
        max_num_seqs=decode.max_num_seqs,
    )


def checked_shapes(req: AdviseRequest) -> dict[str, Shape]:
    """`req.shapes()`, each a data-parallel group of at least one rank within one pod; else the error
    names the flags."""
    shapes = req.shapes()
    for role, shape in shapes.items():
        if shape.data < 1:
            raise AdviseError(f"a {role} replica needs at least one data-parallel rank (--{role}-dp)")
        if shape.gpus_per_instance > MAX_GPUS_PER_POD:
            raise AdviseError(
                f"a {role} replica of TP{shape.tensor} x DP{shape.data} must fit one pod of "
                f"{MAX_GPUS_PER_POD} GPUs (--{role}-tp x --{role}-dp)"
            )
    return shapes


def advise(req: AdviseRequest, on_simulation: Callable[[str], None] | None = None) -> Advice:
    """Runs the searches and the ratio sweep through the simulator and returns the advice."""
    if not req.requests:
        raise AdviseError("the load has no requests")
    if not 0 < req.attainment_target <= 1:
        raise AdviseError("the attainment target must be within (0, 100] percent")
    shapes = checked_shapes(req)
    notes: list[str] = []
    prefill_spec, n1 = replica_spec(req.model, req.gpu, req.prefill_tp, req.bandwidth_gbps)
    decode_spec, n2 = replica_spec(req.model, req.gpu, req.decode_tp, req.bandwidth_gbps)
    colocated_spec, n3 = replica_spec(req.model, req.gpu, req.colocated_tp, req.bandwidth_gbps)
    notes += list(dict.fromkeys(n1 + n2 + n3))
    inputs = [r.prompt_tokens for r in req.requests]
    transfer = [
        transfer_point(label, int(nearest_rank(sorted(inputs), q)), prefill_spec, decode_spec)
        for label, q in (("p50", 0.5), ("p90", 0.9))
    ]
    config = SimConfig(slo=req.slo, seed=req.seed)
    gpus = req.gpus_per_replica()
    cache: dict[StaticLayout, Summary] = {}

    def evaluate(layout: StaticLayout) -> Summary:
        if layout not in cache:
            if on_simulation is not None:
                on_simulation(str(layout))
            pools = static_layout(layout, prefill_spec, decode_spec, colocated_spec, shapes)
            cache[layout] = simulate(req.requests, pools, config).summary
        return cache[layout]

    target = req.attainment_target
    engines = peak_size(planner_config(prefill_spec, decode_spec, req.slo), req.requests)  # in engines
    guess = {  # where the searches start, in replicas
        "prefill": math.ceil(engines["prefill"] / req.prefill_dp),
        "decode": math.ceil(engines["decode"] / req.decode_dp),
        "colocated": math.ceil((engines["prefill"] + engines["decode"]) / req.colocated_dp),
    }
    pd_search = search_static_pd(
        evaluate,
        req.max_gpus,
        gpus["prefill"],
        gpus["decode"],
        target,
        guess=(guess["prefill"], guess["decode"]),
    )
    co_search = search_static_colocated(
        evaluate, req.max_gpus, gpus["colocated"], target, guess=guess["colocated"]
    )
    pd = _candidate(pd_search, gpus)
    colocated = _candidate(co_search, gpus)
    rows = _sweep(req, pd_search, evaluate, gpus)
    for row in rows:  # a ratio may beat the greedy search's layout
        if row.found is not None and (
            pd is None or (row.found.gpus, -row.found.summary.attainment) < (pd.gpus, -pd.summary.attainment)
        ):
            pd = row.found
    advice = Advice(req, prefill_spec, decode_spec, colocated_spec, transfer, pd, colocated, rows, notes)
    if pd is not None:
        advice.modes = compare_modes(req, pd, evaluate, prefill_spec, decode_spec, config)
    advice.simulations = len(cache) + max(0, len(advice.modes) - 2)
    if pd is None and pd_search.note:
        advice.notes.append(pd_search.note)
    if colocated is None and co_search.note:
        advice.notes.append(co_search.note)
    if not advice.achievable:
        advice.notes.append(unachievable_reason(req, prefill_spec, decode_spec))
    return advice


def mode_name(knobs: DisaggregationKnobs) -> str:
    return f"Threshold {knobs.threshold_tokens}" if knobs.mode == "Threshold" else knobs.mode


def compare_modes(
    req: AdviseRequest,
    pd: Candidate,
    evaluate: Callable[[StaticLayout], Summary],
    prefill: ReplicaSpec,
    decode: ReplicaSpec,
    config: SimConfig,
) -> list[ModeRow]:
    """Always (the search's own run), Auto and each Threshold of `req.thresholds` on the P/D layout `pd`,
    and colocated on as many GPUs (`evaluate`'s, shared with the searches), over the same requests."""
    rows = [ModeRow("Always", DisaggregationKnobs(), pd.summary)]
    knobs = [DisaggregationKnobs(mode="Auto")]
    knobs += [DisaggregationKnobs(mode="Threshold", threshold_tokens=t) for t in req.thresholds]
    layout = static_layout(pd.layout, prefill, decode, prefill, req.shapes())
    for k in knobs:
        summary = simulate(req.requests, layout, config.model_copy(update={"disaggregation": k})).summary
        rows.append(ModeRow(mode_name(k), k, summary))
    co_gpus = max(1, pd.gpus // req.gpus_per_replica()["colocated"])
    rows.append(ModeRow(COLOCATED, None, evaluate(StaticLayout(colocated=co_gpus))))
    return rows


def best_mode(rows: Sequence[ModeRow]) -> ModeRow:
    """The highest attainment, then the lowest TTFT p90, then the earlier row (Always before Auto before
    a Threshold before colocated: the simpler change from today's behaviour wins a tie)."""
    return min(enumerate(rows), key=lambda ir: (-ir[1].summary.attainment, ir[1].summary.ttft_p90, ir[0]))[1]


def static_layout(
    layout: StaticLayout,
    prefill: ReplicaSpec,
    decode: ReplicaSpec,
    colocated: ReplicaSpec,
    shapes: Mapping[str, Shape] | None = None,
) -> Layout:
    """`layout`'s pools of these engines; `shapes` by role: a replica's data-parallel group (none: one
    engine a replica)."""
    shapes = shapes or {}
    if layout.colocated:
        pool = PoolSpec(replica=colocated, replicas=layout.colocated, shape=shapes.get("colocated"))
        return Layout(pools={"colocated": pool}, disaggregated_percent=0)
    return Layout(
        pools={
            "prefill": PoolSpec(replica=prefill, replicas=layout.prefill, shape=shapes.get("prefill")),
            "decode": PoolSpec(replica=decode, replicas=layout.decode, shape=shapes.get("decode")),
        }
    )


def _candidate(search: SearchResult, gpus: dict[str, int]) -> Candidate | None:
    if search.layout is None:
        return None
    summary = search.tried[search.layout]
    assert isinstance(summary, Summary)
    return Candidate(search.layout, search.layout.gpus(gpus), summary)


def _sweep(
    req: AdviseRequest,
    search: SearchResult,
    evaluate: Callable[[StaticLayout], Summary],
    gpus: dict[str, int],
) -> list[RatioRow]:
    rows: list[RatioRow] = []
    bounds = search.lower_bounds
    for a, b in req.ratios:
        if a < 1 or b < 1:
            raise AdviseError(f"a P:D ratio needs positive parts, got {a}:{b}")
        per_k = a * gpus["prefill"] + b * gpus["decode"]
        if bounds is None:
            rows.append(RatioRow(a, b, None, search.note or "no P/D layout within the budget"))
            continue
        k = max(1, math.ceil(bounds[0] / a), math.ceil(bounds[1] / b))
        found: Candidate | None = None
        while k * per_k <= req.max_gpus:
            layout = StaticLayout(k * a, k * b)
            summary = evaluate(layout)
            if summary.attainment >= req.attainment_target:
                found = Candidate(layout, layout.gpus(gpus), summary)
                break
            k += 1
        note = "" if found else f"not within {req.max_gpus} GPUs"
        rows.append(RatioRow(a, b, found, note))
    return rows


def unachievable_reason(req: AdviseRequest, prefill: ReplicaSpec, decode: ReplicaSpec) -> str:
    """Why no layout meets the SLO: requests that miss it even alone on idle replicas, or the budget."""
    ttft, tpot = req.slo.ttft_ms / 1e3, req.slo.tpot_ms / 1e3
    alone_ttft = alone_tpot = 0
    for r in req.requests:
        point = transfer_point("", r.prompt_tokens, prefill, decode)
        alone_ttft += point.ttft_ms / 1e3 > ttft
        context = r.prompt_tokens + r.output_tokens
        alone_tpot += r.output_tokens > 1 and decode.profile.decode_step_seconds(1, context) > tpot
    n = len(req.requests)
    allowed = 1 - req.attainment_target
    parts = []
    if alone_ttft / n > allowed:
        parts.append(
            f"{alone_ttft / n:.1%} of requests miss the {req.slo.ttft_ms:g} ms TTFT even on an idle replica"
        )
    if alone_tpot / n > allowed:
        parts.append(
            f"{alone_tpot / n:.1%} miss the {req.slo.tpot_ms:g} ms TPOT even alone in a decode batch"
        )
    if parts:
        return "not achievable: " + "; ".join(parts) + f" (the target allows {allowed:.1%})"
    return f"not achievable within {req.max_gpus} GPUs: raise --max-gpus or relax the SLO"


# --- the PDDeployment -------------------------------------------------------------------------------------


def deployment(advice: Advice, name: str = "", namespace: str = "default") -> dict[str, Any]:
    """The recommended layout as a PDDeployment object (validated by the API models)."""
    chosen = advice.recommended
    if chosen is None:
        raise AdviseError("no layout meets the SLO, so there is no deployment to recommend")
    mode = advice.mode
    knobs = mode.knobs if mode is not None and chosen is advice.pd else None
    return deployment_object(advice.request, chosen.layout, knobs, name, namespace)


def deployment_object(
    req: AdviseRequest,
    layout: StaticLayout,
    knobs: DisaggregationKnobs | None,
    name: str = "",
    namespace: str = "default",
    gpu_types: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`layout` of `req`'s model as a PDDeployment object (validated by the API models): P/D with the
    disaggregation mode `knobs` (None or Always: none written), or colocated; `gpu_types` gives pools a
    `gpuType` (GPU Feature Discovery's product label) by role."""
    info = req.model
    served = info.model.rsplit("/", 1)[-1].lower()
    name = name or _dns_name(served)
    model: dict[str, Any] = {
        "name": _served_name(served),
        "uri": f"hf://{info.model}" if "/" in info.model else f"file:///models/{_dns_name(info.model)}",
    }
    if not info.known or info.kv_bytes_per_token != model_arch(info.model).kv_bytes_per_token:
        model["kvBytesPerToken"] = info.kv_bytes_per_token
    spec: dict[str, Any] = {
        "model": model,
        "engine": {"image": DEFAULT_ENGINE_IMAGE},
        "slo": {
            "ttftMs": round(req.slo.ttft_ms),
            "tpotMs": round(req.slo.tpot_ms),
            "attainmentPercent": round(req.attainment_target * 100, 2),
        },
        "autoscaling": {"gpu": req.gpu},
    }
    if layout.colocated:
        spec["serving"] = {"mode": "Colocated"}
        spec["network"] = {"rdma": {"enabled": False}}
        spec["colocated"] = {"replicas": layout.colocated, "tensorParallelSize": req.colocated_tp}
    else:
        spec["serving"] = {"mode": "Disaggregated"}
        spec["kvTransfer"] = {"connector": "NixlConnector", "bandwidthGbps": round(req.bandwidth_gbps)}
        spec["prefill"] = {"replicas": layout.prefill, "tensorParallelSize": req.prefill_tp}
        spec["decode"] = {"replicas": layout.decode, "tensorParallelSize": req.decode_tp}
    for role, shape in req.shapes().items():
        if role in spec and shape.data > 1:
            spec[role]["parallelism"] = {"data": shape.data}
        if knobs is not None and knobs.mode != "Always":
            block: dict[str, Any] = {"mode": knobs.mode}
            if knobs.mode == "Threshold":
                block["thresholdTokens"] = knobs.threshold_tokens
            spec["router"] = {"disaggregation": block}
    for role, label in (gpu_types or {}).items():
        if role in spec:
            spec[role]["gpuType"] = label
    obj = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    try:
        PDDeployment.from_object(obj)
    except ValidationError as exc:  # a bug here, not the user's: say what was generated
        raise AdviseError(f"the generated PDDeployment is invalid: {exc}") from None
    return obj


def _dns_name(text: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    while "--" in out:
        out = out.replace("--", "-")
    return (out or "model")[:63].strip("-")


def _served_name(text: str) -> str:
    out = "".join(c if c.isalnum() or c in "._-" else "-" for c in text).strip("-._")
    return out[:128] or "model"


# --- PDDeployment -> simulator --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpecLayout:
    """A PDDeployment as the simulator's pools, SLO and the GPU type of its profiles."""

    layout: Layout
    slo: SLO | None
    attainment_target: float
    gpu: str
    model: ModelInfo
    max_gpus: int | None
    notes: tuple[str, ...]
    disaggregation: DisaggregationKnobs = field(
        default_factory=DisaggregationKnobs
    )  # spec.router.disaggregation


def layout_of_spec(spec: PDDeploymentSpec, model_load_seconds: float = 120.0) -> SpecLayout:
    """The pools a PDDeployment asks for, with perf's replicas (profile by model URI, the pool's GPU and
    TP): each pool on the GPU its `gpuType` maps to, else `spec.autoscaling.gpu`, as the autoscaler sizes
    it (`autoscale.capacity.pool_gpu`); a replica of a data-parallel pool is a group of its ranks, each
    such an engine, holding the group's GPUs (`PoolSpec.shape`)."""
    info = resolve_model(spec.model.uri, spec.model.kv_bytes_per_token)
    gpu = spec.autoscaling.gpu
    bandwidth = float(spec.kv_transfer.bandwidth_gbps)
    pools: dict[str, PoolSpec] = {}
    notes: list[str] = []
    roles = ("colocated",) if spec.serving.mode == "Colocated" else ("prefill", "decode")
    for role in roles:
        pool = spec.pool(role)
        limits = engine_limits(spec, role)  # the flags the autoscaler sizes this pool with
        pool_gpu_name, unmapped = pool_gpu(spec, role)
        if unmapped:
            notes.append(f"{role}: gpuType {pool.gpu_type} is no GPU with a profile; simulated on {gpu}")
        elif pool_gpu_name != gpu:
            notes.append(f"{role}: on {pool_gpu_name} (gpuType {pool.gpu_type})")
        replica, n = replica_spec(
            info,
            pool_gpu_name,
            pool.tensor_parallel_size,
            bandwidth,
            gpu_memory_utilization=limits.gpu_memory_utilization,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            max_num_seqs=limits.max_num_seqs,
        )
        notes += [x for x in n if x not in notes]
        # a replica is a group of `parallelism.data` ranks, each an engine at the pool's TP
        pools[role] = PoolSpec(replica=replica, replicas=pool.replicas, shape=pool.shape)
    try:
        layout = Layout(
            pools=pools,
            disaggregated_percent=0 if roles == ("colocated",) else 100,
            model_load_seconds=model_load_seconds,
        )
    except ValidationError as exc:
        raise AdviseError(f"cannot simulate this PDDeployment: {exc}") from None
    slo = None
    target = DEFAULT_ATTAINMENT_TARGET
    if spec.slo is not None:
        slo = SLO(ttft_ms=spec.slo.ttft_ms, tpot_ms=spec.slo.tpot_ms)
        target = spec.slo.attainment_percent / 100
    block = spec.router.disaggregation
    knobs = DisaggregationKnobs.from_spec(
        block.model_dump(by_alias=True, exclude_none=True) if block is not None else None
    )
    return SpecLayout(layout, slo, target, gpu, info, spec.max_gpus, tuple(notes), knobs)
