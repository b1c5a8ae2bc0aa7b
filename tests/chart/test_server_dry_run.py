"""Every object the chart renders, for several values, passes the real apiserver's validation
(server-side dry-run apply: schemas, RBAC rule shapes, the CRD's structural schema and CEL)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tandem.devcluster.handle import ClusterHandle

from .helm import template

pytestmark = pytest.mark.cluster

CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"rbac": {"clusterReadOnly": True}},
    "ha-tuned": {
        "replicaCount": 2,
        "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
        "operator": {"probePort": 9090, "workers": 2, "extraEnv": [{"name": "X", "value": "1"}]},
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                              "labelSelector": {"matchLabels": {"app": "x"}}}}]}},
    },
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_objects_pass_server_side_validation(
    cluster: ClusterHandle, namespace: str, case: str
) -> None:
    values = dict(CASES[case])
    if case == "namespaced":
        values["watchNamespaces"] = [namespace]
    rendered = template(values, release=f"dry-{case}", namespace=namespace)
    # Pods are admitted only when their ServiceAccount exists, which a dry run does not create.
    accounts = [o for o in rendered.objects if o["kind"] == "ServiceAccount"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(accounts))
    docs = yaml.safe_dump_all(rendered.objects)
    out = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--dry-run=server", "--field-manager=chart-test",
        "-f", "-", input=docs, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    applied = [line for line in out.stdout.splitlines() if "serverside-applied (server dry run)" in line]
    assert len(applied) == len(rendered.objects), out.stdout
