"""The committed CRD is the generated one, and it is a structural schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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


def placed_rules(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every CEL rule under `spec` with the path (".prefill.parallelism") of the object it is on."""
    found = []
    for path, node in walk(spec):
        for rule in node.get("x-kubernetes-validations") or []:
            found.append((path.replace(".properties", ""), rule))
    return found


def spec_rules_placed() -> list[tuple[str, dict[str, Any]]]:
    """The rules of `rules.SPEC_RULES` where the CRD has them (the models' own field rules left out)."""
    messages = {r.message for r in rules.SPEC_RULES}
    return [(path, r) for path, r in placed_rules(schema()["properties"]["spec"]) if r["message"] in messages]


def test_every_rule_is_in_the_crd_once() -> None:
    placed = placed_rules(schema()["properties"]["spec"])
    own = placed_rules(crdgen.model_schema(crdgen.PDDeploymentSpec))  # the models' field rules
    assert sorted(r["message"] for _, r in placed) == sorted(
        [r.message for r in rules.SPEC_RULES] + [r["message"] for _, r in own]
    )
    assert schema()["x-kubernetes-validations"][0]["rule"] == rules.NAME_RULE.cel


def test_each_rule_names_the_same_field_where_it_is_placed() -> None:
    """A rule moved under spec reports the field it reported from spec (fieldPath is relative to the
    object the rule is on), and reads nothing outside that object."""
    by_message = {r.message: r for r in rules.SPEC_RULES}
    moved = 0
    for path, placed in spec_rules_placed():
        rule = by_message[placed["message"]]
        assert path + placed.get("fieldPath", "") == rule.field_path, rule.message
        moved += path != ""
        if path:
            assert f"self{path}." not in placed["rule"], placed["rule"]
    assert moved >= len(rules.SPEC_RULES) // 2  # most rules read one object: 72 of 103 today


# (rule at spec, its fieldPath) -> (the object it moves to, the rule there, its fieldPath there)
PLACEMENT_CASES = [
    # one pool's fields only: onto the pool
    (
        (
            "self.prefill.parallelism.data == 1 || "
            "self.prefill.parallelism.data % self.prefill.nodesPerInstance == 0",
            ".prefill.parallelism.data",
        ),
        (
            ("prefill",),
            "self.parallelism.data == 1 || self.parallelism.data % self.nodesPerInstance == 0",
            ".parallelism.data",
        ),
    ),
    # deeper when everything read is deeper
    (
        (
            "self.prefill.parallelism.loadBalancing == 'Internal' || self.prefill.parallelism.data > 1",
            ".prefill.parallelism.loadBalancing",
        ),
        (("prefill", "parallelism"), "self.loadBalancing == 'Internal' || self.data > 1", ".loadBalancing"),
    ),
    # but never below the field the refusal names
    (
        ("self.prefill.parallelism.data > 0", ".prefill.nodesPerInstance"),
        (("prefill",), "self.parallelism.data > 0", ".nodesPerInstance"),
    ),
    # fields of two objects: stays on spec, unchanged
    (
        (
            "self.engine.type != 'sim' || self.prefill.parallelism.pipeline == 1",
            ".prefill.parallelism.pipeline",
        ),
        (
            (),
            "self.engine.type != 'sim' || self.prefill.parallelism.pipeline == 1",
            ".prefill.parallelism.pipeline",
        ),
    ),
    # the object's own guard goes: a rule on it runs only where it is set
    (
        (
            "!has(self.rollout) || self.rollout.steps[0].weight > 0 || size(self.rollout.tenants) > 0",
            ".rollout.steps",
        ),
        (("rollout",), "self.steps[0].weight > 0 || size(self.tenants) > 0", ".steps"),
    ),
    # a guard on an object the rule does not stay within is kept
    (
        (
            "!has(self.prefill.autoscaling) || self.prefill.autoscaling.minReplicas <= self.prefill.replicas",
            ".prefill.replicas",
        ),
        (
            ("prefill",),
            "!has(self.autoscaling) || self.autoscaling.minReplicas <= self.replicas",
            ".replicas",
        ),
    ),
    # a method call is not a field: `steps.all` reads steps, on rollout
    (
        ("!has(self.rollout) || self.rollout.steps.all(a, a.weight >= 0)", ".rollout.steps"),
        (("rollout",), "self.steps.all(a, a.weight >= 0)", ".steps"),
    ),
    # a map's keys are not objects: the rule stops at the object holding the map
    (
        ("!('nvidia.com/gpu' in self.prefill.resources.requests)", ".prefill.resources"),
        (("prefill", "resources"), "!('nvidia.com/gpu' in self.requests)", ""),
    ),
]


@pytest.mark.parametrize(("given", "expected"), PLACEMENT_CASES)
def test_place_rule(given: tuple[str, str], expected: tuple[tuple[str, ...], str, str]) -> None:
    spec = crdgen.model_schema(crdgen.PDDeploymentSpec)
    assert crdgen.place_rule(*given, spec) == expected


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
