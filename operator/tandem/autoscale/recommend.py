"""One pool's raw recommendation: replicas needed for the observed load at the SLO, and why.

Prefill: `(arriving prompt tokens/s + queued prompt tokens / drain) / (capacity at the TTFT target x
correction)`; arriving = computed, plus the queue's growth over the window when the snapshot has
the queue one window earlier (`queued_prompt_tokens_before`). The capacity counts only the prompt
tokens the pool computes: with the engines' prefix-cache hits over queries, a replica serves that
many more prompt tokens (`capacity.busy_prefill_tokens_per_second`); colocated likewise.
Decode: `max(max(running / sequences per replica, output tokens/s / tokens/s per replica) + local
prefill tokens/s / prefill tokens/s per replica + waiting / sequences per replica, KV used /
kv_target_usage, KV heading / kv_target_usage)`, capacities x correction. The capacities assume each
running sequence holds `running_context_tokens`: the prompt plus E[n^2] / (2 E[n]) of the outputs n
(second moment from vLLM's request_generation_tokens buckets), the length-biased mean, since the long
outputs run longest (E[n] / 2 only when all outputs are alike; with 1-8k-token outputs E[n] / 2
sized decode for KV that then filled to 100% and preempted). KV heading: the running and waiting
sequences at that context, whatever they hold now (a sequence just admitted grows with every output
token; and a correction above 1, learnt from fast steps, does not raise the KV a replica has).
The local prefill term is the share of a replica's time spent prefilling the requests
spec.router.disaggregation sent to decode without a remote prefill
(`local_prefill_tokens_rate`: the engines' locally computed prompt tokens, less the one a decode engine
recomputes per pulled request), at a busy replica's prefill rate (`capacity.busy_prefill_tokens_per_second`
at the pool's mean prompt, as colocated adds its two shares). Prefill's demand never includes those
prompts: it is what the prefill engines compute. Output tokens/s is the
larger of those generated and those arriving (requests prefill finished x mean output tokens), so
decode grows with a load step as prefill sees it rather than once its KV cache is full. Sizing by
throughput matters: running sequences alone understate the need of a lightly loaded pool, since
they grow with the batch's TPOT when a replica is removed.
Colocated: the two shares of a replica's time add up (chunked prefill runs prompts in the same steps
as decodes): `prompt part + sequence part`, and the KV term as decode.

A replica is an instance: a multi-node pool's replica is a LeaderWorkerSet group (docs/multinode.md),
and a data-parallel instance (`parallelism.data` ranks, one engine each at the pool's TP) has its
ranks' capacity together: every per-replica capacity above is the profile's per engine x the ranks
(`engines`). The signals are the pool's engines summed (a group's leader reports every rank, or each
serving pod its own), so the learnt samples and the saturation tests are per engine, the KV term
counts replicas' worth of KV (mean usage x pods that report / such pods per replica) and a pool's
load is partial while fewer replicas report than are ready.

Starting pods count as capacity: while any pod of the pool loads, the backlog terms (queued prompt
tokens, waiting requests, KV pressure) cannot raise the recommendation above the current size,
which already includes the loading pods; only the rate terms can.

SLO feedback, from the path the pool serves (`PathSignals`): a pool whose latency at the SLO's
quantile is over target while attainment is under target (prefill: TTFT, unless decode cannot admit
(a request waiting per decode replica, or a pod's KV cache at `kv_full_usage`) while prefill has
less than one request queued per replica; decode: TPOT, or TTFT in that case; colocated: either) is never
recommended below its current size. If it is loaded (a backlog, or at least `miss_min_load` of its
replicas' capacity in use: an idle pool's miss is not for want of replicas) and no pod is starting,
it gets one more replica, and when the capacity model said the current size sufficed, the
correction shrinks by `1/ratio`, kept within [`miss_shrink_min`, `miss_shrink_max`].

Capacity correction (measured / profile capacity, bounded to [`correction_min`, `correction_max`],
smoothed geometrically by `correction_smoothing`), learnt only when every ready pod reports and none
is starting:
- prefill, when it was saturated over the whole window: at least one request waiting per ready
  replica, and a queue of at least a step's budget (or a mean prompt, whichever is larger) per
  replica now and one window earlier. The sample is prompt tokens/s per ready replica over the
  profile's busy throughput (a small token budget alone would call one queued prompt saturation and
  learn a low capacity). Without the queue one window earlier (not read: the live reader has no
  series then while the pool is younger than the window) nothing is learnt: the window's rate then
  averages idle or lightly loaded time with the saturated end (a load step on a young pool read
  0.16 of the profile and learnt the floor 0.25, while the pod computed the profile's rate);
- decode, with a measured TPOT and a batch per replica of at least `decode_learn_min_share` of the
  seeded capacity (a light batch's step time says little about a full one's): the profile's step
  time is scaled by measured TPOT / profile step time at the observed batch, and the sample is the
  batch that then fits the TPOT target over the seeded batch. Not from a window whose TPOT says
  nothing of today's step (`_stale_tpot`): decode preempted in it (vllm:num_preemptions_total) or a
  pod's KV cache is at `kv_full_usage` (the requests waited for blocks and recomputed), or its
  requests ran longer than the window (mean output x TPOT: they measured the batches of minutes
  ago); a TPOT miss in such a window still adds a replica but does not shrink the correction (a
  colocated miss likewise when KV-bound);
- all pools, comfortably within SLO (latency under `comfortable_ratio` of target, attainment met) while
  loaded (as for a miss: a backlog, or at least `miss_min_load` of the replicas' capacity in use): a
  correction below 1 relaxes towards 1 by `relax_rate`. A lightly loaded pool's comfort is no evidence
  of what a busy replica sustains, so the correction is kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from tandem.api.models import PDDeploymentSpec, SLOSpec
from tandem.autoscale.attribution import FIGURE, Attribution, Floors, attribute_ttft
from tandem.autoscale.capacity import (
    DecodeCapacity,
    PoolModel,
    busy_prefill_tokens_per_second,
    decode_capacity,
    pool_model,
    prefill_capacity,
)
from tandem.autoscale.knobs import Knobs
from tandem.perf import kv_transfer_seconds
from tandem.signals import (
    PATH_COLOCATED,
    PATH_DISAGGREGATED,
    PathSignals,
    PoolSignals,
    PoolSize,
    Snapshot,
)

ROLES = ("prefill", "decode", "colocated")


def path_of(role: str) -> str:
    return PATH_COLOCATED if role == "colocated" else PATH_DISAGGREGATED


@dataclass(frozen=True, slots=True)
class Sizing:
    """A pool's raw recommendation with the figures that produced it."""

    exact: float  # replicas needed, fractional, after the starting-pod credit
    replicas: int  # ceil(exact), raised to the SLO floor; before dead band, bounds and windows
    slo_floor: int | None  # the floor an SLO miss imposes (None: met or no requests)
    correction: float  # the capacity correction after this pass's learning
    deficit: float  # how far the pool's latency is over its target (0 within it), for the budget
    reason: str
    figures: Mapping[str, float]
    # What the SLO feedback answered for, when this pool's target was missed: "tpot", a TTFT part
    # charged to this pool (`autoscale.attribution.PARTS`, "decodeFull", "prefill"), or "ttft"
    # (colocated); None when met. A miss charged to another pool, or to none, is only in the reason.
    slo_cause: str | None = None
    demand: float = 0.0  # the measured demand the load term sizes from (`autoscale.forecast`'s input)
    forecast_drove: bool = False  # the forecast raised the recommendation above the measured load's


@dataclass(frozen=True, slots=True)
class Forecast:
    """The demand expected one model load ahead (`autoscale.forecast`), in the pool's demand unit."""

    demand: float
    horizon_seconds: float


def fmt(value: float) -> str:
    """A figure for a sentence: 41234 -> 41k, 9120 -> 9.1k, 820 -> 820, 0.123 -> 0.12."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.0f}k"
    if magnitude >= 1e3:
        return f"{value / 1e3:.2g}k"
    if magnitude >= 10 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2g}"


def _first_positive(*values: float) -> float | None:
    """The first plausible mean length (at least one token) of `values`."""
    for value in values:
        if value >= 1 and math.isfinite(value):
            return value
    return None


@dataclass(frozen=True, slots=True)
class _Observed:
    """What a pool's sizing reads, gathered once."""

    size: PoolSize
    starting: int
    signals: PoolSignals
    path: PathSignals
    prompt_tokens: float
    prompt_second_moment: float  # E[n^2] of the prompts `prompt_tokens` is the mean of (0: unknown)
    output_tokens: float
    output_second_moment: float  # E[n^2] of the outputs `output_tokens` is the mean of (0: unknown)
    drain_seconds: float
    quantile: str
    attainment_target: float
    ranks: int = 1  # engines (data-parallel ranks) of one replica: a group's capacity is theirs together
    metrics_targets: int = 1  # scrape targets of one replica (`Shape.metrics_targets`)

    @property
    def scraped_replicas(self) -> float:
        """Replicas whose engine metrics were fresh (the scraped targets, in replicas)."""
        return self.signals.scraped_targets / self.metrics_targets


def engines(spec: PDDeploymentSpec, role: str) -> tuple[int, int]:
    """A replica of `role` in the units the signals come in: its engines (data-parallel ranks, each
    sized by the profile at the pool's TP) and its scrape targets (`Shape.metrics_targets`). (1, 1) for a
    single-node, single-rank pool; a multi-node group is one replica with the capacity of all its ranks."""
    shape = spec.pool(role).shape
    return shape.data, shape.metrics_targets


def _observe(
    spec: PDDeploymentSpec, role: str, snapshot: Snapshot, current: int, knobs: Knobs, slo: SLOSpec
) -> _Observed:
    size = snapshot.sizes.get(role, PoolSize(replicas=current, ready=current))
    pools = snapshot.pools
    signals = pools.get(role, PoolSignals())
    order = [role, *(r for r in ROLES if r != role)]
    prompt = _first_positive(*(pools[r].mean_prompt_tokens for r in order if r in pools))
    # the second moment of the same pool's prompts as the mean's
    moment = next(
        (
            pools[r].prompt_tokens_second_moment
            for r in order
            if r in pools and pools[r].mean_prompt_tokens == prompt
        ),
        0.0,
    )
    # Decode sees every output token; prefill's outputs are one token each, so it comes last.
    out_order = [r for r in ("decode", "colocated", "prefill") if r in pools]
    output = _first_positive(*(pools[r].mean_output_tokens for r in out_order if r != "prefill"))
    output_moment = next(
        (
            pools[r].output_tokens_second_moment
            for r in out_order
            if r != "prefill" and pools[r].mean_output_tokens == output
        ),
        0.0,
    )
    drain = knobs.queue_drain_seconds or float(spec.autoscaling.interval_seconds)
    ranks, metrics_targets = engines(spec, role)
    return _Observed(
        size=size,
        starting=max(0, size.replicas - size.ready),
        signals=signals,
        path=snapshot.paths.get(path_of(role), PathSignals()),
        prompt_tokens=prompt or knobs.default_prompt_tokens,
        prompt_second_moment=moment if prompt else 0.0,
        output_tokens=output or knobs.default_output_tokens,
        output_second_moment=output_moment if output else 0.0,
        drain_seconds=drain,
        quantile=f"p{slo.attainment_percent:g}",
        attainment_target=slo.attainment_percent / 100.0,
        ranks=ranks,
        metrics_targets=metrics_targets,
    )


def _smooth(correction: float, sample: float, knobs: Knobs) -> float:
    sample = min(knobs.correction_max, max(knobs.correction_min, sample))
    alpha = knobs.correction_smoothing
    return math.exp((1 - alpha) * math.log(correction) + alpha * math.log(sample))


def _clamp_correction(correction: float, knobs: Knobs) -> float:
    return min(knobs.correction_max, max(knobs.correction_min, correction))


@dataclass(frozen=True, slots=True)
class _Slo:
    ratio: float | None  # latency at the quantile / target for what this pool answers for
    missed: bool
    comfortable: bool
    text: str  # e.g. "TTFT p95 820 ms > 500 ms"
    note: str = ""  # a TTFT miss charged elsewhere, or to no pool: where it went
    cause: str | None = None  # what this pool's SLO feedback answers for when missed (ScaleDecision.cause)


def ttft_attribution(spec: PDDeploymentSpec, snapshot: Snapshot, knobs: Knobs) -> Attribution:
    """Where the P/D path's TTFT went over the window, and which pool a miss is charged to
    (`autoscale.attribution`), with each part's floor from the prefill and decode pools' profiles."""
    slo = spec.slo
    assert slo is not None
    prefill = snapshot.pools.get("prefill", PoolSignals())
    decode = snapshot.pools.get("decode", PoolSignals())
    # a request waiting per engine that reports (a group's every rank)
    decode_full = (
        decode.waiting_requests >= max(1.0, _scraped_engines(spec, "decode", decode))
        or decode.kv_usage_max >= knobs.kv_full_usage
    )
    prefill_queued = prefill.waiting_requests >= max(1.0, _scraped_engines(spec, "prefill", prefill))
    path = snapshot.paths.get(PATH_DISAGGREGATED, PathSignals())
    breakdown = path.ttft_breakdown
    if breakdown is None:
        no_floors = Floors(0.0, 0.0, 0.0)
        return attribute_ttft(None, no_floors, decode_full=decode_full, prefill_queued=prefill_queued)
    prompt = (
        _first_positive(prefill.mean_prompt_tokens, decode.mean_prompt_tokens) or knobs.default_prompt_tokens
    )
    moment = prefill.prompt_tokens_second_moment if prefill.mean_prompt_tokens == prompt else 0.0
    p_model, d_model = pool_model(spec, "prefill"), pool_model(spec, "decode")
    alone = prefill_capacity(
        p_model,
        slo,
        prompt,
        knobs,
        transfer_gbps=spec.kv_transfer.bandwidth_gbps,
        prompt_second_moment=moment,
        uncached_fraction=prefill.uncached_fraction,
        first_decode=d_model.profile,
    )
    tokens = max(1, round(prompt))
    floors = Floors(
        prefill_compute=alone.service_seconds if math.isfinite(alone.service_seconds) else 0.0,
        kv_transfer=kv_transfer_seconds(tokens, p_model.kv_bytes_per_token, spec.kv_transfer.bandwidth_gbps),
        decode_step=d_model.profile.decode_step_seconds(1, tokens),
    )
    return attribute_ttft(breakdown, floors, decode_full=decode_full, prefill_queued=prefill_queued)


def _scraped_engines(spec: PDDeploymentSpec, role: str, signals: PoolSignals) -> float:
    ranks, metrics_targets = engines(spec, role)
    return signals.scraped_targets / metrics_targets * ranks


def _slo_state(
    role: str, obs: _Observed, slo: SLOSpec, knobs: Knobs, attribution: Attribution | None
) -> _Slo:
    """The SLO figures `role` answers for: TTFT (prefill, or decode when a miss is charged to it, see
    `autoscale.attribution`; colocated always) and TPOT (decode, colocated). A pool whose own latency
    is within its target is never grown because another pool misses."""
    path = obs.path
    ttft = None if path.ttft_seconds is None else path.ttft_seconds * 1000.0 / slo.ttft_ms
    tpot = None if path.tpot_seconds is None else path.tpot_seconds * 1000.0 / slo.tpot_ms
    attainment = path.attainment
    attained = attainment is None or attainment >= obs.attainment_target
    ttft_missed = ttft is not None and ttft > 1.0 and not attained
    if role == "colocated" or attribution is None:
        answers_ttft = True
    elif ttft_missed:  # a miss is the pool's it is charged to
        answers_ttft = attribution.charged == role
    else:  # within target, prefill's TTFT says how comfortable it is (decode's comfort is its TPOT)
        answers_ttft = role == "prefill"
    answers_tpot = role in ("decode", "colocated")
    note = ""
    if attribution is not None and ttft_missed:
        note = attribution.text()
        if not answers_ttft:
            note += f": not {role}'s" if attribution.charged else ": no pool grows for it"
    ratios: list[tuple[str, float]] = []
    if answers_ttft and ttft is not None:
        ratios.append(("TTFT", ttft))
    if answers_tpot and tpot is not None:
        ratios.append(("TPOT", tpot))
    if not ratios:
        return _Slo(ratio=None, missed=False, comfortable=False, text="", note=note)
    name, ratio = max(ratios, key=lambda item: item[1])
    missed = ratio > 1.0 and not attained
    target_ms = slo.ttft_ms if name == "TTFT" else slo.tpot_ms
    measured_ms = ratio * target_ms
    relation = ">" if ratio > 1.0 else "<="
    text = f"{name} {obs.quantile} {fmt(measured_ms)} ms {relation} {fmt(target_ms)} ms"
    if attainment is not None:
        text += f", attainment {attainment * 100:.1f}%"
    cause: str | None = None
    if missed:
        cause = "tpot" if name == "TPOT" else (attribution.cause if attribution is not None else "ttft")
    return _Slo(
        ratio=ratio,
        missed=missed,
        comfortable=ratio < knobs.comfortable_ratio and attained,
        text=text,
        note=note,
        cause=cause,
    )


def recommend(
    spec: PDDeploymentSpec,
    role: str,
    snapshot: Snapshot,
    current: int,
    correction: float,
    knobs: Knobs,
    *,
    scaled_up_within_window: bool = False,
    attribution: Attribution | None = None,
    forecast: Forecast | None = None,
) -> Sizing:
    """The replicas `role` needs now (see the module docstring); `spec.slo` must be set.
    `forecast`: the demand one model load ahead; the load term then sizes for the larger of it and the
    measured demand (prefill, colocated: prompt tokens/s; decode: output tokens/s).
    `attribution`: the pass's `ttft_attribution` (computed here when not given; one per pass serves
    every pool).
    `scaled_up_within_window`: the pool grew within two of the snapshot's windows (its new pods load,
    then drain the backlog, then a window passes), so its latency quantile may still hold requests
    that queued before that (a prefill miss then counts only with a queue now)."""
    slo = spec.slo
    if slo is None:
        raise ValueError("recommend() needs spec.slo")
    model = pool_model(spec, role)
    obs = _observe(spec, role, snapshot, current, knobs, slo)
    if role in ("prefill", "decode") and attribution is None:
        attribution = ttft_attribution(spec, snapshot, knobs)
    if role == "prefill":
        assert attribution is not None
        sizing = _prefill(
            spec,
            model,
            obs,
            snapshot,
            current,
            correction,
            knobs,
            slo,
            attribution,
            scaled_up_within_window,
            forecast,
        )
    elif role == "decode":
        assert attribution is not None
        sizing = _decode(model, obs, snapshot, current, correction, knobs, slo, attribution, forecast)
    else:
        sizing = _colocated(model, obs, snapshot, current, correction, knobs, slo, forecast)
    return sizing


def _ahead(demand: float, forecast: Forecast | None, figures: dict[str, float]) -> float:
    """The demand the load term sizes for: the measured one, or the forecast when that is higher."""
    if forecast is None:
        return demand
    figures["forecastDemand"] = forecast.demand
    figures["forecastHorizonSeconds"] = forecast.horizon_seconds
    return max(demand, forecast.demand)


def _forecast_note(
    sizing: Sizing, measured_exact: float, forecast: Forecast | None, figures: dict[str, float]
) -> Sizing:
    """Say so when the forecast raised the recommendation (reason and `forecastDrove`)."""
    if forecast is None:
        return sizing
    drove = math.ceil(sizing.exact - 1e-9) > math.ceil(measured_exact - 1e-9)
    figures["forecastDrove"] = 1.0 if drove else 0.0
    if not drove:
        return sizing
    note = (
        f"; forecast {fmt(forecast.demand)}/s in {fmt(forecast.horizon_seconds)} s (one model load ahead) "
        f"over {fmt(sizing.demand)}/s measured: {math.ceil(sizing.exact - 1e-9)} rather than "
        f"{math.ceil(measured_exact - 1e-9)}"
    )
    return replace(sizing, reason=sizing.reason + note, forecast_drove=True)


def running_context_tokens(prompt: float, output: float, output_second_moment: float = 0.0) -> float:
    """The mean context (KV tokens) of a running sequence: prompt + E[n^2] / (2 E[n]) over the outputs n.

    A sequence runs for as long as its output, so the running ones are a length-biased sample (a
    sequence of output n is running n times as long as one of output 1), each on average halfway
    through: its expected context is the prompt plus E[n^2] / (2 E[n]), which is E[n] / 2 only when
    every output has the same length. With 1k-8k outputs log-uniform (E[n] 3.4k) it is 2.3k, not 1.7k:
    sized at E[n] / 2, decode's KV fills to 100%, not 85%. `output_second_moment` 0 (unknown): E[n] / 2.
    """
    if output <= 0:
        return prompt
    ratio = max(1.0, output_second_moment / (output * output)) if output_second_moment > 0 else 1.0
    return prompt + output * ratio / 2.0


def kv_saturated(signals: PoolSignals, knobs: Knobs) -> bool:
    """The pool ran out of KV in the window: it preempted sequences, or a pod's KV cache is at
    `kv_full_usage`. Its TPOT then holds recomputes and waits for blocks, not the step time."""
    return signals.preemptions_rate > 0 or signals.kv_usage_max >= knobs.kv_full_usage


def kv_replicas(
    signals: PoolSignals, cap: DecodeCapacity, knobs: Knobs, *, ranks: int = 1, metrics_targets: int = 1
) -> tuple[float, float]:
    """Replicas the pool's KV needs at `kv_target_usage`: for what the pods hold now, and for where the
    running and waiting sequences' KV is heading (each holds `cap.context_tokens` over its life on
    average, `running_context_tokens`, whatever it holds now: a sequence just admitted holds its prompt
    and grows with every output token). A replica of `ranks` engines (`cap` is one engine's) whose
    `metrics_targets` scrape targets report: the mean usage over the engines x the replicas that report."""
    now = signals.kv_usage_mean * signals.scraped_targets / metrics_targets / knobs.kv_target_usage
    sequences = signals.running_requests + signals.waiting_requests
    heading = sequences * cap.context_tokens / max(cap.kv_tokens * ranks * knobs.kv_target_usage, 1e-9)
    return now, heading


def _stale_tpot(kv_bound: bool, lived: float, window_seconds: float) -> str:
    """Why a TPOT measured over the window says nothing of the pool's step time today ("" when it does):
    the pool ran out of KV in it (`kv_saturated`), or its requests lived longer than the window."""
    if kv_bound:
        return "KV-bound (preempting, or a KV cache full)"
    if lived > window_seconds:
        return f"TPOT of requests that ran {fmt(lived)} s, longer than the {fmt(window_seconds)}-s window"
    return ""


def _can_learn(obs: _Observed) -> bool:
    return obs.starting == 0 and obs.size.ready >= 1 and obs.scraped_replicas >= obs.size.ready


def _arrival(obs: _Observed, snapshot: Snapshot) -> float:
    """Prompt tokens/s arriving: those computed, plus the queue's growth over the window when the
    producer read the queue one window earlier (a saturated pool computes no more than it can)."""
    computed = obs.signals.prompt_tokens_rate
    before = obs.signals.queued_prompt_tokens_before
    if before is None or snapshot.window_seconds <= 0:
        return computed
    return computed + max(0.0, _queue_tokens(obs) - before) / snapshot.window_seconds


def _decode_arrivals(obs: _Observed, snapshot: Snapshot) -> float:
    """Output tokens/s about to reach decode: requests arriving at prefill (finished there, or arriving
    prompt tokens / mean prompt when the queue's growth is known) x mean output tokens."""
    prefill = snapshot.pools.get("prefill")
    if prefill is None:
        return 0.0
    # Requests prefilled on decode itself (spec.router.disaggregation) reach it without prefill.
    requests = prefill.request_rate
    local = obs.path.local_prefill_rate
    if (
        prefill.queued_prompt_tokens_before is not None
        and snapshot.window_seconds > 0
        and obs.prompt_tokens > 0
    ):
        growth = max(0.0, prefill.queued_prompt_tokens - prefill.queued_prompt_tokens_before)
        arriving = prefill.prompt_tokens_rate + growth / snapshot.window_seconds
        requests = max(requests, arriving / obs.prompt_tokens)
    return (requests + local) * obs.output_tokens


def local_prefill_tokens_rate(decode: PoolSignals, path: PathSignals) -> float:
    """Prompt tokens/s the decode engines compute for requests prefilled on them: their locally computed
    prompt tokens less one per pulled request (vLLM recomputes a pulled prompt's last token to sample
    the first output; pulled = decode requests finished - those the routers counted local). None
    counted local by the routers (Always, or routers that do not count): none (the engines count a
    prompt at its first token and the request at its end, so the difference is not exactly 0)."""
    if not path.local_prefill_rate > 0:
        return 0.0
    pulled = max(0.0, decode.request_rate - path.local_prefill_rate)
    return max(0.0, decode.local_prompt_tokens_rate - pulled)


def _queue_tokens(obs: _Observed) -> float:
    queue = obs.signals.queued_prompt_tokens
    if queue <= 0 and obs.signals.waiting_requests > 0:
        queue = obs.signals.waiting_requests * obs.prompt_tokens
    return max(0.0, queue)


def _credited(total: float, base: float, obs: _Observed, current: int, knobs: Knobs) -> float:
    """The replicas `total` needs after the starting-pod credit (as `_finish` applies it)."""
    if obs.starting > 0:
        return max(
            base, min(total, float(current)) + knobs.starting_backlog_share * max(0.0, total - current)
        )
    return total


def _finish(
    *,
    base: float,
    total: float,
    obs: _Observed,
    current: int,
    slo_state: _Slo,
    correction: float,
    model_exact_before: float,
    knobs: Knobs,
    figures: dict[str, float],
    what: tuple[str, str],
    activation: bool,
    attribution: Attribution | None = None,
    present: bool = True,
    stale_miss: str = "",
) -> Sizing:
    """Starting-pod credit, SLO floor, the miss/relax corrections, and the sentence. `stale_miss`: why
    the window's latency says nothing of the pool's capacity today (`_stale_tpot`; empty: it does):
    a miss then still adds a replica, but does not shrink the capacity correction."""
    # the backlog is the loading pods' to serve: it may not add more (but a share)
    exact = _credited(total, base, obs, current, knobs)
    if activation and current == 0:
        exact = max(exact, 1.0)
    replicas = max(0, math.ceil(exact - 1e-9))
    tight = slo_state.ratio is not None and (
        slo_state.ratio >= knobs.down_slo_ratio
        or (obs.path.attainment is not None and obs.path.attainment < obs.attainment_target)
    )
    held_down = tight and replicas < current
    if held_down:
        replicas = current
    floor: int | None = None
    busy = total > base or total >= knobs.miss_min_load * current  # a backlog, or busy enough
    loaded = busy and present  # a miss the pool's present state explains (see Knobs)
    if slo_state.missed:
        floor = current + 1 if obs.starting == 0 and loaded else current
        replicas = max(replicas, floor)
        if obs.starting == 0 and loaded and model_exact_before <= current and not stale_miss:
            shrink = min(knobs.miss_shrink_max, max(knobs.miss_shrink_min, 1.0 / (slo_state.ratio or 1.0)))
            correction *= shrink
    elif slo_state.comfortable and correction < 1.0 and busy:
        # comfort at a light load says nothing of what a replica sustains busy: between bursts it
        # undid what each burst taught (docs/autoscaling.md, "Relaxing only under load")
        correction += (1.0 - correction) * knobs.relax_rate
    correction = _clamp_correction(correction, knobs)
    figures.update(
        exactReplicas=exact,
        replicas=float(obs.size.replicas),
        ready=float(obs.size.ready),
        starting=float(obs.starting),
        scrapedTargets=float(obs.signals.scraped_targets),
        capacityCorrection=correction,
    )
    if obs.ranks > 1 or obs.metrics_targets > 1:
        figures["enginesPerReplica"] = float(obs.ranks)
    if slo_state.ratio is not None:
        figures["sloRatio"] = slo_state.ratio
    for part, seconds in (attribution.seconds if attribution is not None else {}).items():
        figures[FIGURE[part]] = seconds
    if obs.path.attainment is not None:
        figures["attainment"] = obs.path.attainment
    figures["attainmentTarget"] = obs.attainment_target
    demand, each = what
    parts = [f"{demand} need {math.ceil(exact - 1e-9)} replicas at {each}"]
    if obs.starting > 0:
        parts.append(f"counting {obs.starting} starting")
    if slo_state.text:
        parts.append(slo_state.text)
    reason = parts[0] + (f" ({'; '.join(parts[1:])})" if len(parts) > 1 else "")
    if floor is not None and floor > math.ceil(exact - 1e-9):
        reason += f"; SLO missed: at least {floor}"
    if slo_state.missed and stale_miss:
        reason += f"; {stale_miss}: the capacity correction is kept"
    if slo_state.missed and not present:
        reason += "; the miss is the window's past (today's queue drains within the target): holding"
    elif held_down:
        reason += f"; SLO not comfortably met: no scale-down below {current}"
    if slo_state.note:
        reason += f"; {slo_state.note}"
    deficit = max(0.0, (slo_state.ratio or 0.0) - 1.0)
    return Sizing(
        exact=exact,
        replicas=replicas,
        slo_floor=floor,
        correction=correction,
        deficit=deficit,
        reason=reason,
        figures=figures,
        slo_cause=slo_state.cause,
    )


def _square_ratio(obs: _Observed) -> float:
    """E[n^2] / E[n]^2 of the prompts (1: unknown or all alike)."""
    return max(1.0, obs.prompt_second_moment / obs.prompt_tokens**2) if obs.prompt_tokens > 0 else 1.0


def _prefill_saturated(obs: _Observed, queue: float, budget: int) -> bool:
    """Saturated over the whole window: a deep queue now and one window earlier (unknown: not saturated,
    since the window's rate may then hold idle time; see the module docstring)."""
    engines_ready = obs.size.ready * obs.ranks  # every engine of every ready replica
    floor = max(budget, obs.prompt_tokens) * engines_ready
    before = obs.signals.queued_prompt_tokens_before
    return (
        obs.signals.waiting_requests >= engines_ready
        and queue >= floor
        and before is not None
        and before >= floor
    )


def _prefill(
    spec: PDDeploymentSpec,
    model: PoolModel,
    obs: _Observed,
    snapshot: Snapshot,
    current: int,
    correction: float,
    knobs: Knobs,
    slo: SLOSpec,
    attribution: Attribution,
    scaled_up_within_window: bool = False,
    forecast: Forecast | None = None,
) -> Sizing:
    uncached = obs.signals.uncached_fraction
    cap = prefill_capacity(
        model,
        slo,
        obs.prompt_tokens,
        knobs,
        transfer_gbps=spec.kv_transfer.bandwidth_gbps,
        prompt_second_moment=obs.prompt_second_moment,
        uncached_fraction=uncached,
        first_decode=pool_model(spec, "decode").profile,
    )
    computed = obs.signals.prompt_tokens_rate
    rate = _arrival(obs, snapshot)
    queue = _queue_tokens(obs)
    ready = obs.size.ready
    before = correction
    learnt = False
    if (
        _can_learn(obs)
        and computed > 0
        and _prefill_saturated(obs, queue, model.limits.max_num_batched_tokens)
    ):
        correction = _smooth(correction, computed / ready / obs.ranks / cap.raw_tokens_per_second, knobs)
        learnt = True
    per_replica = max(cap.at_target * obs.ranks * correction, 1e-9)
    forecast_figures: dict[str, float] = {}
    base = _ahead(rate, forecast, forecast_figures) / per_replica
    total = base + queue / obs.drain_seconds / per_replica
    measured_total = (rate + queue / obs.drain_seconds) / per_replica
    model_exact_before = (rate + queue / obs.drain_seconds) / max(cap.at_target * obs.ranks * before, 1e-9)
    slo_state = _slo_state("prefill", obs, slo, knobs, attribution)
    # Seconds the prompts queued now take at the ready replicas' busy rate. Right after a scale-up the
    # window's quantile still holds requests that queued before it: a miss with a short queue now is
    # that past, not the present.
    wait_now = queue / max(max(ready, 1) * obs.ranks * cap.raw_tokens_per_second * correction, 1e-9)
    present = not scaled_up_within_window or wait_now >= knobs.miss_present_wait_share * slo.ttft_ms / 1000.0
    if learnt:  # the sample is a measurement: do not also relax or shrink on the same pass
        slo_state = replace(slo_state, comfortable=False)
    figures: dict[str, float] = {
        "promptTokensPerSecond": computed,
        "arrivingPromptTokensPerSecond": rate,
        "queuedPromptTokens": queue,
        "drainSeconds": obs.drain_seconds,
        "meanPromptTokens": obs.prompt_tokens,
        "promptSquareRatio": _square_ratio(obs),
        "profileTokensPerSecond": cap.raw_tokens_per_second,
        "utilisationAtTarget": cap.utilisation,
        "capacityTokensPerSecond": per_replica,
        "ttftTargetSeconds": slo.ttft_ms / 1000.0,
        "queueWaitSeconds": wait_now,
        **forecast_figures,
    }
    if uncached < 1.0:
        figures["uncachedPromptFraction"] = uncached
    if obs.signals.queued_prompt_tokens_before is not None:
        figures["queuedPromptTokensBefore"] = obs.signals.queued_prompt_tokens_before
    if obs.path.ttft_seconds is not None:
        figures["ttftSeconds"] = obs.path.ttft_seconds
    if model.fallback:
        figures["profileFallback"] = 1.0
    what = (
        f"prompt tokens {fmt(rate)}/s + queue {fmt(queue)} over {fmt(obs.drain_seconds)} s",
        f"{fmt(per_replica)} tokens/s each",
    )
    sizing = _finish(
        base=base,
        total=total,
        obs=obs,
        current=current,
        slo_state=slo_state,
        correction=correction,
        model_exact_before=model_exact_before,
        knobs=knobs,
        figures=figures,
        what=what,
        activation=obs.path.request_rate > 0,
        attribution=attribution,
        present=present,
    )
    sizing = replace(sizing, demand=rate)
    return _forecast_note(
        sizing, _credited(measured_total, rate / per_replica, obs, current, knobs), forecast, figures
    )


def _decode(
    model: PoolModel,
    obs: _Observed,
    snapshot: Snapshot,
    current: int,
    correction: float,
    knobs: Knobs,
    slo: SLOSpec,
    attribution: Attribution,
    forecast: Forecast | None = None,
) -> Sizing:
    context = running_context_tokens(obs.prompt_tokens, obs.output_tokens, obs.output_second_moment)
    cap = decode_capacity(model, slo, context, knobs)
    seeded = max(cap.sequences, 1.0)  # per engine
    running, waiting = obs.signals.running_requests, obs.signals.waiting_requests
    ready = obs.size.ready
    before = correction
    learnt = False
    tpot = obs.path.tpot_seconds
    busy = running >= max(1.0, knobs.decode_learn_min_share * seeded) * ready * obs.ranks
    # What the window's TPOT says of today's step: nothing when the pool ran out of KV (the requests
    # waited for blocks and recomputed), nor when those requests ran longer than the window (mean output
    # x TPOT: they measured the batches of minutes ago, not today's).
    kv_bound = kv_saturated(obs.signals, knobs)
    lived = obs.output_tokens * tpot if tpot is not None and tpot > 0 else 0.0
    outlived = lived > snapshot.window_seconds
    if _can_learn(obs) and tpot is not None and tpot > 0 and busy and not kv_bound and not outlived:
        batch = running / ready / obs.ranks  # one engine's batch
        step = model.profile.decode_step_seconds(math.ceil(batch), math.ceil(batch * cap.context_tokens))
        if step > 0:
            scale = min(knobs.correction_max, max(knobs.correction_min, tpot / step))
            measured = decode_capacity(model, slo, context, knobs, headroom=1.0, tpot_scale=scale)
            correction = _smooth(correction, max(measured.sequences, 1.0) / seeded, knobs)
            learnt = True
    per_replica = max(seeded * obs.ranks * correction, 1e-9)
    tokens_each = max(cap.tokens_per_second * obs.ranks * correction, 1e-9)
    kv_now, kv_heading = kv_replicas(
        obs.signals, cap, knobs, ranks=obs.ranks, metrics_targets=obs.metrics_targets
    )
    kv_exact = max(kv_now, kv_heading)
    generation = obs.signals.generation_tokens_rate
    arriving = _decode_arrivals(obs, snapshot)
    demand = max(generation, arriving)
    local = local_prefill_tokens_rate(obs.signals, obs.path)
    prefill_each = busy_prefill_tokens_per_second(
        model.profile, obs.prompt_tokens, obs.prompt_second_moment, model.limits.max_num_batched_tokens
    )
    local_share = local / max(prefill_each * obs.ranks * correction, 1e-9)  # replicas' time prefilling
    forecast_figures: dict[str, float] = {}
    base = max(running / per_replica, _ahead(demand, forecast, forecast_figures) / tokens_each) + local_share
    total = max(base + waiting / per_replica, kv_exact)
    measured_base = max(running / per_replica, demand / tokens_each) + local_share
    measured_total = max(measured_base + waiting / per_replica, kv_exact)
    model_exact_before = max(
        max(
            (running + waiting) / max(seeded * obs.ranks * before, 1e-9),
            demand / max(cap.tokens_per_second * obs.ranks * before, 1e-9),
        )
        + local / max(prefill_each * obs.ranks * before, 1e-9),
        kv_exact,
    )
    slo_state = _slo_state("decode", obs, slo, knobs, attribution)
    if learnt:
        slo_state = replace(slo_state, comfortable=False)
    figures: dict[str, float] = {
        "runningRequests": running,
        "waitingRequests": waiting,
        "generationTokensPerSecond": generation,
        "arrivingTokensPerSecond": arriving,
        "capacityTokensPerSecond": tokens_each,
        "meanContextTokens": cap.context_tokens,
        "batchAtTpot": float(cap.batch_at_tpot),
        "kvTokensPerReplica": float(cap.kv_tokens * obs.ranks),
        "capacitySequences": per_replica,
        "kvUsageMean": obs.signals.kv_usage_mean,
        "kvUsageMax": obs.signals.kv_usage_max,
        "kvReplicas": kv_exact,
        "kvHeadingReplicas": kv_heading,
        "preemptionsPerSecond": obs.signals.preemptions_rate,
        "tpotTargetSeconds": slo.tpot_ms / 1000.0,
        **forecast_figures,
    }
    if obs.output_second_moment > 0:
        figures["outputSquareRatio"] = obs.output_second_moment / obs.output_tokens**2
    if local > 0:
        figures["localPrefillTokensPerSecond"] = local
        figures["localPrefillReplicas"] = local_share
    if tpot is not None:
        figures["tpotSeconds"] = tpot
    if model.fallback:
        figures["profileFallback"] = 1.0
    locally = f", local prefills {fmt(local)} prompt tokens/s" if local > 0 else ""
    what = (
        f"output tokens {fmt(demand)}/s{locally}, running {fmt(running)} + waiting {fmt(waiting)} sequences "
        f"and KV usage {obs.signals.kv_usage_mean * 100:.0f}% over {obs.signals.scraped_targets} targets",
        f"{fmt(tokens_each)} tokens/s or {fmt(per_replica)} sequences each ({fmt(cap.context_tokens)} "
        "context tokens)",
    )
    sizing = _finish(
        base=base,
        total=total,
        obs=obs,
        current=current,
        slo_state=slo_state,
        correction=correction,
        model_exact_before=model_exact_before,
        knobs=knobs,
        figures=figures,
        what=what,
        activation=obs.path.request_rate > 0,
        attribution=attribution,
        stale_miss=_stale_tpot(kv_bound, lived, snapshot.window_seconds),
    )
    sizing = replace(sizing, demand=demand)
    measured_exact = _credited(measured_total, measured_base, obs, current, knobs)
    return _forecast_note(sizing, measured_exact, forecast, figures)


def _colocated(
    model: PoolModel,
    obs: _Observed,
    snapshot: Snapshot,
    current: int,
    correction: float,
    knobs: Knobs,
    slo: SLOSpec,
    forecast: Forecast | None = None,
) -> Sizing:
    uncached = obs.signals.uncached_fraction
    prefill = prefill_capacity(
        model,
        slo,
        obs.prompt_tokens,
        knobs,
        transfer_gbps=None,
        prompt_second_moment=obs.prompt_second_moment,
        uncached_fraction=uncached,
    )
    context = running_context_tokens(obs.prompt_tokens, obs.output_tokens, obs.output_second_moment)
    decode = decode_capacity(model, slo, context, knobs)
    prompt_cap = max(prefill.at_target * obs.ranks * correction, 1e-9)
    seq_cap = max(max(decode.sequences, 1.0) * obs.ranks * correction, 1e-9)
    tokens_cap = max(decode.tokens_per_second * obs.ranks * correction, 1e-9)
    rate, queue = _arrival(obs, snapshot), _queue_tokens(obs)
    running, waiting = obs.signals.running_requests, obs.signals.waiting_requests
    generation = obs.signals.generation_tokens_rate
    kv_now, kv_heading = kv_replicas(
        obs.signals, decode, knobs, ranks=obs.ranks, metrics_targets=obs.metrics_targets
    )
    kv_exact = max(kv_now, kv_heading)
    kv_bound = kv_saturated(obs.signals, knobs)
    measured_base = rate / prompt_cap + max(running / seq_cap, generation / tokens_cap)
    forecast_figures: dict[str, float] = {}
    # A replica's prompt and sequence shares grow together with the arrivals: the forecast of prompt
    # tokens/s scales both.
    growth = _ahead(rate, forecast, forecast_figures) / rate if rate > 0 else 1.0
    base = measured_base * growth
    backlog = queue / obs.drain_seconds / prompt_cap + waiting / seq_cap
    total = max(base + backlog, kv_exact)
    measured_total = max(measured_base + backlog, kv_exact)
    slo_state = _slo_state("colocated", obs, slo, knobs, None)
    figures: dict[str, float] = {
        "promptTokensPerSecond": rate,
        "queuedPromptTokens": queue,
        "drainSeconds": obs.drain_seconds,
        "capacityTokensPerSecond": prompt_cap,
        "runningRequests": running,
        "waitingRequests": waiting,
        "generationTokensPerSecond": generation,
        "capacityOutputTokensPerSecond": tokens_cap,
        "capacitySequences": seq_cap,
        "kvUsageMean": obs.signals.kv_usage_mean,
        "kvReplicas": kv_exact,
        "kvHeadingReplicas": kv_heading,
        "preemptionsPerSecond": obs.signals.preemptions_rate,
        "ttftTargetSeconds": slo.ttft_ms / 1000.0,
        "tpotTargetSeconds": slo.tpot_ms / 1000.0,
        **forecast_figures,
    }
    if uncached < 1.0:
        figures["uncachedPromptFraction"] = uncached
    if model.fallback:
        figures["profileFallback"] = 1.0
    what = (
        f"prompt tokens {fmt(rate)}/s + queue {fmt(queue)} and running {fmt(running)} + waiting "
        f"{fmt(waiting)} sequences",
        f"{fmt(prompt_cap)} tokens/s or {fmt(seq_cap)} sequences each",
    )
    sizing = _finish(
        base=base,
        total=total,
        obs=obs,
        current=current,
        slo_state=slo_state,
        correction=correction,
        model_exact_before=measured_total,
        knobs=knobs,
        figures=figures,
        what=what,
        activation=obs.path.request_rate > 0,
        stale_miss=_stale_tpot(kv_bound, 0.0, snapshot.window_seconds),
    )
    sizing = replace(sizing, demand=rate)
    measured_exact = _credited(measured_total, measured_base, obs, current, knobs)
    return _forecast_note(sizing, measured_exact, forecast, figures)
