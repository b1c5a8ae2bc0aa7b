"""controller.revisions.advance: every transition of status.revisions with a fake clock, and the pair's
readiness and kept objects."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.api.status import RevisionRecord, RevisionsStatus
from tandem.controller.revisions import advance, pair_names, pair_ready

A = RevisionRecord(id="aaaaaaaaaa", prefix="demo", legacy=True)
B = RevisionRecord(id="bbbbbbbbbb", prefix="demo-bbbbbbbbbb")
C = RevisionRecord(id="cccccccccc", prefix="demo-cccccccccc")
DRAIN = 30.0


def run(stored: RevisionsStatus | None, spec: str, *, ready: bool = False, now: float = 1000.0) -> Any:
    status, events = advance(stored, "demo", spec, current_ready=ready, now=now, drain_seconds=DRAIN)
    return status, [reason for _, reason, _ in events]


def test_first_record_is_the_legacy_revision() -> None:
    status, events = run(None, A.id)
    assert status == RevisionsStatus(current=A, weight=100)
    assert events == []


CASES = [
    # (name, stored, spec id, ready, now, expected status, expected event reasons)
    ("steady", RevisionsStatus(current=A), A.id, True, 1000.0, RevisionsStatus(current=A), []),
    (
        "change starts the new pair at weight 0",
        RevisionsStatus(current=A),
        B.id,
        False,
        1000.0,
        RevisionsStatus(current=B, previous=A, weight=0, since=1000.0),
        ["RevisionStarted"],
    ),
    (
        "new pair not ready: no traffic moves",
        RevisionsStatus(current=B, previous=A, weight=0, since=1000.0),
        B.id,
        False,
        1500.0,
        RevisionsStatus(current=B, previous=A, weight=0, since=1000.0),
        [],
    ),
    (
        "new pair ready: it takes every request",
        RevisionsStatus(current=B, previous=A, weight=0, since=1000.0),
        B.id,
        True,
        1010.0,
        RevisionsStatus(current=B, previous=A, weight=100, since=1010.0),
        ["RevisionSwitched"],
    ),
    (
        "old pair still draining",
        RevisionsStatus(current=B, previous=A, weight=100, since=1010.0),
        B.id,
        True,
        1010.0 + DRAIN - 1,
        RevisionsStatus(current=B, previous=A, weight=100, since=1010.0),
        [],
    ),
    (
        "old pair drained: removed",
        RevisionsStatus(current=B, previous=A, weight=100, since=1010.0),
        B.id,
        True,
        1010.0 + DRAIN,
        RevisionsStatus(current=B, weight=100),
        ["RevisionRemoved"],
    ),
    (
        "spec back before the switch: the old pair keeps every request, the new one drains",
        RevisionsStatus(current=B, previous=A, weight=0, since=1000.0),
        A.id,
        False,
        1005.0,
        RevisionsStatus(current=A, previous=B, weight=100, since=1005.0),
        ["RevisionReverted"],
    ),
    (
        "spec back after the switch: weight back to the old pair first",
        RevisionsStatus(current=B, previous=A, weight=100, since=1010.0),
        A.id,
        False,
        1020.0,
        RevisionsStatus(current=A, previous=B, weight=0, since=1020.0),
        ["RevisionReverted"],
    ),
    (
        "third revision while the new pair never served: it is replaced",
        RevisionsStatus(current=B, previous=A, weight=0, since=1000.0),
        C.id,
        False,
        1005.0,
        RevisionsStatus(current=C, previous=A, weight=0, since=1000.0),
        ["RevisionReplaced"],
    ),
    (
        "third revision after the switch: the serving pair becomes the previous one",
        RevisionsStatus(current=B, previous=A, weight=100, since=1010.0),
        C.id,
        False,
        1020.0,
        RevisionsStatus(current=C, previous=B, weight=0, since=1020.0),
        ["RevisionStarted"],
    ),
]


@pytest.mark.parametrize(
    ("stored", "spec", "ready", "now", "expected", "events"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_transitions(
    stored: RevisionsStatus, spec: str, ready: bool, now: float, expected: RevisionsStatus, events: list[str]
) -> None:
    status, reasons = run(stored, spec, ready=ready, now=now)
    assert status == expected
    assert reasons == events


def test_a_later_revision_is_named_apart_from_the_legacy_one() -> None:
    status, _ = run(RevisionsStatus(current=A), "dddddddddd")
    assert status.current == RevisionRecord(id="dddddddddd", prefix="demo-dddddddddd", legacy=False)


def sts(replicas: int | None, ready: int) -> dict[str, Any]:
    spec = {} if replicas is None else {"replicas": replicas}
    return {"spec": spec, "status": {"readyReplicas": ready}}


@pytest.mark.parametrize(
    ("statefulsets", "wanted", "ready"),
    [
        ({"prefill": sts(2, 2), "decode": sts(1, 1)}, {"prefill": 2, "decode": 1}, True),
        ({"prefill": sts(2, 1), "decode": sts(1, 1)}, {"prefill": 2, "decode": 1}, False),
        ({"prefill": sts(1, 1), "decode": None}, {"prefill": 1, "decode": 1}, False),
        ({"prefill": None, "decode": None}, {"prefill": 0, "decode": 0}, True),  # P/D runs no pods
        ({"prefill": sts(None, 1), "decode": sts(None, 0)}, {"prefill": None, "decode": None}, False),
        ({"prefill": sts(None, 1), "decode": sts(None, 1)}, {"prefill": None, "decode": None}, True),
    ],
)
def test_pair_ready(statefulsets: dict[str, Any], wanted: dict[str, int | None], ready: bool) -> None:
    assert pair_ready(statefulsets, wanted) is ready


def test_pair_names() -> None:
    assert ("StatefulSet", "demo-bbbbbbbbbb-prefill") in pair_names(B)
    assert ("PodDisruptionBudget", "demo-decode") in pair_names(A)
    assert len(pair_names(B)) == 6
