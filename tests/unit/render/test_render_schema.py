"""Every field `render` writes is a field of the Kubernetes API, per the official client's models.

The client's deserializer keeps only fields its models know, so a misspelt or misplaced key is
dropped on a round trip (no apiserver needed). A LeaderWorkerSet (multi-node pools) is no core
kind: its pod templates go through the client's V1PodTemplateSpec, the rest is checked against the
fields of LeaderWorkerSet's v1 API (sigs.k8s.io/lws v0.7.0, api/leaderworkerset/v1), and, where
the Go module cache holds that release, against the schema of its CRD as well.
"""

from __future__ import annotations

import functools
import json
import os
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
    # The client has no scheduling.k8s.io/v1alpha2 (what 1.36 serves); its v1alpha3 PodGroup has the
    # same fields tandem renders (metadata, spec.schedulingPolicy.gang.minCount).
    "PodGroup": "V1alpha3PodGroup",
}
VARIANTS: dict[str, dict[str, Any]] = {
    "network policy and router placement": {
        "network": {"policy": {"enabled": True, "prometheusNamespaceSelector": {"team": "obs"}}},
        "router": {"nodeSelector": {"a": "b"}, "tolerations": [{"key": "k", "operator": "Exists"}]},
        "engine": {"type": "sim", "sim": {"requestAccelerators": False}},
    },
    "mooncake": {"kvTransfer": {"connector": "MooncakeConnector"}},
    "lmcache": {"kvTransfer": {"connector": "LMCacheConnectorV1"}},
    "multi-node pools": {
        "engine": {"type": "vllm"},
        "network": {"policy": {"enabled": True}},
        "prefill": {
            "nodesPerInstance": 2,
            "parallelism": {"data": 16, "expert": True, "loadBalancing": "MultiPortExternal"},
            "groupPlacement": {"schedulerName": "volcano"},
            "gpuType": "NVIDIA-H200",
        },
        "decode": {
            "nodesPerInstance": 2,
            "tensorParallelSize": 16,
            "autoscaling": {"external": True, "maxReplicas": 3},
            "groupPlacement": {"gangScheduling": "Kubernetes"},
        },
    },
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


# The fields of LeaderWorkerSet v1 (sigs.k8s.io/lws v0.7.0: api/leaderworkerset/v1/leaderworkerset_types.go)
# above its pod templates and metadata; None: a leaf, "template": a PodTemplateSpec.
LWS_FIELDS: dict[str, Any] = {
    "apiVersion": None,
    "kind": None,
    "metadata": "metadata",
    "spec": {
        "replicas": None,
        "startupPolicy": None,
        "rolloutStrategy": {"type": None, "rollingUpdateConfiguration": None},
        "networkConfig": {"subdomainPolicy": None},
        "leaderWorkerTemplate": {
            "leaderTemplate": "template",
            "workerTemplate": "template",
            "size": None,
            "restartPolicy": None,
            "subGroupPolicy": {"subGroupPolicyType": None, "subGroupSize": None},
        },
    },
}
LWS_ENUMS = {
    "startupPolicy": {"LeaderCreated", "LeaderReady"},
    "restartPolicy": {"RecreateGroupOnPodRestart", "None", "Default"},
}


@functools.cache
def _lws_crd_schema() -> dict[str, Any] | None:
    """The LeaderWorkerSet CRD's schema from the Go module cache, when it holds lws v0.7.0 (read once:
    its 19k-line YAML takes seconds to parse, and every test here needs it; not modified by them)."""
    cache = Path(os.environ.get("GOMODCACHE") or Path.home() / "go" / "pkg" / "mod")
    crd = cache / "sigs.k8s.io" / "lws@v0.7.0" / "config" / "crd" / "bases"
    path = crd / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
    if not path.exists():
        return None
    schema: dict[str, Any] = yaml.safe_load(path.read_text())["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"
    ]
    return schema


def _outside_schema(node: Any, schema: dict[str, Any], path: str) -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields") or not isinstance(node, dict | list):
        return []
    if isinstance(node, list):
        return [
            p
            for i, item in enumerate(node)
            for p in _outside_schema(item, schema.get("items", {}), f"{path}[{i}]")
        ]
    properties = schema.get("properties")
    if properties is None:  # a map (additionalProperties) or an object the schema leaves open
        extra = schema.get("additionalProperties")
        sub = extra if isinstance(extra, dict) else {}
        return [p for k, v in node.items() for p in _outside_schema(v, sub, f"{path}.{k}")]
    return [
        p
        for key, value in node.items()
        for p in (
            [f"{path}.{key}"]
            if key not in properties
            else _outside_schema(value, properties[key], f"{path}.{key}")
        )
    ]


def _lws_dropped(api: ApiClient, node: Any, fields: Any, path: str) -> list[str]:
    if fields == "template" or fields == "metadata":
        kind = "V1PodTemplateSpec" if fields == "template" else "V1ObjectMeta"
        model = api.deserialize(json.dumps(node), kind, "application/json")
        return _dropped(node, api.sanitize_for_serialization(model), path)  # type: ignore[no-untyped-call]
    if fields is None:
        return (
            []
            if path.rsplit(".", 1)[-1] not in LWS_ENUMS or node in LWS_ENUMS[path.rsplit(".", 1)[-1]]
            else [path]
        )
    return [
        p
        for key, value in node.items()
        for p in (
            [f"{path}.{key}"] if key not in fields else _lws_dropped(api, value, fields[key], f"{path}.{key}")
        )
    ]


def _assert_all_fields_known(pdd: PDDeployment) -> None:
    api = ApiClient()
    schema = _lws_crd_schema()
    for obj in render(pdd, {"colocated": 1}):
        if obj["kind"] == "LeaderWorkerSet":
            assert _lws_dropped(api, obj, LWS_FIELDS, obj["kind"]) == []
            if schema is not None:
                assert _outside_schema(obj, schema, obj["kind"]) == []
            continue
        model = api.deserialize(json.dumps(obj), CLIENT_TYPES[obj["kind"]], "application/json")
        kept = api.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
        assert _dropped(obj, kept, obj["kind"]) == []


def test_a_misplaced_leaderworkerset_field_is_found() -> None:
    """The LeaderWorkerSet checks see a key its API lacks, above and inside a pod template."""
    api = ApiClient()
    template = {"spec": {"containers": [{"name": "engine"}], "containerz": []}}
    bad = {"spec": {"leaderWorkerTemplate": {"sise": 2, "workerTemplate": template}}}
    assert _lws_dropped(api, bad, LWS_FIELDS, "LWS") == [
        "LWS.spec.leaderWorkerTemplate.sise",
        "LWS.spec.leaderWorkerTemplate.workerTemplate.spec.containerz",
    ]
    assert _lws_dropped(api, {"spec": {"startupPolicy": "Eventually"}}, LWS_FIELDS, "LWS") == [
        "LWS.spec.startupPolicy"
    ]
    schema = _lws_crd_schema()
    if schema is not None:
        assert _outside_schema(bad, schema, "LWS") == [
            "LWS.spec.leaderWorkerTemplate.sise",
            "LWS.spec.leaderWorkerTemplate.workerTemplate.spec.containerz",
        ]


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_examples_render_only_known_fields(example: Path) -> None:
    _assert_all_fields_known(PDDeployment.model_validate(yaml.safe_load(example.read_text())))


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=list(VARIANTS))
def test_variants_render_only_known_fields(
    make_pdd: Callable[..., PDDeployment], variant: dict[str, Any]
) -> None:
    _assert_all_fields_known(make_pdd(variant))
