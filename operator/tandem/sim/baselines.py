"""The policies tandem's autoscaler is judged against, as `shared/reference/autoscaler-evaluation.md`
defines them. Pure: no clock (time is an argument) and no I/O.

- `search_static_pd` / `search_static_colocated`: the fixed layout with the fewest GPUs whose attainment
  over the whole trace reaches the target, found with few simulations (each candidate is one); they take
  the simulation as a callable, so the search is tested on hand-made attainment surfaces.
- `HPAPolicy`: the Kubernetes HPA algorithm (pkg/controller/podautoscaler) per pool on one signal:
  prefill on queued prompt tokens per replica, decode (and colocated) on KV-cache usage.
- `PlannerPolicy`: Dynamo's throughput planner (generation 1, `anchors.md` section 1.3): every interval
  predict the request count arriving at the frontend, mean ISL and mean OSL, and size prefill as
  prompt-token demand over one replica's prefill throughput at the TTFT target, decode as output-token
  demand over one replica's decode throughput at the ITL target, both derived from the same `perf`
  profile tandem uses the way Dynamo's pre-deployment profiler measures them; no headroom, averages,
  no queue term (its published behaviour). `PlannerConfig.tightness` gives it targets tighter than the
  SLO (the fair baseline's sweep: its cost at an attainment, `report.gpu_hours_at`).
- `LoadPlannerPolicy`: Dynamo's load-based loop (every 5 s, +1/-1 per pool on active prefill tokens and
  active decode KV against thresholds solved at the TTFT/ITL targets), alone or with a throughput
  planner's sizes as its floor.

The policies follow the simulator's policy protocol: `interval_seconds` and
`decide(snapshot, now) -> {role: replicas}`; a role left out keeps its size.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from tandem.perf import Profile, decode_batch_at_tpot
from tandem.signals import Snapshot
from tandem.sim.requests import Request

DEFAULT_ATTAINMENT_TARGET = 0.95


# --- static layouts -------------------------------------------------------------------------------


class Outcome(Protocol):
    """What a search needs from one simulation: shares of the trace's requests (0..1)."""

    @property
    def attainment(self) -> float: ...  # within both targets

    @property
    def ttft_attainment(self) -> float: ...  # within the TTFT target

    @property
    def tpot_attainment(self) -> float: ...  # within the TPOT target (one-token requests count as within)


@dataclass(frozen=True, slots=True)
class StaticLayout:
    """A fixed size per pool: (prefill, decode) for P/D, or colocated replicas."""

    prefill: int = 0
    decode: int = 0
    colocated: int = 0

    def gpus(self, gpus_per_replica: Mapping[str, int]) -> int:
        return (
            self.prefill * gpus_per_replica.get("prefill", 1)
            + self.decode * gpus_per_replica.get("decode", 1)
            + self.colocated * gpus_per_replica.get("colocated", 1)
        )

    def replicas(self) -> dict[str, int]:
        if self.colocated:
            return {"colocated": self.colocated}
        return {"prefill": self.prefill, "decode": self.decode}

    def __str__(self) -> str:
        if self.colocated:
            return f"{self.colocated}C"
        return f"{self.prefill}P+{self.decode}D"


@dataclass(slots=True)
class SearchResult:
    """The layout found (None: none within the budget reaches the target), with every simulation run."""

    layout: StaticLayout | None
    gpus: int | None
    target: float
    budget_gpus: int
    tried: dict[StaticLayout, Outcome] = field(default_factory=dict)
    note: str = ""
    lower_bounds: tuple[int, int] | None = None  # P/D: the fewest (prefill, decode) each pool needs alone

    @property
    def outcome(self) -> Outcome | None:
        return None if self.layout is None else self.tried[self.layout]

    @property
    def simulations(self) -> int:
        return len(self.tried)


def _smallest(low: int, high: int, ok: Callable[[int], bool]) -> int | None:
    """The smallest n in [low, high] with ok(n), assuming ok is monotone (False ... False True ... True)."""
    if low > high or not ok(high):
        return None
    while low < high:
        mid = (low + high) // 2
        if ok(mid):
            high = mid
        else:
            low = mid + 1
    return low


def _smallest_near(guess: int, low: int, high: int, ok: Callable[[int], bool]) -> int | None:
    """As `_smallest`, starting from a guess: steps of 1, 2, 4... away from it until `ok` changes, then
    bisection in between; about 2 + 2 log2(|answer - guess|) calls instead of log2(high - low)."""
    if low > high:
        return None
    g = min(max(guess, low), high)
    if ok(g):
        hi, step = g, 1
        while hi - step >= low and ok(hi - step):
            hi, step = hi - step, step * 2
        lo = max(low, hi - step + 1)
    else:
        lo, step = g + 1, 1  # every value below lo fails
        while True:
            if lo > high:
                return None
            candidate = min(high, lo - 1 + step)
            if ok(candidate):
                hi = candidate
                break
            lo, step = candidate + 1, step * 2
    while lo < hi:  # ok(hi) holds, everything below lo fails
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _oversized(guess: int | None, most: int) -> int:
    """A size surely large enough for a pool while the other is probed: twice the guess and more."""
    if guess is None:
        return most
    return min(most, max(2 * guess + 2, guess + 4))


def search_static_colocated(
    evaluate: Callable[[StaticLayout], Outcome],
    budget_gpus: int,
    gpus_per_replica: int = 1,
    target: float = DEFAULT_ATTAINMENT_TARGET,
    guess: int | None = None,
) -> SearchResult:
    """Fewest colocated replicas reaching `target`, by bisection on the replica count (attainment grows
    with replicas), from `guess` when one is given; about log2(budget) simulations."""
    result = SearchResult(None, None, target, budget_gpus)
    gpus = {"colocated": gpus_per_replica}

    def run(layout: StaticLayout) -> Outcome:
        if layout not in result.tried:
            result.tried[layout] = evaluate(layout)
        return result.tried[layout]

    most = budget_gpus // gpus_per_replica

    def ok(c: int) -> bool:
        return run(StaticLayout(colocated=c)).attainment >= target

    found = _smallest(1, most, ok) if guess is None else _smallest_near(guess, 1, most, ok)
    if found is None:
        result.note = (
            f"no colocated layout within {budget_gpus} GPUs reaches {target:.0%} "
            f"(at {most} replicas: {_share(result, StaticLayout(colocated=most))})"
        )
        return result
    result.layout = StaticLayout(colocated=found)
    result.gpus = result.layout.gpus(gpus)
    return result


def search_static_pd(
    evaluate: Callable[[StaticLayout], Outcome],
    budget_gpus: int,
    gpus_per_prefill: int = 1,
    gpus_per_decode: int = 1,
    target: float = DEFAULT_ATTAINMENT_TARGET,
    guess: tuple[int, int] | None = None,
) -> SearchResult:
    """The P/D layout with (close to) the fewest GPUs reaching `target`, in few simulations.

    1. Lower bounds per pool: the fewest prefill replicas whose TTFT share reaches the target with decode
       oversized, and the fewest decode replicas whose TPOT share does with prefill oversized (bisection,
       or a search out from `guess` when one is given, the other pool then at twice its guess or more;
       the probes may exceed the budget: they only bound). A layout within both targets needs at least
       both, since the share within both is at most either share.
    2. From (p_min, d_min), add one replica at a time to the pool whose extra replica lifts the combined
       attainment more (both are simulated), until it reaches the target or the budget is spent.
    3. Then try to remove one replica from each pool (the greedy steps may overshoot).
    """
    result = SearchResult(None, None, target, budget_gpus)
    gpus = {"prefill": gpus_per_prefill, "decode": gpus_per_decode}

    def run(layout: StaticLayout) -> Outcome:
        if layout not in result.tried:
            result.tried[layout] = evaluate(layout)
        return result.tried[layout]

    max_p = max(1, (budget_gpus - gpus_per_decode) // gpus_per_prefill)
    max_d = max(1, (budget_gpus - gpus_per_prefill) // gpus_per_decode)
    big_p = _oversized(guess[0] if guess else None, max_p)
    big_d = _oversized(guess[1] if guess else None, max_d)

    def ttft_ok(p: int) -> bool:
        return run(StaticLayout(p, big_d)).ttft_attainment >= target

    def tpot_ok(d: int) -> bool:
        return run(StaticLayout(big_p, d)).tpot_attainment >= target

    if guess is None:
        p_min, d_min = _smallest(1, max_p, ttft_ok), _smallest(1, max_d, tpot_ok)
    else:
        p_min = _smallest_near(guess[0], 1, max_p, ttft_ok)
        d_min = _smallest_near(guess[1], 1, max_d, tpot_ok)
    if p_min is None or d_min is None:
        pool = "prefill" if p_min is None else "decode"
        result.note = f"no P/D layout within {budget_gpus} GPUs reaches {target:.0%}: {pool} alone cannot"
        return result
    result.lower_bounds = (p_min, d_min)
    layout = StaticLayout(p_min, d_min)
    while True:
        if layout.gpus(gpus) > budget_gpus:
            result.note = (
                f"no P/D layout within {budget_gpus} GPUs reaches {target:.0%} "
                f"(lower bounds {p_min}P+{d_min}D; best tried {_best(result)})"
            )
            return result
        outcome = run(layout)
        if outcome.attainment >= target:
            break
        layout = _better_step(layout, outcome, run, gpus, budget_gpus)
    improved = True
    while improved:  # local minimality: no single replica can go
        improved = False
        for smaller in (
            StaticLayout(layout.prefill - 1, layout.decode),
            StaticLayout(layout.prefill, layout.decode - 1),
        ):
            if smaller.prefill >= p_min and smaller.decode >= d_min and run(smaller).attainment >= target:
                layout, improved = smaller, True
                break
    result.layout = layout
    result.gpus = layout.gpus(gpus)
    return result


def _better_step(
    layout: StaticLayout,
    outcome: Outcome,
    run: Callable[[StaticLayout], Outcome],
    gpus: Mapping[str, int],
    budget_gpus: int,
) -> StaticLayout:
    """One more replica for the pool that helps more: both neighbours are simulated when both fit the
    budget (a decode pool too small shows up as TTFT misses, its KV pulls waiting, so the miss shares
    alone can point at the wrong pool); the one with the higher attainment wins, ties to the pool whose
    target missed more."""
    more_p = StaticLayout(layout.prefill + 1, layout.decode)
    more_d = StaticLayout(layout.prefill, layout.decode + 1)
    fits = [c for c in (more_p, more_d) if c.gpus(gpus) <= budget_gpus]
    if len(fits) < 2:
        return fits[0] if fits else more_p
    ttft_first = 1 - outcome.ttft_attainment >= 1 - outcome.tpot_attainment
    first, second = (more_p, more_d) if ttft_first else (more_d, more_p)
    return second if run(second).attainment > run(first).attainment else first


def _share(result: SearchResult, layout: StaticLayout) -> str:
    outcome = result.tried.get(layout)
    return "not run" if outcome is None else f"{outcome.attainment:.1%}"


def _best(result: SearchResult) -> str:
    if not result.tried:
        return "none"
    layout, outcome = max(result.tried.items(), key=lambda kv: kv[1].attainment)
    return f"{layout} at {outcome.attainment:.1%}"


# --- HPA ---------------------------------------------------------------------------------------------

HPAMetric = Literal["queued_prompt_tokens", "kv_usage"]
METRIC_BY_ROLE: dict[str, HPAMetric] = {
    "prefill": "queued_prompt_tokens",
    "decode": "kv_usage",
    "colocated": "kv_usage",
}
# Targets tuned once on the training traces (the two Azure 2023 traces) with `bench/autoscale.py --tune-hpa`
# (the grid prefill 1024/2048/4096 x decode 0.2/0.3/0.4/0.5: the fewest GPU-hours reaching 95% on both;
# docs/simulator.md, "Results", has every point) and then fixed.
HPA_PREFILL_QUEUED_TOKENS_TARGET = 4096.0
HPA_KV_USAGE_TARGET = 0.3


@dataclass(frozen=True, slots=True)
class HPAConfig:
    """The HPA's knobs: Kubernetes defaults except the targets."""

    targets: Mapping[str, float] = field(
        default_factory=lambda: {
            "prefill": HPA_PREFILL_QUEUED_TOKENS_TARGET,
            "decode": HPA_KV_USAGE_TARGET,
            "colocated": HPA_KV_USAGE_TARGET,
        }
    )
    tolerance: float = 0.1  # --horizontal-pod-autoscaler-tolerance
    sync_seconds: float = 15.0  # --horizontal-pod-autoscaler-sync-period
    scale_down_stabilization_seconds: float = 300.0  # behavior.scaleDown.stabilizationWindowSeconds
    # behavior.scaleUp default policies (selectPolicy Max): +100% or +4 pods per 15 s; no stabilization.
    scale_up_percent: float = 100.0
    scale_up_pods: int = 4
    min_replicas: int = 1
    max_replicas: int = 1024


def hpa_replicas(
    current: int, with_metrics: int, metric_sum: float, target: float, tolerance: float = 0.1
) -> int:
    """The HPA's replica calculation for an AverageValue pods metric (replica_calculator.go,
    calcPlainMetricReplicas), from the sum of the metric over the `with_metrics` pods that report it.

    Pods without metrics (starting: vLLM serves /metrics only once the model is loaded) count as using 0
    when the others ask to scale up, and the target when they ask to scale down; if that reverses the
    direction, or lands within the tolerance, the size holds.
    """
    if with_metrics <= 0 or target <= 0:
        return current
    ratio = metric_sum / with_metrics / target
    missing = max(0, current - with_metrics)
    if missing == 0:
        if abs(ratio - 1.0) <= tolerance:
            return current
        return math.ceil(ratio * with_metrics)
    if ratio < 1.0:
        new_ratio = (metric_sum + missing * target) / current / target
    else:
        new_ratio = metric_sum / current / target
    if abs(new_ratio - 1.0) <= tolerance or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current
    replicas = math.ceil(new_ratio * current)
    if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
        return current
    return replicas


class HPAPolicy:
    """One HPA per pool (the pools do not coordinate, as two HPAs would not), every `sync_seconds`."""

    def __init__(
        self,
        config: HPAConfig | None = None,
        gpus_per_replica: Mapping[str, int] | None = None,
        max_gpus: int | None = None,
    ) -> None:
        self.config = config or HPAConfig()
        self.interval_seconds = self.config.sync_seconds
        self.gpus_per_replica = dict(gpus_per_replica or {})
        self.max_gpus = max_gpus
        self._recommendations: dict[str, deque[tuple[float, int]]] = {}
        self.last_figures: dict[str, dict[str, float]] = {}

    def _metric_sum(self, snapshot: Snapshot, role: str) -> tuple[int, float]:
        signals = snapshot.pools.get(role)
        if signals is None:
            return 0, 0.0
        if METRIC_BY_ROLE[role] == "queued_prompt_tokens":
            return signals.scraped_targets, signals.queued_prompt_tokens
        return signals.scraped_targets, signals.kv_usage_mean * signals.scraped_targets

    def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
        if not snapshot.has_data:
            return {}  # the HPA cannot read its metric: it keeps the size (ScalingActive=False)
        cfg = self.config
        desired: dict[str, int] = {}
        for role, size in snapshot.sizes.items():
            if role not in cfg.targets:
                continue
            current = size.replicas
            with_metrics, total = self._metric_sum(snapshot, role)
            raw = hpa_replicas(current, with_metrics, total, cfg.targets[role], cfg.tolerance)
            raw = min(max(raw, cfg.min_replicas), cfg.max_replicas)
            if role not in self._recommendations:  # as the HPA controller: first sight records the size
                self._recommendations[role] = deque([(now, current)])
            history = self._recommendations[role]
            history.append((now, raw))
            while history and history[0][0] <= now - cfg.scale_down_stabilization_seconds:
                history.popleft()
            stabilized = raw
            if raw < current:  # scale down only to the highest recommendation within the window
                stabilized = min(current, max(r for _, r in history))
            if stabilized > current:
                by_percent = math.ceil(current * (1 + cfg.scale_up_percent / 100))
                stabilized = min(stabilized, max(by_percent, current + cfg.scale_up_pods))
            desired[role] = stabilized
            self.last_figures[role] = {"metric_sum": total, "with_metrics": with_metrics, "raw": raw}
        return cap_to_budget(desired, snapshot, self.gpus_per_replica, self.max_gpus)


def cap_to_budget(
    desired: dict[str, int],
    snapshot: Snapshot,
    gpus_per_replica: Mapping[str, int],
    max_gpus: int | None,
) -> dict[str, int]:
    """Growth beyond `max_gpus` is cut, largest asks first (shrinking is never blocked); pools keep >= 1."""
    if max_gpus is None:
        return desired
    sizes = {role: size.replicas for role, size in snapshot.sizes.items()}
    merged = {**sizes, **desired}

    def total() -> int:
        return sum(n * gpus_per_replica.get(role, 1) for role, n in merged.items())

    while total() > max_gpus:
        growing = [r for r in merged if merged[r] > sizes.get(r, 0) and merged[r] > 1]
        if not growing:
            break
        role = max(growing, key=lambda r: merged[r] - sizes.get(r, 0))
        merged[role] -= 1
    return {role: merged[role] for role in desired}


# --- Dynamo-style planner ------------------------------------------------------------------------------

Predictor = Literal["constant", "trend"]
TREND_POINTS = 5  # a least-squares line through the last five intervals (Dynamo's ARIMA/Kalman need >= 5)


def predict(history: list[float], predictor: Predictor) -> float:
    """The next interval's value: the last one (constant), or the least-squares line through the last
    `TREND_POINTS` extended one step (trend; the last value with fewer than three points), never below 0."""
    if not history:
        return 0.0
    if predictor == "constant" or len(history) < 3:
        return history[-1]
    ys = history[-TREND_POINTS:]
    n = len(ys)
    mean_x, mean_y = (n - 1) / 2, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in range(n))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(ys)) / sxx
    return max(0.0, mean_y + slope * (n - mean_x))


def prefill_ttft_alone(profile: Profile, isl: int, max_num_batched_tokens: int = 8192) -> float:
    """TTFT of one prompt of `isl` tokens on an idle prefill replica, as Dynamo's profiler measures it
    (batch 1): vLLM computes it in chunks of the token budget, each a step of its linear time, plus the
    prompt's whole attention once."""
    budget = max(1, max_num_batched_tokens)
    full, rest = divmod(max(1, isl), budget)
    linear = full * profile.prefill_linear_seconds(budget) + (
        profile.prefill_linear_seconds(rest) if rest else 0.0
    )
    return linear + profile.prefill_attention_seconds(0, max(1, isl))


def prefill_replica_tokens_per_second(
    profile: Profile, isl: float, ttft_seconds: float, max_num_batched_tokens: int = 8192
) -> float:
    """Prompt tokens/s one prefill replica sustains at this ISL *at the TTFT target*, as Dynamo's
    pre-deployment profiler finds it: prefill is profiled at batch 1 over ISLs, throughput per GPU =
    ISL / TTFT (`prefill_thpt_per_gpu`, `docs/architecture/pre_deployment_profiling.md`, `anchors.md`
    section 1.3), at the TP whose TTFT meets the target. Here TP is the pool's, so when one prompt alone
    takes longer than the target the throughput is divided by how many times over it is (generation 2's
    latency floor, `ceil(ttft_est / ttft_sla)` replicas)."""
    tokens = max(1, round(isl))
    alone = prefill_ttft_alone(profile, tokens, max_num_batched_tokens)
    rate = tokens / alone
    if alone > ttft_seconds:
        rate /= math.ceil(alone / ttft_seconds)
    return rate


def decode_replica_tokens_per_second(
    profile: Profile, isl: float, osl: float, itl_seconds: float, kv_capacity_tokens: int, max_num_seqs: int
) -> float:
    """Output tokens/s one decode replica sustains at the ITL target, sequences at context ISL + OSL/2
    (Dynamo's decode profile point): its profiler sweeps concurrency up to the KV cache's capacity and the
    planner takes the highest throughput whose ITL meets the target, i.e. the largest batch within it,
    capped by KV capacity and max_num_seqs. Where even one sequence misses the target, Dynamo's
    `find_best_throughput_per_gpu` returns its grid's lowest-load point, not nothing: a batch of one.
    0 only where one sequence does not fit the KV cache."""
    context = max(1.0, isl + osl / 2)
    batch = max(1, decode_batch_at_tpot(profile, itl_seconds, context, max_batch=max_num_seqs))
    batch = min(batch, max_num_seqs, int(kv_capacity_tokens // context))
    if batch <= 0:
        return 0.0
    return batch / profile.decode_step_seconds(batch, math.ceil(batch * context))


def check_tightness(tightness: float) -> None:
    """A planner's tightness is a share of the SLO: within (0, 1]."""
    if not 0 < tightness <= 1 or not math.isfinite(tightness):
        raise ValueError(f"a planner's tightness must be within (0, 1], got {tightness}")


def check_ranks(ranks: int) -> None:
    """A replica is a group of at least one engine."""
    if ranks < 1:
        raise ValueError(f"a decode replica has at least one rank, got {ranks}")


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """The throughput planner's settings. `ttft_seconds` and `itl_seconds` are the SLO; the planner is
    given `tightness` x them as its targets (`ttft_target_seconds`, `itl_target_seconds`): 1 is the SLO
    itself (Dynamo's configuration when its targets are the SLO), less is the headroom an operator buys
    by telling the planner a tighter SLO than the one the requests are scored on. `decode_ranks`: engines
    per decode replica (a data-parallel group, `parallelism.data`); the planner sizes decode in whole
    groups, each D engines' throughput on D x TP GPUs (Dynamo's planner divides the demand by one
    worker's throughput, its GPUs times the profiled throughput per GPU)."""

    prefill_profile: Profile
    decode_profile: Profile
    ttft_seconds: float
    itl_seconds: float
    decode_kv_capacity_tokens: int
    adjustment_interval_seconds: float = 180.0
    predictor: Predictor = "constant"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    min_endpoint: int = 1
    max_gpu_budget: int | None = None
    tightness: float = 1.0
    decode_ranks: int = 1

    def __post_init__(self) -> None:
        check_tightness(self.tightness)
        check_ranks(self.decode_ranks)

    @property
    def ttft_target_seconds(self) -> float:
        return self.ttft_seconds * self.tightness

    @property
    def itl_target_seconds(self) -> float:
        return self.itl_seconds * self.tightness


@dataclass(frozen=True, slots=True)
class PlannerObservation:
    """One interval as the planner reads it from the frontend: requests arrived, mean ISL, mean OSL."""

    num_req: float
    isl: float
    osl: float


class PlannerPolicy:
    """Dynamo's throughput planner, generation 1, without its correction factors (the evaluation's
    definition sizes both pools from the profile alone; `anchors.md` section 1.3 for the published loop).

    Each call reads one window; the sim's windows tile the interval when the policy is called every
    window (`interval_seconds` = window); observations are summed over `adjustment_interval_seconds`
    and the planner acts once per adjustment interval. The request count and ISL are those of the
    requests that *arrived* (Dynamo reads its frontend's request counter, `increase(requests_total[I])`,
    and input-length histogram), from `Snapshot.arrivals` (the simulator counts arrivals; a snapshot
    without it, as a live one, falls back to finished requests); OSL is known only when a request
    finishes, so it is the finished requests' mean.
    """

    def __init__(self, config: PlannerConfig, window_seconds: float | None = None) -> None:
        self.config = config
        self.interval_seconds = window_seconds or config.adjustment_interval_seconds
        self.history: list[PlannerObservation] = []
        # (requests arrived, their prompt tokens, requests finished, their output tokens)
        self._pending: list[tuple[float, float, float, float]] = []
        self._next_act: float | None = None
        self.last_figures: dict[str, float] = {}

    def observe(self, snapshot: Snapshot) -> tuple[float, float, float, float]:
        """Requests arrived in the window and their prompt tokens (`Snapshot.arrivals`; finished requests
        without it), and requests finished and their output tokens (the decode and colocated pools)."""
        finished = prompt_finished = output = 0.0
        for role, signals in snapshot.pools.items():
            if role in ("decode", "colocated"):
                n = signals.request_rate * snapshot.window_seconds
                finished += n
                prompt_finished += signals.mean_prompt_tokens * n
                output += signals.mean_output_tokens * n
        arrivals = snapshot.arrivals
        if arrivals is None:
            return snapshot.total().request_rate * snapshot.window_seconds, prompt_finished, finished, output
        arrived = arrivals.request_rate * snapshot.window_seconds
        return arrived, arrivals.mean_prompt_tokens * arrived, finished, output

    def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
        cfg = self.config
        if self._next_act is None:
            self._next_act = now + cfg.adjustment_interval_seconds - self.interval_seconds
        if not snapshot.has_data:
            return {}
        self._pending.append(self.observe(snapshot))
        if now + 1e-9 < self._next_act:
            return {}
        self._next_act = now + cfg.adjustment_interval_seconds
        requests = sum(p[0] for p in self._pending)
        prompt = sum(p[1] for p in self._pending)
        finished = sum(p[2] for p in self._pending)
        output = sum(p[3] for p in self._pending)
        self._pending.clear()
        if requests <= 0 or finished <= 0:
            return {}  # Dynamo skips a tick whose averages are NaN (no traffic)
        self.history.append(PlannerObservation(requests, prompt / requests, output / finished))
        return self.size(self.predicted(), snapshot)

    def predicted(self) -> PlannerObservation:
        p = self.config.predictor
        return PlannerObservation(
            num_req=predict([h.num_req for h in self.history], p),
            isl=predict([h.isl for h in self.history], p),
            osl=predict([h.osl for h in self.history], p),
        )

    def size(self, load: PlannerObservation, snapshot: Snapshot | None = None) -> dict[str, int]:
        """Replicas for the predicted next interval (and the figures, in `last_figures`)."""
        cfg = self.config
        interval = cfg.adjustment_interval_seconds
        gpus_p = cfg.prefill_profile.tensor_parallel_size
        gpus_d = cfg.decode_profile.tensor_parallel_size * cfg.decode_ranks
        prefill_demand = load.num_req * load.isl / interval  # prompt tokens/s
        decode_demand = load.num_req * load.osl / interval  # output tokens/s
        p_rate = prefill_replica_tokens_per_second(
            cfg.prefill_profile, load.isl, cfg.ttft_target_seconds, cfg.max_num_batched_tokens
        )
        d_rate = decode_replica_tokens_per_second(
            cfg.decode_profile,
            load.isl,
            load.osl,
            cfg.itl_target_seconds,
            cfg.decode_kv_capacity_tokens,
            cfg.max_num_seqs,
        )
        num_p = max(cfg.min_endpoint, math.ceil(prefill_demand / p_rate)) if p_rate > 0 else cfg.min_endpoint
        per_group = d_rate * cfg.decode_ranks
        num_d = (
            max(cfg.min_endpoint, math.ceil(decode_demand / per_group)) if d_rate > 0 else cfg.min_endpoint
        )
        budget = cfg.max_gpu_budget
        if budget is not None and num_p * gpus_p + num_d * gpus_d > budget:
            # Dynamo: scale both proportionally, prefill first, decode gets the remainder
            scale = budget / (num_p * gpus_p + num_d * gpus_d)
            num_p = max(cfg.min_endpoint, round(num_p * scale))
            num_d = max(cfg.min_endpoint, (budget - num_p * gpus_p) // gpus_d)
        self.last_figures = {
            "num_req": load.num_req,
            "isl": load.isl,
            "osl": load.osl,
            "prefill_demand_tokens_per_s": prefill_demand,
            "decode_demand_tokens_per_s": decode_demand,
            "prefill_replica_tokens_per_s": p_rate,
            "decode_replica_tokens_per_s": d_rate,
        }
        return {"prefill": num_p, "decode": num_d}


def peak_size(
    config: PlannerConfig, requests: Sequence[Request], window_seconds: float = 60.0
) -> dict[str, int]:
    """The planner's arithmetic over each window of the requests, the largest size per pool: where a
    static search starts (`guess`), so that it does not probe far from the answer."""
    planner = PlannerPolicy(replace(config, adjustment_interval_seconds=window_seconds, max_gpu_budget=None))
    best = {"prefill": 1, "decode": 1}
    start = 0
    for end in range(len(requests) + 1):
        boundary = (
            end == len(requests)
            or requests[end].arrival
            >= (math.floor(requests[start].arrival / window_seconds) + 1) * window_seconds
        )
        if not boundary or end == start:
            continue
        chunk = requests[start:end]
        n = len(chunk)
        load = PlannerObservation(
            num_req=n,
            isl=sum(r.prompt_tokens for r in chunk) / n,
            osl=sum(r.output_tokens for r in chunk) / n,
        )
        for role, size in planner.size(load).items():
            best[role] = max(best[role], size)
        start = end
    return best


# --- Dynamo's load-based planner loop --------------------------------------------------------------------

LOAD_ADJUSTMENT_INTERVAL_SECONDS = 5.0  # Dynamo's `loadbased_adjustment_interval` default
LOAD_SCALING_DOWN_SENSITIVITY = 0.8  # `loadbased_scaling_down_sensitivity` default, 80 (%)


def prefill_seconds_for_tokens(
    profile: Profile, tokens: float, isl: float, max_num_batched_tokens: int = 8192
) -> float:
    """Time one prefill replica takes to compute `tokens` prompt tokens made of prompts of `isl` tokens:
    steps of the token budget (linear ops of each step) plus each prompt's attention once."""
    if tokens <= 0:
        return 0.0
    budget = max(1, max_num_batched_tokens)
    full, rest = divmod(math.ceil(tokens), budget)
    linear = full * profile.prefill_linear_seconds(budget) + (
        profile.prefill_linear_seconds(rest) if rest else 0.0
    )
    prompt = max(1, round(isl))
    return linear + tokens / prompt * profile.prefill_attention_seconds(0, prompt)


def prefill_tokens_at_ttft(
    profile: Profile, isl: float, ttft_seconds: float, max_num_batched_tokens: int = 8192, most: int = 1 << 26
) -> int:
    """The most prompt tokens (queued work plus the new prompt) a prefill replica computes within
    `ttft_seconds`: the `x_sla` Dynamo's load-based planner solves from its regression of TTFT on
    active prefill tokens + ISL, here from the profile (a perfect fit). 0 if not even one token fits."""

    def fits(tokens: int) -> bool:
        return prefill_seconds_for_tokens(profile, tokens, isl, max_num_batched_tokens) <= ttft_seconds

    found = _smallest(1, most, lambda n: not fits(n))
    return most if found is None else found - 1


def decode_tokens_at_itl(profile: Profile, context: float, itl_seconds: float, max_num_seqs: int) -> float:
    """The most KV tokens of active sequences (each of `context` tokens) a decode replica holds with its
    step within `itl_seconds`: Dynamo's `x_sla` from its regression of ITL on active decode blocks, here
    from the profile; 0 if even one sequence misses."""
    context = max(1.0, context)
    return decode_batch_at_tpot(profile, itl_seconds, context, max_batch=max_num_seqs) * context


@dataclass(frozen=True, slots=True)
class LoadPlannerConfig:
    """Dynamo's load-based planner (its SLA mode's reactive loop), per pool every 5 s. `tightness` as in
    `PlannerConfig`. With `throughput` set, that throughput planner runs alongside and its sizes are a lower
    bound on the load-based proposals (Dynamo with both modes enabled). `decode_ranks` as in `PlannerConfig`:
    decode steps by whole groups, its thresholds per engine."""

    prefill_profile: Profile
    decode_profile: Profile
    ttft_seconds: float
    itl_seconds: float
    decode_kv_capacity_tokens: int
    adjustment_interval_seconds: float = LOAD_ADJUSTMENT_INTERVAL_SECONDS
    scaling_down_sensitivity: float = LOAD_SCALING_DOWN_SENSITIVITY
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    min_endpoint: int = 1
    max_gpu_budget: int | None = None
    tightness: float = 1.0
    throughput: PlannerConfig | None = None
    decode_ranks: int = 1

    def __post_init__(self) -> None:
        check_tightness(self.tightness)
        check_ranks(self.decode_ranks)
        if not 0 < self.scaling_down_sensitivity <= 1:
            raise ValueError("scaling_down_sensitivity must be within (0, 1]")
        if not self.adjustment_interval_seconds > 0:
            raise ValueError("adjustment_interval_seconds must be positive")


class LoadPlannerPolicy:
    """Dynamo's load-based scaling loop (`planner_core._load_loop`, `prefill_planner` and `decode_planner`'s
    `loadbased_plan_adjustment`), every `adjustment_interval_seconds`, each pool on its own:

    - prefill: `x_sla` = the most tokens a replica computes within the TTFT target (`prefill_tokens_at_ttft`
      at the window's mean ISL); target active tokens = `x_sla - ISL`; the pool's active prefill tokens per
      replica (queued prompt tokens, including those of prompts being computed) above it: +1; below
      `target x (N-1)/N x sensitivity` (N > min_endpoint): -1;
    - decode: `x_sla` = the most KV tokens a replica holds within the ITL target at context ISL + OSL/2
      (`decode_tokens_at_itl`); the active decode tokens per replica (KV in use, plus ISL per waiting
      request: the router counts a request's blocks from the moment it routes it) above it: +1; below
      `x_sla x (N-1)/N x sensitivity`: -1;
    - one step per pool per tick; none while the pool is changing (Dynamo scales blocking, waiting for
      the deployment to be ready, and skips a tick whose reporting workers differ from the deployment's);
      none without the window's ISL (no traffic: Dynamo's regression has no observation);
    - with a throughput planner configured, its latest sizes, before any GPU budget (Dynamo sets its
      lower bounds from the unbudgeted sizes), are a floor applied to each proposal (none to a pool
      the loop holds for want of a proposal: Dynamo's per-pool load decision returns before it);
    - growth beyond the GPU budget is cut as for the other policies (`cap_to_budget`).
    Dynamo steps when *every* worker is above (below) its threshold; the snapshot holds pool sums, so the
    per-worker value is the pool's mean, which steps at least as readily both ways (the same when the
    workers are balanced).
    """

    def __init__(self, config: LoadPlannerConfig, window_seconds: float = 60.0) -> None:
        self.config = config
        self.interval_seconds = config.adjustment_interval_seconds
        # Dynamo publishes the throughput planner's sizes as the load loop's floors before any budget
        # (its global budget applies only when it scales on its own); the budget is this loop's, after
        # the floor: a floor squeezed by a decode ask beyond the budget would starve prefill.
        self.throughput = (
            PlannerPolicy(replace(config.throughput, max_gpu_budget=None), window_seconds)
            if config.throughput is not None
            else None
        )
        self.window_seconds = window_seconds
        self._fed_at = 0.0
        self.floors: dict[str, int] = {}
        self.last_figures: dict[str, dict[str, float]] = {}
        self.gpus_per_replica = {
            "prefill": config.prefill_profile.tensor_parallel_size,
            "decode": config.decode_profile.tensor_parallel_size * config.decode_ranks,
        }

    def _feed_throughput(self, snapshot: Snapshot, now: float) -> None:
        """The throughput planner reads windows that tile time: one snapshot per `window_seconds`, from
        the first full window on."""
        if self.throughput is None or now + 1e-9 < self._fed_at + self.window_seconds:
            return
        self._fed_at = now
        self.floors.update(self.throughput.decide(snapshot, now))

    def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
        if not snapshot.has_data:
            return {}
        self._feed_throughput(snapshot, now)
        desired: dict[str, int] = {}
        for role in ("prefill", "decode"):
            proposal = self.propose(role, snapshot)
            if proposal is None:
                continue
            if role in self.floors:
                proposal = max(proposal, self.floors[role])
            if proposal != snapshot.sizes[role].replicas:
                desired[role] = proposal
        return cap_to_budget(desired, snapshot, self.gpus_per_replica, self.config.max_gpu_budget)

    def propose(self, role: str, snapshot: Snapshot) -> int | None:
        """The pool's next size, or None (hold): +1, -1 or its size, as described in the class."""
        cfg = self.config
        size = snapshot.sizes.get(role)
        signals = snapshot.pools.get(role)
        if size is None or signals is None:
            return None
        n = size.replicas
        if n <= 0 or size.ready != n or signals.scraped_targets != n:
            return None  # scaling in progress, or workers not all reporting
        isl, osl = _lengths(snapshot)
        if isl <= 0:
            return None
        if role == "prefill":
            x_sla = prefill_tokens_at_ttft(
                cfg.prefill_profile, isl, cfg.ttft_seconds * cfg.tightness, cfg.max_num_batched_tokens
            )
            target = x_sla - isl
            active = signals.queued_prompt_tokens / n
        else:
            context = isl + osl / 2
            target = decode_tokens_at_itl(
                cfg.decode_profile, context, cfg.itl_seconds * cfg.tightness, cfg.max_num_seqs
            )
            engines = n * cfg.decode_ranks
            active = (
                signals.kv_usage_mean * cfg.decode_kv_capacity_tokens
            ) + signals.waiting_requests / engines * isl
        boundary = target * (n - 1) / n * cfg.scaling_down_sensitivity
        self.last_figures[role] = {"active_per_replica": active, "target": target, "down_below": boundary}
        if target <= 0:
            return None  # the SLA is out of reach at this ISL: Dynamo skips
        if active > target:
            return n + 1
        if n > cfg.min_endpoint and active < boundary:
            return n - 1
        return n


def _lengths(snapshot: Snapshot) -> tuple[float, float]:
    """The window's mean ISL (requests finished at prefill, else arrivals) and mean OSL (finished)."""
    isl = osl = 0.0
    prefill = snapshot.pools.get("prefill")
    decode = snapshot.pools.get("decode")
    if prefill is not None and prefill.mean_prompt_tokens > 0:
        isl = prefill.mean_prompt_tokens
    elif decode is not None and decode.mean_prompt_tokens > 0:
        isl = decode.mean_prompt_tokens
    elif snapshot.arrivals is not None:
        isl = snapshot.arrivals.mean_prompt_tokens
    if decode is not None:
        osl = decode.mean_output_tokens
    return isl, osl
