"""Arms and their sizes (pure): the P/D share the routers get, the mode in effect, each pool's bounds
in every phase, the cut-over without a rollout, and the steady-state fall-back. Fake clock: T."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.autoscale.budget import fit_budget
from tandem.rollout.arms import (
    COLOCATED,
    DISAGGREGATED,
    Bound,
    cutover_bounds,
    effective_mode,
    pd_share,
    pool_bounds,
    share_of,
    yield_order,
)
from tandem.rollout.config import Analysis, RolloutConfig, Step
from tandem.rollout.judge import Result, Verdict
from tandem.rollout.machine import fall_back, promoted
from tandem.rollout.state import PauseCause, Phase, RollbackStage, RolloutState, start

T = 1_800_000_000.0
CONFIG = RolloutConfig(
    steps=(Step(10, 0), Step(50, 0), Step(100, 0)),
    analysis=Analysis(window_seconds=20, min_samples=10),
    scale_down_delay_seconds=30,
)
FULL = {"prefill": 2, "decode": 4, "colocated": 6}


@pytest.mark.parametrize(
    ("full", "percent", "want"),
    [
        (6, 0, 0),
        (6, 10, 1),
        (6, 50, 3),
        (6, 51, 4),
        (6, 100, 6),
        (0, 50, 0),
        (4, 25, 1),
        (4, 26, 2),
        (1, 1, 1),
    ],
)
def test_share_of_rounds_up_and_keeps_one(full: int, percent: int, want: int) -> None:
    assert share_of(full, percent) == want


@pytest.mark.parametrize(
    ("target", "weight", "pd"),
    [(DISAGGREGATED, 0, 0), (DISAGGREGATED, 30, 30), (COLOCATED, 30, 70), (COLOCATED, 100, 0)],
)
def test_the_routers_get_the_pd_share(target: str, weight: int, pd: int) -> None:
    assert pd_share(target, weight) == pd


@pytest.mark.parametrize(
    ("phase", "mode"),
    [
        (Phase.Preparing, COLOCATED),
        (Phase.Shifting, COLOCATED),
        (Phase.Paused, COLOCATED),
        (Phase.RollingBack, COLOCATED),
        (Phase.RolledBack, COLOCATED),
        (Phase.Promoted, DISAGGREGATED),
    ],
)
def test_the_mode_in_effect_is_the_source_until_promoted(phase: Phase, mode: str) -> None:
    assert effective_mode(DISAGGREGATED, phase) == mode
    assert effective_mode(COLOCATED, phase) == (COLOCATED if phase is Phase.Promoted else DISAGGREGATED)


def at(phase: Phase, step: int = 0, *, since: float = T, stage: RollbackStage | None = None) -> RolloutState:
    s = start(CONFIG, T - 100)
    weight = {Phase.Shifting: CONFIG.steps[step].weight, Phase.Paused: CONFIG.steps[step].weight}.get(
        phase, 0
    )
    if phase is Phase.Promoted:
        weight = 100
    cause = None
    if phase is Phase.Paused:
        from tandem.rollout.state import PauseCause

        cause = PauseCause.AwaitingPromote
    if phase is Phase.RollingBack and stage is None:
        stage = RollbackStage.RestoringWeight
    return dataclasses.replace(
        s, phase=phase, step=step, weight=weight, phase_since=since, pause_cause=cause, rollback_stage=stage
    )


def sizes(bounds: dict[str, Bound], current: dict[str, int]) -> dict[str, int]:
    return {role: bounds[role].apply(current[role]) for role in current}


# Fixed pools (no autoscaler): each arm at its share of its full size, rounded up, at least 1.
FIXED_TABLE = [
    # (state, source_ready, prefill, decode, colocated)
    (at(Phase.Preparing), True, 1, 1, 6),
    (at(Phase.Shifting, 0), True, 1, 1, 6),  # 10%: ceil(0.2)=1, ceil(0.4)=1; colocated ceil(5.4)=6
    (at(Phase.Shifting, 1), True, 1, 2, 3),
    (at(Phase.Paused, 1), True, 1, 2, 3),
    (at(Phase.Shifting, 2), True, 2, 4, 1),  # 100%: the source keeps one pod until promoted
    (at(Phase.Promoted, 2, since=T - 10), True, 2, 4, 1),  # inside the scale-down delay
    (at(Phase.Promoted, 2, since=T - 30), True, 2, 4, 0),  # after it
    (at(Phase.RollingBack, 1), True, 1, 2, 6),  # weight back: the source at full size, target kept
    (at(Phase.RollingBack, 1, stage=RollbackStage.ScalingDown), False, 1, 2, 6),  # source not ready
    (at(Phase.RollingBack, 1, stage=RollbackStage.ScalingDown), True, 0, 0, 6),
    (at(Phase.RolledBack, 1), True, 0, 0, 6),
]


@pytest.mark.parametrize(("state", "source_ready", "prefill", "decode", "colocated"), FIXED_TABLE)
def test_fixed_pools_get_their_share(
    state: RolloutState, source_ready: bool, prefill: int, decode: int, colocated: int
) -> None:
    bounds = pool_bounds(DISAGGREGATED, state, CONFIG, FULL, set(), T, source_ready)
    got = sizes(bounds, {"prefill": 9, "decode": 9, "colocated": 9})
    assert got == {"prefill": prefill, "decode": decode, "colocated": colocated}
    total = sum(got.values())
    assert total <= sum(FULL.values()), "capacity is traded, never more than both arms' full sizes"


@pytest.mark.parametrize(
    ("phase", "stage", "prefill", "decode", "colocated"),
    [
        (Phase.Preparing, None, 1, 1, 6),
        (Phase.Shifting, None, 1, 1, 6),  # the tenants stage: one pod per target pool, the source whole
        (Phase.Paused, None, 1, 1, 6),
        (Phase.RollingBack, RollbackStage.RestoringWeight, 1, 1, 6),  # kept while the routers catch up
        (Phase.RollingBack, RollbackStage.ScalingDown, 0, 0, 6),
    ],
)
def test_the_tenants_stage_holds_one_target_pod_per_pool(
    phase: Phase, stage: RollbackStage | None, prefill: int, decode: int, colocated: int
) -> None:
    config = dataclasses.replace(CONFIG, steps=(Step(0, 0), *CONFIG.steps))
    cause = PauseCause.AwaitingPromote if phase is Phase.Paused else None
    s = dataclasses.replace(start(config, T), phase=phase, pause_cause=cause, rollback_stage=stage)
    for autoscaled in (set(), set(FULL)):
        bounds = pool_bounds(DISAGGREGATED, s, config, FULL, autoscaled, T, True)
        got = sizes(bounds, dict.fromkeys(FULL, 0))
        assert got == {"prefill": prefill, "decode": decode, "colocated": colocated}, autoscaled


def test_capacity_is_traded_at_every_weight() -> None:
    """Fixed pools over every weight: the GPUs in use never exceed the larger arm's by more than the
    rounding (one pod per pool), so a budget covering both arms at full size always holds."""
    for weight in range(1, 101):
        config = RolloutConfig(steps=(Step(weight, 0),), analysis=CONFIG.analysis)
        s = dataclasses.replace(start(config, T), phase=Phase.Shifting, weight=weight)
        got = sizes(pool_bounds(DISAGGREGATED, s, config, FULL, set(), T, True), dict.fromkeys(FULL, 0))
        assert got["colocated"] + got["prefill"] + got["decode"] <= max(6, 6) + 3, (weight, got)


@pytest.mark.parametrize(
    ("state", "autoscaled_size", "want"),
    [
        (at(Phase.Preparing), 0, {"prefill": 1, "decode": 1, "colocated": 6}),  # P/D at least 1+1
        (at(Phase.Shifting, 1), 0, {"prefill": 1, "decode": 1, "colocated": 1}),  # own load decides, >= 1
        (at(Phase.Shifting, 1), 5, {"prefill": 5, "decode": 5, "colocated": 5}),
        (at(Phase.RollingBack, 1), 2, {"prefill": 2, "decode": 2, "colocated": 6}),  # source to full
        (at(Phase.RolledBack, 1), 3, {"prefill": 0, "decode": 0, "colocated": 6}),
        (at(Phase.Promoted, 2, since=T - 60), 3, {"prefill": 3, "decode": 3, "colocated": 0}),
    ],
)
def test_autoscaled_pools_keep_their_floors(
    state: RolloutState, autoscaled_size: int, want: dict[str, int]
) -> None:
    bounds = pool_bounds(DISAGGREGATED, state, CONFIG, FULL, set(FULL), T, True)
    assert sizes(bounds, dict.fromkeys(FULL, autoscaled_size)) == want


def test_pd_to_colocated_swaps_the_arms() -> None:
    bounds = pool_bounds(COLOCATED, at(Phase.Shifting, 1), CONFIG, FULL, set(), T, True)
    assert sizes(bounds, dict.fromkeys(FULL, 0)) == {"prefill": 1, "decode": 2, "colocated": 3}
    bounds = pool_bounds(COLOCATED, at(Phase.RolledBack, 1), CONFIG, FULL, set(), T, True)
    assert sizes(bounds, dict.fromkeys(FULL, 0)) == {"prefill": 2, "decode": 4, "colocated": 0}


def test_cutover_keeps_the_old_arm_until_the_new_one_is_ready() -> None:
    live = {"prefill": None, "decode": None, "colocated": 3}
    full = {"prefill": 1, "decode": 1, "colocated": 0}
    assert cutover_bounds(COLOCATED, False, live, full) == {"colocated": Bound(3, None)}
    assert cutover_bounds(COLOCATED, True, live, full) == {}
    assert cutover_bounds(
        DISAGGREGATED, False, {"prefill": 2, "decode": None}, {"prefill": 0, "decode": 0}
    ) == {
        "prefill": Bound(2, None),
        "decode": Bound(1, None),
    }


def test_fall_back_takes_weight_first_and_keeps_the_figures() -> None:
    steady = promoted(CONFIG, T - 100, "P/D serves every request")
    assert (steady.phase, steady.weight) == (Phase.Promoted, 100)
    t = fall_back(steady, T, CONFIG, "steady P/D breach: SLO attainment 80.0% below the floor 95.0%")
    assert t.changed
    assert not t.scale_down_allowed
    assert (t.state.phase, t.state.weight, t.state.rollback_stage) == (
        Phase.RollingBack,
        0,
        RollbackStage.RestoringWeight,
    )
    assert "80.0%" in t.state.reason
    again = fall_back(t.state, T + 1, CONFIG, "again")
    assert not again.changed
    assert again.state == t.state
    assert again.problems


def test_fall_back_records_the_verdict_that_decided_it() -> None:
    steady = promoted(CONFIG, T - 100, "P/D serves every request")
    failed = Verdict(
        Result.Fail, "SLO attainment 80.0% below the floor 95.0%", {"targetAttainment": 0.8}, T - 60, T
    )
    t = fall_back(steady, T, CONFIG, "steady P/D breach: " + failed.reason, failed)
    assert [(r.step, r.verdict) for r in t.state.verdicts] == [(CONFIG.last_step, failed)]
    assert t.state.to_dict()["verdicts"][0]["figures"] == {"targetAttainment": 0.8}
    assert fall_back(steady, T, CONFIG, "no verdict given").state.verdicts == ()


@pytest.mark.parametrize(
    ("status", "mode", "pd"),
    [
        ({}, "Disaggregated", None),  # before the operator's first status: the spec's mode
        ({"mode": "Colocated"}, "Colocated", None),  # the mode in effect, not the spec's
        ({"mode": "Colocated", "rollout": {"target": "Disaggregated", "weight": 30}}, "Colocated", 30),
        ({"mode": "Disaggregated", "rollout": {"target": "Colocated", "weight": 30}}, "Disaggregated", 70),
        ({"mode": "Colocated", "rollout": {"target": "Disaggregated", "weight": 0}}, "Colocated", 0),
    ],
)
def test_routers_read_the_mode_in_effect_and_the_pd_share(
    status: dict[str, object], mode: str, pd: int | None
) -> None:
    from tandem.kube.pods import pdd_info_from

    info = pdd_info_from(
        {"metadata": {"name": "x"}, "spec": {"serving": {"mode": "Disaggregated"}}, "status": status}
    )
    assert (info.serving_mode, info.rollout_weight) == (mode, pd)


@pytest.mark.parametrize(
    ("bound", "want"),
    [
        (Bound(0, 0), (0, 0)),  # an arm held at zero claims nothing
        (Bound(1, None), (1, 4)),
        (Bound(3, None), (3, 4)),  # a source restored to its full size
        (Bound(2, 2), (2, 2)),
        (Bound(6, None), (6, 6)),  # a floor above the maximum wins (the spec's replicas never exceed it)
    ],
)
def test_bounded_spec_narrows_the_autoscaler_bounds(bound: Bound, want: tuple[int, int]) -> None:
    from tandem.api.models import PDDeploymentSpec
    from tandem.rollout.arms import bounded_spec

    spec = PDDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"type": "sim", "image": "img"},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
            "slo": {"ttftMs": 1000, "tpotMs": 50},
            "autoscaling": {"enabled": True},
        }
    )
    got = bounded_spec(spec, {"decode": bound, "prefill": Bound(0, 0)})
    block = got.decode.autoscaling
    assert block is not None
    assert (block.min_replicas, block.max_replicas) == want
    assert got.prefill.autoscaling is None, "a fixed pool is the bounds' business, not decide()'s"
    assert spec.decode.autoscaling is not None
    assert (spec.decode.autoscaling.min_replicas, spec.decode.autoscaling.max_replicas) == (1, 4)


# (sizes, GPUs per replica, who gives way first, budget) -> sizes
FIT = [
    (
        {"colocated": 4, "prefill": 2, "decode": 4},
        {},
        [["prefill", "decode"], ["colocated"]],
        8,
        {"colocated": 4, "prefill": 2, "decode": 2},
    ),
    (
        {"colocated": 4, "prefill": 2, "decode": 4},
        {},
        [["colocated"], ["prefill", "decode"]],
        8,
        {"colocated": 2, "prefill": 2, "decode": 4},
    ),
    (
        {"colocated": 4, "prefill": 2, "decode": 4},
        {},
        [["colocated"], ["prefill", "decode"]],
        4,
        {"colocated": 1, "prefill": 1, "decode": 2},
    ),  # the first side at its floor, then the next
    (
        {"colocated": 2, "prefill": 1, "decode": 1},
        {},
        [["prefill", "decode"], ["colocated"]],
        2,
        {"colocated": 1, "prefill": 1, "decode": 1},
    ),  # cannot fit: floors kept (admission refuses)
    (
        {"colocated": 0, "prefill": 2, "decode": 2},
        {"decode": 4},
        [["prefill", "decode"]],
        6,
        {"colocated": 0, "prefill": 2, "decode": 1},
    ),  # the pool holding the most GPUs first
    ({"colocated": 3, "prefill": 1}, {}, [["colocated"]], 10, {"colocated": 3, "prefill": 1}),
]


@pytest.mark.parametrize(("sizes", "gpus", "order", "budget", "expected"), FIT)
def test_fit_budget(
    sizes: dict[str, int], gpus: dict[str, int], order: list[list[str]], budget: int, expected: dict[str, int]
) -> None:
    assert fit_budget(sizes, gpus, order, budget) == expected


def test_yield_order() -> None:
    new, old = ["prefill", "decode"], ["colocated"]
    assert yield_order("Preparing", 0, new, old) == [new, old]
    assert yield_order("RollingBack", 0, new, old) == [new, old]
    assert yield_order("Shifting", 50, new, old) == [new, old]
    assert yield_order("Paused", 51, new, old) == [old, new]
    assert yield_order("Promoted", 100, new, old) == [old, new]
