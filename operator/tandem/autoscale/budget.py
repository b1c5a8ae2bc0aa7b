"""`spec.maxGPUs`: share one GPU budget between the autoscaled pools by SLO deficit.

GPUs of pools the autoscaler does not size (fixed or external) are spent first. When the pools'
wanted sizes do not fit in the rest, each pool starts at its `minReplicas` (never less, even if the
minimums alone exceed the budget: then the condition says so) and replicas are handed out one at a
time; each time, among the pools still under their wanted size whose next replica fits, the one
with the highest priority gets it:
1. a pool keeping a replica it already runs comes before one adding a replica (no churn when the
   budget is merely full);
2. then the larger SLO deficit (latency at the quantile over its target, minus 1);
3. then the larger relative shortfall `(wanted - granted) / wanted`;
4. then the pool order prefill, decode, colocated.
A pool with the largest deficit thus gets every replica it wants before the next one gets any.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Claim:
    role: str
    wanted: int  # after windows and step limits, within [min_replicas, max_replicas]
    current: int
    min_replicas: int
    gpus_per_replica: int
    deficit: float  # >= 0


def gpus(sizes: Mapping[str, int], claims: Sequence[Claim]) -> int:
    per = {c.role: c.gpus_per_replica for c in claims}
    return sum(sizes[role] * per[role] for role in sizes)


def arbitrate(claims: Sequence[Claim], available: int) -> dict[str, int]:
    """Sizes within `available` GPUs, each at least its minimum (see the module docstring)."""
    wanted = {c.role: c.wanted for c in claims}
    if gpus(wanted, claims) <= available:
        return wanted
    granted = {c.role: min(c.min_replicas, c.wanted) for c in claims}
    left = available - gpus(granted, claims)
    order = {c.role: i for i, c in enumerate(claims)}
    while True:
        candidates = [
            c
            for c in claims
            if granted[c.role] < c.wanted and c.gpus_per_replica <= left and c.gpus_per_replica > 0
        ]
        free = [c for c in claims if granted[c.role] < c.wanted and c.gpus_per_replica <= 0]
        for c in free:  # a pool without GPUs costs nothing
            granted[c.role] = c.wanted
        if not candidates:
            return granted

        def priority(c: Claim) -> tuple[int, float, float, int]:
            keeping = 1 if granted[c.role] < c.current else 0
            shortfall = (c.wanted - granted[c.role]) / c.wanted
            return (keeping, c.deficit, shortfall, -order[c.role])

        best = max(candidates, key=priority)
        granted[best.role] += 1
        left -= best.gpus_per_replica
