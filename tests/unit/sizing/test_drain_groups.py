"""Drain-aware scale-down of a multi-node pool (issue 27 item 5): LeaderWorkerSet removes its highest
groups; the drain marks every pod of each group leaving (leader `<lws>-<g>`, workers `<lws>-<g>-<w>`:
LeaderWorkerSet's leader StatefulSet `<lws>` and each group's worker StatefulSet `<lws>-<g>`, ordinals
from 1) and keeps the groups until the pods that report engine metrics are idle (fake clock)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tandem.api import meta
from tandem.api.status import DrainStatus
from tandem.sizing import drain
from tandem.sizing.drain import DRAIN_SETTLE_SECONDS, PodView

LWS = "mn-decode"
T0 = 1000.0
TIMEOUT = 300.0
LATER = T0 + DRAIN_SETTLE_SECONDS + 1


@dataclass(frozen=True)
class Load:
    running: float = 0.0
    waiting: float = 0.0
    kv_blocks_held: float = 0.0


def pod(name: str, *, scraped: bool = True, draining: bool = False, phase: str = "Running") -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if scraped:
        annotations[meta.ANNOTATION_SCRAPE] = "true"
    if draining:
        annotations[meta.ANNOTATION_DRAINING] = "2026-01-01T00:00:00Z"
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {"phase": phase, "podIP": "127.0.0.9" if phase == "Running" else None},
    }


def groups(
    n: int, nodes: int = 2, *, draining: tuple[int, ...] = (), workers_serve: bool = False
) -> list[PodView]:
    """The pods of `n` groups of `nodes` pods (Internal: the workers headless, unscraped)."""
    objs = []
    for g in range(n):
        objs.append(pod(f"{LWS}-{g}", draining=g in draining))
        objs += [
            pod(f"{LWS}-{g}-{w}", scraped=workers_serve, draining=g in draining) for w in range(1, nodes)
        ]
    return drain.pod_views(objs, LWS, nodes)


def plan(**kwargs: Any) -> drain.DrainPlan:
    args: dict[str, Any] = {
        "role": "decode",
        "statefulset": LWS,
        "desired": 1,
        "applied": 3,
        "drain": None,
        "pods": groups(3),
        "loads": None,
        "now": T0,
        "timeout": TIMEOUT,
        "nodes": 2,
    }
    return drain.plan(**(args | kwargs))


def started(target: int = 1, at: float = T0, current: int = 3) -> DrainStatus:
    names = drain.drained_names(LWS, target, current, 2)
    return DrainStatus(pod=names[0], pods=names, started_at=at, target_replicas=target)


@pytest.mark.parametrize(
    ("target", "current", "nodes", "expected"),
    [
        (2, 3, 1, ["mn-decode-2"]),  # a StatefulSet
        (1, 3, 2, ["mn-decode-1", "mn-decode-1-1", "mn-decode-2", "mn-decode-2-1"]),
        (0, 1, 3, ["mn-decode-0", "mn-decode-0-1", "mn-decode-0-2"]),
        (2, 2, 2, []),
    ],
)
def test_drained_names_are_every_pod_of_the_groups_leaving(
    target: int, current: int, nodes: int, expected: list[str]
) -> None:
    assert drain.drained_names(LWS, target, current, nodes) == expected


def test_pod_views_of_groups_by_name() -> None:
    objs = [
        pod("mn-decode-1-1", scraped=False),
        pod("mn-decode-0"),
        pod("mn-decode-0-1", scraped=False),
        pod("mn-decode-1", draining=True),
        pod("mn-decode-0-2"),  # not a worker of a 2-pod group
        pod("mn-decode-x"),
        pod("mn-prefill-0"),
        pod("mn-decode-10", phase="Pending"),
    ]
    views = drain.pod_views(objs, LWS, 2)
    assert [(v.name, v.ordinal, v.serving, v.draining, v.reports) for v in views] == [
        ("mn-decode-0", 0, True, False, True),
        ("mn-decode-0-1", 0, True, False, False),
        ("mn-decode-1", 1, True, True, True),
        ("mn-decode-1-1", 1, True, False, False),
        ("mn-decode-10", 10, False, False, True),
    ]
    # A StatefulSet's pods (one pod a replica) never parse as workers, and always report.
    assert [v.name for v in drain.pod_views(objs, LWS)] == ["mn-decode-0", "mn-decode-1", "mn-decode-10"]


def test_scale_down_marks_every_pod_of_the_highest_groups_and_keeps_them() -> None:
    result = plan()
    assert result.replicas == 3
    assert result.annotate == ("mn-decode-1", "mn-decode-1-1", "mn-decode-2", "mn-decode-2-1")
    assert result.drain == started()
    assert not result.finished


IDLE_CASES = [
    # id, loads by pod, workers serve (scraped), expected replicas after the settle time
    ("leaders-idle", {"mn-decode-1": Load(), "mn-decode-2": Load()}, False, 1),
    ("a-leader-streams", {"mn-decode-1": Load(), "mn-decode-2": Load(running=2)}, False, 3),
    ("a-leader-unknown", {"mn-decode-1": Load()}, False, 3),
    # Hybrid: every pod serves and reports; a worker's stream holds its group
    (
        "serving-worker-streams",
        {
            "mn-decode-1": Load(),
            "mn-decode-1-1": Load(running=1),
            "mn-decode-2": Load(),
            "mn-decode-2-1": Load(),
        },
        True,
        3,
    ),
    (
        "serving-workers-idle",
        {"mn-decode-1": Load(), "mn-decode-1-1": Load(), "mn-decode-2": Load(), "mn-decode-2-1": Load()},
        True,
        1,
    ),
]


@pytest.mark.parametrize(
    ("loads", "workers_serve", "replicas"), [c[1:] for c in IDLE_CASES], ids=[c[0] for c in IDLE_CASES]
)
def test_a_group_goes_once_every_pod_that_reports_is_idle(
    loads: dict[str, Load], workers_serve: bool, replicas: int
) -> None:
    pods = groups(3, draining=(1, 2), workers_serve=workers_serve)
    result = plan(drain=started(), pods=pods, loads=loads, now=LATER)
    assert result.replicas == replicas
    assert (result.finished == "idle") == (replicas == 1)
    assert (result.drain is None) == (replicas == 1)


def test_prefill_group_waits_for_kv_not_yet_pulled_from_its_leader() -> None:
    loads = {"mn-decode-1": Load(), "mn-decode-2": Load(kv_blocks_held=3)}
    result = plan(role="prefill", drain=started(), pods=groups(3, draining=(1, 2)), loads=loads, now=LATER)
    assert result.replicas == 3


def test_timeout_removes_the_groups_even_while_busy() -> None:
    busy = {"mn-decode-1": Load(running=1), "mn-decode-2": Load(running=1)}
    result = plan(drain=started(), pods=groups(3, draining=(1, 2)), loads=busy, now=T0 + TIMEOUT)
    assert (result.replicas, result.finished) == (1, "timeout")


def test_scale_up_during_a_group_drain_unmarks_every_pod_that_stays() -> None:
    result = plan(desired=3, drain=started(), pods=groups(3, draining=(1, 2)))
    assert result.cancelled
    assert result.replicas == 3
    assert result.unannotate == ("mn-decode-1", "mn-decode-1-1", "mn-decode-2", "mn-decode-2-1")


def test_a_smaller_scale_down_unmarks_the_group_that_stays() -> None:
    result = plan(desired=2, drain=started(), pods=groups(3, draining=(1, 2)), now=T0 + 5)
    assert result.unannotate == ("mn-decode-1", "mn-decode-1-1")
    assert result.drain == started(target=2)
