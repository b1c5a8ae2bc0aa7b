"""Every field `render` writes is a field of the Kubernetes API, per the official client's models.

The client's deserializer keeps only fields its models know, so a misspelt or misplaced key is
dropped on a round trip (no apiserver needed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from tandem.api.models import PDDeployment
from tandem.render import render

ROOT = Path(__file__).resolve().parents[3]
CLIENT_TYPES = {
    "ServiceAccount": "V1ServiceAccount",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
    "Service": "V1Service",
    "StatefulSet": "V1StatefulSet",
    "Deployment": "V1Deployment",
    "PodDisruptionBudget": "V1PodDisruptionBudget",
    "NetworkPolicy": "V1NetworkPolicy",
}
VARIANTS: dict[str, dict[str, Any]] = {
    "network policy and router placement": {
        "network": {"policy": {"enabled": True, "prometheusNamespaceSelector": {"team": "obs"}}},
        "router": {"nodeSelector": {"a": "b"}, "tolerations": [{"key": "k", "operator": "Exists"}]},
        "engine": {"type": "sim", "sim": {"requestAccelerators": False}},
    },
    "mooncake": {"kvTransfer": {"connector": "MooncakeConnector"}},
    "lmcache": {"kvTransfer": {"connector": "LMCacheConnectorV1"}},
    "pools with scheduling": {
        "colocated": {"replicas": 1},
        "decode": {
            "nodeSelector": {"a": "b"},
            "tolerations": [
                {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
            ],
        },
        "engine": {
            "imagePullSecrets": ["r"],
            "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        },
    },
}


def _dropped(sent: Any, kept: Any, path: str) -> list[str]:
    if isinstance(sent, dict):
        if not isinstance(kept, dict):
            return [path]
        missing = [f"{path}.{k}" for k in sent if k not in kept]
        return missing + [p for k in sent if k in kept for p in _dropped(sent[k], kept[k], f"{path}.{k}")]
    if isinstance(sent, list):
        return [
            p for i, (s, k) in enumerate(zip(sent, kept, strict=True)) for p in _dropped(s, k, f"{path}[{i}]")
        ]
    return []


def _assert_all_fields_known(pdd: PDDeployment) -> None:
    api = ApiClient()
    for obj in render(pdd, {"colocated": 1}):
        model = api.deserialize(json.dumps(obj), CLIENT_TYPES[obj["kind"]], "application/json")
        kept = api.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
        assert _dropped(obj, kept, obj["kind"]) == []


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_examples_render_only_known_fields(example: Path) -> None:
    _assert_all_fields_known(PDDeployment.model_validate(yaml.safe_load(example.read_text())))


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=list(VARIANTS))
def test_variants_render_only_known_fields(
    make_pdd: Callable[..., PDDeployment], variant: dict[str, Any]
) -> None:
    _assert_all_fields_known(make_pdd(variant))
