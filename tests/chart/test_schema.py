"""values.schema.json: it rejects bad values with a message naming the field, and it describes
exactly the keys values.yaml has (no undocumented or forgotten value)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from .helm import CHART, template, template_error

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())

BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown top-level key", {"replicas": 2}, "additional properties 'replicas' not allowed"),
    ("unknown nested key", {"crds": {"enabled": True}}, "additional properties 'enabled' not allowed"),
    ("zero replicas", {"replicaCount": 0}, "/replicaCount"),
    ("replicas as string", {"replicaCount": "2"}, "/replicaCount"),
    ("bad namespace name", {"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ("duplicate namespaces", {"watchNamespaces": ["a", "a"]}, "/watchNamespaces"),
    ("namespaces as a string", {"watchNamespaces": "a,b"}, "/watchNamespaces"),
    ("pull policy", {"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ("digest without algorithm", {"image": {"digest": "abc123"}}, "/image/digest"),
    ("empty repository", {"image": {"repository": ""}}, "/image/repository"),
    ("tag with a colon", {"image": {"tag": "v1:2"}}, "/image/tag"),
    ("privileged probe port", {"operator": {"probePort": 80}}, "/operator/probePort"),
    ("resync too short", {"operator": {"resyncSeconds": 1}}, "/operator/resyncSeconds"),
    ("no workers", {"operator": {"workers": 0}}, "/operator/workers"),
    (
        "negative grace",
        {"operator": {"unschedulableGraceSeconds": -1}},
        "/operator/unschedulableGraceSeconds",
    ),
    (
        "grace over a day",
        {"operator": {"unschedulableGraceSeconds": 86401}},
        "/operator/unschedulableGraceSeconds",
    ),
    ("extra args not strings", {"operator": {"extraArgs": [1]}}, "/operator/extraArgs/0"),
    ("env without a name", {"operator": {"extraEnv": [{"value": "x"}]}}, "/operator/extraEnv/0"),
    ("crds.install as a string", {"crds": {"install": "yes"}}, "/crds/install"),
    ("bad cpu quantity", {"resources": {"limits": {"cpu": "lots"}}}, "/resources/limits/cpu"),
    ("scrape interval without unit", {"podMonitor": {"interval": "30"}}, "/podMonitor/interval"),
    ("pdb as a word", {"podDisruptionBudget": {"minAvailable": "half"}}, "/podDisruptionBudget/minAvailable"),
    ("pull secret without a name", {"imagePullSecrets": [{}]}, "/imagePullSecrets/0"),
    ("fullname too long", {"fullnameOverride": "x" * 53}, "/fullnameOverride"),
    ("prometheus url without scheme", {"prometheus": {"url": "prometheus:9090"}}, "/prometheus/url"),
    ("prometheus url not http", {"prometheus": {"url": "ftp://prometheus"}}, "/prometheus/url"),
]


@pytest.mark.parametrize(
    ("values", "where"), [(v, w) for _, v, w in BAD_VALUES], ids=[n for n, _, _ in BAD_VALUES]
)
def test_schema_rejects_bad_values(values: dict[str, Any], where: str) -> None:
    error = template_error(values)
    assert "values don't meet the specifications of the schema" in error
    assert where in error, error


def test_service_account_name_required_when_not_created() -> None:
    error = template_error({"serviceAccount": {"create": False}})
    assert "serviceAccount.name is required" in error


def test_good_values_are_accepted() -> None:
    template({"replicaCount": 3, "watchNamespaces": ["a", "b-2"], "resources": {"limits": {"cpu": 2}}})


def leaves(node: Any, prefix: str = "") -> set[str]:
    """Dotted paths of values.yaml's keys, not descending into free-form maps and lists."""
    if not isinstance(node, dict) or not node:
        return {prefix}
    out: set[str] = set()
    for key, value in node.items():
        out |= leaves(value, f"{prefix}.{key}" if prefix else key)
    return out


def schema_accepts(path: str) -> bool:
    node = SCHEMA
    for part in path.split("."):
        props = node.get("properties")
        if props is not None and part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict) or node.get("additionalProperties") is None:
            # a free-form map (labels, requests) or an object passed through as is
            return node.get("type") == "object"
        else:
            return False
    return True


def test_every_value_is_in_the_schema() -> None:
    missing = sorted(p for p in leaves(VALUES) if not schema_accepts(p))
    assert not missing, f"values.yaml keys the schema does not describe: {missing}"


def test_every_schema_property_is_documented_in_values_yaml() -> None:
    text = (CHART / "values.yaml").read_text()

    def walk(node: dict[str, Any], prefix: str) -> list[str]:
        out = []
        for key, sub in (node.get("properties") or {}).items():
            path = f"{prefix}.{key}" if prefix else key
            if key != "global":
                out.append(path)
            out += walk(sub, path)
        return out

    paths = walk(SCHEMA, "")
    undocumented = [p for p in paths if f"{p.split('.')[-1]}:" not in text]
    assert not undocumented, undocumented
    # every top-level section and value carries a comment right above it
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#")) and ":" in line:
            assert lines[i - 1].lstrip().startswith("#") or lines[i - 1] == "", f"no comment above {line!r}"


def test_defaults_satisfy_the_schema_strictly() -> None:
    def check(node: dict[str, Any], value: Any, path: str) -> None:
        if node.get("additionalProperties") is False and isinstance(value, dict):
            extra = set(value) - set(node["properties"])
            assert not extra, f"{path}: {extra}"
            for key, sub in value.items():
                check(node["properties"][key], sub, f"{path}.{key}")

    check(SCHEMA, VALUES, "")
