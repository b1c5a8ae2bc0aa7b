"""The request latency's serving process: one request at a time, first come first served."""

from __future__ import annotations

import pytest

from tandem.engine.ingress import IngressQueue


@pytest.mark.parametrize(
    ("arrivals", "waits"),
    [
        ([0.0], [0.004]),  # alone: its own work
        ([0.0, 0.0, 0.0], [0.004, 0.008, 0.012]),  # together: each behind those before it
        ([0.0, 0.002], [0.004, 0.006]),  # during the first one's work: the rest of it, then its own
        ([0.0, 0.010], [0.004, 0.004]),  # after the process went idle: its own work only
        ([5.0, 5.001, 9.0], [0.004, 0.007, 0.004]),
    ],
)
def test_waits(arrivals: list[float], waits: list[float]) -> None:
    queue = IngressQueue()
    assert [queue.admit(now, 0.004) for now in arrivals] == pytest.approx(waits)
