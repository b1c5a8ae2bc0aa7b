"""One engine pool's objects: its workload (a StatefulSet, or a LeaderWorkerSet for a multi-node pool,
`group.py`), headless Service and PodDisruptionBudget.

Pure. Replicas come from the caller (autoscaler and rollout decisions), never from observed state;
a pool handed to an HPA or KEDA gets no `spec.replicas` at all.
StatefulSets give each replica a stable name and DNS entry; `Parallel` starts and stops them all at
once, since replicas of a pool do not depend on each other.
"""

from __future__ import annotations

from typing import Any

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import PDDeployment
from tandem.api.status import RevisionRecord
from tandem.render import group, names, pod

Manifest = names.Manifest


def workload(
    pdd: PDDeployment, role: Role, *, replicas: int | None, revision: RevisionRecord | None = None
) -> Manifest:
    """The pool's StatefulSet, or its LeaderWorkerSet when a replica spans nodes."""
    if pdd.spec.pool(role).shape.multi_node:
        return group.leaderworkerset(pdd, role, replicas=replicas, revision=revision)
    return statefulset(pdd, role, replicas=replicas, revision=revision)


def statefulset(
    pdd: PDDeployment, role: Role, *, replicas: int | None, revision: RevisionRecord | None = None
) -> Manifest:
    """The pool's StatefulSet; `replicas=None` leaves `spec.replicas` out (another controller sets it).

    `revision`: the serving revision prefill and decode are rendered for (None or legacy: today's
    names, selector and template)."""
    spec: Manifest = {} if replicas is None else {"replicas": replicas}
    spec |= {
        "serviceName": names.child_name(pdd, role, revision),
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": names.selector(pdd, role, revision)},
        "template": pod.pod_template(pdd, role, revision),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": names.object_meta(pdd, role, revision),
        "spec": spec,
    }


def _service_ports(pdd: PDDeployment, role: Role) -> list[dict[str, Any]]:
    return [
        {"name": port["name"], "port": port["containerPort"], "targetPort": port["name"], "protocol": "TCP"}
        for port in pod.ports(pdd, role)
    ]


def headless_service(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> Manifest:
    """Stable per-pod DNS names; not-ready pods are published so peers can handshake during start-up.
    A LeaderWorkerSet's groups use it as their subdomain (it carries the LeaderWorkerSet's name)."""
    metadata = names.object_meta(pdd, role, revision)
    metadata["name"] = names.workload_name(pdd, role, revision)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": names.selector(pdd, role, revision),
            "ports": _service_ports(pdd, role),
        },
    }


def disruption_budget(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> Manifest:
    """Voluntary evictions (node drains) take one pod of the role (and revision) at a time.

    The legacy revision's prefill/decode budget leaves out pods with a revision label: a pod under two
    budgets cannot be evicted at all (PDB selectors, unlike StatefulSet ones, may change)."""
    selector: Manifest = {"matchLabels": names.selector(pdd, role, revision)}
    if role in meta.REVISIONED_ROLES and not names.revisioned(role, revision):
        selector["matchExpressions"] = [{"key": meta.LABEL_REVISION, "operator": "DoesNotExist"}]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": names.object_meta(pdd, role, revision),
        "spec": {"maxUnavailable": 1, "selector": selector},
    }
