"""A pass over a PDDeployment whose namespace is being deleted, against the real apiserver and its
namespace controller: the apiserver refuses every create with 403 and the `NamespaceTerminating`
cause, the REST layer reads that cause, and the pass stops after its applies with no Stalled
status and no Warning (a cluster-wide operator met this when another team's namespace went away)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tandem.controller.events import EventRecorder
from tandem.controller.reconcile import Reconciler
from tandem.devcluster.handle import ClusterHandle
from tandem.kube.rest import EVENT, Kind, KubeError, KubeRest

pytestmark = pytest.mark.cluster

HOLD = "tandem.dev/test-hold"
CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")


@pytest.fixture
def terminating(cluster: ClusterHandle) -> Iterator[str]:
    """A namespace in phase Terminating, held there by a ConfigMap's finalizer until the test ends."""
    name = f"t-terminating-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    held = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "hold", "namespace": name, "finalizers": [HOLD]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(held))
    cluster.kubectl("delete", "namespace", name, "--wait=false")
    try:
        deadline = time.monotonic() + 60
        while True:
            phase = cluster.kubectl("get", "namespace", name, "-o", "jsonpath={.status.phase}").stdout
            if phase == "Terminating":
                break
            assert time.monotonic() < deadline, f"namespace {name} is {phase!r}, not Terminating"
            time.sleep(1)
        yield name
    finally:
        cluster.kubectl(
            "patch", "configmap", "hold", "-n", name, "--type", "json",
            "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]', check=False,
        )  # fmt: skip


def pdd(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {
            "name": "leaving",
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "generation": 1,
            "resourceVersion": "1",
        },
        "spec": {
            "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"type": "sim", "image": "img"},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1},
        },
    }


def test_a_create_in_a_terminating_namespace_is_read_as_such(
    cluster: ClusterHandle, terminating: str
) -> None:
    kube = KubeRest(cluster.api_client())
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "new", "namespace": terminating}}
    with pytest.raises(KubeError) as refused:
        kube.apply(CONFIG_MAP, config)
    assert refused.value.status == 403
    assert refused.value.namespace_terminating, (refused.value, refused.value.causes)
    assert kube.get(CONFIG_MAP, terminating, "new") is None


def test_a_pass_in_a_terminating_namespace_stops_quietly(
    cluster: ClusterHandle, terminating: str, caplog: pytest.LogCaptureFixture
) -> None:
    kube = KubeRest(cluster.api_client())
    reconciler = Reconciler(kube, EventRecorder(kube))
    with caplog.at_level(logging.INFO):
        result = reconciler.reconcile(pdd(terminating), "2026-12-01T00:00:00Z", 1.0)
    assert result.applied == []
    assert not result.status_written
    assert result.requeue_after is None, "the namespace controller deletes the object: no retry"
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("the namespace is being deleted" in r.getMessage() for r in caplog.records)
    assert kube.list(EVENT, terminating, "") == []
