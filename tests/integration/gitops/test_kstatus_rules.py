"""The kstatus helper itself, table-driven against the rules in its docstring, and the kstatus of
statuses the operator derives for revision rollouts and a degraded KV transport (no cluster)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeployment
from tandem.api.status import RevisionRecord, RevisionsStatus, RolloutStatus
from tandem.status.derive import Observed, WorkloadState, derive_status

from .kstatus import compute


def obj(generation: int = 1, status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "x", "generation": generation, **meta}}
    if status is not None:
        body["status"] = status
    return body


def cond(kind: str, status: str, reason: str = "R") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": f"{kind} is {status}"}


CASES = [
    ("no status is Current (the apply-time gap)", obj(), "Current"),
    ("deleting", obj(deletionTimestamp="2026-11-29T09:00:00Z"), "Terminating"),
    (
        "old generation",
        obj(2, {"observedGeneration": 1, "conditions": [cond("Ready", "True")]}),
        "InProgress",
    ),
    ("defaulted observedGeneration 0", obj(1, {"observedGeneration": 0}), "InProgress"),
    ("string observedGeneration", obj(1, {"observedGeneration": "1"}), "Unknown"),
    (
        "reconciling",
        obj(1, {"observedGeneration": 1, "conditions": [cond("Reconciling", "True")]}),
        "InProgress",
    ),
    ("stalled", obj(1, {"observedGeneration": 1, "conditions": [cond("Stalled", "True")]}), "Failed"),
    (
        "reconciling wins over stalled",
        obj(1, {"conditions": [cond("Stalled", "True"), cond("Reconciling", "True")]}),
        "InProgress",
    ),
    ("ready", obj(1, {"observedGeneration": 1, "conditions": [cond("Ready", "True")]}), "Current"),
    ("not ready", obj(1, {"observedGeneration": 1, "conditions": [cond("Ready", "False")]}), "InProgress"),
    ("ready unknown", obj(1, {"conditions": [cond("Ready", "Unknown")]}), "InProgress"),
    ("other conditions only", obj(1, {"conditions": [cond("Available", "False")]}), "Current"),
]


@pytest.mark.parametrize(("body", "expected"), [(b, e) for _, b, e in CASES], ids=[n for n, _, _ in CASES])
def test_rules(body: dict[str, Any], expected: str) -> None:
    assert compute(body).status == expected


# --- kstatus of the statuses the operator derives for rollouts and the KV transport ---------------

NOW = "2026-11-29T09:00:00Z"


def _derived(**observed: Any) -> dict[str, Any]:
    doc = yaml.safe_load((Path(__file__).parents[3] / "examples" / "sim-pd.yaml").read_text())
    doc["metadata"].update(generation=4, uid="3a0c1f6e-0000-4000-8000-000000000001")
    pdd = PDDeployment.from_object(doc)
    done = WorkloadState(
        generation=1, observed_generation=1, replicas=1, ready_replicas=1, updated_replicas=1
    )
    base = Observed(
        workloads={"prefill": done, "decode": done, "router": done},
        desired_replicas={"prefill": 1, "decode": 1, "colocated": 0, "router": 1},
    )
    status = derive_status(pdd, dataclasses.replace(base, **observed), [], NOW)
    return {
        "metadata": {"name": "x", "generation": 4},
        "status": status.model_dump(by_alias=True, mode="json", exclude_none=True),
    }


def _revision_rollout(phase: str, weight: int, **extra: Any) -> RevisionsStatus:
    record = RolloutStatus(
        phase=phase, weight=weight, started_at=0, step_started_at=0, phase_since=0, reason=phase,
        target="bbbbbbbbbb", **extra,
    )  # fmt: skip
    old = RevisionRecord(id="aaaaaaaaaa", prefix="sim-pd", legacy=True)
    new = RevisionRecord(id="bbbbbbbbbb", prefix="sim-pd-bbbbbbbbbb")
    return RevisionsStatus(current=new, previous=old, weight=weight, rollout=record)


DERIVED = [
    ("revision rollout preparing", {"revisions": _revision_rollout("Preparing", 0)}, "InProgress"),
    ("revision rollout shifting", {"revisions": _revision_rollout("Shifting", 50)}, "InProgress"),
    (
        "revision rollout rolling back",
        {"revisions": _revision_rollout("RollingBack", 0, rollback_stage="RestoringWeight")},
        "InProgress",
    ),
    (
        "revision rollout paused (waits for a human)",
        {"revisions": _revision_rollout("Paused", 50, pause_cause="AwaitingPromote")},
        "Current",
    ),
    ("revision rollout rolled back", {"revisions": _revision_rollout("RolledBack", 0)}, "Failed"),
    ("revision rollout promoted", {"revisions": _revision_rollout("Promoted", 100)}, "Current"),
    # Serving works on a slow link: Ready stays True (kstatus Current, the message says why), while
    # the phase and Argo CD health are Degraded.
    (
        "KV transport degraded",
        {"kv_condition": ("True", "BandwidthBelowThreshold", "effective KV bandwidth 1.0 Gb/s, 10%")},
        "Current",
    ),
]


@pytest.mark.parametrize(
    ("observed", "expected"), [(o, e) for _, o, e in DERIVED], ids=[n for n, _, _ in DERIVED]
)
def test_derived_statuses(observed: dict[str, Any], expected: str) -> None:
    obj = _derived(**observed)
    result = compute(obj)
    assert result.status == expected, obj["status"]["conditions"]
    if "kv_condition" in observed:
        assert obj["status"]["phase"] == "Degraded"
        assert "KVTransportDegraded: effective KV bandwidth 1.0 Gb/s" in result.message
    if expected == "Failed":
        assert result.reason == "RolledBack"
        assert "revision rollout to bbbbbbbbbb RolledBack" in result.message
