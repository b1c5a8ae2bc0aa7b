"""The operator's dashboard gauges from a PDDeployment's status (controller/metrics.observe_status)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tandem.controller import metrics


def value(name: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels)


@pytest.mark.parametrize(
    ("status", "share"),
    [
        ({"mode": "Disaggregated"}, 100),
        ({"mode": "Colocated"}, 0),
        ({"mode": "Colocated", "rollout": {"target": "Disaggregated", "weight": 30}}, 30),
        ({"mode": "Disaggregated", "rollout": {"target": "Colocated", "weight": 30}}, 70),
    ],
)
def test_weight_is_the_share_the_routers_send_disaggregated(status: dict[str, Any], share: int) -> None:
    metrics.observe_status("ns", "w", status)
    assert value("tandem_operator_disaggregated_weight_percent", namespace="ns", pddeployment="w") == share


def test_pools_and_revision_weight_then_forgotten() -> None:
    status = {
        "mode": "Disaggregated",
        "pools": {"prefill": {"readyReplicas": 2, "gpus": 4}, "decode": {"readyReplicas": 1, "gpus": 8}},
        "revisions": {"current": {"id": "abc"}, "weight": 50},
    }
    metrics.observe_status("ns", "p", status)
    labels = {"namespace": "ns", "pddeployment": "p"}
    assert value("tandem_operator_pool_ready_replicas", **labels, pool="prefill") == 2
    assert value("tandem_operator_pool_gpus", **labels, pool="decode") == 8
    assert value("tandem_operator_pool_gpus", **labels, pool="colocated") == 0
    assert value("tandem_operator_revision_weight_percent", **labels) == 50
    metrics.forget_status("ns", "p")
    assert value("tandem_operator_pool_gpus", **labels, pool="decode") is None
    assert value("tandem_operator_revision_weight_percent", **labels) is None


async def test_metrics_endpoint_serves_the_gauges() -> None:
    metrics.observe_status("ns-endpoint", "served", {"pools": {"decode": {"readyReplicas": 3, "gpus": 8}}})
    async with TestClient(TestServer(metrics.make_app(metrics.Health(max_silence=60)))) as client:
        response = await client.get("/metrics")
        assert response.status == 200
        text = await response.text()
    line = next(
        line
        for line in text.splitlines()
        if line.startswith("tandem_operator_pool_ready_replicas{")
        and 'pddeployment="served"' in line
        and 'pool="decode"' in line
    )
    assert line.endswith(" 3.0")
    metrics.forget_status("ns-endpoint", "served")
