"""Which pools the SLO autoscaler sizes, and its bounds on a size: one rule for the decision
(`decide`), the operator (`tandem.controller`) and the simulator (`tandem.sim.tandem_policy`). Pure.
"""

from __future__ import annotations

from tandem.api.meta import POOL_ROLES
from tandem.api.models import PDDeploymentSpec, PoolAutoscaling


def autoscaled_roles(spec: PDDeploymentSpec) -> list[str]:
    """Pools the SLO autoscaler decides for: autoscaling enabled, the pool's `autoscaling` bounds set,
    and the pool not handed to an external controller (`autoscaling.external`)."""
    if not spec.autoscaling.enabled:
        return []
    roles: list[str] = []
    for role in POOL_ROLES:
        bounds = spec.pool(role).autoscaling
        if bounds is not None and not bounds.external:
            roles.append(role)
    return roles


def clamp(replicas: int, bounds: PoolAutoscaling) -> int:
    """`replicas` within [minReplicas, maxReplicas]; minReplicas wins should the bounds cross."""
    return max(bounds.min_replicas, min(bounds.max_replicas, replicas))
