"""Proof that the dev cluster is a real Kubernetes: scheduling, GC, helm, Prometheus, loopback IPs."""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import eventually, pods, runner_test_pod

pytestmark = pytest.mark.cluster

RDMA_NODES = {f"h100-rdma-{i}" for i in range(4)}
TESTDATA = Path(__file__).parent / "testdata"


def gpu_pod(name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "command": ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
            **spec,
        },
    }


def wait_no_gpu_pods_on(core: Any, nodes: set[str]) -> None:
    """Tests share the cluster; pods of earlier tests' namespaces may still be going away."""

    def idle() -> bool:
        for p in kube.raw(core.list_pod_for_all_namespaces(_preload_content=False))["items"]:
            if p["spec"].get("nodeName") in nodes and p["status"].get("phase") in ("Pending", "Running"):
                limits = p["spec"]["containers"][0].get("resources", {}).get("limits", {})
                if "nvidia.com/gpu" in limits:
                    return False
        return True

    eventually(idle, timeout=120, what=f"no GPU pods left on {sorted(nodes)}")


def test_gpu_statefulset_lands_only_where_gpus_are_free(
    cluster: ClusterHandle, namespace: str, core: Any
) -> None:
    wait_no_gpu_pods_on(core, RDMA_NODES)
    # Take all 8 GPUs of one RDMA node first.
    core.create_namespaced_pod(
        namespace, gpu_pod("hog", 8, nodeSelector={"kubernetes.io/hostname": "h100-rdma-0"})
    )
    eventually(lambda: pods(core, namespace)[0]["status"].get("phase") == "Running", what="hog Running")

    template = gpu_pod("x", 8, nodeSelector={"network.tandem.dev/rdma": "true"})
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "decode"},
        "spec": {
            "replicas": 3,
            "serviceName": "decode",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "decode"}},
            "template": {"metadata": {"labels": {"app": "decode"}}, "spec": template["spec"]},
        },
    }
    apps = client.AppsV1Api(core.api_client)
    apps.create_namespaced_stateful_set(namespace, sts)

    def three_ready() -> list[dict[str, Any]] | None:
        ps = [p for p in pods(core, namespace, "app=decode") if kube.is_ready(p)]
        return ps if len(ps) == 3 else None

    ready = eventually(three_ready, what="3 ready decode replicas")
    nodes = sorted(p["spec"]["nodeName"] for p in ready)
    assert nodes == ["h100-rdma-1", "h100-rdma-2", "h100-rdma-3"]

    # A fourth replica has nowhere to go.
    apps.patch_namespaced_stateful_set_scale("decode", namespace, {"spec": {"replicas": 4}})
    pending = eventually(
        lambda: next(
            (p for p in pods(core, namespace, "app=decode") if p["metadata"]["name"] == "decode-3"), None
        ),
        what="decode-3 created",
    )
    assert "nodeName" not in pending["spec"]


def test_pod_asking_for_nine_gpus_stays_pending_with_the_schedulers_reason(namespace: str, core: Any) -> None:
    core.create_namespaced_pod(namespace, gpu_pod("too-big", 9))

    def unschedulable() -> dict[str, Any] | None:
        pod = pods(core, namespace)[0]
        for c in pod["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
                return dict(c)
        return None

    cond = eventually(unschedulable, what="PodScheduled=False/Unschedulable")
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    time.sleep(2)
    pod = pods(core, namespace)[0]
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]


def test_deleting_an_owner_garbage_collects_its_children(namespace: str, core: Any) -> None:
    apps = client.AppsV1Api(core.api_client)
    apps.create_namespaced_deployment(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]},
                },
            },
        },
    )
    eventually(
        lambda: len([p for p in pods(core, namespace, "app=web") if kube.is_ready(p)]) == 2, what="2 pods"
    )
    assert kube.raw(apps.list_namespaced_replica_set(namespace, _preload_content=False))["items"]

    apps.delete_namespaced_deployment("web", namespace, propagation_policy="Background")

    def all_gone() -> bool:
        rs = kube.raw(apps.list_namespaced_replica_set(namespace, _preload_content=False))["items"]
        return not rs and not pods(core, namespace, "app=web")

    eventually(all_gone, what="ReplicaSet and pods garbage-collected")


def test_helm_install_of_a_small_chart(cluster: ClusterHandle, namespace: str, core: Any) -> None:
    assert "v3." in cluster.helm("version", "--short").stdout
    out = cluster.helm(
        "install", "smoke", str(TESTDATA / "smoke-chart"), "-n", namespace, "--wait", "--timeout", "3m"
    )
    assert "STATUS: deployed" in out.stdout, out.stdout
    releases = json.loads(cluster.helm("list", "-n", namespace, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [("smoke", "deployed")]
    cm = core.read_namespaced_config_map("smoke-config", namespace)
    assert cm.data["message"] == "hello from helm"
    assert cm.data["kubeVersion"].startswith("v1.36")
    ready = [p for p in pods(core, namespace, "app.kubernetes.io/instance=smoke") if kube.is_ready(p)]
    assert len(ready) == 2
    cluster.helm("uninstall", "smoke", "-n", namespace, "--wait")


def test_kubectl_sees_a_real_server_version(cluster: ClusterHandle) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.36.")
    assert version["serverVersion"]["minor"] == "36"


def test_prometheus_reports_a_runner_pod_target_up(cluster: ClusterHandle, namespace: str, core: Any) -> None:
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9400",
        "prometheus.io/path": "/metrics",
    }
    core.create_namespaced_pod(namespace, runner_test_pod("metrics", annotations=annotations))
    pod = eventually(
        lambda: next((p for p in pods(core, namespace) if kube.is_ready(p)), None), what="pod Ready"
    )
    ip = pod["status"]["podIP"]

    def target_up() -> dict[str, Any] | None:
        with urllib.request.urlopen(f"{cluster.prometheus_url}/api/v1/targets?state=active", timeout=5) as r:
            targets = json.load(r)["data"]["activeTargets"]
        for t in targets:
            if t["labels"].get("pod") == "metrics" and t["labels"].get("namespace") == namespace:
                return dict(t) if t["health"] == "up" else None
        return None

    target = eventually(target_up, timeout=120, what="Prometheus target up")
    assert target["scrapeUrl"] == f"http://{ip}:9400/metrics"

    query = urllib.parse.urlencode({"query": f'up{{namespace="{namespace}",pod="metrics"}}'})
    with urllib.request.urlopen(f"{cluster.prometheus_url}/api/v1/query?{query}", timeout=5) as r:
        result = json.load(r)["data"]["result"]
    assert [x["value"][1] for x in result] == ["1"]


def test_pod_ips_are_loopback(namespace: str, core: Any) -> None:
    core.create_namespaced_pod(namespace, gpu_pod("plain", 1))
    core.create_namespaced_pod(namespace, runner_test_pod("own"))
    ready = eventually(
        lambda: ps if len(ps := [p for p in pods(core, namespace) if kube.is_ready(p)]) == 2 else None,
        what="both pods Ready",
    )
    for p in ready:
        ip = ipaddress.ip_address(p["status"]["podIP"])
        assert ip in ipaddress.ip_network("127.0.0.0/8"), p["metadata"]["name"]
        assert p["status"]["hostIP"] == "127.0.0.1"
