"""The pod runner: tandem's own pods become local processes on their pod IP, like a kubelet runs them."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tandem.api import meta
from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import eventually, pods, runner_test_pod

pytestmark = pytest.mark.cluster


def _pid(pod: dict[str, Any]) -> int:
    cid = pod["status"]["containerStatuses"][0]["containerID"]
    assert cid.startswith("tandem://")
    return int(cid.removeprefix("tandem://"))


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def test_runner_starts_and_stops_a_process_with_its_pod(
    cluster: ClusterHandle, namespace: str, core: Any
) -> None:
    core.create_namespaced_secret(namespace, {"metadata": {"name": "tok"}, "stringData": {"token": "s3cret"}})
    body = runner_test_pod("web", "--ready-after", "2")
    body["spec"]["containers"][0]["env"].append(
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}}
    )
    core.create_namespaced_pod(namespace, body)

    # KWOK's tandem stage: Running with a pod IP, not Ready until /health answers.
    first = eventually(
        lambda: p if (p := pods(core, namespace)[0])["status"].get("podIP") else None, what="pod IP"
    )
    assert not kube.is_ready(first)
    pod = eventually(lambda: next((p for p in pods(core, namespace) if kube.is_ready(p)), None), what="Ready")
    ip = pod["status"]["podIP"]
    pid = _pid(pod)
    assert _alive(pid)
    assert "testserver" in Path(f"/proc/{pid}/cmdline").read_text()

    with urllib.request.urlopen(f"http://{ip}:9400/env", timeout=5) as r:
        env = json.load(r)
    assert env["TANDEM_POD_IP"] == ip
    assert env["POD_IP"] == ip
    assert env["TOKEN"] == "s3cret"
    assert Path(env["KUBECONFIG"]).read_text().count("https://127.0.0.1:") == 1
    assert "KUBERNETES_SERVICE_HOST" not in env

    files = list((cluster.dir / "pods").glob(f"{namespace}_web_*.log"))
    if cluster.owned:
        assert len(files) == 1
        assert f"--host {ip}" in files[0].read_text()

    logs = cluster.kubectl("logs", "-n", namespace, "web").stdout
    assert f"testserver on {ip}:9400" in logs

    core.delete_namespaced_pod("web", namespace)
    eventually(lambda: not pods(core, namespace), timeout=60, what="pod gone")
    eventually(lambda: not _alive(pid), timeout=30, what=f"process {pid} gone")


def test_runner_shows_a_crash_as_restart_count(namespace: str, core: Any) -> None:
    core.create_namespaced_pod(namespace, runner_test_pod("crashy", "--exit-after", "1", "--exit-code", "3"))

    def restarted() -> dict[str, Any] | None:
        p = pods(core, namespace)[0]
        statuses = p["status"].get("containerStatuses") or []
        return dict(statuses[0]) if statuses and statuses[0].get("restartCount", 0) >= 1 else None

    status = eventually(restarted, timeout=60, what="restartCount >= 1")
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["lastState"]["terminated"]["reason"] == "Error"

    def crash_looping() -> bool:
        p = pods(core, namespace)[0]
        st = p["status"]["containerStatuses"][0]
        return st.get("state", {}).get("waiting", {}).get(
            "reason"
        ) == "CrashLoopBackOff" and not kube.is_ready(p)

    eventually(crash_looping, timeout=60, what="CrashLoopBackOff and not Ready")


def test_pods_it_cannot_run_are_left_to_kwok(namespace: str, core: Any) -> None:
    body = runner_test_pod("vllm")
    body["spec"]["containers"][0]["command"] = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    body["spec"]["containers"][0]["args"] = []
    core.create_namespaced_pod(namespace, body)
    pod = eventually(lambda: next((p for p in pods(core, namespace) if kube.is_ready(p)), None), what="Ready")
    assert "containerID" not in pod["status"]["containerStatuses"][0]


def test_runner_runs_a_sim_engine_worker(cluster: ClusterHandle, namespace: str, core: Any) -> None:
    """The contract with the renderer: `tandem engine serve MODEL --host $(POD_IP) --port 8000`."""
    annotations = {
        meta.ANNOTATION_SCRAPE: "true",
        meta.ANNOTATION_SCRAPE_PORT: str(meta.ENGINE_PORT),
        meta.ANNOTATION_SCRAPE_PATH: "/metrics",
    }
    model = "meta-llama/Llama-3.1-8B-Instruct"
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "decode-0", "annotations": annotations},
            "spec": {
                "nodeSelector": {"network.tandem.dev/rdma": "true"},
                "containers": [
                    {
                        "name": "vllm",
                        "image": "tandem/sim:dev",
                        "command": ["tandem", "engine", "serve", model],
                        "args": ["--host", "$(POD_IP)", "--port", str(meta.ENGINE_PORT)],
                        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                        "resources": {"limits": {"nvidia.com/gpu": "1", "rdma/hca": "1"}},
                        "readinessProbe": {
                            "httpGet": {"path": "/health", "port": meta.ENGINE_PORT},
                            "periodSeconds": 5,
                        },
                    }
                ],
            },
        },
    )
    pod = eventually(lambda: next((p for p in pods(core, namespace) if kube.is_ready(p)), None), what="Ready")
    ip = pod["status"]["podIP"]
    with urllib.request.urlopen(f"http://{ip}:{meta.ENGINE_PORT}/v1/models", timeout=10) as r:
        assert json.load(r)["data"], "the engine serves no model"

    def scraped() -> bool:
        query = urllib.parse.urlencode({"query": f'up{{namespace="{namespace}",pod="decode-0"}}'})
        with urllib.request.urlopen(f"{cluster.prometheus_url}/api/v1/query?{query}", timeout=5) as r:
            return [x["value"][1] for x in json.load(r)["data"]["result"]] == ["1"]

    eventually(scraped, timeout=120, what="Prometheus scraping the engine")


def test_failing_liveness_probe_restarts_the_process(namespace: str, core: Any) -> None:
    body = runner_test_pod("sick", "--unhealthy-after", "2")
    body["spec"]["containers"][0]["livenessProbe"] = {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    core.create_namespaced_pod(namespace, body)

    def restarted() -> dict[str, Any] | None:
        statuses = pods(core, namespace)[0]["status"].get("containerStatuses") or []
        return dict(statuses[0]) if statuses and statuses[0].get("restartCount", 0) >= 1 else None

    status = eventually(restarted, timeout=60, what="a restart after failed liveness probes")
    assert status["lastState"]["terminated"]["exitCode"] == 143  # SIGTERM


def test_runner_reports_ready_again_when_someone_else_marks_the_pod_not_ready(
    namespace: str, core: Any
) -> None:
    """As a kubelet's status manager: the node lifecycle controller marks the pods of a node it found
    NotReady (after an apiserver outage, KWOK's node leases look stale) Ready=False; the runner, whose
    probes still pass, writes Ready=True back."""
    core.create_namespaced_pod(namespace, runner_test_pod("web"))
    pod = eventually(lambda: next((p for p in pods(core, namespace) if kube.is_ready(p)), None), what="Ready")
    condition = {"type": "Ready", "status": "False", "reason": "NodeNotReady", "lastTransitionTime": None}
    marked = core.patch_namespaced_pod_status(
        "web", namespace, {"status": {"conditions": [condition]}}, _preload_content=False
    )
    assert not kube.is_ready(kube.raw(marked)), "the patch did not mark the pod not ready"

    def ready_again() -> dict[str, Any] | None:
        current = pods(core, namespace)[0]
        return current if kube.is_ready(current) else None

    again = eventually(ready_again, timeout=30, what="Ready again")
    assert _pid(again) == _pid(pod), "the process was restarted: only its status should change"
