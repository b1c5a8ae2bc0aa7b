"""Discovery on the real local control plane: the router follows its PDDeployment's pods and spec.

Sim engine pods (run by the dev cluster's pod runner on loopback pod IPs) come and go; a
`tandem router --namespace NS --pddeployment NAME` process, given the cluster's kubeconfig like
the pod runner gives one, must route to exactly the Ready ones, by the serving mode its
PDDeployment sets. No operator runs here: the pods are made by hand, so only the router acts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tandem.api import meta
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import POD_IP, sim_engine_pod

from .sim import LOOPBACK, MODEL, NAME, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

PDD = "llm"
T = TypeVar("T")


def eventually(check: Callable[[], T | None], *, timeout: float = 120, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (OSError, urllib.error.URLError, ValueError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def engine_pod(name: str, role: str) -> dict[str, Any]:
    engine_args = ["--host", "$(POD_IP)", "--port", str(meta.ENGINE_PORT), "--served-model-name", NAME]
    engine_args += ["--max-model-len", "4096"]
    if role != "colocated":
        kv_role = {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
        engine_args += [
            "--kv-transfer-config",
            json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role}),
        ]
    return sim_engine_pod(
        name,
        labels={**meta.selector_labels(PDD, role)},  # type: ignore[arg-type]
        model=MODEL,
        args=engine_args,
        env=[
            {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", **POD_IP},
            {"name": "TANDEM_SIM_TIME_SCALE", "value": "0"},
        ],
        limits={"nvidia.com/gpu": "1", "rdma/hca": "1"},
    )


@pytest.fixture
def core(cluster: ClusterHandle) -> Iterator[client.CoreV1Api]:
    api = cluster.api_client()
    yield client.CoreV1Api(api)
    api.close()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def complete(router: str) -> tuple[int, Any]:
    body = json.dumps({"model": NAME, "prompt": "hello there", "max_tokens": 3}).encode()
    request = urllib.request.Request(router + "/v1/completions", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def start_router(cluster: ClusterHandle, namespace: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    command = [sys.executable, "-m", "tandem.cli", "router", "--namespace", namespace, "--pddeployment", PDD]
    command += ["--host", LOOPBACK, "--port", str(port)]
    router = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return router, f"http://{LOOPBACK}:{port}"


def has_endpoints(url: str, expected: dict[str, int]) -> bool:
    return bool(get_json(url + "/health")["endpoints"] == {**{r: 0 for r in meta.POOL_ROLES}, **expected})


def sample_of(url: str, name: str, **labels: str) -> float | None:
    """One sample of the router's /metrics, None when it has no such series."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def served(url: str, path: str) -> float:
    """`tandem_router_requests_total{path=..., code="2xx"}` as the router's /metrics shows it."""
    return sample_of(url, "tandem_router_requests_total", path=path, code="2xx") or 0.0


def draining_endpoints(url: str, role: str) -> float:
    return sample_of(url, "tandem_router_draining_endpoints", role=role) or 0.0


def test_router_follows_pods_as_they_come_and_go(
    cluster: ClusterHandle, namespace: str, core: client.CoreV1Api
) -> None:
    core.create_namespaced_pod(namespace, engine_pod("p0", "prefill"))
    core.create_namespaced_pod(namespace, engine_pod("d0", "decode"))
    router, url = start_router(cluster, namespace)

    def endpoints(expected: dict[str, int]) -> bool:
        return has_endpoints(url, expected)

    try:
        eventually(lambda: endpoints({"prefill": 1, "decode": 1}), timeout=240, what="p0 and d0 routable")
        assert get_json(url + "/ready")["synced"] is True
        status, answer = eventually(lambda: (r := complete(url))[0] == 200 and r, what="a P/D answer")
        assert len(answer["choices"][0]["text"].split()) == 3

        core.create_namespaced_pod(namespace, engine_pod("d1", "decode"))
        eventually(lambda: endpoints({"prefill": 1, "decode": 2}), timeout=240, what="d1 routable")

        # Draining (the autoscaler's mark on a pod it removes): out of rotation, back when unmarked.
        draining = {"metadata": {"annotations": {meta.ANNOTATION_DRAINING: "2026-11-30T09:00:00Z"}}}
        core.patch_namespaced_pod("d1", namespace, draining)
        eventually(lambda: endpoints({"prefill": 1, "decode": 1}), what="draining d1 out of rotation")
        assert draining_endpoints(url, "decode") == 1
        core.patch_namespaced_pod(
            "d1", namespace, {"metadata": {"annotations": {meta.ANNOTATION_DRAINING: None}}}
        )
        eventually(lambda: endpoints({"prefill": 1, "decode": 2}), what="d1 back in rotation")

        core.delete_namespaced_pod("d0", namespace)
        eventually(lambda: endpoints({"prefill": 1, "decode": 1}), what="d0 gone from rotation")
        for _ in range(3):
            assert complete(url)[0] == 200

        core.delete_namespaced_pod("p0", namespace)
        eventually(lambda: endpoints({"decode": 1}), what="p0 gone from rotation")
        status, body = complete(url)
        assert status == 503
        assert "prefill" in body["error"]["message"]
    finally:
        router.terminate()
        router.wait(timeout=30)


def pddeployment(mode: str) -> dict[str, Any]:
    pool = {"replicas": 1, "tensorParallelSize": 1}
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": PDD},
        "spec": {
            "model": {"name": NAME, "uri": f"hf://{MODEL}", "maxModelLen": 4096},
            "engine": {"type": "sim", "image": "tandem/sim:dev"},
            "prefill": pool,
            "decode": pool,
            "colocated": pool,
            "router": {"replicas": 1, "image": "tandem/sim:dev"},
            "serving": {"mode": mode},
        },
    }


def test_router_serves_by_its_pddeployment_serving_mode(
    cluster: ClusterHandle, crd: None, namespace: str, core: client.CoreV1Api
) -> None:
    api = cluster.api_client()
    custom = client.CustomObjectsApi(api)
    group, version, plural = "tandem.dev", "v1alpha1", "pddeployments"
    custom.create_namespaced_custom_object(group, version, namespace, plural, pddeployment("Colocated"))
    for name, role in (("p0", "prefill"), ("d0", "decode"), ("c0", "colocated")):
        core.create_namespaced_pod(namespace, engine_pod(name, role))
    router, url = start_router(cluster, namespace)
    try:
        every_pool = {"prefill": 1, "decode": 1, "colocated": 1}
        eventually(lambda: has_endpoints(url, every_pool), timeout=240, what="all three pods routable")
        eventually(lambda: complete(url)[0] == 200, what="a first answer")
        for _ in range(3):
            assert complete(url)[0] == 200
        assert served(url, "colocated") >= 4
        assert served(url, "disaggregated") == 0

        patch = {"spec": {"serving": {"mode": "Disaggregated"}}}
        custom.patch_namespaced_custom_object(group, version, namespace, plural, PDD, patch)
        eventually(
            lambda: complete(url)[0] == 200 and served(url, "disaggregated") > 0,
            what="requests served disaggregated after the mode change",
        )
        colocated = served(url, "colocated")
        for _ in range(3):
            assert complete(url)[0] == 200
        assert served(url, "colocated") == colocated  # every request since went prefill -> decode

        # spec.slo: the router judges requests by it from then on.
        within = "tandem_router_requests_within_slo_total"
        assert sample_of(url, within, path="disaggregated") is None
        patch = {"spec": {"slo": {"ttftMs": 30000, "tpotMs": 5000}}}
        custom.patch_namespaced_custom_object(group, version, namespace, plural, PDD, patch)
        eventually(
            lambda: sample_of(url, "tandem_router_slo_target_seconds", target="ttft") == 30.0,
            what="the router to read spec.slo",
        )
        for _ in range(2):
            assert complete(url)[0] == 200
        assert sample_of(url, within, path="disaggregated") == 2
    finally:
        router.terminate()
        router.wait(timeout=30)
        api.close()
