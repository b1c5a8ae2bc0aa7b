"""decide(): one table per rule, on a fake clock (`now`), no cluster."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from tandem.api.status import (
    AutoscalingPoolsStatus,
    AutoscalingStatus,
    DrainStatus,
    PoolAutoscalingStatus,
    Recommendation,
)
from tandem.autoscale.decide import decide
from tandem.autoscale.knobs import Knobs
from tandem.signals import PoolSignals, Snapshot

if TYPE_CHECKING:
    from conftest import Kit, Loop

T0 = 1_800_000_000.0


def at(desired: dict[str, int], **extra: Any) -> AutoscalingStatus:
    """A state whose pools are held at `desired`."""
    pools = {role: PoolAutoscalingStatus(desired_replicas=n, **extra) for role, n in desired.items()}
    return AutoscalingStatus(mode="Active", last_evaluated=T0 - 30, pools=AutoscalingPoolsStatus(**pools))


# --- scale up: load step, queue growth, KV pressure ------------------------------------------------

UP_CASES = [
    # id, current prefill, load (replicas' worth), expected target, limited_by
    ("load-step", 2, {"prefill": 4.5}, 5, None),
    ("load-step-over-step-limit", 2, {"prefill": 9.5}, 6, "maxStep"),
    ("queue-growth", 2, {"busy": 2, "queue": 2.5}, 6, None),  # 2 busy = 2.86 at target (rho 0.7), + 2.5
    ("queue-over-step-limit", 2, {"busy": 2, "queue": 6.0}, 6, "maxStep"),
    ("steady-no-change", 4, {"prefill": 3.5}, 4, None),
]


@pytest.mark.parametrize(
    ("current", "load", "target", "limited_by"), [c[1:] for c in UP_CASES], ids=[c[0] for c in UP_CASES]
)
def test_prefill_scales_up_at_once_from_rate_and_queue(
    kit: Kit, current: int, load: dict[str, float], target: int, limited_by: str | None
) -> None:
    snapshot = kit.snapshot(T0, sizes={"prefill": (current, current), "decode": (2, 2)}, **load)
    decision = decide(kit.spec, snapshot, at({"prefill": current, "decode": 2}), T0)
    pool = decision.pools["prefill"]
    assert (pool.current, pool.target, pool.limited_by) == (current, target, limited_by)
    assert decision.state.pools.prefill.desired_replicas == target
    assert "prompt tokens" in pool.reason
    assert "tokens/s each" in pool.reason
    assert pool.figures["capacityTokensPerSecond"] == pytest.approx(kit.prompt_capacity)
    assert not decision.held


DECODE_CASES = [
    # id, load, expected target
    ("running-sequences", {"decode": 3.4}, 4),
    ("waiting-sequences", {"decode": 1.9, "waiting": 1.5}, 4),
    ("kv-pressure", {"decode": 0.5, "kv": 0.95}, 3),  # 2 pods x 95% / 85% = 2.24
    ("kv-comfortable", {"decode": 0.5, "kv": 0.80}, 2),  # 1.88: within what 2 hold
    # Few sequences running at a low TPOT, but the output tokens/s need 3.4 replicas at the target:
    # with one replica fewer, each would batch more, run slower, and hold more sequences.
    ("output-tokens", {"decode": 0.4, "generation": 3.4}, 4),
    # Prefill just finished 4.4 replicas' worth of requests; decode has not seen them yet.
    ("arriving-from-prefill", {"decode": 0.4, "generation": 0.5, "arriving": 4.4}, 5),
]


@pytest.mark.parametrize(("load", "target"), [c[1:] for c in DECODE_CASES], ids=[c[0] for c in DECODE_CASES])
def test_decode_scales_from_running_sequences_and_kv_usage(
    kit: Kit, load: dict[str, float], target: int
) -> None:
    snapshot = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, prefill=1.5, **load)
    decision = decide(kit.spec, snapshot, at({"prefill": 2, "decode": 2}), T0)
    assert decision.pools["decode"].target == target
    assert "sequences" in decision.pools["decode"].reason


def test_decode_capacity_is_the_smaller_of_tpot_batch_and_kv(kit: Kit) -> None:
    snapshot = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, prefill=1.5, decode=1.5)
    figures = decide(kit.spec, snapshot, at({"prefill": 2, "decode": 2}), T0).pools["decode"].figures
    kv_sequences = figures["kvTokensPerReplica"] * 0.85 / figures["meanContextTokens"]
    assert figures["capacitySequences"] == pytest.approx(min(figures["batchAtTpot"], kv_sequences))


QUEUE_GROWTH_CASES = [
    # id, queue now, queue one window earlier, expected target. 2 busy replicas compute 2.86 replicas'
    # worth at target (1 / rho 0.7 each); the queue grew by `now - before` x 30 s of capacity over the
    # 60 s window.
    ("growth-unknown", 1.0, None, 4),  # 2.86 + backlog 1.0 = 3.86
    ("grew", 1.0, 0.0, 5),  # arrivals 2.86 + 0.5, backlog 1.0: 4.36
    ("shrinking", 1.0, 3.0, 4),  # draining: arrivals are what is computed
]


@pytest.mark.parametrize(
    ("queue", "before", "target"), [c[1:] for c in QUEUE_GROWTH_CASES], ids=[c[0] for c in QUEUE_GROWTH_CASES]
)
def test_queue_growth_counts_as_arrivals(kit: Kit, queue: float, before: float | None, target: int) -> None:
    sizes = {"prefill": (2, 2), "decode": (2, 2)}
    snapshot = kit.snapshot(T0, sizes=sizes, busy=2, queue=queue, queue_before=before)
    pool = decide(kit.spec, snapshot, at({"prefill": 2, "decode": 2}), T0).pools["prefill"]
    assert pool.target == target
    growth = 0.0 if before is None else max(0.0, queue - before) * kit.prompt_capacity * 30 / 60
    assert pool.figures["arrivingPromptTokensPerSecond"] == pytest.approx(2 * kit.prompt_raw + growth)


# --- starting pods count as capacity ----------------------------------------------------------------


@pytest.mark.parametrize("ready", [2, 5])
def test_starting_pods_are_capacity(kit: Kit, ready: int) -> None:
    """The ready pods compute flat out while 2 replicas' worth of prompts queue. With 3 of 5 pods
    still loading, the backlog is theirs to serve: no more pods. With all 5 ready, it adds pods."""
    snapshot = kit.snapshot(T0, sizes={"prefill": (5, ready), "decode": (2, 2)}, busy=ready, queue=2.0)
    pool = decide(kit.spec, snapshot, at({"prefill": 5, "decode": 2}), T0).pools["prefill"]
    assert pool.figures["starting"] == 5 - ready
    if ready < 5:
        assert pool.target == 5
        assert "counting 3 starting" in pool.reason
    else:
        assert pool.recommendation == math.ceil(5 * kit.prompt_raw / kit.prompt_capacity + 2.0) > 5


def test_starting_backlog_share_knob(kit: Kit) -> None:
    snapshot = kit.snapshot(T0, sizes={"prefill": (5, 2), "decode": (2, 2)}, busy=2, queue=6.0)
    state = at({"prefill": 5, "decode": 2})
    credited = decide(kit.spec, snapshot, state, T0).pools["prefill"]
    half = decide(kit.spec, snapshot, state, T0, knobs=Knobs(starting_backlog_share=0.5)).pools["prefill"]
    exact = 2 * kit.prompt_raw / kit.prompt_capacity + 6.0  # 8.35
    assert credited.figures["exactReplicas"] == pytest.approx(5.0)
    assert half.figures["exactReplicas"] == pytest.approx(5.0 + 0.5 * (exact - 5.0))


def test_a_load_step_adds_pods_once_while_models_load(kit: Kit) -> None:
    """Pass 1 sizes for the step; while the new pods load the backlog keeps growing, pass 2 adds nothing."""
    state = at({"prefill": 2, "decode": 2})
    step = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, busy=2, queue=2.0)
    first = decide(kit.spec, step, state, T0)
    assert first.pools["prefill"].target == 5  # 2.86 + 2.0
    loading = kit.snapshot(T0 + 30, sizes={"prefill": (5, 2), "decode": (2, 2)}, busy=2, queue=4.0)
    second = decide(kit.spec, loading, first.state, T0 + 30)
    assert second.pools["prefill"].target == 5


# --- dead band --------------------------------------------------------------------------------------

DEAD_BAND_CASES = [
    # id, current, load, TTFT p95 as a share of its target (None: no TTFT read), target, limited_by
    ("just-above", 4, 4.3, None, 4, "deadBand"),
    ("just-above-comfortably-within-the-slo", 4, 4.3, 0.5, 4, "deadBand"),
    # At 90% of its TTFT target the pool is not comfortably within it (comfortable_ratio 0.8): a small
    # excess is the load rising into the SLO, not noise.
    ("just-above-near-the-slo", 4, 4.3, 0.9, 5, None),
    ("just-below", 4, 3.7, None, 4, None),  # ceil is 4 already
    ("beyond-up", 4, 4.5, None, 5, None),
    ("beyond-down-held-by-window", 4, 3.5, None, 4, None),
]


@pytest.mark.parametrize(
    ("current", "load", "ttft_share", "target", "limited_by"),
    [c[1:] for c in DEAD_BAND_CASES],
    ids=[c[0] for c in DEAD_BAND_CASES],
)
def test_dead_band(
    kit: Kit, current: int, load: float, ttft_share: float | None, target: int, limited_by: str | None
) -> None:
    assert kit.spec.slo is not None
    ttft = None if ttft_share is None else ttft_share * kit.spec.slo.ttft_ms / 1000
    sizes = {"prefill": (current, current), "decode": (2, 2)}
    snapshot = kit.snapshot(T0, sizes=sizes, prefill=load, ttft=ttft)
    pool = decide(kit.spec, snapshot, at({"prefill": current, "decode": 2}), T0).pools["prefill"]
    assert (pool.target, pool.limited_by) == (target, limited_by)


def test_the_dead_band_near_the_slo_can_be_kept_for_scale_ups(kit: Kit) -> None:
    """`dead_band_up_needs_comfort` off: the dead band holds a small scale-up whatever the latency."""
    assert kit.spec.slo is not None
    ttft = 0.9 * kit.spec.slo.ttft_ms / 1000
    snapshot = kit.snapshot(T0, sizes={"prefill": (4, 4), "decode": (2, 2)}, prefill=4.3, ttft=ttft)
    knobs = Knobs(dead_band_up_needs_comfort=False)
    pool = decide(kit.spec, snapshot, at({"prefill": 4, "decode": 2}), T0, knobs=knobs).pools["prefill"]
    assert (pool.target, pool.limited_by) == (4, "deadBand")


# --- stabilization and steps --------------------------------------------------------------------------


def test_scale_down_waits_for_the_window_and_goes_to_the_highest_recommendation_in_it(
    kit: Kit, make_loop: type[Loop]
) -> None:
    loop = make_loop(kit.with_spec(prefill={"replicas": 6}))
    assert loop.step(prefill=5.5).pools["prefill"].target == 6  # T0: recommends 6
    loop.now = T0 + 100
    assert loop.step(prefill=4.5).pools["prefill"].target == 6  # recommends 5
    loop.now = T0 + 200
    for _ in range(4):  # T0+200 .. T0+290: recommends 3, held by the window (6 at T0)
        pool = loop.step(prefill=2.5).pools["prefill"]
        assert (pool.target, pool.limited_by) == (6, "stabilization")
    loop.now = T0 + 301  # 6 left the window; 5 (T0+100) is the highest in it
    pool = loop.step(prefill=2.5).pools["prefill"]
    assert pool.target == 5
    loop.now = T0 + 401  # only 3s in the window: one step down (maxStep 1)
    pool = loop.step(prefill=2.5).pools["prefill"]
    assert (pool.target, pool.limited_by) == (4, "maxStep")
    assert loop.step(prefill=2.5).pools["prefill"].target == 3
    assert loop.step(prefill=2.5).pools["prefill"].target == 3


def test_a_descent_has_the_shorter_window_and_a_burst_restores_the_full_one(
    kit: Kit, make_loop: type[Loop]
) -> None:
    """descentStabilizationSeconds 90 of the 300-s window: the size 90 s allow, once no recommendation
    came back above it within 300 s."""
    down = {"stabilizationSeconds": 300, "maxStep": 1, "descentStabilizationSeconds": 90}
    loop = make_loop(kit.with_spec(prefill={"replicas": 6}, autoscaling={"scaleDown": down}))
    for _ in loop.run(301, prefill=5.5):  # T0..T0+300: recommends 6, the window's history fills
        pass
    held = [loop.step(prefill=4.5).pools["prefill"] for _ in range(3)]  # recommends 5, 6 within 90 s
    assert [p.target for p in held] == [6, 6, 6]
    pool = loop.step(prefill=4.5).pools["prefill"]  # 6 is 120 s old now
    assert pool.target == 5
    assert "no recommendation came back above 5 within 300 s: the descent's scale-down window, 90 s" in (
        pool.reason
    )
    # a burst (recommends 8), then the load falls back
    for _ in loop.run(60, prefill=7.5):
        pass
    assert loop.size("prefill") == 8
    # 5 (T0+420), then 8 (T0+450): back above 5 within the 300-s window until T0+750
    after = [loop.step(prefill=4.5).pools["prefill"] for _ in range(9)]  # T0+510 .. T0+750
    assert [p.target for p in after] == [8] * 9
    assert all("descent" not in p.reason for p in after)
    # then 8 (T0+450, T0+480) is the baseline before the window: the 90-s window allows 5, one step
    # down (maxStep 1)
    pool = loop.step(prefill=4.5).pools["prefill"]
    assert (pool.target, pool.limited_by) == (7, "maxStep")
    assert "the descent's scale-down window, 90 s" in pool.reason


@pytest.mark.parametrize(
    ("descent", "held_passes"),
    [
        (None, 10),  # unset: off, the HPA's rule alone
        (300, 10),  # equal to the window: off too
        (60, 2),
        (0, 0),  # at once, once the descent is seen
    ],
)
def test_descent_window_default_and_off(
    kit: Kit, make_loop: type[Loop], descent: int | None, held_passes: int
) -> None:
    down: dict[str, Any] = {"stabilizationSeconds": 300, "maxStep": 1}
    if descent is not None:
        down["descentStabilizationSeconds"] = descent
    loop = make_loop(kit.with_spec(prefill={"replicas": 6}, autoscaling={"scaleDown": down}))
    for _ in loop.run(301, prefill=5.5):
        pass
    targets = [loop.step(prefill=4.5).pools["prefill"].target for _ in range(11)]
    assert targets == [6] * held_passes + [5] * (11 - held_passes)


TIGHT_CASES = [
    # id, TTFT (s, target 1 s), attainment, expected target. The load needs 3 of the 6 prefill replicas
    # (scale-down window 0): a pool near its SLO keeps its size.
    ("comfortable", 0.3, 0.99, 5, None),  # one step down (maxStep 1)
    ("ttft-at-0.8-of-target", 0.8, 0.99, 6, "SLO not comfortably met: no scale-down below 6"),
    ("attainment-under-target", 0.3, 0.90, 6, "SLO not comfortably met: no scale-down below 6"),
    ("no-requests", None, 1.0, 5, None),
]


@pytest.mark.parametrize(
    ("ttft", "attainment", "target", "said"), [c[1:] for c in TIGHT_CASES], ids=[c[0] for c in TIGHT_CASES]
)
def test_no_scale_down_while_the_slo_is_tight(
    kit: Kit, ttft: float | None, attainment: float, target: int, said: str | None
) -> None:
    k = kit.with_spec(prefill={"replicas": 6}, autoscaling={"scaleDown": {"stabilizationSeconds": 0}})
    snapshot = k.snapshot(
        T0,
        sizes={"prefill": (6, 6), "decode": (2, 2)},
        prefill=2.5,
        decode=1.5,
        ttft=ttft,
        attainment=attainment,
        request_rate=None if ttft is not None else 0.0,
    )
    pool = decide(k.spec, snapshot, at({"prefill": 6, "decode": 2}), T0).pools["prefill"]
    assert pool.target == target
    assert (said in pool.reason) if said else "no scale-down" not in pool.reason
    off = decide(k.spec, snapshot, at({"prefill": 6, "decode": 2}), T0, knobs=Knobs(down_slo_ratio=math.inf))
    if ttft is not None and attainment >= 0.95:
        assert off.pools["prefill"].target == 5  # the knob turns the hold off


STEP_CASES = [
    # id, down maxStep, up maxStep, current, load, target
    ("down-1", 1, 4, 8, 1.5, 7),
    ("down-3", 3, 4, 8, 1.5, 5),
    ("down-3-not-below-need", 3, 4, 8, 6.5, 7),
    ("up-4", 1, 4, 2, 12.0, 6),
    ("up-2", 1, 2, 2, 12.0, 4),
]


@pytest.mark.parametrize(
    ("down", "up", "current", "load", "target"), [c[1:] for c in STEP_CASES], ids=[c[0] for c in STEP_CASES]
)
def test_max_step_both_ways(kit: Kit, down: int, up: int, current: int, load: float, target: int) -> None:
    spec = kit.with_spec(
        autoscaling={"scaleDown": {"stabilizationSeconds": 0, "maxStep": down}, "scaleUp": {"maxStep": up}}
    ).spec
    snapshot = kit.snapshot(T0, sizes={"prefill": (current, current), "decode": (2, 2)}, prefill=load)
    pool = decide(spec, snapshot, at({"prefill": current, "decode": 2}), T0).pools["prefill"]
    assert pool.target == target
    if pool.target != math.ceil(load):
        assert pool.limited_by == "maxStep"


# --- no data / no traffic -----------------------------------------------------------------------------


def _unscraped_decode(snapshot: Snapshot) -> Snapshot:
    return dataclasses.replace(snapshot, pools={**snapshot.pools, "decode": PoolSignals(scraped_targets=0)})


def _nan_queue(snapshot: Snapshot) -> Snapshot:
    prefill = dataclasses.replace(snapshot.pools["prefill"], queued_prompt_tokens=math.nan)
    return dataclasses.replace(snapshot, pools={**snapshot.pools, "prefill": prefill})


NO_DATA_CASES: list[tuple[str, dict[str, Any], Callable[[Snapshot], Snapshot] | None, str]] = [
    ("query-error", {"missing": ("prometheus: query timed out",)}, None, "query timed out"),
    ("stale", {"age": 600.0}, None, "s old"),
    ("unscraped-pool", {}, _unscraped_decode, "none of the 4 ready decode pods"),
    ("nan", {}, _nan_queue, "queued_prompt_tokens is nan"),
]


@pytest.mark.parametrize(
    ("load", "transform", "why"), [c[1:] for c in NO_DATA_CASES], ids=[c[0] for c in NO_DATA_CASES]
)
def test_no_data_holds_every_size_and_says_so(
    kit: Kit, load: dict[str, Any], transform: Callable[[Snapshot], Snapshot] | None, why: str
) -> None:
    state = at({"prefill": 4, "decode": 4})
    # No traffic in the data that does come: a decide() that trusted it would scale down.
    snapshot = kit.snapshot(T0, sizes={"prefill": (4, 4), "decode": (4, 4)}, **load)
    if transform is not None:
        snapshot = transform(snapshot)
    decision = decide(
        kit.with_spec(autoscaling={"scaleDown": {"stabilizationSeconds": 0}}).spec, snapshot, state, T0
    )
    assert decision.held
    for role in ("prefill", "decode"):
        pool = decision.pools[role]
        assert (pool.current, pool.target) == (4, 4)
        assert "no data" in pool.reason
        assert why in pool.reason
        assert getattr(decision.state.pools, role).desired_replicas == 4
    status, reason, message = decision.condition
    assert (status, reason) == ("False", "MetricsMissing")
    assert why in message


def test_no_data_after_the_window_still_never_scales_down(kit: Kit, make_loop: type[Loop]) -> None:
    loop = make_loop(kit.with_spec(prefill={"replicas": 6}))
    for decision in loop.run(900, missing=("prometheus: connection refused",)):
        assert decision.pools["prefill"].target == 6
    # Data returns with no traffic: the held passes count as recommendations of the current size,
    # so the scale-down still waits a full window.
    for decision in loop.run(300):  # the last held pass (T0+870) is in the window until T0+1170
        assert decision.pools["prefill"].target == 6
    targets = [d.pools["prefill"].target for d in loop.run(300)]
    assert targets[0] == 5
    assert targets[-1] == 1


def test_after_no_data_a_descent_waits_its_own_window(kit: Kit, make_loop: type[Loop]) -> None:
    """The held passes recorded 6; with no traffic the recommendations fall to 1 and stay there, a
    descent: the scale-down waits the descent's window (60 s of 300) after the last held pass, not
    the full window."""
    down = {"stabilizationSeconds": 300, "maxStep": 1, "descentStabilizationSeconds": 60}
    loop = make_loop(kit.with_spec(prefill={"replicas": 6}, autoscaling={"scaleDown": down}))
    for decision in loop.run(900, missing=("prometheus: connection refused",)):
        assert decision.pools["prefill"].target == 6
    targets = [d.pools["prefill"].target for d in loop.run(150)]  # T0+900 .. T0+1020
    assert targets == [6, 6, 5, 4, 3]  # the last held pass, T0+870, leaves the 60-s window at T0+960


def test_no_scale_down_before_the_history_covers_the_window(kit: Kit, make_loop: type[Loop]) -> None:
    """A pool the autoscaler has just taken over (no recommendations yet) is not shrunk on its first
    pass, as an HPA would: its first recommendation must age a full window first."""
    loop = make_loop(kit.with_spec(prefill={"replicas": 6}))
    targets = [d.pools["prefill"].target for d in loop.run(300)]
    assert targets == [6] * 10
    assert loop.step().pools["prefill"].target == 5


def test_no_traffic_is_data_and_scales_in_to_min_after_the_window(kit: Kit, make_loop: type[Loop]) -> None:
    loop = make_loop(
        kit.with_spec(prefill={"replicas": 5, "autoscaling": {"minReplicas": 2}}, decode={"replicas": 3})
    )
    loop.step(prefill=4.5, decode=2.5)
    history = [loop.step() for _ in range(30)]  # 15 minutes with zero rates, fresh scrapes
    prefill = [d.pools["prefill"].target for d in history]
    decode = [d.pools["decode"].target for d in history]
    assert not any(d.held for d in history)
    first_down = next(i for i, t in enumerate(prefill) if t < 5)
    assert (first_down + 1) * 30 >= 300  # not before the 300 s window has passed
    assert prefill[-1] == 2
    assert decode[-1] == 1  # minReplicas
    assert all(b - a in (0, -1) for a, b in itertools.pairwise(prefill))
    assert history[-1].condition[0] == "True"


# --- pause, advisory, external ------------------------------------------------------------------------


def test_pause_holds_every_decision(kit: Kit) -> None:
    snapshot = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, prefill=9.0, decode=6.0)
    decision = decide(kit.spec, snapshot, at({"prefill": 2, "decode": 2}), T0, paused=True)
    assert decision.held
    assert {r: p.target for r, p in decision.pools.items()} == {"prefill": 2, "decode": 2}
    assert decision.state.mode == "Paused"
    assert decision.condition[:2] == ("False", "Paused")
    assert decision.state.pools.prefill.desired_replicas == 2


def test_advisory_decides_and_reports_without_acting(kit: Kit) -> None:
    spec = kit.with_spec(autoscaling={"mode": "Advisory"}).spec
    snapshot = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, prefill=4.5)
    decision = decide(spec, snapshot, at({"prefill": 2, "decode": 2}), T0)
    pool = decision.pools["prefill"]
    assert (pool.current, pool.target) == (2, 5)
    assert decision.state.pools.prefill.desired_replicas == 2
    assert decision.state.pools.prefill.last_scale_time is None
    last = decision.state.pools.prefill.last_decision
    assert last is not None
    assert (last.from_replicas, last.to) == (2, 5)
    assert decision.state.mode == "Advisory"
    status, reason, message = decision.condition
    assert (status, reason) == ("False", "Advisory")
    assert "prefill 2 -> 5" in message
    assert not decision.held


def test_advisory_advises_from_the_size_the_spec_runs(kit: Kit) -> None:
    """Switching Active -> Advisory: the operator runs spec.<pool>.replicas again, so that is current."""
    spec = kit.with_spec(autoscaling={"mode": "Advisory"}).spec
    snapshot = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, prefill=1.5, decode=1.5)
    decision = decide(spec, snapshot, at({"prefill": 6, "decode": 5}), T0)
    assert {r: p.current for r, p in decision.pools.items()} == {"prefill": 2, "decode": 2}
    assert decision.state.pools.prefill.desired_replicas == 2


def test_external_pools_are_not_decided(kit: Kit) -> None:
    spec = kit.with_spec(decode={"autoscaling": {"external": True}}).spec
    decode_state = PoolAutoscalingStatus(desired_replicas=7, capacity_correction=0.5)
    state = AutoscalingStatus(pools=AutoscalingPoolsStatus(decode=decode_state))
    snapshot = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (3, 3)}, prefill=1.5, decode=9.0)
    decision = decide(spec, snapshot, state, T0)
    assert set(decision.pools) == {"prefill"}
    assert decision.state.pools.decode == decode_state


# --- bounds ----------------------------------------------------------------------------------------------

BOUNDS_CASES = [
    # id, bounds, spec replicas, state's desired size, load, target, limited_by, condition reason
    ("max", {"minReplicas": 1, "maxReplicas": 5}, 2, 4, 11.0, 5, "maxReplicas", "LimitedByMaxReplicas"),
    ("min", {"minReplicas": 3, "maxReplicas": 8}, 3, 3, 0.0, 3, "minReplicas", "Active"),
    ("max-lowered-below-state", {"minReplicas": 1, "maxReplicas": 4}, 2, 6, 3.5, 4, "maxReplicas", "Active"),
    ("min-raised-above-state", {"minReplicas": 3, "maxReplicas": 8}, 3, 1, 0.5, 3, "minReplicas", "Active"),
    ("spec-size-first", {"minReplicas": 2, "maxReplicas": 8}, 5, None, 4.5, 5, None, "Active"),
]


@pytest.mark.parametrize(
    ("bounds", "replicas", "desired", "load", "target", "limited_by", "reason"),
    [c[1:] for c in BOUNDS_CASES],
    ids=[c[0] for c in BOUNDS_CASES],
)
def test_min_max_clamps(
    kit: Kit,
    bounds: dict[str, int],
    replicas: int,
    desired: int | None,
    load: float,
    target: int,
    limited_by: str | None,
    reason: str,
) -> None:
    spec = kit.with_spec(prefill={"replicas": replicas, "autoscaling": bounds}).spec
    state = at({"decode": 2}) if desired is None else at({"prefill": desired, "decode": 2})
    size = replicas if desired is None else desired
    snapshot = kit.snapshot(T0, sizes={"prefill": (size, size), "decode": (2, 2)}, prefill=load)
    decision = decide(spec, snapshot, state, T0)
    pool = decision.pools["prefill"]
    assert pool.current == size
    assert (pool.target, pool.limited_by) == (target, limited_by)
    assert decision.condition[1] == reason


# --- maxGPUs ------------------------------------------------------------------------------------------------

BUDGET_CASES = [
    # id, TTFT seconds, TPOT seconds, expected (prefill, decode). Prefill (TP1, at 2) wants 7 and decode
    # (TP2, at 1) wants 3: 13 GPUs of 10. Prefill has a queue, so TTFT is its own.
    ("prefill-deficit-first", 1.5, 0.055, (7, 1)),  # deficits 2.0 and 0.1
    ("decode-deficit-first", 0.55, 0.150, (4, 3)),  # deficits 0.1 and 2.0
]


@pytest.mark.parametrize(
    ("ttft", "tpot", "expected"), [c[1:] for c in BUDGET_CASES], ids=[c[0] for c in BUDGET_CASES]
)
def test_max_gpus_goes_to_the_largest_slo_deficit_first(
    kit: Kit, ttft: float, tpot: float, expected: tuple[int, int]
) -> None:
    k = kit.with_spec(
        maxGPUs=10,
        decode={"replicas": 1, "tensorParallelSize": 2},
        autoscaling={"scaleUp": {"maxStep": 8}},
    )
    sizes = {"prefill": (2, 2), "decode": (1, 1)}
    snapshot = k.snapshot(
        T0, sizes=sizes, busy=2, queue=3.5, decode=2.5, ttft=ttft, tpot=tpot, attainment=0.8
    )
    decision = decide(k.spec, snapshot, at({"prefill": 2, "decode": 1}), T0)
    wanted = (decision.pools["prefill"].recommendation, decision.pools["decode"].recommendation)
    assert wanted == (7, 3)
    targets = (decision.pools["prefill"].target, decision.pools["decode"].target)
    assert targets == expected
    assert targets[0] + 2 * targets[1] <= 10
    assert decision.condition[:2] == ("False", "LimitedByMaxGPUs")
    assert "maxGPUs" in {p.limited_by for p in decision.pools.values()}


def test_max_gpus_counts_the_pools_it_does_not_size(kit: Kit) -> None:
    spec = kit.with_spec(maxGPUs=8, colocated={"replicas": 3}).spec  # 3 GPUs of colocated, fixed
    snapshot = kit.snapshot(
        T0, sizes={"prefill": (2, 2), "decode": (2, 2), "colocated": (3, 3)}, prefill=4.5, decode=1.5
    )
    decision = decide(spec, snapshot, at({"prefill": 2, "decode": 2}), T0)
    assert decision.pools["prefill"].target + decision.pools["decode"].target == 5


def test_max_gpus_never_goes_below_min_replicas(kit: Kit) -> None:
    """An HPA grew the external decode pool to 5 GPUs: 6 GPUs leave 1 for prefill's minimum of 2."""
    spec = kit.with_spec(
        maxGPUs=6, prefill={"autoscaling": {"minReplicas": 2}}, decode={"autoscaling": {"external": True}}
    ).spec
    snapshot = kit.snapshot(T0, sizes={"prefill": (3, 3), "decode": (5, 5)}, prefill=4.5, decode=4.5)
    decision = decide(spec, snapshot, at({"prefill": 3}), T0)
    pool = decision.pools["prefill"]
    assert (pool.target, pool.limited_by) == (2, "maxGPUs")
    assert decision.condition[1] == "LimitedByMaxGPUs"
    assert "minimums need 2 GPUs" in decision.condition[2]


@pytest.mark.parametrize(
    ("decode_wants", "prefill_gets"),
    [
        (1, 1),  # decode keeps draining decode-1: 3 GPUs = prefill 1 + decode 1 + 1 draining
        (2, 1),  # decode wants its draining pod back (the drain is cancelled): prefill 1 + decode 2
    ],
)
def test_max_gpus_counts_pods_still_draining(kit: Kit, decode_wants: int, prefill_gets: int) -> None:
    """A draining pod keeps its GPUs until its StatefulSet lets it go: the budget cannot lend them."""
    k = kit.with_spec(
        maxGPUs=3, prefill={"replicas": 1}, decode={"replicas": 1}, autoscaling={"scaleUp": {"maxStep": 8}}
    )
    drain = DrainStatus(pod="decode-1", pods=["decode-1"], started_at=T0 - 10, target_replicas=1)
    state = at({"prefill": 1, "decode": 1})
    state.pools.decode = state.pools.decode.model_copy(update={"draining": drain})
    snapshot = k.snapshot(
        T0, sizes={"prefill": (1, 1), "decode": (2, 2)}, busy=1, queue=3.0, decode=decode_wants - 0.5
    )
    decision = decide(k.spec, snapshot, state, T0)
    assert decision.pools["decode"].target == decode_wants
    assert decision.pools["prefill"].target == prefill_gets
    held = decision.pools["prefill"].target + max(decision.pools["decode"].target, 2)
    assert held <= 3
    assert decision.state.pools.decode.draining == drain  # the operator's, carried over


# --- state ---------------------------------------------------------------------------------------------


def test_first_decision_is_recorded_then_only_changes(kit: Kit, make_loop: type[Loop]) -> None:
    loop = make_loop(kit)
    first = loop.step(prefill=1.5, decode=1.5)
    last = first.state.pools.prefill.last_decision
    assert last is not None
    assert (last.from_replicas, last.to) == (2, 2)
    assert last.figures
    second = loop.step(prefill=1.5, decode=1.5)
    assert second.state.pools.prefill.last_decision == last
    third = loop.step(prefill=4.5, decode=1.5)
    changed = third.state.pools.prefill.last_decision
    assert changed is not None
    assert (changed.from_replicas, changed.to) == (2, 5)
    assert changed.reason == third.pools["prefill"].reason
    assert third.state.pools.prefill.last_scale_time == loop.now - 30
    assert third.state.last_evaluated == loop.now - 30


def test_recommendations_are_pruned_to_the_longest_window_and_drain_is_kept(kit: Kit) -> None:
    drain = DrainStatus(pod="p-1", started_at=T0 - 10, target_replicas=1)
    old = [Recommendation(time=T0 - s, replicas=3) for s in (900, 400, 301, 300, 60)]
    state = AutoscalingStatus(
        pools=AutoscalingPoolsStatus(
            prefill=PoolAutoscalingStatus(desired_replicas=2, recommendations=old, draining=drain)
        )
    )
    snapshot = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, prefill=1.5)
    new = decide(kit.spec, snapshot, state, T0).state.pools.prefill
    # The newest entry older than the window stays: it shows the history covers the window.
    assert [r.time for r in new.recommendations] == [T0 - 301, T0 - 300, T0 - 60, T0]
    assert new.draining == drain


def test_decision_figures_fit_the_status(kit: Kit) -> None:
    spec = kit.with_spec(colocated={"replicas": 1, "autoscaling": {"minReplicas": 1}}).spec
    snapshot = kit.snapshot(
        T0,
        sizes={"prefill": (2, 2), "decode": (2, 2), "colocated": (1, 1)},
        prefill=1.5,
        decode=1.5,
        ttft=0.3,
        tpot=0.02,
        colocated=(0.0, 0.0),
    )
    decision = decide(spec, snapshot, AutoscalingStatus(), T0)
    for pool in decision.pools.values():
        assert len(pool.figures) <= 32
        assert all(key[0].islower() and "_" not in key for key in pool.figures)
        assert all(math.isfinite(v) for v in pool.figures.values())
    AutoscalingStatus.model_validate(decision.state.model_dump(by_alias=True))


INACTIVE_CASES: list[tuple[str, dict[str, Any], str]] = [
    # The API refuses these specs; decide() still holds if handed one (model_copy skips validation).
    ("disabled", {"autoscaling": None}, "Disabled"),
    ("no-slo", {"slo": None}, "NoSLO"),
    ("no-pools", {"prefill": None, "decode": None}, "NoAutoscaledPools"),
]


@pytest.mark.parametrize(
    ("patch", "reason"), [c[1:] for c in INACTIVE_CASES], ids=[c[0] for c in INACTIVE_CASES]
)
def test_inactive_autoscaler_holds_and_says_why(kit: Kit, patch: dict[str, Any], reason: str) -> None:
    spec = kit.spec
    update: dict[str, Any] = {}
    for key in patch:
        if key == "autoscaling":
            update[key] = spec.autoscaling.model_copy(update={"enabled": False})
        elif key == "slo":
            update[key] = None
        else:
            update[key] = spec.pool(key).model_copy(update={"autoscaling": None})
    spec = spec.model_copy(update=update)
    snapshot = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, prefill=9.0)
    decision = decide(spec, snapshot, AutoscalingStatus(), T0)
    assert decision.held
    assert not decision.pools
    assert decision.condition[:2] == ("False", reason)
