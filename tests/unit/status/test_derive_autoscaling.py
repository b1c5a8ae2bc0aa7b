"""AutoscalingActive, pools' replica sources and the measured SLO in derived status."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.api.models import PDDeployment
from tandem.api.status import AutoscalingStatus, Condition, ReplicaSource
from tandem.signals import PATH_COLOCATED, PATH_DISAGGREGATED, PathSignals, Snapshot
from tandem.status.derive import (
    AutoscalingView,
    ConditionValue,
    Observed,
    WorkloadState,
    autoscaling_condition,
    derive_status,
    measured_slo,
)

NOW = "2026-11-29T10:00:00Z"
URL = "http://127.0.0.1:9090"


def pdd(enabled: bool = True, decode: dict[str, Any] | None = None) -> PDDeployment:
    return PDDeployment.model_validate(
        {
            "metadata": {"name": "llama", "namespace": "ns", "uid": "u1", "generation": 4},
            "spec": {
                "model": {"name": "llama-8b", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"type": "sim", "image": "img"},
                "prefill": {"replicas": 1},
                "decode": {"replicas": 2, **({"autoscaling": decode} if decode is not None else {})},
                "slo": {"ttftMs": 500, "tpotMs": 50},
                "autoscaling": {"enabled": enabled},
            },
        }
    )


BOUNDED = {"minReplicas": 1, "maxReplicas": 4}
ACTING: ConditionValue = ("True", "Active", "decode 2 -> 3")


@pytest.mark.parametrize(
    ("spec", "view", "expected"),
    [
        (pdd(enabled=False), AutoscalingView(URL), None),  # nothing configured: no condition at all
        (
            pdd(enabled=False, decode={**BOUNDED, "external": True}),
            AutoscalingView(URL),
            ("False", "Disabled"),
        ),
        (pdd(decode={**BOUNDED, "external": True}), AutoscalingView(URL), ("False", "Disabled")),
        (pdd(decode=BOUNDED), AutoscalingView(None, ACTING), ("False", "PrometheusNotConfigured")),
        (pdd(decode=BOUNDED), AutoscalingView(URL, ACTING), ("True", "Active")),
        (pdd(decode=BOUNDED), AutoscalingView(URL, ("False", "Paused", "paused")), ("False", "Paused")),
        (pdd(decode=BOUNDED), AutoscalingView(URL, None), None),  # between decisions: keep the last
    ],
)
def test_autoscaling_condition(
    spec: PDDeployment, view: AutoscalingView, expected: tuple[str, str] | None
) -> None:
    got = autoscaling_condition(spec, view, [])
    assert (got[:2] if got else None) == expected


def test_disabling_flips_an_earlier_condition() -> None:
    before = Condition(type="AutoscalingActive", status="True", last_transition_time=NOW, reason="Active")
    got = autoscaling_condition(pdd(enabled=False), AutoscalingView(URL), [before])
    assert got is not None
    assert got[:2] == ("False", "Disabled")


def test_not_configured_message_says_how_to_fix_it() -> None:
    got = autoscaling_condition(pdd(decode=BOUNDED), AutoscalingView(None), [])
    assert got is not None
    assert "--prometheus-url" in got[2]
    assert "spec.autoscaling.prometheus.url" in got[2]


def test_status_carries_sources_state_slo_and_condition() -> None:
    state = AutoscalingStatus(mode="Active", last_evaluated=5.0)
    slo = measured_slo(
        Snapshot(
            observed_at=5.0,
            window_seconds=60,
            paths={PATH_DISAGGREGATED: PathSignals(2.0, 1.5, 0.42, 0.031)},
        ),
        NOW,
    )
    observed = Observed(
        workloads={"decode": WorkloadState(1, 1, 3, 3, 3)},
        desired_replicas={"prefill": 1, "decode": 3, "router": 1},
        sources={"prefill": ReplicaSource.spec, "decode": ReplicaSource.autoscaler},
        autoscaling=state,
        slo=slo,
        autoscaling_condition=ACTING,
    )
    status = derive_status(pdd(decode=BOUNDED), observed, [], NOW)
    assert status.pools.decode.source is ReplicaSource.autoscaler
    assert status.pools.decode.desired_replicas == 3
    assert status.pools.prefill.source is ReplicaSource.spec
    assert status.pools.colocated.source is ReplicaSource.spec
    assert status.autoscaling == state
    cond = next(c for c in status.conditions if c.type == "AutoscalingActive")
    assert (cond.status, cond.reason, cond.message, cond.observed_generation) == (
        "True",
        "Active",
        ACTING[2],
        4,
    )
    assert status.slo == slo


def test_measured_slo_in_ms_and_percent() -> None:
    snapshot = Snapshot(
        observed_at=5.0,
        window_seconds=60,
        paths={
            PATH_DISAGGREGATED: PathSignals(
                request_rate=3.0,
                within_slo_rate=2.85,
                ttft_seconds=0.4,
                tpot_seconds=0.03,
                local_prefill_rate=1.0,
                remote_prefill_rate=2.0,
            ),
            PATH_COLOCATED: PathSignals(request_rate=1.0, within_slo_rate=1.0, ttft_seconds=0.2),
        },
    )
    slo = measured_slo(snapshot, NOW)
    assert slo is not None
    assert (slo.ttft_ms, slo.tpot_ms, slo.attainment_percent) == (400.0, 30.0, 96.25)
    assert (slo.requests_per_second, slo.window_seconds, slo.observed_at) == (4.0, 60, NOW)
    assert slo.local_prefill_percent == 33.33  # of the P/D requests, prefilled on their decode pod
    assert slo.tpot_ms_by_concurrency == {}  # no bucketed latency measured: none shown


def test_measured_slo_by_bucket_in_ms() -> None:
    snapshot = Snapshot(
        observed_at=5.0,
        window_seconds=60,
        paths={PATH_DISAGGREGATED: PathSignals(request_rate=3.0, within_slo_rate=3.0, tpot_seconds=0.03)},
        latency_by_bucket={
            "ttft_by_input_length": {"1024-4096": 0.41234, "0-1024": 0.2},
            "tpot_by_output_length": {"0-128": 0.021},
            "tpot_by_concurrency": {"0-4": 0.02, "64-256": 0.0455},
            "itl_by_output_length": {"128-512": 0.019},
            "itl_by_concurrency": {"4-16": 0.0301},
            "ttft_by_prefill": {"remote": 0.25, "local": 0.0121},
            "tpot_by_prefill": {"local": 0.0305},
        },
    )
    slo = measured_slo(snapshot, NOW)
    assert slo is not None
    assert slo.ttft_ms_by_input_length == {"0-1024": 200.0, "1024-4096": 412.34}
    assert slo.tpot_ms_by_output_length == {"0-128": 21.0}
    assert slo.tpot_ms_by_concurrency == {"0-4": 20.0, "64-256": 45.5}
    assert slo.itl_ms_by_output_length == {"128-512": 19.0}
    assert slo.itl_ms_by_concurrency == {"4-16": 30.1}
    assert slo.ttft_ms_by_prefill == {"local": 12.1, "remote": 250.0}
    assert slo.tpot_ms_by_prefill == {"local": 30.5}
    shown = slo.model_dump(by_alias=True)
    assert shown["tpotMsByConcurrency"] == {"0-4": 20.0, "64-256": 45.5}


def test_no_data_measures_nothing() -> None:
    assert measured_slo(Snapshot(observed_at=5.0, window_seconds=60, missing=("down",)), NOW) is None
    idle = measured_slo(Snapshot(observed_at=5.0, window_seconds=60), NOW)
    assert idle is not None
    assert (idle.ttft_ms, idle.attainment_percent, idle.requests_per_second) == (None, None, 0.0)
    assert idle.local_prefill_percent is None
