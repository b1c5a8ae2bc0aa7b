"""Each CEL rule of the CRD, checked by the real apiserver: the rejection message names the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.testing import merge
from tandem.devcluster.handle import ClusterHandle

CASES = yaml.safe_load((Path(__file__).parents[2] / "data" / "invalid-specs.yaml").read_text())


def manifest(name: str, spec: dict[str, Any]) -> str:
    obj = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }
    return yaml.safe_dump(obj)


def test_valid_base_is_accepted_with_defaults(cluster: ClusterHandle, crd: None, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest("valid", CASES["base"]))
    got = yaml.safe_load(cluster.kubectl("get", "-n", namespace, "pdd/valid", "-o", "yaml").stdout)
    assert got["spec"]["kvTransfer"] == {
        "connector": "NixlConnector",
        "bandwidthGbps": 400,
        "loadFailurePolicy": "fail",
        "degradedBelowPercent": 50,
        "minJudgedTransferBytes": 128 * 1024 * 1024,
    }
    assert got["spec"]["network"]["rdma"]["resourceName"] == "rdma/hca"
    assert got["spec"]["router"]["resources"]["requests"]["cpu"] == "500m"


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["id"] for c in CASES["cases"]])
def test_apiserver_rejects_with_field_message(
    cluster: ClusterHandle, crd: None, namespace: str, case: dict[str, Any]
) -> None:
    text = manifest(case.get("name", "invalid"), merge(CASES["base"], case.get("spec", {})))
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=text, check=False)
    assert result.returncode != 0, result.stdout
    message = case["message"]
    for fragment in [message] if isinstance(message, str) else message:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize("case", CASES["valid"], ids=[c["id"] for c in CASES["valid"]])
def test_apiserver_accepts_the_valid_cases(
    cluster: ClusterHandle, crd: None, namespace: str, case: dict[str, Any]
) -> None:
    """The edges the Python predicates accept, the CEL accepts too (server-side dry run: nothing stays)."""
    text = manifest("valid-edge", merge(CASES["base"], case["spec"]))
    result = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=text, check=False)
    assert result.returncode == 0, result.stderr


def test_unknown_field_is_refused(cluster: ClusterHandle, crd: None, namespace: str) -> None:
    spec = merge(CASES["base"], {"prefill": {"replicaz": 2}})
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest("typo", spec), check=False)
    assert result.returncode != 0
    assert "replicaz" in result.stderr


def test_kubectl_get_wide_shows_the_disaggregation_mode(
    cluster: ClusterHandle, crd: None, namespace: str
) -> None:
    """The CRD's printer column, as the real apiserver's table and kubectl print it: status.disaggregation
    .mode under -o wide only; empty while the status has none (the mode absent: Always)."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest("columns", CASES["base"]))

    def table(*wide: str) -> dict[str, str]:
        lines = cluster.kubectl("get", "-n", namespace, "pdd/columns", *wide).stdout.splitlines()
        header, row = lines[0], lines[1]
        # Columns are padded by at least 3 spaces; a header may hold one ("PREFILL SHAPE").
        starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
        bounds = [*starts[1:], None]
        return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, bounds, strict=True)}

    assert "DISAGGREGATION" not in table()
    assert table("-o", "wide")["DISAGGREGATION"] == ""
    status = '{"status": {"disaggregation": {"mode": "Auto"}}}'
    cluster.kubectl(
        "patch", "-n", namespace, "pdd/columns", "--subresource=status", "--type=merge", "-p", status
    )
    assert table("-o", "wide")["DISAGGREGATION"] == "Auto"
