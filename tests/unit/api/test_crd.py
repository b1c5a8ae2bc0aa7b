"""The committed CRD is the generated one, and it is a structural schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tandem.api import crdgen, rules
from tandem.api.status import DisaggregationStatus, PDDeploymentStatus

CRD_PATH = Path(__file__).parents[3] / "crds" / "pddeployment.yaml"
FORBIDDEN_KEYS = {"$ref", "definitions", "$defs", "anyOf", "oneOf", "allOf", "title", "nullable"}


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.items():
            found += walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += walk(value, f"{path}[{i}]")
    return found


def test_committed_crd_is_current() -> None:
    assert CRD_PATH.read_text() == crdgen.crd_yaml(), "crds/pddeployment.yaml is stale: run `make crd`"


def schema() -> dict[str, Any]:
    schema: dict[str, Any] = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_schema_is_structural() -> None:
    for path, node in walk(schema()):
        if ".properties." in path and path.rsplit(".", 2)[-2] == "properties":
            assert "type" in node or node.get("x-kubernetes-int-or-string"), f"untyped node at {path}"
        assert not (FORBIDDEN_KEYS & set(node)) or path.endswith("x-kubernetes-validations"), path
        assert node.get("additionalProperties") is not False, path


def test_every_rule_is_in_the_crd() -> None:
    spec_rules = schema()["properties"]["spec"]["x-kubernetes-validations"]
    assert [r["message"] for r in spec_rules] == [r.message for r in rules.SPEC_RULES]
    assert schema()["x-kubernetes-validations"][0]["rule"] == rules.NAME_RULE.cel


def test_defaults_are_in_the_schema() -> None:
    spec = schema()["properties"]["spec"]["properties"]
    assert spec["kvTransfer"]["properties"]["connector"]["default"] == "NixlConnector"
    assert spec["serving"]["properties"]["mode"]["default"] == "Disaggregated"
    assert spec["prefill"]["properties"]["tensorParallelSize"]["default"] == 1


def test_names_and_printer_columns() -> None:
    crd = crdgen.crd()
    assert crd["metadata"]["name"] == "pddeployments.tandem.dev"
    assert crd["spec"]["names"]["shortNames"] == ["pdd"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:3] == ["Mode", "Prefill", "Decode"]
    assert "Ready" in columns
    assert "Autoscaling" in columns
    # One line on a terminal: at most 8 columns without -o wide (NAME comes on top).
    assert len([c for c in version["additionalPrinterColumns"] if not c.get("priority")]) <= 7
    assert columns[-1] == "Age"
    wide = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"] if c.get("priority")}
    assert wide["Rev Rollout"] == ".status.revisions.rollout.phase", "a revision rollout's phase"
    assert wide["Rev Weight"] == ".status.revisions.weight"
    assert wide["Disaggregation"] == ".status.disaggregation.mode", (
        "spec.router.disaggregation's mode in effect"
    )
    conditions = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_every_printer_column_reads_a_field_of_the_schema_of_its_type() -> None:
    """A column whose jsonPath names no field prints nothing forever: each plain path (no filter) under
    spec or status must be a property of the CRD's schema, of the column's type."""
    version = crdgen.crd()["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    checked = []
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"]
        if "[" in path or path.startswith(".metadata."):
            continue
        node = root
        for part in path.strip(".").split("."):
            assert part in node.get("properties", {}), (column["name"], path, part)
            node = node["properties"][part]
        assert node.get("type") == column["type"], (column["name"], node.get("type"))
        checked.append(column["name"])
    assert "Disaggregation" in checked
    assert len(checked) >= 12


def test_the_disaggregation_column_reads_the_status_the_operator_writes() -> None:
    status = PDDeploymentStatus(disaggregation=DisaggregationStatus(mode="Auto"))
    dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["disaggregation"]["mode"] == "Auto"


def test_exclusive_bounds_are_openapi_v3_flags() -> None:
    """Kubernetes' JSONSchemaProps has boolean exclusiveMinimum/Maximum; a number there fails the CRD."""
    for path, node in walk(schema()):
        for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if key in node and not path.endswith(".properties"):
                assert node[key] is True, path
                assert bound in node, path
    slo = schema()["properties"]["spec"]["properties"]["slo"]["properties"]
    assert (
        slo["attainmentPercent"].items() >= {"minimum": 0, "exclusiveMinimum": True, "maximum": 100}.items()
    )


def test_crd_yaml_round_trips() -> None:
    assert yaml.safe_load(crdgen.crd_yaml()) == crdgen.crd()
