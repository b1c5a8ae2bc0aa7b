"""router.revisions: which revision's pair serves a request (pure), pods grouped by revision, and the
router's reading of status.revisions."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.kube.pods import PodInfo, pdd_info_from, pod_info_from
from tandem.router.discovery import endpoints_by_revision
from tandem.router.revisions import choose_revision, draw_for, meant_revision

BOTH = {"": True, "new": True}


@pytest.mark.parametrize(
    ("shares", "draw", "complete", "expected", "meant"),
    [
        ((("new", 0), ("", 100)), 0.0, BOTH, "", ""),  # new pair at weight 0 gets nothing
        ((("new", 100), ("", 0)), 0.99, BOTH, "new", "new"),
        ((("new", 30), ("", 70)), 0.29, BOTH, "new", "new"),
        ((("new", 30), ("", 70)), 0.30, BOTH, "", ""),
        ((("new", 100), ("", 0)), 0.5, {"": True, "new": False}, "", "new"),  # never a pair not ready
        ((("new", 0), ("", 100)), 0.5, {"": False, "new": True}, "new", ""),  # old pair gone: the ready one
        ((("new", 100),), 0.5, {"other": True}, "other", "new"),  # pods of a revision status does not know
        ((("new", 100), ("", 0)), 0.5, {"": False, "new": False}, None, "new"),
        (None, 0.5, {"b": True, "a": True}, "a", None),  # no status yet: any ready pair, deterministically
        (None, 0.5, {}, None, None),
    ],
)
def test_choose_revision(
    shares: tuple[tuple[str, int], ...] | None,
    draw: float,
    complete: dict[str, bool],
    expected: str | None,
    meant: str | None,
) -> None:
    """`meant`: the revision the weights chose, ready or not; a different `expected` stood in for it."""
    assert choose_revision(shares, draw, complete) == expected
    assert meant_revision(shares, draw) == meant


def test_split_follows_the_weight_and_is_stable_per_request_id() -> None:
    shares = (("new", 25), ("", 75))
    picks = [choose_revision(shares, draw_for(f"req-{i}"), BOTH) for i in range(4000)]
    share = picks.count("new") / len(picks)
    assert 0.22 < share < 0.28
    assert picks == [choose_revision(shares, draw_for(f"req-{i}"), BOTH) for i in range(4000)]


def pod(name: str, role: str, revision: str | None, ip: str) -> PodInfo:
    labels = {"tandem.dev/pddeployment": "demo", "tandem.dev/role": role}
    if revision is not None:
        labels["tandem.dev/revision"] = revision
    return pod_info_from(
        {
            "metadata": {"name": name, "labels": labels},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
        }
    )


def test_pods_are_grouped_by_revision_and_legacy_pods_have_none() -> None:
    pods = {
        p.name: p
        for p in [
            pod("demo-prefill-0", "prefill", None, "127.0.0.2"),
            pod("demo-decode-0", "decode", None, "127.0.0.3"),
            pod("demo-r2-prefill-0", "prefill", "r2", "127.0.0.4"),
            pod("demo-colocated-0", "colocated", None, "127.0.0.5"),
        ]
    }
    assert pods["demo-prefill-0"].revision == ""
    assert endpoints_by_revision(pods, "demo", 8000) == {
        "": {"prefill": ["http://127.0.0.2:8000"], "decode": ["http://127.0.0.3:8000"]},
        "r2": {"prefill": ["http://127.0.0.4:8000"], "decode": []},
    }


def pdd(revisions: Any) -> dict[str, Any]:
    return {"metadata": {"name": "demo"}, "spec": {}, "status": {"revisions": revisions}}


@pytest.mark.parametrize(
    ("revisions", "expected"),
    [
        (None, None),
        ({"current": {"id": "a1", "prefix": "demo", "legacy": True}, "weight": 100}, (("", 100),)),
        (
            {
                "current": {"id": "b2", "prefix": "demo-b2"},
                "previous": {"id": "a1", "prefix": "demo", "legacy": True},
                "weight": 0,
            },
            (("b2", 0), ("", 100)),
        ),
        (
            {
                "current": {"id": "c3", "prefix": "demo-c3"},
                "previous": {"id": "b2", "prefix": "x"},
                "weight": 140,
            },
            (("c3", 100), ("b2", 0)),
        ),
        ({"current": "garbage"}, None),
    ],
)
def test_router_reads_status_revisions(revisions: Any, expected: Any) -> None:
    assert pdd_info_from(pdd(revisions)).revisions == expected
