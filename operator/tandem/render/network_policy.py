"""The optional NetworkPolicy on a PDDeployment's engine pods (`spec.network.policy.enabled`).

Pure. One policy selects every engine pod of the PDDeployment (all pools and serving revisions) and
admits ingress only from:
- the PDDeployment's own routers, to the engine's HTTP port (the OpenAI API and /metrics);
- its own engine pods, to every engine port (HTTP, the NIXL side channel, Mooncake bootstrap,
  LMCache peer ports): prefill and decode hand KV over between themselves;
- the Prometheus pods the spec names, to the HTTP port (vLLM serves /metrics on the API port, so a
  policy cannot admit the metrics without the API);
- for a multi-node pool (docs/multinode.md), its own pods, to every port: the pods of one replica
  (a LeaderWorkerSet group) talk over ports vLLM, torch.distributed and NCCL choose at start (ZMQ
  listeners bound to port 0, the NCCL bootstrap), besides the fixed ones named below.
Per-rank ports: a data-parallel pool's NIXL side channels (5600 + each global rank), a
MultiPortExternal pool's API ports (8000 + each local rank) and its supervisor, a group leader's
data-parallel RPC and torch.distributed master ports; consecutive ports become one range (`endPort`).
Egress is not restricted (engines download models). See docs/security.md.
"""

from __future__ import annotations

from typing import Any

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import PDDeployment
from tandem.render import names, pod
from tandem.render.command import Member

Manifest = names.Manifest
COMPONENT = "network-policy"


def name(pdd: PDDeployment) -> str:
    return f"{pdd.metadata.name}-engines"


def _engines(pdd: PDDeployment) -> dict[str, Any]:
    return {
        "matchLabels": {meta.LABEL_PDD: pdd.metadata.name},
        "matchExpressions": [{"key": meta.LABEL_ROLE, "operator": "In", "values": list(meta.POOL_ROLES)}],
    }


def _ranges(numbers: set[int]) -> list[dict[str, Any]]:
    """NetworkPolicy ports for `numbers`, ascending, runs of consecutive ports as one `endPort` range."""
    result: list[dict[str, Any]] = []
    for number in sorted(numbers):
        last = result[-1] if result else None
        if last is not None and last.get("endPort", last["port"]) == number - 1:
            last["endPort"] = number
        else:
            result.append({"protocol": "TCP", "port": number})
    return result


def _members(pdd: PDDeployment, role: Role) -> tuple[Member, ...]:
    return ("leader", "worker") if pdd.spec.pool(role).shape.multi_node else ("single",)


def _engine_ports(pdd: PDDeployment) -> list[dict[str, Any]]:
    """Every port an engine of any pool listens on, once each, in a stable order."""
    numbers: set[int] = set()
    for role in meta.POOL_ROLES:
        for member in _members(pdd, role):
            numbers |= {port["containerPort"] for port in pod.ports(pdd, role, member)}
        shape = pdd.spec.pool(role).shape
        if shape.data > 1 and "nixl" in {port["name"] for port in pod.ports(pdd, role)}:
            base = meta.NIXL_SIDE_CHANNEL_PORT  # one side channel per global data-parallel rank
            numbers |= set(range(base, base + shape.data))
    return _ranges(numbers)


def _api_ports(pdd: PDDeployment) -> list[dict[str, Any]]:
    """The OpenAI API (and /metrics) ports of every pool: 8000, and 8000 + i per MultiPortExternal rank."""
    numbers = {meta.ENGINE_PORT}
    for role in meta.POOL_ROLES:
        numbers |= set(range(meta.ENGINE_PORT, meta.ENGINE_PORT + pdd.spec.pool(role).shape.ports_per_pod))
    return _ranges(numbers)


def _group_peers(pdd: PDDeployment) -> list[dict[str, Any]]:
    """Each multi-node pool's pods to each other, on every port (no `ports`: all of them)."""
    return [
        {"from": [{"podSelector": {"matchLabels": names.selector(pdd, role)}}]}
        for role in meta.POOL_ROLES
        if pdd.spec.pool(role).shape.multi_node
    ]


def network_policy(pdd: PDDeployment) -> Manifest:
    policy = pdd.spec.network.policy
    http = _api_ports(pdd)
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
                *_group_peers(pdd),
            ],
        },
    }
