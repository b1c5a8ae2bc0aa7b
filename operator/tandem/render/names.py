"""Child object names, label sets and the metadata every child carries (labels, owner, namespace).

Pure. Names are `<pddeployment>-<role>`; the API limits the PDDeployment's name so that the longest
(`-colocated`) still fits a StatefulSet's pod labels (see `tandem.api.rules.MAX_NAME_LENGTH`).
Prefill and decode objects of a serving revision other than the legacy one are named
`<revision prefix>-<role>` and select on the `tandem.dev/revision` label too (`tandem.render.revision`).

A multi-node pool's LeaderWorkerSet (and its headless Service, which is the group's DNS subdomain)
has a shorter limit: LeaderWorkerSet names each group's worker StatefulSet `<lws>-<group index>`,
whose pods' controller-revision-hash label `<sts>-<10-character hash>` must fit 63 characters, so
with up to 1024 groups the LeaderWorkerSet's name has at most `MAX_GROUP_NAME` characters; a longer
child name is cut and followed by 5 characters of its own hash (`workload_name`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import PDDeployment
from tandem.api.status import RevisionRecord

Manifest = dict[str, Any]

MANAGED_BY = "tandem-operator"

# 63 (label value) - 11 ("-" + revision hash) - 5 ("-" + the largest group index, 1023).
MAX_GROUP_NAME: Final = 63 - 11 - 5
GROUP_NAME_HASH_LENGTH: Final = 5


def revisioned(role: Role, revision: RevisionRecord | None) -> bool:
    """Whether `role`'s objects carry `revision`'s names and label (not the legacy revision's)."""
    return revision is not None and not revision.legacy and role in meta.REVISIONED_ROLES


def child_name(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> str:
    """The name of a role's workload, Service, PDB (and the router's RBAC objects)."""
    if revision is not None and revisioned(role, revision):
        return f"{revision.prefix}-{role}"
    return f"{pdd.metadata.name}-{role}"


def workload_name(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> str:
    """The name of a pool's workload and headless Service: the child name, cut to `MAX_GROUP_NAME` with
    a hash of the whole when the pool renders a LeaderWorkerSet (single-node pools: `child_name`)."""
    name = child_name(pdd, role, revision)
    if role == "router" or not pdd.spec.pool(role).shape.multi_node:
        return name
    return group_name(name)


def group_name(name: str) -> str:
    """A LeaderWorkerSet's name for the child name `name`: as it is, or cut to `MAX_GROUP_NAME` with a
    hash of the whole (module docstring)."""
    if len(name) <= MAX_GROUP_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:GROUP_NAME_HASH_LENGTH]
    head = name[: MAX_GROUP_NAME - GROUP_NAME_HASH_LENGTH - 1].rstrip("-")
    return f"{head}-{digest}"


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
