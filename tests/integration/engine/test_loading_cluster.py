"""TANDEM_SIM_LOAD_SECONDS through the dev cluster: the pod runner passes the pod's env, and the
engine's pod stays unready (its /health answers 503) until the simulated model load is over."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tandem.api import meta
from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import eventually, sim_engine_pod

from .harness import MODEL, NAME

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

LOAD_SECONDS = 10


def loading_pod() -> dict[str, Any]:
    return sim_engine_pod(
        "loading",
        labels={**meta.selector_labels("loading", "decode")},
        model=MODEL,
        args=["--host", "$(POD_IP)", "--port", str(meta.ENGINE_PORT), "--served-model-name", NAME],
        env=[
            {"name": "TANDEM_SIM_TIME_SCALE", "value": "0"},
            {"name": "TANDEM_SIM_LOAD_SECONDS", "value": str(LOAD_SECONDS)},
        ],
        limits={"nvidia.com/gpu": "1"},
    )


@pytest.fixture
def core(cluster: ClusterHandle) -> Iterator[client.CoreV1Api]:
    api = cluster.api_client()
    yield client.CoreV1Api(api)
    kube.close(api)


def health(ip: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{ip}:{meta.ENGINE_PORT}/health", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


def test_a_loading_engine_pod_is_unready_until_loaded(
    cluster: ClusterHandle, namespace: str, core: client.CoreV1Api
) -> None:
    core.create_namespaced_pod(namespace, loading_pod())

    def listening_ip() -> str | None:
        pod = core.read_namespaced_pod("loading", namespace)
        ip = pod.status.pod_ip
        return ip if ip and health(ip) is not None else None

    ip = eventually(listening_ip, timeout=240, what="the engine listening on its pod IP")
    assert health(ip) == 503  # listening, but loading

    def ready_pod() -> Any:
        pod = core.read_namespaced_pod("loading", namespace)
        ready = [c for c in pod.status.conditions or [] if c.type == "Ready" and c.status == "True"]
        return pod if ready else None

    pod = eventually(ready_pod, timeout=120, what="the pod Ready after its load")
    assert health(ip) == 200
    started = pod.status.container_statuses[0].state.running.started_at
    ready_at = next(c.last_transition_time for c in pod.status.conditions if c.type == "Ready")
    # Timestamps have whole seconds; the engine starts a moment after its container.
    assert (ready_at - started).total_seconds() >= LOAD_SECONDS - 1
