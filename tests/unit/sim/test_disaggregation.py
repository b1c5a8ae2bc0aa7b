"""Remote or local prefill in the simulator (SimConfig.disaggregation): local prefills run on the decode
replicas and count there, not on the prefill pool."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.routing.disaggregation import DisaggregationKnobs
from tandem.sim import Request, simulate
from tandem.sim.layout import Layout, PoolSpec
from tandem.sim.traces.prefix import SessionParams, sessions

if TYPE_CHECKING:
    from conftest import SimKit

TRACE = [Request(0.2 * i, 200 + (i * 37) % 3000, 20 + i % 40) for i in range(400)]


def config(kit: SimKit, knobs: DisaggregationKnobs) -> object:
    return kit.config().model_copy(update={"disaggregation": knobs})


def test_threshold_prefills_short_prompts_on_decode_replicas(kit: SimKit) -> None:
    knobs = DisaggregationKnobs(mode="Threshold", threshold_tokens=1000)
    result = simulate(TRACE, kit.pd(), config(kit, knobs))  # type: ignore[arg-type]
    short = sum(1 for r in TRACE if r.prompt_tokens <= 1000)
    assert result.summary.prefill_choices == {"below_threshold": short, "above_threshold": len(TRACE) - short}
    assert result.summary.finished == len(TRACE)
    always = simulate(TRACE, kit.pd(), kit.config()).summary  # SimConfig's default: Always
    assert always.prefill_choices == {}
    # The prefill pool computes only the long prompts; the decode pool's GPU time grows by the short ones.
    assert result.summary.busy_gpu_hours["prefill"] < always.busy_gpu_hours["prefill"]
    assert result.summary.busy_gpu_hours["decode"] > always.busy_gpu_hours["decode"]


def test_no_prefill_replica_is_served_on_decode(kit: SimKit) -> None:
    replica = kit.spec()
    layout = Layout(
        pools={
            "prefill": PoolSpec(replica=replica, replicas=0),
            "decode": PoolSpec(replica=replica, replicas=1),
        }
    )
    requests = TRACE[:20]
    refused = simulate(requests, layout, kit.config()).summary
    assert refused.finished == 0
    served = simulate(requests, layout, config(kit, DisaggregationKnobs(mode="Auto"))).summary  # type: ignore[arg-type]
    assert served.finished == 20
    assert served.prefill_choices == {"no_prefill_ready": 20}


def test_auto_on_multi_turn_sessions_prefills_later_turns_on_decode(kit: SimKit) -> None:
    base = [Request(0.5 * i, 150, 60) for i in range(600)]
    trace = sessions(base, SessionParams(turns=4, think_seconds=5.0, system_prompt_tokens=1500, seed=2))
    layout = kit.pd(prefill=1, decode=2)
    always = simulate(trace, layout, kit.config()).summary
    auto = simulate(
        trace, layout, config(kit, DisaggregationKnobs(mode="Auto", max_local_tokens=1024))
    ).summary  # type: ignore[arg-type]
    assert auto.finished == always.finished == len(trace)
    assert auto.prefill_choices.get("local_faster", 0) > len(trace) // 4
    assert auto.ttft_p50 < always.ttft_p50


def _bidirectional(kit: SimKit, on: bool, threshold: int = 64) -> object:
    return kit.config().model_copy(
        update={"bidirectional_kv": on, "kv_recompute_threshold": threshold, "routing": "power-of-two"}
    )


def test_bidirectional_prefill_pulls_earlier_turns_back_from_decode(kit: SimKit) -> None:
    """vLLM's bidirectional mode: a later turn's remote prefill reads the conversation the decode replica
    holds instead of recomputing it (the prefill replicas, picked by load here, often lack it)."""
    base = [Request(0.5 * i, 150, 60) for i in range(400)]
    trace = sessions(base, SessionParams(turns=4, think_seconds=5.0, system_prompt_tokens=1500, seed=2))
    layout = kit.pd(prefill=3, decode=2)
    off = simulate(trace, layout, _bidirectional(kit, False)).summary  # type: ignore[arg-type]
    on = simulate(trace, layout, _bidirectional(kit, True)).summary  # type: ignore[arg-type]
    assert on.finished == off.finished == len(trace)
    assert off.pulled_back_tokens == 0
    assert on.pulled_back_tokens > 0
    # what is read back is not computed: the prefill pool's GPU time falls, its cache hits do not change
    # meaning (a pulled block is not a hit)
    assert on.busy_gpu_hours["prefill"] < off.busy_gpu_hours["prefill"]
    assert on.ttft_p50 <= off.ttft_p50
    # under the recompute threshold nothing is read (the decode replica is still picked at arrival, by
    # its cache, so the runs are not identical): a threshold above every prompt computes it all again
    never = simulate(trace, layout, _bidirectional(kit, True, threshold=10**9)).summary  # type: ignore[arg-type]
    assert never.pulled_back_tokens == 0
    assert never.busy_gpu_hours["prefill"] > on.busy_gpu_hours["prefill"]
    # requests without a prefix (nothing cached anywhere) never pull back
    plain = simulate(TRACE, kit.pd(), _bidirectional(kit, True)).summary  # type: ignore[arg-type]
    assert plain.pulled_back_tokens == 0


def test_a_slow_link_makes_the_pull_back_cost_time(kit: SimKit) -> None:
    base = [Request(2.0 * i, 150, 20) for i in range(120)]
    trace = sessions(base, SessionParams(turns=4, think_seconds=5.0, system_prompt_tokens=3000, seed=3))
    fast = simulate(trace, kit.pd(prefill=2, decode=2), _bidirectional(kit, True)).summary  # type: ignore[arg-type]
    slow_layout = kit.pd(replica=kit.spec(bandwidth=1.0), prefill=2, decode=2)
    slow = simulate(trace, slow_layout, _bidirectional(kit, True)).summary  # type: ignore[arg-type]
    assert fast.pulled_back_tokens > 0
    assert slow.pulled_back_tokens > 0
    assert slow.ttft_p90 > fast.ttft_p90
