"""What decide() learns: the measured SLO as a floor and as a capacity correction, and what the pods
actually sustained; the colocated pool sized from both prompts and sequences."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import pytest

from tandem.api.status import (
    AutoscalingPoolsStatus,
    AutoscalingStatus,
    PoolAutoscalingStatus,
    ScaleDecision,
)
from tandem.autoscale.capacity import decode_capacity, pool_model, prefill_capacity
from tandem.autoscale.decide import decide
from tandem.autoscale.knobs import KNOBS
from tandem.signals import PathSignals, PoolSignals, PoolSize, Snapshot

if TYPE_CHECKING:
    from conftest import Kit

T0 = 1_800_000_000.0


def at(desired: dict[str, int], correction: float = 1.0) -> AutoscalingStatus:
    pools = {
        role: PoolAutoscalingStatus(desired_replicas=n, capacity_correction=correction)
        for role, n in desired.items()
    }
    return AutoscalingStatus(mode="Active", last_evaluated=T0 - 30, pools=AutoscalingPoolsStatus(**pools))


def no_window(kit: Kit) -> Kit:
    return kit.with_spec(autoscaling={"scaleDown": {"stabilizationSeconds": 0, "maxStep": 4}})


# --- SLO feedback ---------------------------------------------------------------------------------------

SLO_CASES: list[tuple[str, dict[str, Any], tuple[int, int], dict[str, int], dict[str, float]]] = [
    # id, snapshot arguments, prefill (replicas, ready), expected targets, expected corrections
    (
        "ttft-miss-model-said-enough",  # 1.7 of 2 replicas busy, TTFT 1.6x target: +1, correction x0.8
        {"prefill": 1.7, "decode": 1.5, "ttft": 0.8, "attainment": 0.8},
        (2, 2),
        {"prefill": 3, "decode": 2},
        {"prefill": 0.80, "decode": 1.0},
    ),
    (
        "ttft-over-but-attainment-met",  # the quantile is one of two: attainment decides
        {"prefill": 1.7, "decode": 1.5, "ttft": 0.8, "attainment": 0.97},
        (2, 2),
        {"prefill": 2, "decode": 2},
        {"prefill": 1.0, "decode": 1.0},
    ),
    (
        "ttft-miss-small-overshoot",  # TTFT 1.04x: the correction shrinks by the smallest step, x0.95
        {"prefill": 1.7, "decode": 1.5, "ttft": 0.52, "attainment": 0.9},
        (2, 2),
        {"prefill": 3, "decode": 2},
        {"prefill": 0.95, "decode": 1.0},
    ),
    (
        "ttft-miss-while-pods-start",  # the new pod will fix it: no more, no correction
        {"prefill": 1.7, "decode": 1.5, "ttft": 0.8, "attainment": 0.8},
        (3, 2),
        {"prefill": 3, "decode": 2},
        {"prefill": 1.0, "decode": 1.0},
    ),
    (
        "ttft-miss-while-idle",  # 0.2 of 2 busy: not for want of replicas; but no scale-down either
        {"prefill": 0.2, "decode": 1.5, "ttft": 0.8, "attainment": 0.8},
        (2, 2),
        {"prefill": 2, "decode": 2},
        {"prefill": 1.0, "decode": 1.0},
    ),
    (
        "ttft-miss-is-decodes",  # requests wait on decode (KV admission), prefill has no queue
        {"prefill": 1.7, "decode": 1.8, "waiting": 0.05, "ttft": 0.8, "attainment": 0.8},
        (2, 2),
        {"prefill": 2, "decode": 3},
        {"prefill": 1.0, "decode": 0.8},
    ),
    (
        "one-request-waiting-on-decode-is-not-decodes",  # 1 request over 2 decode pods: prefill's miss
        {"prefill": 1.7, "decode": 1.5, "waiting": 1 / 352, "ttft": 0.8, "attainment": 0.8},
        (2, 2),
        {"prefill": 3, "decode": 2},
        {"prefill": 0.80, "decode": 1.0},
    ),
    (
        "ttft-miss-is-decodes-kv-full",  # no one waits yet, but decode's KV cache is full
        {"prefill": 1.7, "decode": 1.5, "kv": 0.97, "ttft": 0.8, "attainment": 0.8},
        (2, 2),
        {"prefill": 2, "decode": 3},
        {"prefill": 1.0, "decode": 1.0},  # the KV term already asked for 3: no correction
    ),
    (
        "tpot-miss",
        {"prefill": 1.7, "decode": 1.7, "tpot": 0.07, "attainment": 0.8},
        (2, 2),
        {"prefill": 2, "decode": 3},
        {"prefill": 1.0, "decode": None},  # decode also learns from the measured TPOT: checked below
    ),
]


@pytest.mark.parametrize(
    ("load", "prefill_size", "targets", "corrections"),
    [c[1:] for c in SLO_CASES],
    ids=[c[0] for c in SLO_CASES],
)
def test_measured_slo_feeds_back(
    kit: Kit,
    load: dict[str, Any],
    prefill_size: tuple[int, int],
    targets: dict[str, int],
    corrections: dict[str, float | None],
) -> None:
    k = no_window(kit)
    sizes = {"prefill": prefill_size, "decode": (2, 2)}
    decision = decide(
        k.spec, k.snapshot(T0, sizes=sizes, **load), at({"prefill": prefill_size[0], "decode": 2}), T0
    )
    assert {role: pool.target for role, pool in decision.pools.items()} == targets
    for role, expected in corrections.items():
        correction = getattr(decision.state.pools, role).capacity_correction
        if expected is None:
            assert correction < 1.0
        else:
            assert correction == pytest.approx(expected)
    if targets["prefill"] > prefill_size[0]:
        assert "SLO missed" in decision.pools["prefill"].reason or "TTFT" in decision.pools["prefill"].reason


RELAX_CASES = [
    # id, prefill load (profile replicas' worth), expected correction from 0.5
    ("busy-relaxes", 1.5, 0.5 + 0.5 * KNOBS.relax_rate),  # 3 corrected replicas' worth on 3: loaded
    ("half-busy-relaxes", 0.75, 0.5 + 0.5 * KNOBS.relax_rate),  # 1.5 of 3: exactly miss_min_load
    ("just-under-half-keeps", 0.74, 0.5),  # 1.48 of 3 corrected replicas busy: comfort proves nothing
    ("light-keeps", 0.3, 0.5),
    ("idle-keeps", 0.0, 0.5),  # between bursts
]


@pytest.mark.parametrize(("load", "expected"), [c[1:] for c in RELAX_CASES], ids=[c[0] for c in RELAX_CASES])
def test_a_comfortable_slo_relaxes_a_pessimistic_correction_only_under_load(
    kit: Kit, load: float, expected: float
) -> None:
    snapshot = kit.snapshot(T0, sizes={"prefill": (3, 3), "decode": (2, 2)}, prefill=load, ttft=0.1)
    decision = decide(kit.spec, snapshot, at({"prefill": 3, "decode": 2}, correction=0.5), T0)
    assert decision.state.pools.prefill.capacity_correction == pytest.approx(expected)


# --- what the pods sustained ------------------------------------------------------------------------------


def saturated(
    kit: Kit, share: float, *, now: float = T0, ready: int = 4, starting: int = 0, scraped: int | None = None
) -> Snapshot:
    """4 prefill pods flat out at `share` of the profile's throughput, a deep queue behind them now
    and one window earlier."""
    snapshot = kit.snapshot(
        now,
        sizes={"prefill": (ready + starting, ready), "decode": (2, 2)},
        busy=ready * share,
        queue=1.0,
        queue_before=1.0,
    )
    if scraped is not None:
        pools = {
            **snapshot.pools,
            "prefill": dataclasses.replace(snapshot.pools["prefill"], scraped_targets=scraped),
        }
        snapshot = dataclasses.replace(snapshot, pools=pools)
    return snapshot


@pytest.mark.parametrize(
    ("share", "learnt"), [(0.5, 0.5), (1.0, 1.0), (1.6, 1.6), (0.1, KNOBS.correction_min)]
)
def test_prefill_capacity_is_learnt_from_saturated_pods(kit: Kit, share: float, learnt: float) -> None:
    state = at({"prefill": 4, "decode": 2})
    corrections = []
    for i in range(40):
        decision = decide(kit.spec, saturated(kit, share, now=T0 + 30 * i), state, T0 + 30 * i)
        state = decision.state.model_copy(
            update={
                "pools": decision.state.pools.model_copy(
                    update={
                        "prefill": decision.state.pools.prefill.model_copy(update={"desired_replicas": 4})
                    }
                )
            }
        )
        corrections.append(decision.state.pools.prefill.capacity_correction)
    # Smooth (one step moves at most a third of the way, in log terms) and converging to the measurement.
    first = corrections[0]
    assert abs(math.log(first)) <= KNOBS.correction_smoothing * abs(math.log(max(learnt, 1e-9))) + 1e-9
    assert corrections[-1] == pytest.approx(learnt, rel=0.01)
    assert all(KNOBS.correction_min <= c <= KNOBS.correction_max for c in corrections)


@pytest.mark.parametrize(
    ("snapshot_args", "why"),
    [({"starting": 2}, "pods starting"), ({"scraped": 3}, "a pod does not report")],
    ids=["starting", "partial-scrape"],
)
def test_no_learning_from_an_incomplete_picture(kit: Kit, snapshot_args: dict[str, int], why: str) -> None:
    decision = decide(kit.spec, saturated(kit, 0.5, **snapshot_args), at({"prefill": 4, "decode": 2}), T0)
    assert decision.state.pools.prefill.capacity_correction == 1.0, why


def _with_queue(snapshot: Snapshot, **fields: float | None) -> Snapshot:
    pools = {**snapshot.pools, "prefill": dataclasses.replace(snapshot.pools["prefill"], **fields)}
    return dataclasses.replace(snapshot, pools=pools)


@pytest.mark.parametrize(
    ("fields", "learns"),
    [
        ({}, True),  # a deep queue, many requests waiting per pod
        ({"waiting_requests": 3.0}, False),  # fewer requests waiting than pods: one pod may idle
        ({"queued_prompt_tokens_before": 0.0}, False),  # the queue built up only at the window's end
        # not read (the live reader's pool younger than the window): the rate may average idle time
        ({"queued_prompt_tokens_before": None}, False),
        ({"queued_prompt_tokens": 4 * 1000.0, "waiting_requests": 4.0}, False),  # one prompt per pod <
    ],  # the 8192-token budget: a pod with one queued prompt may still have room in its step
    ids=["saturated", "too-few-waiting", "queue-only-at-the-end", "queue-before-unknown", "under-a-step"],
)
def test_prefill_learns_only_from_a_pool_saturated_over_the_window(
    kit: Kit, fields: dict[str, float | None], learns: bool
) -> None:
    snapshot = saturated(kit, 0.5)
    decision = decide(kit.spec, _with_queue(snapshot, **fields), at({"prefill": 4, "decode": 2}), T0)
    assert (decision.state.pools.prefill.capacity_correction < 1.0) is learns


def test_a_partial_scrape_forbids_scaling_down(kit: Kit) -> None:
    k = no_window(kit)
    snapshot = k.snapshot(T0, sizes={"prefill": (4, 4), "decode": (2, 2)}, prefill=0.5)
    pools = {**snapshot.pools, "prefill": dataclasses.replace(snapshot.pools["prefill"], scraped_targets=2)}
    decision = decide(k.spec, dataclasses.replace(snapshot, pools=pools), at({"prefill": 4, "decode": 2}), T0)
    assert decision.pools["prefill"].target == 4
    assert "not every pod reports" in decision.pools["prefill"].reason


def test_a_pool_whose_pods_all_load_is_not_scaled_down(kit: Kit) -> None:
    """Nothing measures its load yet (a 70B pool loads for minutes): zero rates are not "no traffic"."""
    k = no_window(kit)
    snapshot = k.snapshot(T0, sizes={"prefill": (4, 0), "decode": (2, 2)}, decode=0.5)
    decision = decide(k.spec, snapshot, at({"prefill": 4, "decode": 2}), T0)
    assert decision.pools["prefill"].target == 4
    assert decision.pools["decode"].target == 1  # its ready pods measure little load: it shrinks


@pytest.mark.parametrize(("slowdown", "direction"), [(2.0, -1), (1.0, +1)], ids=["slower", "as-profiled"])
def test_decode_capacity_follows_the_measured_tpot(kit: Kit, slowdown: float, direction: int) -> None:
    """TPOT measured at `slowdown` x the profile's step time at the running batch (a 20 ms target
    makes the batch, not the KV cache, the limit)."""
    kit = kit.with_spec(slo={"tpotMs": 20})
    slo = kit.spec.slo
    assert slo is not None
    model = pool_model(kit.spec, "decode")
    running_each = 100
    context = 1000 + 200 / 2
    step = model.profile.decode_step_seconds(running_each, math.ceil(running_each * 1088))
    snapshot = kit.snapshot(
        T0,
        sizes={"prefill": (2, 2), "decode": (2, 2)},
        prefill=1.0,
        decode=2 * running_each / kit.sequence_capacity,
        tpot=step * slowdown,
    )
    decision = decide(kit.spec, snapshot, at({"prefill": 2, "decode": 2}), T0)
    correction = decision.state.pools.decode.capacity_correction
    assert (correction - 1.0) * direction > 0
    seeded = decode_capacity(model, slo, context, KNOBS).sequences
    measured = decode_capacity(model, slo, context, KNOBS, headroom=1.0, tpot_scale=slowdown).sequences
    assert correction == pytest.approx((measured / seeded) ** KNOBS.correction_smoothing, rel=1e-6)


# --- colocated ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt_share", "sequence_share", "target"), [(1.5, 1.2, 3), (0.3, 0.2, 1), (2.5, 2.4, 5)]
)
def test_colocated_is_sized_from_prompts_and_sequences_together(
    kit: Kit, prompt_share: float, sequence_share: float, target: int
) -> None:
    k = kit.with_spec(
        serving={"mode": "Colocated"},
        prefill={"replicas": 0, "autoscaling": None},
        decode={"replicas": 0, "autoscaling": None},
        colocated={"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 8}},
        autoscaling={"scaleDown": {"stabilizationSeconds": 0, "maxStep": 4}},
    )
    slo = k.spec.slo
    assert slo is not None
    model = pool_model(k.spec, "colocated")
    assert model.limits.max_num_batched_tokens == 2048  # tandem's colocated default
    prompts = prefill_capacity(model, slo, 1000, KNOBS, transfer_gbps=None).at_target
    sequences = decode_capacity(model, slo, 1100, KNOBS).sequences
    running = sequence_share * sequences
    snapshot = Snapshot(
        observed_at=T0,
        window_seconds=60,
        sizes={"colocated": PoolSize(2, 2), "prefill": PoolSize(0, 0), "decode": PoolSize(0, 0)},
        pools={
            "colocated": PoolSignals(
                scraped_targets=2,
                prompt_tokens_rate=prompt_share * prompts,
                running_requests=running,
                kv_usage_mean=running * 1100 / (2 * decode_capacity(model, slo, 1100, KNOBS).kv_tokens),
                mean_prompt_tokens=1000,
                mean_output_tokens=200,
            )
        },
        paths={
            "colocated": PathSignals(request_rate=5, within_slo_rate=5, ttft_seconds=0.2, tpot_seconds=0.02)
        },
    )
    decision = decide(k.spec, snapshot, AutoscalingStatus(), T0)
    assert set(decision.pools) == {"colocated"}
    pool = decision.pools["colocated"]
    assert pool.figures["exactReplicas"] == pytest.approx(prompt_share + sequence_share, rel=0.02)
    assert pool.target == target


def test_decode_does_not_learn_from_a_light_batch(kit: Kit) -> None:
    """At a tenth of its capacity a replica's step time says little about a full batch's."""
    snapshot = kit.snapshot(
        T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, prefill=1.0, decode=0.2, tpot=0.045
    )
    decision = decide(kit.spec, snapshot, at({"prefill": 2, "decode": 2}), T0)
    assert decision.state.pools.decode.capacity_correction == 1.0


# --- a miss right after a scale-up ------------------------------------------------------------------------


def _scaled_up(seconds_ago: float) -> AutoscalingStatus:
    """prefill went 1 -> 2 `seconds_ago` (decode at 2)."""
    state = at({"prefill": 2, "decode": 2})
    up = ScaleDecision(time="2027-01-15T08:00:00Z", from_replicas=1, to=2, reason="load")
    prefill = state.pools.prefill.model_copy(
        update={"last_scale_time": T0 - seconds_ago, "last_decision": up}
    )
    return state.model_copy(update={"pools": state.pools.model_copy(update={"prefill": prefill})})


@pytest.mark.parametrize(
    ("seconds_ago", "queue", "target", "correction", "why"),
    [
        (20.0, 0.0, 2, 1.0, "the window's past"),  # 60 s window, grown 20 s ago, no queue now: hold
        (20.0, 2.0, 3, 1.0, ""),  # a deep queue now: the miss is present (the model saw it: no shrink)
        (100.0, 0.0, 2, 1.0, "the window's past"),  # within two windows: still the past
        (130.0, 0.0, 3, 0.8, ""),  # grown two windows ago: the window's quantile is all present
    ],
    ids=["just-grown-no-queue", "just-grown-deep-queue", "grown-a-window-ago", "grown-long-ago"],
)
def test_a_miss_right_after_a_scale_up_counts_only_with_a_queue_now(
    kit: Kit, seconds_ago: float, queue: float, target: int, correction: float, why: str
) -> None:
    k = no_window(kit)
    load = {"prefill": 1.7, "decode": 1.5, "ttft": 0.8, "attainment": 0.8, "queue": queue}
    snapshot = k.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, **load)
    decision = decide(k.spec, snapshot, _scaled_up(seconds_ago), T0)
    prefill = decision.pools["prefill"]
    assert prefill.target >= target
    assert prefill.target == target or queue > 0  # a deep queue may ask for more than +1
    assert decision.state.pools.prefill.capacity_correction == pytest.approx(correction)
    assert (why in prefill.reason) if why else ("window's past" not in prefill.reason)


def test_a_comfortable_busy_pool_relaxes_right_after_a_scale_up_too(kit: Kit) -> None:
    """The guard above is about misses: comfort under load, 20 s after a scale-up, still relaxes a
    pessimistic correction (the relax tests the pool's load only)."""
    state = _scaled_up(20.0)
    prefill = state.pools.prefill.model_copy(update={"capacity_correction": 0.5})
    state = state.model_copy(update={"pools": state.pools.model_copy(update={"prefill": prefill})})
    snapshot = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, prefill=1.0, ttft=0.1)
    decision = decide(kit.spec, snapshot, state, T0)
    assert decision.state.pools.prefill.capacity_correction == pytest.approx(0.5 + 0.5 * KNOBS.relax_rate)
