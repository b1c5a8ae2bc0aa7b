"""Pod Security Standards, judged by the real kube-apiserver's PodSecurity admission (built in and on
by default; the dev cluster does not disable it): in a namespace labelled
`pod-security.kubernetes.io/enforce: restricted`, the operator's pod (the chart's Deployment
template), the chart's `helm test` pod and the router's pod (rendered by the operator) are admitted,
and variants of the operator's and the router's pod that each break one rule are refused, so the
check can fail. Engine pods: a CPU sim engine meets
`baseline`; an RDMA engine needs IPC_LOCK, which `baseline` (and so every standard profile) refuses
(docs/security.md).

Server-side dry-run creates: admission runs in full, nothing is stored, no pod runs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeployment
from tandem.devcluster.handle import ClusterHandle
from tandem.render import render

from .helm import REPO, template

pytestmark = pytest.mark.cluster

ENFORCE = "pod-security.kubernetes.io/enforce"


def _pod(name: str, namespace: str, workload: dict[str, Any]) -> dict[str, Any]:
    tmpl = workload["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": tmpl["metadata"].get("labels", {})},
        "spec": copy.deepcopy(tmpl["spec"]),
    }


def _enforce(cluster: ClusterHandle, namespace: str, level: str) -> None:
    cluster.kubectl("label", "--overwrite", "namespace", namespace, f"{ENFORCE}={level}")


def _admit(cluster: ClusterHandle, pod: dict[str, Any]) -> tuple[bool, str]:
    out = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)
    return out.returncode == 0, out.stdout + out.stderr


def _service_account(cluster: ClusterHandle, namespace: str, pod: dict[str, Any]) -> None:
    name = pod["spec"].get("serviceAccountName")
    if name:
        cluster.kubectl("create", "serviceaccount", name, "-n", namespace, check=False)


def _pdd(path: Path, namespace: str) -> PDDeployment:
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = namespace
    doc["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    return PDDeployment.model_validate(doc)


def _workloads(pdd: PDDeployment) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["labels"]["tandem.dev/role"]: o
        for o in render(pdd)
        if o["kind"] in ("StatefulSet", "Deployment")
    }


def test_operator_and_router_pods_meet_the_restricted_standard(
    cluster: ClusterHandle, namespace: str
) -> None:
    _enforce(cluster, namespace, "restricted")
    chart = template({}, release="pss", namespace=namespace)
    operator = _pod("pss-operator", namespace, chart.get("Deployment", "pss-tandem"))
    hook = chart.get("Pod", "pss-tandem-test-health")  # `helm test` runs in the same namespace
    hook["metadata"]["namespace"] = namespace
    hook["metadata"].pop("annotations", None)
    router = _pod(
        "pss-router", namespace, _workloads(_pdd(REPO / "examples" / "sim-pd.yaml", namespace))["router"]
    )
    for pod in (operator, hook, router):
        _service_account(cluster, namespace, pod)
        admitted, out = _admit(cluster, pod)
        assert admitted, f"{pod['metadata']['name']} refused under restricted:\n{out}"

    # Each rule the two pods rely on, broken once: the apiserver refuses every variant.
    def broken(pod: dict[str, Any], how: str) -> dict[str, Any]:
        bad = copy.deepcopy(pod)
        spec, container = bad["spec"], bad["spec"]["containers"][0]
        if how == "seccomp":
            del spec["securityContext"]["seccompProfile"]
        elif how == "escalation":
            container["securityContext"]["allowPrivilegeEscalation"] = True
        elif how == "capabilities":
            container["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["NET_ADMIN"]}
        elif how == "root":
            del spec["securityContext"]["runAsNonRoot"]
            spec["securityContext"]["runAsUser"] = 0
        return bad

    for pod in (operator, router):
        for how in ("seccomp", "escalation", "capabilities", "root"):
            admitted, out = _admit(cluster, broken(pod, how))
            assert not admitted, f"{pod['metadata']['name']} with {how} broken was admitted"
            assert 'violates PodSecurity "restricted' in out, out


def test_engine_pods_cpu_sim_meets_baseline_and_rdma_needs_ipc_lock(
    cluster: ClusterHandle, namespace: str
) -> None:
    """No standard profile allows IPC_LOCK, which RDMA engines need to register pinned memory."""
    _enforce(cluster, namespace, "baseline")
    cpu = _workloads(_pdd(REPO / "examples" / "sim-pd.yaml", namespace))
    rdma = _workloads(_pdd(REPO / "examples" / "sim-pd-autoscaling.yaml", namespace))
    for role in ("prefill", "decode"):
        admitted, out = _admit(cluster, _pod(f"cpu-{role}", namespace, cpu[role]))
        assert admitted, f"CPU sim {role} refused under baseline:\n{out}"
        pod = _pod(f"rdma-{role}", namespace, rdma[role])
        assert pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        admitted, out = _admit(cluster, pod)
        assert not admitted, f"RDMA {role} admitted under baseline"
        assert 'violates PodSecurity "baseline' in out, out
        assert "IPC_LOCK" in out, out
