"""Drain-aware scale-down: which pods are drained, when the StatefulSet may shrink, cancellation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tandem.api.status import DrainStatus
from tandem.controller import drain
from tandem.controller.drain import DRAIN_SETTLE_SECONDS, PodView

STS = "llama-decode"
T0 = 1000.0
TIMEOUT = 300.0


@dataclass(frozen=True)
class Load:
    running: float = 0.0
    waiting: float = 0.0
    kv_blocks_held: float = 0.0


def views(n: int, draining: tuple[int, ...] = ()) -> list[PodView]:
    return [PodView(f"{STS}-{i}", i, True, i in draining) for i in range(n)]


def plan(**kwargs: Any) -> drain.DrainPlan:
    args: dict[str, Any] = {
        "role": "decode",
        "statefulset": STS,
        "desired": 2,
        "applied": 4,
        "drain": None,
        "pods": views(4),
        "loads": None,
        "now": T0,
        "timeout": TIMEOUT,
    }
    return drain.plan(**(args | kwargs))


def started(target: int = 2, at: float = T0) -> DrainStatus:
    names = drain.drained_names(STS, target, 4)
    return DrainStatus(pod=names[0], pods=names, started_at=at, target_replicas=target)


def test_scale_down_marks_the_highest_ordinals_and_keeps_replicas() -> None:
    result = plan()
    assert result.replicas == 4
    assert result.annotate == (f"{STS}-2", f"{STS}-3")
    assert result.drain == started()
    assert not result.finished


def test_waits_while_a_drained_pod_streams() -> None:
    later = T0 + DRAIN_SETTLE_SECONDS + 1
    busy = {f"{STS}-2": Load(), f"{STS}-3": Load(running=1)}
    result = plan(drain=started(), pods=views(4, (2, 3)), loads=busy, now=later)
    assert result.replicas == 4
    assert result.drain == started()
    assert result.annotate == ()


def test_unknown_load_is_not_idle() -> None:
    later = T0 + DRAIN_SETTLE_SECONDS + 1
    result = plan(drain=started(), pods=views(4, (2, 3)), loads={f"{STS}-2": Load()}, now=later)
    assert result.replicas == 4


def test_idle_pods_before_the_settle_time_still_wait() -> None:
    idle = {f"{STS}-2": Load(), f"{STS}-3": Load()}
    result = plan(drain=started(), pods=views(4, (2, 3)), loads=idle, now=T0 + 1)
    assert result.replicas == 4


def test_shrinks_once_every_drained_pod_is_idle() -> None:
    idle = {f"{STS}-2": Load(), f"{STS}-3": Load()}
    result = plan(drain=started(), pods=views(4, (2, 3)), loads=idle, now=T0 + DRAIN_SETTLE_SECONDS)
    assert result.replicas == 2
    assert result.drain is None
    assert result.finished == "idle"


def test_prefill_waits_for_kv_not_yet_pulled() -> None:
    names = drain.drained_names("llama-prefill", 1, 2)
    record = DrainStatus(pod=names[0], pods=names, started_at=T0, target_replicas=1)
    pods = [PodView("llama-prefill-0", 0, True, False), PodView("llama-prefill-1", 1, True, True)]
    later = T0 + DRAIN_SETTLE_SECONDS
    common: dict[str, Any] = {"role": "prefill", "statefulset": "llama-prefill", "desired": 1, "applied": 2}
    held = plan(
        **common, drain=record, pods=pods, loads={"llama-prefill-1": Load(kv_blocks_held=3)}, now=later
    )
    assert held.replicas == 2
    done = plan(**common, drain=record, pods=pods, loads={"llama-prefill-1": Load()}, now=later)
    assert done.replicas == 1


def test_pods_that_never_ran_or_are_gone_hold_nothing() -> None:
    pods = [*views(2), PodView(f"{STS}-2", 2, False, True)]  # pending; ordinal 3 already gone
    result = plan(drain=started(), pods=pods, loads={}, now=T0 + DRAIN_SETTLE_SECONDS)
    assert result.replicas == 2


def test_timeout_shrinks_even_while_busy() -> None:
    busy = {f"{STS}-2": Load(running=5), f"{STS}-3": Load(waiting=1)}
    result = plan(drain=started(), pods=views(4, (2, 3)), loads=busy, now=T0 + TIMEOUT)
    assert result.replicas == 2
    assert result.finished == "timeout"


def test_zero_timeout_shrinks_at_once_after_marking() -> None:
    result = plan(timeout=0.0)
    assert result.annotate == (f"{STS}-2", f"{STS}-3")
    assert result.replicas == 2


def test_scale_up_during_a_drain_cancels_it() -> None:
    result = plan(desired=5, drain=started(), pods=views(4, (2, 3)))
    assert result.replicas == 5
    assert result.drain is None
    assert result.cancelled
    assert result.unannotate == (f"{STS}-2", f"{STS}-3")


def test_back_to_the_current_size_cancels_too() -> None:
    result = plan(desired=4, drain=started(), pods=views(4, (2, 3)))
    assert (result.replicas, result.cancelled, result.unannotate) == (4, True, (f"{STS}-2", f"{STS}-3"))


def test_a_smaller_scale_down_keeps_the_start_and_unmarks_pods_that_stay() -> None:
    result = plan(desired=3, drain=started(), pods=views(4, (2, 3)), now=T0 + 5)
    assert result.unannotate == (f"{STS}-2",)
    assert result.drain == DrainStatus(pod=f"{STS}-3", pods=[f"{STS}-3"], started_at=T0, target_replicas=3)


def test_a_deeper_scale_down_restarts_the_clock_for_the_new_pods() -> None:
    result = plan(desired=1, drain=started(), pods=views(4, (2, 3)), now=T0 + 5)
    assert result.annotate == (f"{STS}-1",)
    assert result.drain is not None
    assert result.drain.started_at == T0 + 5
    assert result.drain.pods == [f"{STS}-1", f"{STS}-2", f"{STS}-3"]


def test_no_statefulset_yet_means_no_drain() -> None:
    assert plan(applied=None) == drain.DrainPlan(replicas=2, drain=None)


@pytest.mark.parametrize(
    ("now", "needed"),
    [(T0, False), (T0 + DRAIN_SETTLE_SECONDS, True), (T0 + TIMEOUT, False)],
)
def test_loads_are_read_only_while_they_matter(now: float, needed: bool) -> None:
    assert drain.loads_needed(started(), now, TIMEOUT) is needed
    assert drain.loads_needed(None, now, TIMEOUT) is False


def test_pod_views_from_api_objects() -> None:
    pods: list[dict[str, Any]] = [
        {"metadata": {"name": f"{STS}-1", "annotations": {"tandem.dev/draining": "x"}},
         "status": {"phase": "Running", "podIP": "127.20.0.5"}},
        {"metadata": {"name": f"{STS}-0"}, "status": {"phase": "Pending"}},
        {"metadata": {"name": "llama-decode-extra-0"}, "status": {}},  # another StatefulSet's
        {"metadata": {"name": "llama-router-5d9f-abcde"}, "status": {}},
    ]  # fmt: skip
    assert drain.pod_views(pods, STS) == [
        PodView(f"{STS}-0", 0, False, False),
        PodView(f"{STS}-1", 1, True, True),
    ]


def test_nan_figures_are_not_idle() -> None:
    nan = float("nan")
    assert not drain.idle(Load(running=nan), "decode")
    assert not drain.idle(Load(kv_blocks_held=nan), "prefill")  # vLLM's unpulled KV may be unknown
    assert drain.idle(Load(kv_blocks_held=nan), "decode")
