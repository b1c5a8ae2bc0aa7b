"""The optional NetworkPolicy on a PDDeployment's engine pods (`spec.network.policy.enabled`).

Pure. One policy selects every engine pod of the PDDeployment (all pools and serving revisions) and
admits ingress only from:
- the PDDeployment's own routers, to the engine's HTTP port (the OpenAI API and /metrics);
- its own engine pods, to every engine port (HTTP, the NIXL side channel, Mooncake bootstrap,
  LMCache peer ports): prefill and decode hand KV over between themselves;
- the Prometheus pods the spec names, to the HTTP port (vLLM serves /metrics on the API port, so a
  policy cannot admit the metrics without the API).
Egress is not restricted (engines download models). See docs/security.md.
"""

from __future__ import annotations

from typing import Any

from tandem.api import meta
from tandem.api.models import PDDeployment
from tandem.render import names, pod

Manifest = names.Manifest
COMPONENT = "network-policy"


def name(pdd: PDDeployment) -> str:
    return f"{pdd.metadata.name}-engines"


def _engines(pdd: PDDeployment) -> dict[str, Any]:
    return {
        "matchLabels": {meta.LABEL_PDD: pdd.metadata.name},
        "matchExpressions": [{"key": meta.LABEL_ROLE, "operator": "In", "values": list(meta.POOL_ROLES)}],
    }


def _engine_ports(pdd: PDDeployment) -> list[dict[str, Any]]:
    """Every port an engine of any pool listens on, once each, in a stable order."""
    seen: dict[int, dict[str, Any]] = {}
    for role in meta.POOL_ROLES:
        for port in pod.ports(pdd, role):
            seen.setdefault(port["containerPort"], {"protocol": "TCP", "port": port["containerPort"]})
    return [seen[number] for number in sorted(seen)]


def network_policy(pdd: PDDeployment) -> Manifest:
    policy = pdd.spec.network.policy
    http = [{"protocol": "TCP", "port": meta.ENGINE_PORT}]
    prometheus: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": dict(policy.prometheus_namespace_selector)},
        "podSelector": {"matchLabels": dict(policy.prometheus_pod_selector)},
    }
    labels = {
        meta.LABEL_NAME: meta.APP_NAME,
        meta.LABEL_INSTANCE: pdd.metadata.name,
        meta.LABEL_COMPONENT: COMPONENT,
        meta.LABEL_PART_OF: meta.APP_NAME,
        meta.LABEL_MANAGED_BY: names.MANAGED_BY,
        meta.LABEL_PDD: pdd.metadata.name,
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name(pdd),
            "namespace": pdd.metadata.namespace,
            "labels": labels,
            "ownerReferences": [names.owner_reference(pdd)],
        },
        "spec": {
            "podSelector": _engines(pdd),
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": names.selector(pdd, "router")}}], "ports": http},
                {"from": [{"podSelector": _engines(pdd)}], "ports": _engine_ports(pdd)},
                {"from": [prometheus], "ports": http},
            ],
        },
    }
