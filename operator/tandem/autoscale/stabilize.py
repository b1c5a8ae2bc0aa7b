"""Dead band, stabilization windows and step limits: what keeps a pool from flapping.

The Kubernetes HPA's algorithm (reference: rollout-autoscale-kopf.md section 2.1), per pool:
- dead band: while the replicas needed are within `dead_band` of the current size, recommend it;
- windows: every pass appends its (dead-banded, bounded) recommendation to a history kept in
  `status.autoscaling.pools.<pool>.recommendations`, pruned to the longer window. Scale up goes to
  the *lowest* recommendation within `scaleUp.stabilizationSeconds` (0: the current one, immediate);
  scale down only to the *highest* within `scaleDown.stabilizationSeconds`;
- steps: at most `scaleUp.maxStep` replicas added and `scaleDown.maxStep` removed per decision.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.api.status import Recommendation

MAX_HISTORY = 512  # PoolAutoscalingStatus.recommendations max_length


def within_dead_band(exact: float, current: int, tolerance: float) -> bool:
    """True when `exact` replicas needed are close enough to `current` to change nothing."""
    if current <= 0:
        return False
    return abs(exact / current - 1.0) <= tolerance


def record(
    history: Sequence[Recommendation], now: float, replicas: int, keep_seconds: float
) -> list[Recommendation]:
    """`history` with (now, replicas) appended, entries more than `keep_seconds` old (or from the
    future, after a clock step back) dropped, and at most MAX_HISTORY kept."""
    kept = [r for r in history if now - keep_seconds <= r.time <= now]
    kept.append(Recommendation(time=now, replicas=replicas))
    return kept[-MAX_HISTORY:]


def stabilized(
    history: Sequence[Recommendation], now: float, current: int, up_seconds: float, down_seconds: float
) -> int:
    """The size the windows allow, from `history` that already holds this pass's recommendation.

    HPA semantics: up = min of the recommendations within the up window, down = max within the down
    window (each window includes the current pass). Above current only if even the lowest recent one
    is; below current only if even the highest recent one is.
    """
    latest = history[-1].replicas if history else current
    up_window = [r.replicas for r in history if r.time >= now - up_seconds] or [latest]
    down_window = [r.replicas for r in history if r.time >= now - down_seconds] or [latest]
    up = min(up_window)
    down = max(down_window)
    if up > current:
        return up
    if down < current:
        return down
    return current


def limit_step(target: int, current: int, up_step: int, down_step: int) -> int:
    return max(current - down_step, min(current + up_step, target))
