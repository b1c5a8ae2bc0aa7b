"""The kstatus helper itself, table-driven against the rules in its docstring (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

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
