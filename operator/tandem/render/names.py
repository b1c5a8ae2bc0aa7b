"""Child object names, label sets and the metadata every child carries (labels, owner, namespace).

Pure. Names are `<pddeployment>-<role>`; the API limits the PDDeployment's name so that the longest
(`-colocated`) still fits a StatefulSet's pod labels (see `tandem.api.rules.MAX_NAME_LENGTH`).
Prefill and decode objects of a serving revision other than the legacy one are named
`<revision prefix>-<role>` and select on the `tandem.dev/revision` label too (`tandem.render.revision`).
"""

from __future__ import annotations

from typing import Any

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import PDDeployment
from tandem.api.status import RevisionRecord

Manifest = dict[str, Any]

MANAGED_BY = "tandem-operator"


def revisioned(role: Role, revision: RevisionRecord | None) -> bool:
    """Whether `role`'s objects carry `revision`'s names and label (not the legacy revision's)."""
    return revision is not None and not revision.legacy and role in meta.REVISIONED_ROLES


def child_name(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> str:
    """The name of a role's workload, Service, PDB (and the router's RBAC objects)."""
    if revision is not None and revisioned(role, revision):
        return f"{revision.prefix}-{role}"
    return f"{pdd.metadata.name}-{role}"


def labels(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> dict[str, str]:
    """Labels on every child object and pod template of `role`; a superset of the selector."""
    return {
        meta.LABEL_NAME: meta.APP_NAME,
        meta.LABEL_INSTANCE: pdd.metadata.name,
        meta.LABEL_COMPONENT: role,
        meta.LABEL_PART_OF: meta.APP_NAME,
        meta.LABEL_MANAGED_BY: MANAGED_BY,
        **selector(pdd, role, revision),
    }


def selector(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> dict[str, str]:
    """The pods of `role` (of one revision when `revision` is a non-legacy one)."""
    found = meta.selector_labels(pdd.metadata.name, role)
    if revision is not None and revisioned(role, revision):
        found[meta.LABEL_REVISION] = revision.id
    return found


def owner_reference(pdd: PDDeployment) -> dict[str, Any]:
    return {
        "apiVersion": meta.API_VERSION,
        "kind": meta.KIND,
        "name": pdd.metadata.name,
        "uid": pdd.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> dict[str, Any]:
    """metadata of a child: name, namespace, labels and the controller owner reference."""
    return {
        "name": child_name(pdd, role, revision),
        "namespace": pdd.metadata.namespace,
        "labels": labels(pdd, role, revision),
        "ownerReferences": [owner_reference(pdd)],
    }


def scrape_annotations(port: int, path: str) -> dict[str, str]:
    """Pod annotations Prometheus' kubernetes_sd relabelling reads."""
    return {
        meta.ANNOTATION_SCRAPE: "true",
        meta.ANNOTATION_SCRAPE_PORT: str(port),
        meta.ANNOTATION_SCRAPE_PATH: path,
    }
