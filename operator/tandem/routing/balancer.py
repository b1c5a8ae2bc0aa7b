"""Which pod of a pool gets the next leg: least outstanding work by power-of-two choices.

Pure: no I/O and no clock (callers pass `now`), randomness from an injected `random.Random`.
Each pod's load is its outstanding requests and tokens; two random eligible pods are compared and
the lighter one wins. A pod whose leg failed is out of rotation until its quarantine ends (doubling
on repeated failures, reset by a success). When every pod of a pool is quarantined the least
recently failed one is still offered: a pool of one pod with one hiccup must not turn into a
ten-second outage.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class PodLoad:
    requests: int = 0
    tokens: int = 0
    failures: int = 0  # consecutive
    quarantined_until: float = 0.0

    def cost(self, tokens_per_request: float) -> float:
        return self.requests + self.tokens / tokens_per_request


@dataclass
class Balancer:
    """Per-pool load table. Pods are keyed by their base URL (e.g. `http://127.0.0.1:8000`)."""

    rng: random.Random = field(default_factory=random.Random)
    # How many outstanding tokens weigh as much as one outstanding request.
    tokens_per_request: float = 512.0
    quarantine_s: float = 5.0
    max_quarantine_s: float = 60.0
    _pools: dict[str, list[str]] = field(default_factory=dict)
    _loads: dict[str, PodLoad] = field(default_factory=dict)
    _turns: dict[str, int] = field(default_factory=dict)  # round-robin: picks made per pool

    def set_pool(self, role: str, pods: Iterable[str]) -> None:
        """Replaces a pool's members; load of pods still present (in any pool) is kept."""
        self._pools[role] = sorted(set(pods))
        live = {pod for members in self._pools.values() for pod in members}
        for pod in live:
            self._loads.setdefault(pod, PodLoad())
        for pod in [pod for pod, load in self._loads.items() if pod not in live and load.requests == 0]:
            del self._loads[pod]

    def pool(self, role: str) -> list[str]:
        return list(self._pools.get(role, ()))

    def load(self, pod: str) -> PodLoad:
        return self._loads.setdefault(pod, PodLoad())

    def pick(self, role: str, now: float, exclude: Iterable[str] = ()) -> str | None:
        """A pod of `role` not in `exclude`, or None when the pool has none left."""
        excluded = set(exclude)
        candidates = [pod for pod in self._pools.get(role, ()) if pod not in excluded]
        if not candidates:
            return None
        healthy = [pod for pod in candidates if self.load(pod).quarantined_until <= now]
        if not healthy:
            return min(candidates, key=lambda pod: (self.load(pod).quarantined_until, pod))
        if len(healthy) == 1:
            return healthy[0]
        first, second = self.rng.sample(healthy, 2)
        first_cost = self.load(first).cost(self.tokens_per_request)
        second_cost = self.load(second).cost(self.tokens_per_request)
        return second if second_cost < first_cost else first

    def pick_in_turn(self, role: str, now: float, exclude: Iterable[str] = ()) -> str | None:
        """Round-robin: the pool's next healthy pod not in `exclude`, in the pool's (sorted) order,
        load ignored; None when there is none (the caller falls back to `pick`)."""
        excluded = set(exclude)
        members = self._pools.get(role, [])
        if not members:
            return None
        turn = self._turns.get(role, 0)
        for step in range(len(members)):
            pod = members[(turn + step) % len(members)]
            if pod not in excluded and self.load(pod).quarantined_until <= now:
                self._turns[role] = turn + step + 1
                return pod
        return None

    def acquire(self, pod: str, tokens: int) -> None:
        load = self.load(pod)
        load.requests += 1
        load.tokens += tokens

    def release(self, pod: str, tokens: int) -> None:
        load = self._loads.get(pod)
        if load is None:
            return
        load.requests = max(0, load.requests - 1)
        load.tokens = max(0, load.tokens - tokens)

    def mark_failed(self, pod: str, now: float) -> float:
        """Takes the pod out of rotation; returns until when."""
        load = self.load(pod)
        load.failures += 1
        hold = min(self.quarantine_s * 2 ** (load.failures - 1), self.max_quarantine_s)
        load.quarantined_until = max(load.quarantined_until, now + hold)
        return load.quarantined_until

    def mark_ok(self, pod: str) -> None:
        load = self._loads.get(pod)
        if load is not None and load.failures:
            load.failures = 0
            load.quarantined_until = 0.0

    def healthy_count(self, role: str, now: float) -> int:
        return sum(1 for pod in self._pools.get(role, ()) if self.load(pod).quarantined_until <= now)
