"""controller.revisions.advance: every transition of status.revisions with a fake clock, and the pair's
readiness and kept objects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from tandem.api.status import RevisionRecord, RevisionsStatus, RolloutStatus
from tandem.controller.revisions import (
    PairSizes,
    advance,
    idle_check,
    pair_names,
    pair_ready,
    pair_sizes,
    pair_workload,
    removal,
    share_config,
)
from tandem.render import names

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
        "old pair not seen idle: removed at the drain timeout",
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
    # a pool of either shape: its StatefulSet, or its LeaderWorkerSet (a pair kept across a change of
    # nodesPerInstance has the other revision's kind)
    assert ("LeaderWorkerSet", "demo-bbbbbbbbbb-decode") in pair_names(B)
    assert len(pair_names(B)) == 8


def test_pair_names_of_a_long_prefix_hold_the_cut_group_names() -> None:
    long = RevisionRecord(id="cccccccccc", prefix="a-deployment-name-of-forty-characters-cccccccccc")
    lws = names.group_name(f"{long.prefix}-decode")
    assert lws != f"{long.prefix}-decode"
    assert len(lws) <= names.MAX_GROUP_NAME
    assert ("LeaderWorkerSet", lws) in pair_names(long)
    assert ("Service", lws) in pair_names(long)  # the group's headless Service, of its name
    assert ("StatefulSet", f"{long.prefix}-decode") in pair_names(long)


@pytest.mark.parametrize(
    ("existing", "found"),
    [
        ({("StatefulSet", "demo-bbbbbbbbbb-decode"): {"kind": "StatefulSet"}}, "StatefulSet"),
        ({("LeaderWorkerSet", "demo-bbbbbbbbbb-decode"): {"kind": "LeaderWorkerSet"}}, "LeaderWorkerSet"),
        ({("StatefulSet", "demo-decode"): {"kind": "StatefulSet"}}, None),  # another revision's
    ],
)
def test_a_pairs_workload_is_its_statefulset_or_its_leaderworkerset(
    existing: dict[tuple[str, str], Any], found: str | None
) -> None:
    workload = pair_workload(existing, B, "decode")
    assert (workload or {}).get("kind") == found


# --- the old pair goes once idle, at the latest after the drain timeout --------------------------------

SETTLE, TIMEOUT = 10.0, 300.0

# (seconds since its weight went to 0, what its pods' loads say) -> removed now, and why
REMOVAL = [
    (5.0, True, None),  # idle, but the routers and a scrape have not caught up yet
    (10.0, True, "idle"),
    (10.0, False, None),  # requests still in flight
    (10.0, None, None),  # loads unknown (no Prometheus, a failed query): waits
    (299.0, False, None),
    (300.0, False, "timeout"),
    (300.0, None, "timeout"),
]


@pytest.mark.parametrize(("elapsed", "idle", "expected"), REMOVAL)
def test_removal(elapsed: float, idle: bool | None, expected: str | None) -> None:
    asked: list[bool] = []

    def check() -> bool | None:
        asked.append(True)
        return idle

    assert removal(1000.0, 1000.0 + elapsed, check, SETTLE, TIMEOUT) == expected
    if elapsed < SETTLE:
        assert asked == [], "loads are read only once they can tell"


def test_the_cut_over_removes_the_old_pair_when_idle_and_says_so() -> None:
    stored = RevisionsStatus(current=B, previous=A, weight=100, since=1010.0)

    def at(now: float, idle: bool | None) -> tuple[RevisionsStatus, list[tuple[str, str, str]]]:
        return advance(
            stored, "demo", B.id, current_ready=True, now=now, drain_seconds=TIMEOUT,
            old_idle=lambda: idle, settle_seconds=SETTLE,
        )  # fmt: skip

    assert at(1015.0, True) == (stored, [])
    assert at(1030.0, False) == (stored, [])
    status, events = at(1030.0, True)
    assert status == RevisionsStatus(current=B, weight=100)
    assert [(r, "idle" in m) for _, r, m in events] == [("RevisionRemoved", True)]
    assert "20 s after its weight went to 0" in events[0][2]
    status, events = at(1310.0, False)
    assert status == RevisionsStatus(current=B, weight=100)
    assert "drain timeout (300 s" in events[0][2]


def pod(
    name: str, role: str, revision: str | None, phase: str = "Running", ports: tuple[str, ...] = ("http",)
) -> dict[str, Any]:
    labels = {"tandem.dev/role": role}
    if revision is not None:
        labels["tandem.dev/revision"] = revision
    container = {
        "name": "engine",
        "ports": [{"name": n, "containerPort": 8000 + i} for i, n in enumerate(ports)],
    }
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [container]},
        "status": {"phase": phase, "podIP": "127.0.0.9"},
    }


@dataclass
class Load:
    running: float = 0.0
    waiting: float = 0.0
    kv_blocks_held: float = 0.0


PODS = [
    pod("demo-prefill-0", "prefill", None, ports=("http", "http-1", "nixl")),  # MultiPortExternal, 2 ranks
    pod("demo-decode-0", "decode", None),
    pod("demo-decode-1", "decode", None, phase="Pending"),  # holds no request
    pod(f"{B.prefix}-prefill-0", "prefill", B.id),
    pod(f"{B.prefix}-decode-0", "decode", B.id),
    pod("demo-colocated-0", "colocated", None),
    pod("demo-router-x", "router", None),
]


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ({"demo-prefill-0": Load(), "demo-decode-0": Load()}, True),
        ({"demo-prefill-0": Load(), "demo-decode-0": Load(running=1)}, False),
        ({"demo-prefill-0": Load(kv_blocks_held=3), "demo-decode-0": Load()}, False),  # a pull pending
        ({"demo-prefill-0": Load()}, False),  # a pod without figures is not known idle
        (None, None),  # not read
    ],
)
def test_idle_check_reads_the_old_pairs_serving_pods(
    loads: dict[str, Load] | None, expected: bool | None
) -> None:
    asked: list[dict[str, int]] = []

    def loads_for(ports: Mapping[str, int]) -> Any:
        asked.append(dict(ports))
        return loads

    assert idle_check(PODS, A, loads_for)() is expected
    # the legacy pair's Running P/D pods only, each with the scrape targets it must report from
    assert asked == [{"demo-prefill-0": 2, "demo-decode-0": 1}]
    assert idle_check(PODS, B, lambda ports: {n: Load() for n in ports})() is True
    assert idle_check([], A, loads_for)() is True, "no pod left"
    assert idle_check(PODS, A, None)() is None


# --- each pair sized for its share during a revision rollout --------------------------------------------


def rollout_record(phase: str, step: int = 0, target: str = B.id) -> RolloutStatus:
    extra: dict[str, Any] = {}
    if phase == "Paused":
        extra["pause_cause"] = "AwaitingPromote"
    if phase == "RollingBack":
        extra["rollback_stage"] = "RestoringWeight"
    return RolloutStatus(
        phase=phase, step=step, weight=0, started_at=0, step_started_at=0, phase_since=0, reason="",
        target=target, **extra,
    )  # fmt: skip


STEPS = [10, 50, 100]
DECIDED: dict[str, int | None] = {"prefill": 2, "decode": 4, "colocated": 3}

# (phase, step, weight on the new pair) -> the new pair's sizes, the old pair's (None: left as it is)
PAIR_SIZES = [
    ("Preparing", 0, 0, {"prefill": 1, "decode": 1}, {"prefill": 2, "decode": 4}),  # first step's share
    ("Shifting", 0, 10, {"prefill": 1, "decode": 1}, {"prefill": 2, "decode": 4}),  # ceil(0.9 x 4) = 4
    ("Shifting", 1, 50, {"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 2}),  # traded, not doubled
    ("Paused", 1, 50, {"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 2}),
    ("Shifting", 2, 100, {"prefill": 2, "decode": 4}, {"prefill": 1, "decode": 1}),  # one each while 0 %
    ("RollingBack", 1, 0, {"prefill": 1, "decode": 2}, {"prefill": 2, "decode": 4}),  # old back to full
    ("Promoted", 2, 100, {"prefill": 2, "decode": 4}, None),  # the old pair drains as it is
]


@pytest.mark.parametrize(("phase", "step", "weight", "new", "old"), PAIR_SIZES)
def test_pair_sizes(
    phase: str, step: int, weight: int, new: dict[str, int], old: dict[str, int] | None
) -> None:
    status = RevisionsStatus(current=B, previous=A, weight=weight, rollout=rollout_record(phase, step))
    sizes = pair_sizes(status, DECIDED, STEPS)
    assert sizes.current == new
    assert sizes.previous == (old or {})
    if old is not None and phase in ("Shifting", "Paused"):
        for role in ("prefill", "decode"):
            full = DECIDED[role]
            assert full is not None
            new_size = sizes.current[role]
            assert new_size is not None
            assert new_size + sizes.previous[role] <= full + 1, "at most one more than full"


def test_pair_sizes_leave_the_cut_over_and_external_pools_alone() -> None:
    cut_over = RevisionsStatus(current=B, previous=A, weight=0)
    assert pair_sizes(cut_over, DECIDED, STEPS) == PairSizes()
    held = RevisionsStatus(current=A, weight=100, rollout=rollout_record("RolledBack"))
    assert pair_sizes(held, DECIDED, STEPS) == PairSizes()
    status = RevisionsStatus(current=B, previous=A, weight=50, rollout=rollout_record("Shifting", 1))
    sizes = pair_sizes(status, {"prefill": None, "decode": 0}, STEPS)
    assert sizes.current == {"prefill": None, "decode": 0}
    assert sizes.previous == {"decode": 0}


@pytest.mark.parametrize(
    ("api_version", "kind"), [("apps/v1", "StatefulSet"), ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")]
)
def test_share_config_sets_only_the_replicas(api_version: str, kind: str) -> None:
    live = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "demo-decode", "namespace": "ns", "labels": {"a": "b"}},
        "spec": {"replicas": 4, "template": {}},
    }
    config = share_config(live, 2)
    assert config == {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "demo-decode", "namespace": "ns"},
        "spec": {"replicas": 2},
    }
