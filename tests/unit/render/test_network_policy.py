"""`spec.network.policy`: off by default (no NetworkPolicy); on, one policy on the engine pods that
admits their routers (HTTP), their peer engines (every engine port) and Prometheus (HTTP), nothing
else; pruned like any child when switched off."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeployment
from tandem.render import render
from tandem.render.desired import CHILD_KINDS

BASE: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "PDDeployment",
    "metadata": {"name": "np", "namespace": "ns", "uid": "u-1"},
    "spec": {
        "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"type": "vllm", "image": "vllm/vllm-openai:v0.27.1"},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
        "colocated": {"replicas": 1},
    },
}


def _pdd(policy: dict[str, Any] | None = None, connector: str = "NixlConnector") -> PDDeployment:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    doc["spec"]["kvTransfer"] = {"connector": connector}
    if policy is not None:
        doc["spec"]["network"] = {"policy": policy}
    return PDDeployment.model_validate(doc)


def _policies(pdd: PDDeployment) -> list[dict[str, Any]]:
    return [o for o in render(pdd) if o["kind"] == "NetworkPolicy"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics for matchLabels and In/DoesNotExist expressions."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        if e["operator"] == "In" and labels.get(e["key"]) not in e["values"]:
            return False
        if e["operator"] == "DoesNotExist" and e["key"] in labels:
            return False
    return True


def _pod_labels(pdd: PDDeployment) -> dict[str, dict[str, str]]:
    labels: dict[str, dict[str, str]] = {}
    for obj in render(pdd):
        if obj["kind"] in ("StatefulSet", "Deployment"):
            template = obj["spec"]["template"]["metadata"]["labels"]
            labels[template["tandem.dev/role"]] = template
    return labels


def _admitted(
    policy: dict[str, Any], source: dict[str, str], port: int, namespace_labels: dict[str, str]
) -> bool:
    """Whether `policy` lets a pod with labels `source` (same namespace unless namespace_labels says
    otherwise) reach `port` of a selected pod."""
    for rule in policy["spec"]["ingress"]:
        if port not in [p["port"] for p in rule["ports"]]:
            continue
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                if _selects(peer["namespaceSelector"], namespace_labels) and _selects(
                    peer["podSelector"], source
                ):
                    return True
            elif namespace_labels.get("same") == "true" and _selects(peer["podSelector"], source):
                return True
    return False


def test_off_by_default() -> None:
    assert _policies(_pdd()) == []
    assert _policies(_pdd({"enabled": False})) == []


@pytest.mark.parametrize(
    ("connector", "ports"),
    [
        ("NixlConnector", [8000, 5600]),
        ("MooncakeConnector", [8000, 8998]),
        ("LMCacheConnectorV1", [8000, 7300, 7400]),
    ],
)
def test_engines_admit_routers_peers_and_prometheus_only(connector: str, ports: list[int]) -> None:
    pdd = _pdd({"enabled": True, "prometheusNamespaceSelector": {"team": "obs"}}, connector)
    (policy,) = _policies(pdd)
    assert policy["metadata"]["name"] == "np-engines"
    assert policy["metadata"]["namespace"] == "ns"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert policy["metadata"]["labels"]["tandem.dev/pddeployment"] == "np"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    engine_ports = sorted({p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]})
    assert engine_ports == sorted(ports)

    pods = _pod_labels(pdd)
    for role, labels in pods.items():
        assert _selects(policy["spec"]["podSelector"], labels) is (role != "router"), role
    same_ns = {"same": "true"}
    router, prefill = pods["router"], pods["prefill"]
    assert _admitted(policy, router, 8000, same_ns)
    assert not any(_admitted(policy, router, port, same_ns) for port in ports if port != 8000)
    for port in ports:  # peers reach every engine port
        assert _admitted(policy, prefill, port, same_ns)
        assert _admitted(policy, pods["decode"], port, same_ns)
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert _admitted(policy, prometheus, 8000, {"team": "obs"})
    assert not _admitted(policy, prometheus, 8000, {"team": "other"})
    assert not any(_admitted(policy, prometheus, port, {"team": "obs"}) for port in ports if port != 8000)
    # Another PDDeployment's router and engines, and any other pod, are refused.
    stranger_router = {**router, "tandem.dev/pddeployment": "other"}
    stranger_engine = {**prefill, "tandem.dev/pddeployment": "other"}
    for source in (stranger_router, stranger_engine, {"app": "client"}):
        assert not any(_admitted(policy, source, port, same_ns) for port in ports), source


def test_prometheus_in_any_namespace_by_default() -> None:
    (policy,) = _policies(_pdd({"enabled": True}))
    (prometheus_rule,) = [r for r in policy["spec"]["ingress"] if "namespaceSelector" in r["from"][0]]
    assert prometheus_rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]


def test_network_policy_is_a_child_kind_so_switching_off_prunes_it() -> None:
    assert ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies") in CHILD_KINDS
    on = {(o["kind"], o["metadata"]["name"]) for o in render(_pdd({"enabled": True}))}
    off = {(o["kind"], o["metadata"]["name"]) for o in render(_pdd({"enabled": False}))}
    assert on - off == {("NetworkPolicy", "np-engines")}
