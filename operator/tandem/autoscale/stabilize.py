"""Dead band, stabilization windows and step limits: what keeps a pool from flapping.

The Kubernetes HPA's algorithm (reference: rollout-autoscale-kopf.md section 2.1), per pool:
- dead band: while the replicas needed are within `dead_band` of the current size, recommend it;
- windows: every pass appends its (dead-banded, bounded) recommendation to a history kept in
  `status.autoscaling.pools.<pool>.recommendations`, pruned to the longer window (plus the newest
  older entry, which shows that the history covers the window). Scale up goes to the *lowest*
  recommendation within `scaleUp.stabilizationSeconds` (0: the current one, immediate); scale down
  only to the *highest* within `scaleDown.stabilizationSeconds`, and only once the history covers
  that window: the first passes after the autoscaler starts on a pool (no history) never scale it
  down, unlike the HPA, which would on its first pass;
- steps: at most `scaleUp.maxStep` replicas added and `scaleDown.maxStep` removed per decision.

`fell_for_good` tells a descent from bursts: over a whole scale-down window, the load never came back
above a size once it had fallen to it. The policy then allows that size after a shorter window
(`scaleDown.descentStabilizationSeconds`): a load that has not returned within the window is not
expected back as soon as one that keeps returning.
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
    """`history` with (now, replicas) appended; entries more than `keep_seconds` old are dropped but
    the newest of them (it marks how far back the history goes), entries from the future (a clock
    stepped back) are dropped, and at most MAX_HISTORY are kept."""
    past = [r for r in history if r.time <= now]
    older = [r for r in past if r.time < now - keep_seconds]
    kept = older[-1:] + [r for r in past if r.time >= now - keep_seconds]
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
    covered = bool(history) and history[0].time <= now - down_seconds
    if not covered:
        down = max(down, current)
    if up > current:
        return up
    if down < current:
        return down
    return current


def fell_for_good(history: Sequence[Recommendation], now: float, window_seconds: float, level: int) -> bool:
    """True when `history` covers the last `window_seconds` and, from the newest entry before the
    window on (the window includes its start, as in `stabilized`), no recommendation above `level`
    follows one at or below it: a scale-down to `level` anywhere in the window would not have been
    undone. Bursts and flapping across `level` make it False; a steady or falling load, True."""
    start = now - window_seconds
    if not history or history[0].time > start:
        return False
    first = max((i for i, entry in enumerate(history) if entry.time < start), default=0)
    fell = False
    for entry in history[first:]:
        if entry.replicas <= level:
            fell = True
        elif fell:
            return False
    return True


def limit_step(target: int, current: int, up_step: int, down_step: int) -> int:
    return max(current - down_step, min(current + up_step, target))
