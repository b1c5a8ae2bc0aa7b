"""Who sizes each pool, and at what size its StatefulSet runs (pure).

Three sources (`status.pools.<role>.source`):
- `spec`: `spec.<pool>.replicas`, for pools without `autoscaling` bounds, pools whose bounds are
  inert (`spec.autoscaling.enabled: false`), and every pool in `Advisory` mode (the autoscaler
  only advises, the user's size runs);
- `autoscaler`: `status.autoscaling.pools.<role>.desiredReplicas`, initialised from
  `spec.<pool>.replicas` clamped to the pool's bounds and then changed only by decisions, so a
  `kubectl apply` of the unchanged manifest, a restart or a fail-over never resets it;
- `external`: another controller (HPA, KEDA) sets the StatefulSet's replicas; the operator renders
  it without `spec.replicas` and reports the count it finds.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from tandem import sizing
from tandem.api import meta
from tandem.api.models import AutoscalingMode, PDDeploymentSpec, PoolAutoscaling
from tandem.api.status import (
    AutoscalingPoolsStatus,
    AutoscalingStatus,
    PoolAutoscalingStatus,
    Recommendation,
    ReplicaSource,
)
from tandem.autoscale.bounds import clamp

SEED_AGE_SECONDS = 0.001
is_external = sizing.is_external  # who sizes which pool: one definition, the sizing chain's


class Mode(StrEnum):
    """What the autoscaler does for a PDDeployment (`status.autoscaling.mode`)."""

    Active = "Active"
    Advisory = "Advisory"
    Paused = "Paused"
    Disabled = "Disabled"


def mode(spec: PDDeploymentSpec, paused: bool) -> Mode:
    if not spec.autoscaling.enabled:
        return Mode.Disabled
    if spec.autoscaling.mode is AutoscalingMode.Advisory:
        return Mode.Advisory
    return Mode.Paused if paused else Mode.Active


def bounds(spec: PDDeploymentSpec, role: str) -> PoolAutoscaling | None:
    return spec.pool(role).autoscaling


def source(spec: PDDeploymentSpec, role: str, paused: bool) -> ReplicaSource:
    """`tandem.sizing.source` (a pause does not change who sizes a pool)."""
    return sizing.source(spec, role)


def prepare_state(
    spec: PDDeploymentSpec,
    previous: AutoscalingStatus | None,
    live_replicas: Mapping[str, int | None],
    paused: bool,
    now: float,
) -> AutoscalingStatus | None:
    """The autoscaler's state before this pass's decision: carried over from status, completed.

    Autoscaled pools keep their `desiredReplicas` (clamped to bounds that may have changed) or start
    from the spec; a pool's first size is also its first recommendation (at `now`), as the HPA
    seeds its history with the current size, so the first scale-down waits a full window. In
    Advisory mode the spec's size is the one that runs. External pools record the count another
    controller set (`live_replicas`, the StatefulSets' `spec.replicas`), so a hand-back continues
    from it. Other pools carry no state. None when nothing is autoscaled and status never had
    autoscaling state.
    """
    current = mode(spec, paused)
    managed = [role for role in meta.POOL_ROLES if bounds(spec, role) is not None]
    if previous is None and (current is Mode.Disabled and not managed):
        return None
    before = previous.pools if previous is not None else AutoscalingPoolsStatus()
    pools: dict[str, PoolAutoscalingStatus] = {}
    for role in meta.POOL_ROLES:
        block = bounds(spec, role)
        old: PoolAutoscalingStatus = getattr(before, role)
        if block is None:
            pools[role] = PoolAutoscalingStatus()
        elif block.external:
            live = live_replicas.get(role)
            held = live if live is not None else old.desired_replicas
            desired = held if held is not None else clamp(spec.pool(role).replicas, block)
            pools[role] = PoolAutoscalingStatus(desired_replicas=desired)
        elif current is Mode.Disabled:
            pools[role] = PoolAutoscalingStatus()
        elif old.desired_replicas is None:
            first = clamp(spec.pool(role).replicas, block)
            # just before this pass: inside a scale-down window, outside a zero-second scale-up one
            seed = [*old.recommendations, Recommendation(time=now - SEED_AGE_SECONDS, replicas=first)]
            pools[role] = old.model_copy(update={"desired_replicas": first, "recommendations": seed})
        elif current is Mode.Advisory:
            pools[role] = old.model_copy(update={"desired_replicas": clamp(spec.pool(role).replicas, block)})
        else:
            pools[role] = old.model_copy(update={"desired_replicas": clamp(old.desired_replicas, block)})
    return AutoscalingStatus(
        mode=current.value,
        last_evaluated=previous.last_evaluated if previous is not None else None,
        pools=AutoscalingPoolsStatus(**pools),
    )


def pool_sizes(spec: PDDeploymentSpec, state: AutoscalingStatus | None) -> dict[str, int | None]:
    """The size each pool should have by the decision (before any drain holds a scale-down back):
    the sizing chain's first stage, `tandem.sizing.decided_sizes`. `None` for external pools."""
    return sizing.decided_sizes(spec, state)


def decision_due(
    state: AutoscalingStatus | None,
    interval: float,
    now: float,
    generation: int,
    decided_generation: int | None,
) -> bool:
    """A decision is due once per interval, and at once after a spec change (a new generation)."""
    if state is None or state.last_evaluated is None or decided_generation != generation:
        return True
    return now - state.last_evaluated >= interval or now < state.last_evaluated


def seconds_until_due(state: AutoscalingStatus | None, interval: float, now: float) -> float:
    if state is None or state.last_evaluated is None:
        return 0.0
    return max(0.0, state.last_evaluated + interval - now)
