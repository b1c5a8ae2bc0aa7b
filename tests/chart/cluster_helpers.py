"""Helpers for the chart's end-to-end tests: the example PDDeployment, CRD adoption by a release,
a kubeconfig that authenticates as a ServiceAccount, and an operator process running under it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tandem.devcluster.handle import ClusterHandle

from .helm import REPO

EXAMPLE = REPO / "examples" / "sim-pd.yaml"
CRD_NAME = "pddeployments.tandem.dev"


def example_manifest() -> dict[str, Any]:
    """The sim P/D example without its namespace, so it can be applied into a test namespace."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"].pop("namespace", None)
    return doc


def adopt_crd(cluster: ClusterHandle, release: str, namespace: str) -> None:
    """Make sure the CRD exists and mark it as the release's, as the chart README tells users who
    installed it with kubectl (tests share one cluster, where another test may have applied it)."""
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds" / "pddeployment.yaml")
    )
    cluster.kubectl(
        "annotate", "--overwrite", f"crd/{CRD_NAME}",
        f"meta.helm.sh/release-name={release}", f"meta.helm.sh/release-namespace={namespace}",
    )  # fmt: skip
    cluster.kubectl("label", "--overwrite", f"crd/{CRD_NAME}", "app.kubernetes.io/managed-by=Helm")


def service_account_kubeconfig(cluster: ClusterHandle, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig for the same apiserver that authenticates with a token of `sa` (TokenRequest)."""
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": server}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": "dev", "user": sa, "namespace": namespace}}],
        "current-context": sa,
    }
    path.write_text(yaml.safe_dump(config))
    return path
