"""kstatus (`sigs.k8s.io/cli-utils/pkg/kstatus`) for a custom resource, as a pure function.

Flux's health checks, Helm 4's `--wait` and kpt compute a resource's status this way; a
PDDeployment is GitOps-friendly exactly when these rules tell the truth about it. Order, from
cli-utils `status.Compute` for a kind without built-in rules:
1. `metadata.deletionTimestamp` set -> Terminating
2. `status.observedGeneration` present (must be an integer) and != `metadata.generation` -> InProgress
3. condition `Reconciling=True` -> InProgress; `Stalled=True` -> Failed
4. condition `Ready`: True -> Current; False or Unknown -> InProgress
5. otherwise Current ("absence of known conditions means current")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

KStatus = Literal["InProgress", "Failed", "Current", "Terminating", "Unknown"]


@dataclass(frozen=True)
class Result:
    status: KStatus
    reason: str
    message: str = ""


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in status.get("conditions") or [] if isinstance(c, dict)}


def compute(obj: dict[str, Any]) -> Result:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return Result("Terminating", "Terminating", "resource scheduled for deletion")
    generation = meta.get("generation")
    if "observedGeneration" in status:
        observed = status["observedGeneration"]
        if isinstance(observed, bool) or not isinstance(observed, int):
            return Result("Unknown", "InvalidObservedGeneration", f"not an integer: {observed!r}")
        if generation is not None and observed != generation:
            return Result(
                "InProgress",
                "LatestGenerationNotObserved",
                f"resource generation is {generation}, observed generation is {observed}",
            )
    conditions = _conditions(status)
    reconciling = conditions.get("Reconciling")
    if reconciling is not None and reconciling.get("status") == "True":
        return Result("InProgress", str(reconciling.get("reason", "")), str(reconciling.get("message", "")))
    stalled = conditions.get("Stalled")
    if stalled is not None and stalled.get("status") == "True":
        return Result("Failed", str(stalled.get("reason", "")), str(stalled.get("message", "")))
    ready = conditions.get("Ready")
    if ready is not None:
        if ready.get("status") == "True":
            return Result("Current", "Ready", str(ready.get("message", "")))
        return Result("InProgress", str(ready.get("reason", "")), str(ready.get("message", "")))
    return Result("Current", "NoConditions", "resource is current")
