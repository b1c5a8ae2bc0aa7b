"""LeaderWorkerSet on the dev cluster: LWS's own controller and webhooks (built from its Go module),
started on the worker's cluster by `devcluster.start_lws`, and the pod runner resolving the leader
address it injects.

One LeaderWorkerSet of two groups (size 2: a leader and one worker each) on the fake GPU nodes; its
pods are `tandem dev testserver` processes. The worker's serves only once it has fetched the
leader's `/env` from `http://$(LWS_LEADER_ADDRESS):9400`. The tests run in order on that one object:
the StatefulSets and the env LWS makes, the worker reaching its leader, a deleted worker taking its
whole group down and back (RecreateGroupOnPodRestart), and a scale from 2 groups to 1.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tandem.devcluster import kube, lws
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import POD_IP, eventually, pods, scratch_namespace

pytestmark = pytest.mark.cluster

NAME = "mn"
PORT = 9400
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def ns(lws: ClusterHandle) -> Iterator[str]:
    with scratch_namespace(lws, f"t-lws-{uuid.uuid4().hex[:6]}") as name:
        yield name


@pytest.fixture(scope="module")
def core(lws: ClusterHandle) -> Iterator[client.CoreV1Api]:
    api = lws.api_client()
    yield client.CoreV1Api(api)
    kube.close(api)


@pytest.fixture(scope="module")
def api(lws: ClusterHandle) -> Iterator[client.ApiClient]:
    api = lws.api_client()
    yield api
    kube.close(api)


def _template(*args: str) -> dict[str, Any]:
    return {
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT},
            "containers": [
                {
                    "name": "main",
                    "image": "tandem:dev",
                    "command": ["tandem", "dev", "testserver"],
                    "args": ["--host", "$(POD_IP)", "--port", str(PORT), *args],
                    "env": [{"name": "POD_IP", **POD_IP}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "ports": [{"name": "http", "containerPort": PORT}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
                }
            ],
        }
    }


def leader_worker_set(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{lws.GROUP}/{lws.VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": 2,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _template(),
                # The worker is Ready once it fetched its leader's /env at the address LWS injects.
                "workerTemplate": _template("--peer", f"http://$(LWS_LEADER_ADDRESS):{PORT}/env"),
            },
        },
    }


def _by_name(core: client.CoreV1Api, ns: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in pods(core, ns) if not p["metadata"].get("deletionTimestamp")}


def _all_ready(core: client.CoreV1Api, ns: str, names: set[str]) -> dict[str, dict[str, Any]] | None:
    current = _by_name(core, ns)
    if set(current) == names and all(kube.is_ready(p) for p in current.values()):
        return current
    return None


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        body: bytes = r.read()
        return body


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


GROUPS = {f"{NAME}-0", f"{NAME}-0-1", f"{NAME}-1", f"{NAME}-1-1"}


@pytest.fixture(scope="module")
def group_pods(api: client.ApiClient, core: client.CoreV1Api, ns: str) -> dict[str, dict[str, Any]]:
    """The LeaderWorkerSet, created once; its four pods once all are Ready."""
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        lws.GROUP, lws.VERSION, ns, lws.PLURAL, leader_worker_set(2)
    )
    return eventually(lambda: _all_ready(core, ns, GROUPS), timeout=120, what="4 LWS pods Ready")


def test_lws_makes_a_leader_statefulset_and_one_worker_statefulset_per_group(
    api: client.ApiClient, ns: str, group_pods: dict[str, dict[str, Any]]
) -> None:
    apps = client.AppsV1Api(api)
    sets = {s.metadata.name: s for s in apps.list_namespaced_stateful_set(ns).items}
    assert set(sets) == {NAME, f"{NAME}-0", f"{NAME}-1"}
    assert sets[NAME].spec.replicas == 2  # the leaders, one per group
    assert sets[f"{NAME}-0"].spec.replicas == 1  # each group's workers: size - 1
    assert sets[f"{NAME}-1"].spec.replicas == 1
    # Every pod is on a fake GPU node.
    assert {p["spec"]["nodeName"] for p in group_pods.values()} <= {
        n["metadata"]["name"]
        for n in kube.list_nodes(api)
        if n["metadata"]["labels"].get("nvidia.com/gpu.product") == GPU_PRODUCT
    }


def test_lws_webhook_injects_the_group_env(ns: str, group_pods: dict[str, dict[str, Any]]) -> None:
    for group in (0, 1):
        leader, worker = group_pods[f"{NAME}-{group}"], group_pods[f"{NAME}-{group}-1"]
        address = f"{NAME}-{group}.{NAME}.{ns}"
        assert _env(leader)["LWS_LEADER_ADDRESS"] == address
        assert _env(worker)["LWS_LEADER_ADDRESS"] == address
        assert _env(leader)["LWS_GROUP_SIZE"] == _env(worker)["LWS_GROUP_SIZE"] == "2"
        assert _env(leader)["LWS_WORKER_INDEX"] == "0"
        assert _env(worker)["LWS_WORKER_INDEX"] == "1"
        # The process sees the leader pod's loopback IP in place of the DNS name (`poddns`).
        process_env = json.loads(_get(f"http://{worker['status']['podIP']}:{PORT}/env"))
        assert process_env["LWS_LEADER_ADDRESS"] == leader["status"]["podIP"]
        assert process_env["LWS_WORKER_INDEX"] == "1"


def test_worker_reaches_its_leader_at_the_resolved_leader_address(
    group_pods: dict[str, dict[str, Any]],
) -> None:
    for group in (0, 1):
        leader, worker = group_pods[f"{NAME}-{group}"], group_pods[f"{NAME}-{group}-1"]
        fetched = json.loads(_get(f"http://{worker['status']['podIP']}:{PORT}/peer"))
        assert fetched["HOSTNAME"] == leader["metadata"]["name"]
        assert fetched["TANDEM_POD_IP"] == leader["status"]["podIP"]


def test_deleting_a_worker_recreates_its_whole_group(
    core: client.CoreV1Api, ns: str, group_pods: dict[str, dict[str, Any]]
) -> None:
    before = _by_name(core, ns)
    core.delete_namespaced_pod(f"{NAME}-1-1", ns)

    def recreated() -> dict[str, dict[str, Any]] | None:
        now = _all_ready(core, ns, GROUPS)
        if now is None:
            return None
        new = {n for n in GROUPS if now[n]["metadata"]["uid"] != before[n]["metadata"]["uid"]}
        return now if new == {f"{NAME}-1", f"{NAME}-1-1"} else None

    after = eventually(recreated, timeout=120, what="group 1 recreated (leader and worker), group 0 kept")
    fetched = json.loads(_get(f"http://{after[f'{NAME}-1-1']['status']['podIP']}:{PORT}/peer"))
    assert fetched["TANDEM_POD_IP"] == after[f"{NAME}-1"]["status"]["podIP"]


def test_scaling_from_two_groups_to_one_removes_a_whole_group(
    api: client.ApiClient, core: client.CoreV1Api, ns: str, group_pods: dict[str, dict[str, Any]]
) -> None:
    kept = _by_name(core, ns)
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        lws.GROUP, lws.VERSION, ns, lws.PLURAL, NAME, {"spec": {"replicas": 1}}
    )
    group0 = {f"{NAME}-0", f"{NAME}-0-1"}
    eventually(lambda: set(_by_name(core, ns)) == group0, timeout=90, what="group 1's pods gone")
    apps = client.AppsV1Api(api)
    eventually(
        lambda: {s.metadata.name for s in apps.list_namespaced_stateful_set(ns).items} == {NAME, f"{NAME}-0"},
        timeout=60,
        what="group 1's worker StatefulSet gone",
    )
    now = _by_name(core, ns)
    assert all(now[n]["metadata"]["uid"] == kept[n]["metadata"]["uid"] for n in group0)
