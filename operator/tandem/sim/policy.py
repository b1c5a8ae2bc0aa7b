"""The policy hook: what the simulator asks every `interval_seconds` of virtual time.

A policy sees what a live autoscaler would (a `Snapshot` built from the simulator's Prometheus-like
windows) and the virtual `now`, and answers the replicas it wants per pool; pools it leaves out keep their
size. New replicas become ready after the layout's model load time; removed ones drain first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tandem.signals import Snapshot


class Policy(Protocol):
    interval_seconds: float

    def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
        """Desired replicas by role (`prefill`, `decode`, `colocated`)."""
        ...


@dataclass
class StaticPolicy:
    """Keeps the sizes it is given (empty: the layout's initial sizes), and records what it saw."""

    sizes: Mapping[str, int] = field(default_factory=dict)
    interval_seconds: float = 60.0
    seen: list[Snapshot] = field(default_factory=list)
    keep_snapshots: bool = False

    def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
        if self.keep_snapshots:
            self.seen.append(snapshot)
        return dict(self.sizes)


@dataclass
class ScheduledPolicy:
    """Sizes by time: at the first tick at or after each `at` second, the sizes given there (tests)."""

    steps: Sequence[tuple[float, Mapping[str, int]]]
    interval_seconds: float = 15.0

    def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
        current: dict[str, int] = {}
        for at, sizes in sorted(self.steps, key=lambda step: step[0]):
            if at <= now:
                current.update(sizes)
        return current
