"""The two arms of a colocated <-> P/D rollout and their sizes, pure (no I/O, `now` an argument).

An arm is the set of pools that serves one serving mode: P/D is prefill + decode, colocated is the
colocated pool. A rollout moves traffic from the source arm (the mode in effect) to the target arm
(`spec.serving.mode`); `status.rollout.weight` is the target's percent, and the routers read the
P/D percent (`pd_share`). Each arm is sized for the traffic it gets (`pool_bounds`): pools with a
fixed size get their share of their full size (`spec.<pool>.replicas`), rounded up; pools under the
autoscaler are sized from their own load, within floors that keep an arm able to serve while it
has (or is about to get) traffic. The arm traffic left is scaled to zero only after the delay and,
for a rollback, only once the source arm has ready pods again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Final

from tandem.api.models import PDDeploymentSpec
from tandem.rollout.config import Analysis, OnMetricsUnavailable, RolloutConfig, Step
from tandem.rollout.state import Phase, RollbackStage, RolloutState

DISAGGREGATED: Final = "Disaggregated"
COLOCATED: Final = "Colocated"
ARMS: Final[dict[str, tuple[str, ...]]] = {DISAGGREGATED: ("prefill", "decode"), COLOCATED: ("colocated",)}


def other(mode: str) -> str:
    """The other serving mode: the source arm of a rollout whose target is `mode`."""
    return COLOCATED if mode == DISAGGREGATED else DISAGGREGATED


def pd_share(target: str, weight: int) -> int:
    """Percent of requests the routers send to P/D, from the target arm's weight."""
    return weight if target == DISAGGREGATED else 100 - weight


def effective_mode(target: str, phase: Phase) -> str:
    """The mode in effect (`status.mode`): the target's once Promoted, the source's before and after."""
    return target if phase is Phase.Promoted else other(target)


@dataclass(frozen=True, slots=True)
class Bound:
    """Replicas a pool may have this pass: the autoscaler's (or the spec's) size clamped to [low, high]."""

    low: int = 0
    high: int | None = None  # None: no ceiling

    def apply(self, size: int) -> int:
        size = max(size, self.low)
        return size if self.high is None else min(size, self.high)


def share_of(full: int, percent: int) -> int:
    """Replicas for `percent` of the traffic of a pool whose full size is `full`: rounded up, and at
    least 1 while the share is above zero."""
    if percent <= 0 or full <= 0:
        return 0
    return max(1, math.ceil(full * min(percent, 100) / 100 - 1e-9))


def pool_bounds(
    target: str,
    state: RolloutState,
    config: RolloutConfig,
    full: Mapping[str, int],
    autoscaled: Set[str],
    now: float,
    source_ready: bool,
) -> dict[str, Bound]:
    """Each pool's bounds in this phase of the rollout (see the module docstring).

    `full` is each pool's full size (`spec.<pool>.replicas`); `autoscaled` the pools the autoscaler
    sizes; `source_ready` whether every source pool has a ready pod (the target arm of a rollback is
    scaled down only then).
    """
    phase = state.phase
    target_roles, source_roles = ARMS[target], ARMS[other(target)]
    # The weight the target arm is sized for: the step's (Preparing: the first step's; a rollback:
    # the step it left, until its pods may go).
    step_weight = config.steps[min(state.step, config.last_step)].weight
    scaled_down_target = phase is Phase.RolledBack or (
        phase is Phase.RollingBack and state.rollback_stage is RollbackStage.ScalingDown
    )
    bounds: dict[str, Bound] = {}
    for role in (*target_roles, *source_roles):
        is_target = role in target_roles
        size = full.get(role, 0)
        fixed = role not in autoscaled
        if is_target:
            if scaled_down_target and source_ready:
                bounds[role] = Bound(0, 0)
                continue
            if phase is Phase.Promoted:
                percent = 100
            elif phase in (Phase.Shifting, Phase.Paused):
                percent = state.weight
            else:  # Preparing, RollingBack (until the source is ready again)
                percent = step_weight
        elif phase is Phase.Promoted:
            done = now - state.phase_since >= config.scale_down_delay_seconds
            if done:
                bounds[role] = Bound(0, 0)
                continue
            percent = 100 - step_weight
        elif phase in (Phase.Shifting, Phase.Paused):
            percent = 100 - state.weight
        else:  # Preparing, RollingBack, RolledBack: the source serves (or is about to serve) everything
            percent = 100
        # Every arm not scaled to zero keeps a pod: the target's first step needs it, and the
        # source must be able to take everything back until it is let go.
        want = max(share_of(size, percent), 1)
        if fixed:
            bounds[role] = Bound(want, want)
        elif percent >= 100 and not is_target:
            bounds[role] = Bound(want, None)  # back to its full size at least; the autoscaler may add
        else:
            bounds[role] = Bound(1, None)
    return bounds


def cutover_bounds(
    old_mode: str, new_arm_ready: bool, live: Mapping[str, int | None], full: Mapping[str, int]
) -> dict[str, Bound]:
    """A mode change without `spec.rollout`: the old arm keeps its pods (at least its live size, at
    least 1) until every pool of the new arm has its desired replicas ready; then nothing is held."""
    if new_arm_ready:
        return {}
    bounds: dict[str, Bound] = {}
    for role in ARMS[old_mode]:
        keep = max(live.get(role) or 0, full.get(role, 0), 1)
        bounds[role] = Bound(keep, None)
    return bounds


def config_from(
    steps: list[tuple[int, float | None]],
    *,
    window_seconds: float,
    min_samples: int,
    attainment_floor: float,
    max_attainment_drop: float,
    max_error_rate: float,
    max_kv_failure_rate: float,
    min_kv_bandwidth_ratio: float,
    on_metrics_unavailable: str,
    metrics_unavailable_seconds: float,
    inconclusive_pause_seconds: float,
    auto_rollback: bool,
    scale_down_delay_seconds: float,
    prepare_timeout_seconds: float | None = 900.0,
) -> RolloutConfig:
    """A `RolloutConfig` from plain values (the API layer passes `spec.rollout`'s)."""
    return RolloutConfig(
        steps=tuple(Step(weight, pause) for weight, pause in steps),
        analysis=Analysis(
            window_seconds=float(window_seconds),
            min_samples=min_samples,
            attainment_floor=attainment_floor,
            max_attainment_drop=max_attainment_drop,
            max_error_rate=max_error_rate,
            max_kv_failure_rate=max_kv_failure_rate,
            min_kv_bandwidth_ratio=min_kv_bandwidth_ratio,
            on_metrics_unavailable=OnMetricsUnavailable(on_metrics_unavailable),
            metrics_unavailable_seconds=float(metrics_unavailable_seconds),
            inconclusive_pause_seconds=float(inconclusive_pause_seconds),
        ),
        auto_rollback=auto_rollback,
        scale_down_delay_seconds=float(scale_down_delay_seconds),
        prepare_timeout_seconds=None if prepare_timeout_seconds is None else float(prepare_timeout_seconds),
    )


def bounded_spec(spec: PDDeploymentSpec, bounds: Mapping[str, Bound]) -> PDDeploymentSpec:
    """`spec` as the autoscaler's `decide()` should see it during a rollout: each autoscaled pool's
    `minReplicas` / `maxReplicas` narrowed to its bound, so an arm held at zero claims no GPU of
    `maxGPUs` (capacity is traded between the arms, not reserved twice) and an arm that must serve
    is never decided below its floor. Copies without validation (a zero maximum is not a valid
    spec); the spec itself is unchanged."""
    pools = {}
    for role, bound in bounds.items():
        pool = spec.pool(role)
        block = pool.autoscaling
        if block is None or block.external:
            continue
        high = block.max_replicas if bound.high is None else min(block.max_replicas, bound.high)
        low = (
            min(max(block.min_replicas, bound.low), high)
            if bound.high is not None
            else max(block.min_replicas, bound.low)
        )
        high = max(high, low)
        if (low, high) != (block.min_replicas, block.max_replicas):
            narrowed = block.model_copy(update={"min_replicas": low, "max_replicas": high})
            pools[role] = pool.model_copy(update={"autoscaling": narrowed})
    return spec.model_copy(update=pools) if pools else spec


def yield_order(phase: str, weight: int, first: Sequence[str], second: Sequence[str]) -> list[list[str]]:
    """Which side gives way first when a change holds more GPUs than maxGPUs (the sizing chain fits them
    with `autoscale.budget.fit_budget`): `first` is the side the
    change moves to (a mode rollout's target arm, a revision rollout's new pair), `second` the side it
    leaves. Before traffic moves (Preparing) and on the way back (RollingBack, RolledBack) the side
    moved to; once promoted the side left (it has no traffic); while shifting, the one with the smaller
    share of the traffic (`weight`: percent on `first`)."""
    if phase in ("Preparing", "RollingBack", "RolledBack"):
        return [list(first), list(second)]
    if phase == "Promoted":
        return [list(second), list(first)]
    return [list(first), list(second)] if weight <= 50 else [list(second), list(first)]
