"""Serving revisions of the P/D pair: what prefill and decode must agree on, its id, and its names.

Pure. A prefill pod hands its KV to a decode pod, so both must run the same engine build on the same
weights with the same connector: the fields below (`REVISION_FIELDS`) define a *serving revision*,
identified by a short stable hash of their values (`revision_id`). A change of any of them creates a
new P/D pair beside the old one (StatefulSet selectors are immutable) instead of rolling prefill
and decode independently; the router pairs pods of one revision only (docs/rollout.md, Revisions).

Naming within Kubernetes' limits. A StatefulSet's pods carry `controller-revision-hash:
<sts>-<hash of up to 10 characters>`, a label value of at most 63 characters, so a StatefulSet name
has at most 52 (`MAX_STATEFULSET_NAME`). The first revision a deployment records keeps today's
names (`<pdd>-prefill`, `<pdd>-decode`) and today's pod template, so an operator upgrade renames
nothing and replaces no pod: it is the *legacy* revision, whose pods carry no revision label.
Every later revision is named `<prefix>-<role>` with `prefix = <pdd>-<revision id>`; a PDDeployment
name too long for that (over 33 characters) is cut and followed by 5 characters of its own hash,
so two long names with a common start still differ.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from tandem.api.models import PDDeploymentSpec

REVISION_ID_LENGTH: Final = 10
# controller-revision-hash = "<sts>-<up to 10 characters>" must be a label value (<= 63).
MAX_STATEFULSET_NAME: Final = 63 - 1 - 10
LONGEST_REVISIONED_ROLE: Final = "prefill"
# <prefix>-prefill <= 52 and prefix = <short>-<id>: short <= 52 - 8 - 11 = 33.
MAX_SHORT_NAME: Final = MAX_STATEFULSET_NAME - len(LONGEST_REVISIONED_ROLE) - 1 - 1 - REVISION_ID_LENGTH
NAME_HASH_LENGTH: Final = 5

# The spec fields (camelCase paths) prefill and decode must agree on. Not in the list: per-pool
# settings (resources, TP, extraArgs of a pool roll that pool as before), the link's bandwidth and
# thresholds (figures the operator judges with, not what the engines exchange), env, scheduling; a
# pool's move between a StatefulSet and groups is (`revision_fields`).
REVISION_FIELDS: Final[tuple[str, ...]] = (
    "engine.type",
    "engine.image",
    "model.name",
    "model.uri",  # hf://org/repo@revision carries the model's revision
    "model.kvBytesPerToken",
    "kvTransfer.connector",
    "network.rdma.enabled",  # the UCX transports (rc/ud or tcp) both ends must speak
)


# Set in the revision's values only when a P/D pool renders groups, so that specs without one keep
# the ids they always had: the P/D pools that are multi-node (`nodesPerInstance` > 1).
GROUP_POOLS_FIELD: Final = "groupPools"


def revision_fields(spec: PDDeploymentSpec) -> dict[str, Any]:
    """The values of `REVISION_FIELDS` in `spec` (None where unset), and which P/D pools are groups
    (`GROUP_POOLS_FIELD`, only when one is): a pool moving between one pod a replica (a StatefulSet)
    and groups (a LeaderWorkerSet, whose leaders' StatefulSet takes the same name) is a new revision,
    so the new pair runs beside the old one and the rollout moves the traffic (docs/multinode.md)."""
    data = spec.model_dump(by_alias=True, mode="json")
    values: dict[str, Any] = {}
    for path in REVISION_FIELDS:
        node: Any = data
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        values[path] = node
    groups = [
        role
        for role in ("prefill", "decode")
        if isinstance(data.get(role), dict) and int(data[role].get("nodesPerInstance") or 1) > 1
    ]
    if groups:
        values[GROUP_POOLS_FIELD] = groups
    return values


def revision_id(spec: PDDeploymentSpec) -> str:
    """A short stable hash of the revision fields: the same values give the same id in any process."""
    canonical = json.dumps(revision_fields(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_ID_LENGTH]


def _name_hash(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:NAME_HASH_LENGTH]


def short_name(pdd_name: str) -> str:
    """The PDDeployment's part of a revisioned name: itself when short enough, else cut + its hash."""
    if len(pdd_name) <= MAX_SHORT_NAME:
        return pdd_name
    head = pdd_name[: MAX_SHORT_NAME - NAME_HASH_LENGTH - 1].rstrip("-")
    return f"{head}-{_name_hash(pdd_name)}"


def name_prefix(pdd_name: str, rev: str, *, legacy: bool) -> str:
    """What precedes `-<role>` in the names of a revision's StatefulSet, Service and PDB."""
    return pdd_name if legacy else f"{short_name(pdd_name)}-{rev}"
