"""Handing a pool's workload's `spec.replicas` (a StatefulSet's pods, a LeaderWorkerSet's groups) to an
HPA or KEDA and back, by server-side apply field ownership (pure: what to apply, from the live
object's `managedFields`).

Server-side apply removes a field when its only manager applies a configuration without it, so
the operator cannot simply stop sending `spec.replicas`: the count would fall to the default. The
hand-over first applies `{spec: {replicas: <current>}}` under a second manager (`HANDOVER_MANAGER`),
then the operator's configuration without replicas; the field keeps its value, co-owned by the
hand-over manager until the HPA's first scale moves it to the HPA. The hand-back applies the
operator's configuration with replicas (forced, taking the field over) and then an empty
configuration under the hand-over manager, which releases what it still holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from tandem.api import meta

HANDOVER_MANAGER = "tandem-handover"

Step = Literal["none", "hand-over", "hand-back"]


def _entries(live: Mapping[str, Any], manager: str) -> list[Mapping[str, Any]]:
    return [
        entry
        for entry in (live.get("metadata") or {}).get("managedFields") or []
        if entry.get("manager") == manager and entry.get("operation") == "Apply"
    ]


def trim_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with only what `step` reads of its managedFields: each entry's manager and operation,
    and whether it holds `spec.replicas`. A StatefulSet's full field sets are most of its size; the
    watch cache keeps this form (tested to decide as the full one does)."""
    md = obj.get("metadata") or {}
    entries = md.get("managedFields")
    if isinstance(entries, list):
        md["managedFields"] = [
            {
                "manager": entry.get("manager"),
                "operation": entry.get("operation"),
                "fieldsV1": {"f:spec": {"f:replicas": {}}}
                if "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
                else {},
            }
            for entry in entries
            if isinstance(entry, dict)
        ]
    return obj


def owns_replicas(live: Mapping[str, Any], manager: str) -> bool:
    """Whether `manager`'s applied configuration includes `spec.replicas`."""
    entries = _entries(live, manager)
    return any("f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {}) for entry in entries)


def has_manager(live: Mapping[str, Any], manager: str) -> bool:
    return bool(_entries(live, manager))


def step(live: Mapping[str, Any] | None, external: bool) -> Step:
    """What the StatefulSet needs: hand its replicas over, take them back, or nothing."""
    if live is None:
        return "none"  # a new StatefulSet: created with the spec's replicas, handed over on the next pass
    if external:
        return "hand-over" if owns_replicas(live, meta.FIELD_MANAGER) else "none"
    if has_manager(live, HANDOVER_MANAGER) or not owns_replicas(live, meta.FIELD_MANAGER):
        return "hand-back"
    return "none"


def pin_replicas(live: Mapping[str, Any]) -> dict[str, Any]:
    """The hand-over manager's configuration: the StatefulSet's current replicas, nothing else."""
    md = live["metadata"]
    return {
        "apiVersion": live.get("apiVersion", "apps/v1"),
        "kind": live.get("kind", "StatefulSet"),
        "metadata": {"name": md["name"], "namespace": md["namespace"]},
        "spec": {"replicas": int((live.get("spec") or {}).get("replicas", 1))},
    }


def release(live: Mapping[str, Any]) -> dict[str, Any]:
    """An empty configuration: applying it under the hand-over manager drops every field it owns."""
    md = live["metadata"]
    return {
        "apiVersion": live.get("apiVersion", "apps/v1"),
        "kind": live.get("kind", "StatefulSet"),
        "metadata": {"name": md["name"], "namespace": md["namespace"]},
    }
