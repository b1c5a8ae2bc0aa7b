"""One engine pool's objects: StatefulSet, headless Service and PodDisruptionBudget.

Pure. Replicas come from the caller (autoscaler and rollout decisions), never from observed state;
a pool handed to an HPA or KEDA gets no `spec.replicas` at all.
StatefulSets give each replica a stable name and DNS entry; `Parallel` starts and stops them all at
once, since replicas of a pool do not depend on each other.
"""

from __future__ import annotations

from typing import Any

from tandem.api.meta import Role
from tandem.api.models import PDDeployment
from tandem.render import names, pod

Manifest = names.Manifest


def statefulset(pdd: PDDeployment, role: Role, *, replicas: int | None) -> Manifest:
    """The pool's StatefulSet; `replicas=None` leaves `spec.replicas` out (another controller sets it)."""
    spec: Manifest = {} if replicas is None else {"replicas": replicas}
    spec |= {
        "serviceName": names.child_name(pdd, role),
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": names.selector(pdd, role)},
        "template": pod.pod_template(pdd, role),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": names.object_meta(pdd, role),
        "spec": spec,
    }


def _service_ports(pdd: PDDeployment, role: Role) -> list[dict[str, Any]]:
    return [
        {"name": port["name"], "port": port["containerPort"], "targetPort": port["name"], "protocol": "TCP"}
        for port in pod.ports(pdd, role)
    ]


def headless_service(pdd: PDDeployment, role: Role) -> Manifest:
    """Stable per-pod DNS names; not-ready pods are published so peers can handshake during start-up."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.object_meta(pdd, role),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": names.selector(pdd, role),
            "ports": _service_ports(pdd, role),
        },
    }


def disruption_budget(pdd: PDDeployment, role: Role) -> Manifest:
    """Voluntary evictions (node drains) take one pod of the role at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": names.object_meta(pdd, role),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector(pdd, role)}},
    }
