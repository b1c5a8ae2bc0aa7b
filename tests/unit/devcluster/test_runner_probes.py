"""The pod runner's probe schedule: probed at most MAX_PROBE_PERIOD apart, but a liveness or startup
probe kills only after as long a run of failures as a kubelet's."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.devcluster.runner import MAX_PROBE_PERIOD, _Probe


@pytest.mark.parametrize(
    ("spec", "period", "kill_after", "failing_seconds"),
    [
        # the router's liveness probe: a kubelet kills after 20 s of failures (at 0, 10 and 20 s)
        ({"periodSeconds": 10, "failureThreshold": 3}, MAX_PROBE_PERIOD, 11, 20.0),
        ({}, MAX_PROBE_PERIOD, 11, 20.0),  # Kubernetes' defaults: 10 s, 3
        # an engine's startup budget: 60 probes 10 s apart
        ({"periodSeconds": 10, "failureThreshold": 60}, MAX_PROBE_PERIOD, 296, 590.0),
        # periods at or under the cap run as written
        ({"periodSeconds": 1, "failureThreshold": 2}, 1.0, 2, 1.0),
        ({"periodSeconds": 2, "failureThreshold": 3}, 2.0, 3, 4.0),
        ({"periodSeconds": 5, "failureThreshold": 1}, MAX_PROBE_PERIOD, 1, 0.0),
    ],
)
def test_a_kill_takes_a_kubelets_time_of_failures(
    spec: dict[str, Any], period: float, kill_after: int, failing_seconds: float
) -> None:
    probe = _Probe(spec, now=0.0)
    assert probe.period == period
    assert probe.kill_threshold == kill_after
    assert (probe.kill_threshold - 1) * probe.period == failing_seconds
