"""Decode's KV for long outputs: the running sequences' mean context is length-biased (they grow after
admission, and the long ones run longest), the KV term sizes for where it is heading, and a window
that ran out of KV (preemptions, a full cache) teaches no slower step. Fake clock: `now` passed in."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import pytest

from tandem.api.status import AutoscalingPoolsStatus, AutoscalingStatus, PoolAutoscalingStatus
from tandem.autoscale.capacity import decode_capacity, pool_model
from tandem.autoscale.decide import decide
from tandem.autoscale.knobs import KNOBS
from tandem.autoscale.recommend import running_context_tokens
from tandem.signals import PathSignals, PoolSignals, PoolSize, Snapshot

if TYPE_CHECKING:
    from conftest import Kit

T0 = 1_800_000_000.0
PROMPT = 1000.0
# Outputs log-uniform in [1024, 8192] (the decode-heavy mix, `sim.traces.reasoning`): exact moments.
LO, HI = 1024.0, 8192.0
LOG_MEAN = (HI - LO) / math.log(HI / LO)  # 3,447
LOG_SQUARE = (HI * HI - LO * LO) / (2 * math.log(HI / LO))  # 15.9M: E[n^2] / E[n]^2 = 1.338


@pytest.mark.parametrize(
    ("prompt", "output", "moment", "context"),
    [
        (1000.0, 200.0, 0.0, 1100.0),  # spread unknown: every output alike, halfway through
        (1000.0, 200.0, 200.0**2, 1100.0),  # every output alike, measured
        (1000.0, 200.0, 2 * 200.0**2, 1200.0),  # exponential outputs (E[n^2] = 2 E[n]^2): prompt + E[n]
        (1000.0, LOG_MEAN, LOG_SQUARE, 1000.0 + LOG_SQUARE / (2 * LOG_MEAN)),  # + 2,306, not + 1,724
        (1000.0, 200.0, 100.0, 1100.0),  # a second moment under E[n]^2 (buckets' noise): as alike
        (1000.0, 0.0, 0.0, 1000.0),  # no outputs
    ],
)
def test_a_running_sequence_holds_its_prompt_and_a_length_biased_half_output(
    prompt: float, output: float, moment: float, context: float
) -> None:
    assert running_context_tokens(prompt, output, moment) == pytest.approx(context)


def status(decode: int, correction: float = 1.0) -> AutoscalingStatus:
    pools = AutoscalingPoolsStatus(
        prefill=PoolAutoscalingStatus(desired_replicas=1, capacity_correction=1.0),
        decode=PoolAutoscalingStatus(desired_replicas=decode, capacity_correction=correction),
    )
    return AutoscalingStatus(mode="Active", last_evaluated=T0 - 30, pools=pools)


def window(
    *,
    decode: int,
    running: float,
    kv: float,
    output: float,
    moment: float,
    tpot: float | None = None,
    attainment: float = 1.0,
    preemptions: float = 0.0,
    kv_max: float | None = None,
) -> Snapshot:
    """One prefill pod idle; `decode` pods running `running` sequences in all, KV `kv` full on average."""
    return Snapshot(
        observed_at=T0,
        window_seconds=60.0,
        sizes={"prefill": PoolSize(1, 1), "decode": PoolSize(decode, decode)},
        pools={
            "prefill": PoolSignals(scraped_targets=1),
            "decode": PoolSignals(
                scraped_targets=decode,
                running_requests=running,
                kv_usage_mean=kv,
                kv_usage_max=kv if kv_max is None else kv_max,
                mean_prompt_tokens=PROMPT,
                mean_output_tokens=output,
                output_tokens_second_moment=moment,
                preemptions_rate=preemptions,
            ),
        },
        paths={
            "disaggregated": PathSignals(
                request_rate=10.0, within_slo_rate=10.0 * attainment, ttft_seconds=0.1, tpot_seconds=tpot
            )
        },
    )


def unlimited(kit: Kit) -> Kit:
    return kit.with_spec(
        autoscaling={
            "scaleUp": {"stabilizationSeconds": 0, "maxStep": 16},
            "scaleDown": {"stabilizationSeconds": 0, "maxStep": 16},
        }
    )


# Four decode pods, each running 240 young sequences that hold 1,500 tokens each so far: KV 80% full,
# under the 85% target, no preemption, TPOT within target.
HELD_NOW = 1500.0
KV_CASES: list[tuple[str, float, float, float, int]] = [
    # id, mean output, E[n^2], correction learnt earlier, expected decode target
    ("short-outputs-hold", 200.0, 200.0**2, 1.0, 4),  # heading for 1,100 tokens each: 2.8 replicas
    ("long-outputs-add-before-preempting", LOG_MEAN, LOG_SQUARE, 1.0, 9),  # for 3,306 each: 8.3
    ("long-outputs-with-a-fast-step-learnt", LOG_MEAN, LOG_SQUARE, 2.0, 9),  # the KV, not the step
]


@pytest.mark.parametrize(
    ("output", "moment", "correction", "target"), [c[1:] for c in KV_CASES], ids=[c[0] for c in KV_CASES]
)
def test_decode_sizes_its_kv_for_where_the_running_sequences_are_heading(
    kit: Kit, output: float, moment: float, correction: float, target: int
) -> None:
    k = unlimited(kit)
    slo = k.spec.slo
    assert slo is not None
    kv_tokens = decode_capacity(pool_model(k.spec, "decode"), slo, 1100, KNOBS).kv_tokens
    running = 4 * 0.80 * kv_tokens / HELD_NOW
    snapshot = window(decode=4, running=running, kv=0.80, output=output, moment=moment)
    decision = decide(k.spec, snapshot, status(4, correction), T0)
    pool = decision.pools["decode"]
    context = running_context_tokens(PROMPT, output, moment)
    rounded = 64 * round(context / 64)  # as decode_capacity rounds it
    heading = running * rounded / (kv_tokens * KNOBS.kv_target_usage)
    assert pool.figures["kvHeadingReplicas"] == pytest.approx(heading, rel=1e-9)
    assert pool.figures["kvReplicas"] == pytest.approx(max(heading, 4 * 0.80 / KNOBS.kv_target_usage))
    assert pool.target == target
    assert decision.state.pools.decode.capacity_correction == pytest.approx(correction)


# A TPOT miss (55 ms against 50, attainment 80%) on 4 busy decode pods at the capacity the model
# gives them: without KV trouble the step is slower than profiled (the correction shrinks, learnt from
# the TPOT); with preemptions or a full KV cache in the window the TPOT holds recomputes and waits for
# blocks, and requests of 2,000 output tokens ran 110 s, longer than the 60-s window (their TPOT is of
# the batches of minutes ago): the miss still adds a replica, the correction stays.
GUARD_CASES: list[tuple[str, float, float, float, str]] = [
    # id, preemptions/s, fullest pod's KV usage, mean output, why the correction is kept ("": learnt)
    ("slow-step-is-learnt", 0.0, 0.80, 200.0, ""),
    ("preempting-window-teaches-nothing", 0.5, 0.80, 200.0, "KV-bound"),
    ("kv-full-window-teaches-nothing", 0.0, KNOBS.kv_full_usage, 200.0, "KV-bound"),
    ("requests-longer-than-the-window-teach-nothing", 0.0, 0.80, 2000.0, "longer than the 60-s window"),
]


@pytest.mark.parametrize(
    ("preemptions", "kv_max", "output", "why"), [c[1:] for c in GUARD_CASES], ids=[c[0] for c in GUARD_CASES]
)
def test_a_window_out_of_kv_teaches_no_slower_step(
    kit: Kit, preemptions: float, kv_max: float, output: float, why: str
) -> None:
    k = unlimited(kit)
    slo = k.spec.slo
    assert slo is not None
    context = running_context_tokens(PROMPT, output, output**2)
    sequences = decode_capacity(pool_model(k.spec, "decode"), slo, context, KNOBS).sequences
    running = 4 * 0.9 * sequences
    state = status(4)
    corrections, targets, reasons = [], [], []
    for i in range(5):  # five passes, 30 s apart on the fake clock, the cluster at the target each time
        now = T0 + 30 * i
        size = state.pools.decode.desired_replicas or 4
        snapshot = window(
            decode=size,
            running=running,
            kv=0.75,
            output=output,
            moment=output**2,
            tpot=0.055,
            attainment=0.8,
            preemptions=preemptions,
            kv_max=kv_max,
        )
        decision = decide(k.spec, dataclasses.replace(snapshot, observed_at=now), state, now)
        state = decision.state
        corrections.append(state.pools.decode.capacity_correction)
        targets.append(decision.pools["decode"].target)
        reasons.append(decision.pools["decode"].reason)
    assert targets[0] == 5  # the miss adds a replica either way
    if why:
        assert corrections == [1.0] * 5
        assert why in reasons[0]
        assert "the capacity correction is kept" in reasons[0]
    else:
        assert all(c < 1.0 for c in corrections)
        assert corrections == sorted(corrections, reverse=True)
        assert "the capacity correction is kept" not in reasons[0]
