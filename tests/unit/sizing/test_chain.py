"""The sizing chain (pure): spec + the autoscaler's state + the rollout arms + drains + the change in
progress -> each pool's StatefulSet replicas, its desiredReplicas, and the stage that set them.

Each row of the table is one pass: fixed sizes, autoscaled, external (HPA) pools, a mode rollout's
steps (colocated shrinking as P/D grows), revision pairs, maxGPUs binding during a change, pods
still draining, Advisory mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tandem import sizing
from tandem.api.models import PDDeploymentSpec
from tandem.api.status import (
    AutoscalingPoolsStatus,
    AutoscalingStatus,
    DrainStatus,
    PoolAutoscalingStatus,
    RevisionRecord,
    RevisionsStatus,
    RolloutStatus,
)
from tandem.controller import replicas
from tandem.rollout.arms import Bound
from tandem.sizing.drain import PodView

NAME = "llama"
NOW = 1_800_000_000.0
TIMEOUT = 60.0


def spec(**pools: Any) -> PDDeploymentSpec:
    """Prefill 1, decode 2, colocated 0, none autoscaled, unless `pools` says otherwise (camelCase)."""
    extra = {key: pools.pop(key) for key in ("maxGPUs", "autoscaling", "rollout") if key in pools}
    doc: dict[str, Any] = {
        "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"type": "sim", "image": "img"},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 2},
        "slo": {"ttftMs": 500, "tpotMs": 50},
        "autoscaling": {"enabled": True},
    }
    for role, block in pools.items():
        doc[role] = block
    if "autoscaling" in extra:
        doc["autoscaling"] = {"enabled": True, **extra["autoscaling"]}
    if "maxGPUs" in extra:  # admission wants spec.rollout when the arms trade capacity within it
        doc["maxGPUs"] = extra["maxGPUs"]
        doc["rollout"] = {"steps": [{"weight": 10}, {"weight": 50}, {"weight": 100}]}
    return PDDeploymentSpec.model_validate(doc)


def autoscaled(replicas: int, low: int = 1, high: int = 8, **more: Any) -> dict[str, Any]:
    return {"replicas": replicas, "autoscaling": {"minReplicas": low, "maxReplicas": high, **more}}


def state(**pools: PoolAutoscalingStatus) -> AutoscalingStatus:
    return AutoscalingStatus(mode="Active", last_evaluated=NOW, pools=AutoscalingPoolsStatus(**pools))


def want(n: int, draining: DrainStatus | None = None) -> PoolAutoscalingStatus:
    return PoolAutoscalingStatus(desired_replicas=n, draining=draining)


def pods(role: str, count: int, draining: tuple[int, ...] = ()) -> tuple[PodView, ...]:
    return tuple(PodView(f"{NAME}-{role}-{i}", i, True, i in draining) for i in range(count))


def record(phase: str, weight: int, target: str, step: int = 0) -> RolloutStatus:
    extra: dict[str, Any] = {"rollback_stage": "RestoringWeight"} if phase == "RollingBack" else {}
    return RolloutStatus(
        phase=phase, step=step, weight=weight, started_at=0, step_started_at=0, phase_since=0,
        target=target, **extra,
    )  # fmt: skip


OLD = RevisionRecord(id="aaaa", prefix=f"{NAME}-aaaa")
NEW = RevisionRecord(id="bbbb", prefix=f"{NAME}-bbbb")


def pairs(phase: str, weight: int, step: int = 0) -> RevisionsStatus:
    return RevisionsStatus(
        current=NEW, previous=OLD, weight=weight, rollout=record(phase, weight, NEW.id, step)
    )


@dataclass(frozen=True)
class Row:
    id: str
    spec: PDDeploymentSpec
    replicas: dict[str, int | None]  # expected StatefulSet replicas per pool
    limited_by: dict[str, str]  # expected stage per pool (pools not named: the source's stage)
    state: AutoscalingStatus | None = None
    bounds: dict[str, Bound] = field(default_factory=dict)
    live: dict[str, int | None] = field(default_factory=dict)
    pods: dict[str, tuple[PodView, ...]] = field(default_factory=dict)
    loads: dict[str, Any] = field(default_factory=dict)
    change: sizing.Change = field(default_factory=sizing.Change)
    desired: dict[str, int | None] | None = None  # expected desiredReplicas (default: = replicas)
    previous: dict[str, int] = field(default_factory=dict)  # expected sizes of the kept previous pair


@dataclass
class Load:
    running: float = 0.0
    waiting: float = 0.0
    kv_blocks_held: float = 0.0


DRAIN = DrainStatus(pod=f"{NAME}-decode-2", pods=[f"{NAME}-decode-2"], started_at=NOW - 30, target_replicas=2)
PD_RAMP = {"colocated": {"replicas": 4}, "prefill": {"replicas": 2}, "decode": {"replicas": 2}}

ROWS = [
    Row(
        "fixed sizes: the spec's",
        spec(prefill={"replicas": 2}, decode={"replicas": 3}),
        {"prefill": 2, "decode": 3, "colocated": 0},
        {},
        live={"prefill": 2, "decode": 3, "colocated": 0},
    ),
    Row(
        "autoscaled: the autoscaler's desiredReplicas, not the spec's",
        spec(decode=autoscaled(2)),
        {"prefill": 1, "decode": 5, "colocated": 0},
        {"decode": "autoscaler"},
        state=state(decode=want(5)),
        live={"prefill": 1, "decode": 3, "colocated": 0},
    ),
    Row(
        "external: rendered without replicas; the desired count is the live one (filled by the caller)",
        spec(decode=autoscaled(2, external=True)),
        {"prefill": 1, "decode": None, "colocated": 0},
        {"decode": "external"},
        state=state(decode=want(4)),
        live={"prefill": 1, "decode": 4, "colocated": 0},
        desired={"prefill": 1, "decode": None, "colocated": 0},
    ),
    Row(
        "external, first pass: the StatefulSet starts at the spec's size (handed over next pass)",
        spec(decode=autoscaled(2, external=True)),
        {"prefill": 1, "decode": 2, "colocated": 0},
        {"decode": "external"},
        desired={"prefill": 1, "decode": None, "colocated": 0},
    ),
    Row(
        "mode rollout at 50 %: colocated at its share, the P/D pools fixed at theirs",
        spec(**PD_RAMP),
        {"prefill": 1, "decode": 1, "colocated": 2},
        {"prefill": "rolloutArm", "decode": "rolloutArm", "colocated": "rolloutArm"},
        bounds={"prefill": Bound(1, 1), "decode": Bound(1, 1), "colocated": Bound(2, 2)},
        live={"prefill": 1, "decode": 1, "colocated": 4},
        change=sizing.Change(mode_rollout=record("Shifting", 50, "Disaggregated", 1)),
    ),
    Row(
        "mode rollout promoted: the colocated arm held at zero",
        spec(**PD_RAMP),
        {"prefill": 2, "decode": 2, "colocated": 0},
        {"colocated": "rolloutArm"},
        bounds={"prefill": Bound(2, 2), "decode": Bound(2, 2), "colocated": Bound(0, 0)},
        live={"prefill": 2, "decode": 2, "colocated": 2},
        change=sizing.Change(mode_rollout=record("Promoted", 100, "Disaggregated", 2)),
    ),
    Row(
        "maxGPUs binds during a change: the side the change moves to (P/D at 10 %) gives way first",
        spec(**PD_RAMP, maxGPUs=6),
        {"prefill": 1, "decode": 1, "colocated": 4},
        {"prefill": "maxGPUs", "decode": "maxGPUs"},
        change=sizing.Change(mode_rollout=record("Shifting", 10, "Disaggregated")),
        live={"prefill": 2, "decode": 2, "colocated": 4},
    ),
    Row(
        "maxGPUs past the middle of a change: the side it leaves (colocated) gives way first",
        spec(**PD_RAMP, maxGPUs=6),
        {"prefill": 2, "decode": 2, "colocated": 2},
        {"colocated": "maxGPUs"},
        change=sizing.Change(mode_rollout=record("Shifting", 90, "Disaggregated", 1)),
    ),
    Row(
        "revision rollout at 50 %: each pair at its share of the P/D requests",
        spec(prefill={"replicas": 2}, decode={"replicas": 4}),
        {"prefill": 1, "decode": 2, "colocated": 0},
        {"prefill": "revisionShare", "decode": "revisionShare"},
        change=sizing.Change(revisions=pairs("Shifting", 50, 1), step_weights=[10, 50, 100]),
        previous={"prefill": 1, "decode": 2},
    ),
    Row(
        "revision rollout at 10 % over maxGPUs: the new pair is at a replica a pool, the old pair gives way",
        spec(prefill={"replicas": 2}, decode=autoscaled(4), colocated={"replicas": 1}, maxGPUs=9),
        {"prefill": 1, "decode": 1, "colocated": 1},
        {"prefill": "revisionShare", "decode": "revisionShare"},
        state=state(decode=want(6)),
        change=sizing.Change(revisions=pairs("Shifting", 10), step_weights=[10, 50, 100]),
        previous={"prefill": 2, "decode": 4},  # 2 and ceil(90 % of 6) = 6, less 2 for maxGPUs 9
    ),
    Row(
        "revision rollout at 90 % over maxGPUs: the old pair is at its floor, the new pair gives way",
        spec(prefill={"replicas": 2}, decode=autoscaled(4), colocated={"replicas": 1}, maxGPUs=9),
        {"prefill": 2, "decode": 4, "colocated": 1},
        {"decode": "maxGPUs"},
        state=state(decode=want(6)),
        change=sizing.Change(revisions=pairs("Shifting", 90, 2), step_weights=[10, 50, 100]),
        previous={"prefill": 1, "decode": 1},
    ),
    Row(
        "revision promoted over maxGPUs: the old pair, at its live size, gives way first",
        spec(prefill={"replicas": 2}, decode=autoscaled(4), colocated={"replicas": 1}, maxGPUs=9),
        {"prefill": 2, "decode": 4, "colocated": 1},
        {"decode": "maxGPUs"},
        state=state(decode=want(6)),
        change=sizing.Change(
            revisions=pairs("Promoted", 100, 2),
            step_weights=[10, 50, 100],
            previous_live={"prefill": 2, "decode": 4},
        ),
        previous={"prefill": 1, "decode": 1},
    ),
    Row(
        "a drain starts: the StatefulSet keeps the pod being drained",
        spec(decode=autoscaled(3)),
        {"prefill": 1, "decode": 3, "colocated": 0},
        {"decode": "drain"},
        state=state(decode=want(2)),
        live={"prefill": 1, "decode": 3, "colocated": 0},
        pods={"decode": pods("decode", 3)},
        desired={"prefill": 1, "decode": 2, "colocated": 0},
    ),
    Row(
        "a drain ends: the drained pod is idle, the StatefulSet shrinks",
        spec(decode=autoscaled(3)),
        {"prefill": 1, "decode": 2, "colocated": 0},
        {"decode": "autoscaler"},
        state=state(decode=want(2, DRAIN)),
        live={"prefill": 1, "decode": 3, "colocated": 0},
        pods={"decode": pods("decode", 3, draining=(2,))},
        loads={"decode": {f"{NAME}-decode-2": Load()}},
    ),
    Row(
        "an arm held at zero drains first: its pods are kept until idle",
        spec(colocated=autoscaled(2)),
        {"prefill": 1, "decode": 2, "colocated": 2},
        {"colocated": "drain"},
        state=state(colocated=want(2)),
        bounds={"colocated": Bound(0, 0)},
        live={"prefill": 1, "decode": 2, "colocated": 2},
        pods={"colocated": pods("colocated", 2)},
        desired={"prefill": 1, "decode": 2, "colocated": 0},
    ),
    Row(
        "Advisory mode: the spec's size runs (the state carries it, clamped), no drain",
        spec(decode=autoscaled(2), autoscaling={"mode": "Advisory"}),
        {"prefill": 1, "decode": 2, "colocated": 0},
        {},
        state=replicas.prepare_state(
            spec(decode=autoscaled(2), autoscaling={"mode": "Advisory"}),
            state(decode=want(5)),
            {"decode": 2},
            False,
            NOW,
        ),
        live={"prefill": 1, "decode": 2, "colocated": 0},
        pods={"decode": pods("decode", 2)},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_the_chain(row: Row) -> None:
    inp = sizing.ServingInput(
        spec=row.spec,
        name=NAME,
        state=row.state,
        bounds=row.bounds,
        live=row.live,
        now=NOW,
        drain_timeout=TIMEOUT,
        pods=row.pods,
        loads=row.loads,
    )
    sizes, _ = sizing.size_pools(inp, sizing.given(row.change))
    assert {role: pool.replicas for role, pool in sizes.pools.items()} == row.replicas
    desired = row.desired if row.desired is not None else row.replicas
    assert {role: pool.desired for role, pool in sizes.pools.items()} == desired
    sources = {role: pool.source.value for role, pool in sizes.pools.items()}
    assert {role: pool.limited_by for role, pool in sizes.pools.items()} == sources | row.limited_by
    assert dict(sizes.previous) == row.previous
    assert sizes.replicas["router"] == row.spec.router.replicas


def test_a_drain_is_recorded_and_its_pods_marked() -> None:
    inp = sizing.ServingInput(
        spec=spec(decode=autoscaled(3)),
        name=NAME,
        state=state(decode=want(2)),
        bounds={},
        live={"decode": 3},
        now=NOW,
        drain_timeout=TIMEOUT,
        pods={"decode": pods("decode", 3)},
    )
    served = sizing.serving(inp)
    plan = served.pools["decode"].drain.plan
    assert plan is not None
    assert plan.annotate == (f"{NAME}-decode-2",)
    assert served.state is not None
    assert served.state.pools.decode.draining == DrainStatus(
        pod=f"{NAME}-decode-2", pods=[f"{NAME}-decode-2"], started_at=NOW, target_replicas=2
    )


def test_a_pool_the_autoscaler_left_has_its_drain_marks_lifted() -> None:
    """Decode was autoscaled and draining; now fixed at 3: the recorded marks go, the record too."""
    inp = sizing.ServingInput(
        spec=spec(decode={"replicas": 3}),
        name=NAME,
        state=state(decode=want(2, DRAIN)),
        bounds={},
        live={"decode": 3},
        now=NOW,
        drain_timeout=TIMEOUT,
        pods={"decode": pods("decode", 3, draining=(2,))},
        recorded={"decode": frozenset({f"{NAME}-decode-2"})},
    )
    served = sizing.serving(inp)
    assert served.pools["decode"].drain.lift == (f"{NAME}-decode-2",)
    assert served.pools["decode"].replicas == 3
    assert served.state is not None
    assert served.state.pools.decode.draining is None


def test_the_chain_is_what_the_stages_give() -> None:
    """`size_pools` is `serving` then `finish`: the pass runs the revision step between them."""
    row = next(row for row in ROWS if row.id.startswith("revision rollout at 50"))
    inp = sizing.ServingInput(row.spec, NAME, row.state, row.bounds, row.live, NOW, TIMEOUT)
    sizes, _ = sizing.size_pools(inp, sizing.given(row.change))
    assert sizes == sizing.finish(row.spec, sizing.serving(inp), row.change)


def test_the_step_between_sees_stage_3_and_its_change_sizes_stages_4_and_5() -> None:
    """The revision step gets the sizes after the drain (decode held at 3 while a pod drains), and the
    change it returns is what stages 4-5 size; its own outcome comes back with the sizes."""
    row = next(row for row in ROWS if row.id.startswith("revision rollout at 50"))
    inp = sizing.ServingInput(
        spec=spec(decode=autoscaled(3)),
        name=NAME,
        state=state(decode=want(2)),
        bounds={},
        live={"decode": 3},
        now=NOW,
        drain_timeout=TIMEOUT,
        pods={"decode": pods("decode", 3)},
    )
    seen: list[dict[str, int | None]] = []

    def between(served: sizing.Serving) -> tuple[sizing.Change, str]:
        seen.append(served.replicas)
        return row.change, "the step's outcome"

    sizes, outcome = sizing.size_pools(inp, between)
    assert outcome == "the step's outcome"
    assert seen == [sizing.serving(inp).replicas]
    assert seen[0]["decode"] == 3, "the drain keeps the pod the decision let go"
    assert sizes == sizing.finish(inp.spec, sizing.serving(inp), row.change)
    assert sizes.serving == sizing.serving(inp)
