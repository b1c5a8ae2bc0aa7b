"""End to end on the local cluster: `helm install` the chart, the operator pod becomes Ready and
reconciles the sim P/D example to Ready; then the same operator runs with only the chart's RBAC
(a token of its ServiceAccount) and reconciles a spec change without a single Forbidden."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess

from .cluster_helpers import (
    CRD_NAME,
    adopt_crd,
    example_manifest,
    service_account_kubeconfig,
)
from .helm import CHART

pytestmark = pytest.mark.cluster

RELEASE = "tandem"
FULLNAME = "tandem"  # the release name already contains the chart name


def get_json(cluster: ClusterHandle, namespace: str, *what: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cluster.kubectl("get", "-n", namespace, *what, "-o", "json").stdout)
    return out


def wait_ready(cluster: ClusterHandle, namespace: str, name: str, timeout: str = "300s") -> dict[str, Any]:
    """`kubectl wait --for=condition=Ready`, which also requires observedGeneration == generation."""
    out = cluster.run(
        "kubectl", "wait", "-n", namespace, "--for=condition=Ready", f"pdd/{name}", f"--timeout={timeout}",
        check=False, timeout=400,
    )  # fmt: skip
    pdd = get_json(cluster, namespace, "pdd", name)
    assert out.returncode == 0, f"{out.stderr}\nstatus: {json.dumps(pdd.get('status'), indent=1)}"
    assert f"pddeployment.tandem.dev/{name} condition met" in out.stdout
    return pdd


@pytest.mark.parametrize("cluster_reads", [True, False], ids=["cluster-reads", "no-cluster-scope"])
def test_helm_install_runs_an_operator_that_reconciles_the_example(
    cluster: ClusterHandle, namespace: str, tmp_path: Path, cluster_reads: bool
) -> None:
    """With rbac.clusterReadOnly=false the operator holds no cluster-scoped permission at all: kopf's
    cluster-wide scans are refused (and retried, then given up) and the operator still does its job."""
    adopt_crd(cluster, RELEASE, namespace)
    install = cluster.run(
        "helm", "install", RELEASE, str(CHART), "-n", namespace,
        "--set", f"watchNamespaces={{{namespace}}}", "--set", "operator.resyncSeconds=20",
        "--set", f"rbac.clusterReadOnly={str(cluster_reads).lower()}",
        "--wait", "--timeout", "3m", check=False, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    assert "STATUS: deployed" in install.stdout
    assert f"It reconciles PDDeployments in: {namespace}." in install.stdout  # NOTES.txt
    try:
        deployment = get_json(cluster, namespace, "deployment", FULLNAME)
        assert deployment["status"]["readyReplicas"] == 1
        pods = get_json(cluster, namespace, "pods", "-l", "app.kubernetes.io/component=operator")["items"]
        assert len(pods) == 1
        pod_ip = pods[0]["status"]["podIP"]
        assert pod_ip.startswith("127.")
        # `helm test`: the hook pod runs `tandem probe` (the pod runner runs it like any tandem pod).
        helm_test = cluster.run(
            "helm", "test", RELEASE, "-n", namespace, "--timeout", "3m", check=False, timeout=300
        )
        assert helm_test.returncode == 0, helm_test.stdout + helm_test.stderr
        assert "Phase:          Succeeded" in helm_test.stdout
        crd = get_json(cluster, namespace, "crd", CRD_NAME)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

        doc = example_manifest()
        name = doc["metadata"]["name"]
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
        pdd = wait_ready(cluster, namespace, name)
        assert pdd["status"]["phase"] == "Healthy"
        lease = get_json(cluster, namespace, "lease", FULLNAME)
        assert lease["spec"]["holderIdentity"] == pods[0]["metadata"]["name"]

        # helm upgrade to two replicas: both Ready, one leader, and the model stays Ready.
        upgrade = cluster.run(
            "helm", "upgrade", RELEASE, str(CHART), "-n", namespace, "--reuse-values",
            "--set", "replicaCount=2", "--wait", "--timeout", "3m", check=False, timeout=300,
        )  # fmt: skip
        assert upgrade.returncode == 0, upgrade.stderr
        pods = get_json(cluster, namespace, "pods", "-l", "app.kubernetes.io/component=operator")["items"]
        assert len(pods) == 2
        names = {p["metadata"]["name"] for p in pods}
        assert get_json(cluster, namespace, "lease", FULLNAME)["spec"]["holderIdentity"] in names
        wait_ready(cluster, namespace, name)

        # Now the operator with nothing but the chart's RBAC: hand the lease over and change the spec.
        cluster.kubectl("scale", "-n", namespace, f"deployment/{FULLNAME}", "--replicas=0")
        cluster.kubectl(
            "wait", "-n", namespace, "--for=delete", *(f"pod/{p}" for p in names), "--timeout=90s"
        )
        kubeconfig = service_account_kubeconfig(cluster, namespace, FULLNAME, tmp_path / "sa.kubeconfig")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        own = [a for a in args if not a.startswith(("--probe-host", "--probe-port", "--identity"))]
        operator = OperatorProcess(cluster, [*own, "--identity=sa-test"], tmp_path / "op.log", kubeconfig)
        try:
            operator.wait_leader()
            decode = doc["spec"]["decode"]["replicas"]
            patch = {"spec": {"decode": {"replicas": decode + 1}}}
            cluster.kubectl("patch", "-n", namespace, f"pdd/{name}", "--type=merge", "-p", json.dumps(patch))
            pdd = wait_ready(cluster, namespace, name)
            assert pdd["status"]["pools"]["decode"]["readyReplicas"] == decode + 1
            assert pdd["status"]["observedGeneration"] == pdd["metadata"]["generation"]
        finally:
            operator.stop()
        log = operator.log_text()
        refused = [line for line in log.splitlines() if "forbidden" in line.lower() or " 403 " in line]
        if cluster_reads:
            assert not refused, "\n".join(refused)
        else:  # only kopf's cluster-wide scans (CRDs, namespaces) were refused, nothing it reconciles
            assert refused
            stray = [
                line
                for line in refused
                if "customresourcedefinitions" not in line and "namespaces" not in line
            ]
            assert not stray, "\n".join(stray)
        assert "applied" in log, log[-4000:]  # it did write, as the ServiceAccount
    finally:
        cluster.run("helm", "uninstall", RELEASE, "-n", namespace, "--wait", check=False, timeout=200)
    # `helm.sh/resource-policy: keep`: the CRD (and so every PDDeployment) outlives the release.
    assert get_json(cluster, namespace, "crd", CRD_NAME)["metadata"]["name"] == CRD_NAME


def test_cluster_wide_rbac_lets_the_operator_reconcile_another_namespace(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    """The default install: a ClusterRole, no namespace list/watch. Run as the chart's
    ServiceAccount, the operator reconciles a PDDeployment in a namespace of its own to Ready."""
    models = f"{namespace[:50]}-m"
    adopt_crd(cluster, RELEASE, namespace)
    install = cluster.run(
        "helm", "install", RELEASE, str(CHART), "-n", namespace, "--set", "replicaCount=1",
        check=False, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    assert "It reconciles PDDeployments in every namespace." in install.stdout
    cluster.kubectl("create", "namespace", models)
    try:
        # The chart's own pod runs with the runner's admin credentials: keep it out of the way.
        cluster.kubectl("scale", "-n", namespace, f"deployment/{FULLNAME}", "--replicas=0")
        kubeconfig = service_account_kubeconfig(cluster, namespace, FULLNAME, tmp_path / "sa.kubeconfig")
        args = [f"--lease-namespace={namespace}", f"--lease-name={FULLNAME}", "--identity=cluster-wide-test"]
        operator = OperatorProcess(cluster, args, tmp_path / "op.log", kubeconfig)
        try:
            operator.wait_leader()
            doc = example_manifest()
            cluster.kubectl("apply", "-n", models, "-f", "-", input=yaml.safe_dump(doc))
            pdd = wait_ready(cluster, models, doc["metadata"]["name"])
            assert pdd["status"]["phase"] == "Healthy"
        finally:
            operator.stop()
        log = operator.log_text()
        refused = [line for line in log.splitlines() if "forbidden" in line.lower() or " 403 " in line]
        assert not refused, "\n".join(refused)
    finally:
        cluster.kubectl("delete", "namespace", models, "--wait=false", check=False)
        cluster.run("helm", "uninstall", RELEASE, "-n", namespace, "--wait", check=False, timeout=200)
