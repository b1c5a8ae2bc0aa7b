"""Child object names, label sets and the metadata every child carries (labels, owner, namespace).

Pure. Names are `<pddeployment>-<role>`; the API limits the PDDeployment's name so that the longest
(`-colocated`) still fits a StatefulSet's pod labels (see `tandem.api.rules.MAX_NAME_LENGTH`).
"""

from __future__ import annotations

from typing import Any

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import PDDeployment

Manifest = dict[str, Any]

MANAGED_BY = "tandem-operator"


def child_name(pdd: PDDeployment, role: Role) -> str:
    """The name of a role's workload, Service, PDB (and the router's RBAC objects)."""
    return f"{pdd.metadata.name}-{role}"


def labels(pdd: PDDeployment, role: Role) -> dict[str, str]:
    """Labels on every child object and pod template of `role`; a superset of the selector."""
    return {
        meta.LABEL_NAME: meta.APP_NAME,
        meta.LABEL_INSTANCE: pdd.metadata.name,
        meta.LABEL_COMPONENT: role,
        meta.LABEL_PART_OF: meta.APP_NAME,
        meta.LABEL_MANAGED_BY: MANAGED_BY,
        **meta.selector_labels(pdd.metadata.name, role),
    }


def selector(pdd: PDDeployment, role: Role) -> dict[str, str]:
    return meta.selector_labels(pdd.metadata.name, role)


def owner_reference(pdd: PDDeployment) -> dict[str, Any]:
    return {
        "apiVersion": meta.API_VERSION,
        "kind": meta.KIND,
        "name": pdd.metadata.name,
        "uid": pdd.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(pdd: PDDeployment, role: Role) -> dict[str, Any]:
    """metadata of a child: name, namespace, labels and the controller owner reference."""
    return {
        "name": child_name(pdd, role),
        "namespace": pdd.metadata.namespace,
        "labels": labels(pdd, role),
        "ownerReferences": [owner_reference(pdd)],
    }


def scrape_annotations(port: int, path: str) -> dict[str, str]:
    """Pod annotations Prometheus' kubernetes_sd relabelling reads."""
    return {
        meta.ANNOTATION_SCRAPE: "true",
        meta.ANNOTATION_SCRAPE_PORT: str(port),
        meta.ANNOTATION_SCRAPE_PATH: path,
    }
