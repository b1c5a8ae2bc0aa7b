"""`spec.maxGPUs`, the one module that fits pools into it: two rules over one GPU count (`gpus_held`).

`arbitrate` is the autoscaler's rule (`decide()` calls it): what the autoscaled pools get when
their wanted sizes do not fit, by SLO deficit (below). `fit_budget` is the trade during a change
(the sizing chain calls it, `tandem.sizing`): while a mode or revision rollout holds both sides,
the side that gives way shrinks first. They are different rules (a grant by priority among
autoscaled pools within what other pools leave, against a shrink by side over every pool and both
revision pairs), so each keeps its own expectations; they share the count and the module.
`arbitrate`'s result is the decision (stage 1 of the chain), `fit_budget` the one cut of what the
chain produced: docs/architecture.md (One sizing chain) says why that is one enforcement, not two.

The autoscaler's rule: GPUs of pools the autoscaler does not size (fixed or external) are spent
first. When the pools' wanted sizes do not fit in the rest, each pool starts at its `minReplicas`
(never less, even if the minimums alone exceed the budget: then the condition says so) and
replicas are handed out one at a time; each time, among the pools still under their wanted size
whose next replica fits, the one with the highest priority gets it:
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


def gpus_held(sizes: Mapping[str, int], gpus_each: Mapping[str, int]) -> int:
    """GPUs `sizes` (replicas by pool key) hold; a key without a figure counts one GPU a replica."""
    return sum(n * gpus_each.get(key, 1) for key, n in sizes.items())


def gpus(sizes: Mapping[str, int], claims: Sequence[Claim]) -> int:
    return gpus_held(sizes, {c.role: c.gpus_per_replica for c in claims})


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


def fit_budget(
    sizes: Mapping[str, int],
    gpus_each: Mapping[str, int],
    order: Sequence[Sequence[str]],
    max_gpus: int,
) -> dict[str, int]:
    """`sizes` (replicas by pool key) made to fit `max_gpus` (capacity traded, not doubled): the pools
    of the first group in `order` give up replicas first, one at a time, the one holding the most GPUs
    first, then the next group's; never below one replica (a pool at 0 stays 0, one at 1 keeps its
    pod: an arm or pair that carries, or is about to carry, weight keeps a replica per pool). Sizes
    that cannot fit even so are returned as far as they could go (admission refuses such budgets)."""
    out = dict(sizes)
    for group in order:
        while gpus_held(out, gpus_each) > max_gpus:
            movable = [key for key in group if out.get(key, 0) > 1]
            if not movable:
                break
            key = max(movable, key=lambda k: (out[k] * gpus_each.get(k, 1), k))
            out[key] -= 1
    return out
