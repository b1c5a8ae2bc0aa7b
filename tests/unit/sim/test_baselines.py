"""The baselines on hand-checkable cases: the HPA's replica formula and behaviour, the planner's
arithmetic, and the static searches on hand-made attainment surfaces (`tandem.sim.baselines`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from tandem.perf import decode_batch_at_tpot, kv_cache_tokens, load_profile, prefill_tokens_per_second
from tandem.signals import ArrivalSignals, PathSignals, PoolSignals, PoolSize, Snapshot
from tandem.sim.baselines import (
    HPAConfig,
    HPAPolicy,
    LoadPlannerConfig,
    LoadPlannerPolicy,
    PlannerConfig,
    PlannerObservation,
    PlannerPolicy,
    StaticLayout,
    decode_replica_tokens_per_second,
    decode_tokens_at_itl,
    hpa_replicas,
    predict,
    prefill_replica_tokens_per_second,
    prefill_seconds_for_tokens,
    prefill_tokens_at_ttft,
    prefill_ttft_alone,
    search_static_colocated,
    search_static_pd,
)
from tandem.sim.tandem_policy import TandemPolicy, autoscaled_spec

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


# --- the HPA formula ---------------------------------------------------------------------------------


def test_hpa_scales_by_ratio_of_average_to_target() -> None:
    # 4 pods averaging 150 against a target of 100: ceil(4 x 1.5) = 6
    assert hpa_replicas(4, 4, 600.0, 100.0) == 6
    # 4 pods averaging 40: ceil(4 x 0.4) = 2
    assert hpa_replicas(4, 4, 160.0, 100.0) == 2


def test_hpa_holds_within_ten_percent_tolerance() -> None:
    assert hpa_replicas(4, 4, 436.0, 100.0) == 4  # ratio 1.09: within
    assert hpa_replicas(4, 4, 364.0, 100.0) == 4  # ratio 0.91: within
    assert hpa_replicas(4, 4, 444.0, 100.0) == 5  # ratio 1.11: ceil(4.44)
    assert hpa_replicas(4, 4, 356.0, 100.0) == 4  # ratio 0.89: ceil(3.56) = 4, no change either way
    assert hpa_replicas(10, 10, 850.0, 100.0) == 9  # ratio 0.85: ceil(8.5)


def test_hpa_counts_starting_pods_as_zero_on_scale_up() -> None:
    # 2 of 4 pods report, averaging 300 (ratio 3); the 2 starting pods count as 0: 600/4 = 150 -> ratio
    # 1.5 -> ceil(1.5 x 4) = 6
    assert hpa_replicas(4, 2, 600.0, 100.0) == 6
    # 2 of 4 report 120 each (ratio 1.2); with the starting pods at 0 the ratio is 0.6: the direction
    # reverses, so the HPA holds
    assert hpa_replicas(4, 2, 240.0, 100.0) == 4


def test_hpa_counts_starting_pods_at_target_on_scale_down() -> None:
    # 2 of 4 report 20 each (ratio 0.2); the 2 starting pods count at the target: (40 + 200) / 4 = 60
    # -> ratio 0.6 -> ceil(0.6 x 4) = 3
    assert hpa_replicas(4, 2, 40.0, 100.0) == 3


def test_hpa_holds_without_metrics() -> None:
    assert hpa_replicas(3, 0, 0.0, 100.0) == 3


def _snapshot(now: float, prefill: tuple[int, float], decode: tuple[int, float]) -> Snapshot:
    """prefill: (replicas, queued prompt tokens in total); decode: (replicas, mean KV usage)."""
    return Snapshot(
        observed_at=now,
        window_seconds=60.0,
        sizes={"prefill": PoolSize(prefill[0], prefill[0]), "decode": PoolSize(decode[0], decode[0])},
        pools={
            "prefill": PoolSignals(scraped_targets=prefill[0], queued_prompt_tokens=prefill[1]),
            "decode": PoolSignals(scraped_targets=decode[0], kv_usage_mean=decode[1]),
        },
        paths={"disaggregated": PathSignals(request_rate=1.0, within_slo_rate=1.0)},
    )


def test_hpa_policy_scales_up_at_once_and_down_after_300_s() -> None:
    hpa = HPAPolicy(HPAConfig(targets={"prefill": 1000.0, "decode": 0.5}))
    assert hpa.interval_seconds == 15.0
    # prefill: 2 replicas with 6000 queued tokens = 3000 each, ratio 3 -> 6; decode: 2 at 0.5 -> hold
    assert hpa.decide(_snapshot(0.0, (2, 6000.0), (2, 0.5)), 0.0) == {"prefill": 6, "decode": 2}
    # the queue drains: raw recommendation is 1, but scale-down waits for the 300-s window
    for t in range(15, 300, 15):
        assert hpa.decide(_snapshot(float(t), (6, 0.0), (2, 0.5)), float(t))["prefill"] == 6
    # at t=300 the recommendation of 6 (at t=0) has left the window: down to 1 (HPA minReplicas)
    assert hpa.decide(_snapshot(300.0, (6, 0.0), (2, 0.5)), 300.0)["prefill"] == 1


def test_hpa_first_sight_records_the_current_size() -> None:
    # as the HPA controller: a new HPA does not scale down before its window has passed
    hpa = HPAPolicy(HPAConfig(targets={"prefill": 1000.0, "decode": 0.5}))
    assert hpa.decide(_snapshot(0.0, (4, 0.0), (4, 0.0)), 0.0) == {"prefill": 4, "decode": 4}
    assert hpa.decide(_snapshot(285.0, (4, 0.0), (4, 0.0)), 285.0) == {"prefill": 4, "decode": 4}
    # the window keeps recommendations strictly after now - 300 s (the controller's cutoff)
    assert hpa.decide(_snapshot(300.0, (4, 0.0), (4, 0.0)), 300.0) == {"prefill": 1, "decode": 1}


def test_hpa_scale_up_rate_is_double_or_four_pods_per_sync() -> None:
    hpa = HPAPolicy(HPAConfig(targets={"prefill": 100.0, "decode": 0.5}))
    # 1 prefill replica with 2,000 queued tokens: ratio 20 -> 20 wanted, limited to max(2x1, 1+4) = 5
    assert hpa.decide(_snapshot(0.0, (1, 2000.0), (1, 0.5)), 0.0)["prefill"] == 5
    # 10 replicas asking for 40: limited to max(2x10, 10+4) = 20
    assert hpa.decide(_snapshot(15.0, (10, 4000.0), (1, 0.5)), 15.0)["prefill"] == 20


def test_hpa_decode_on_kv_usage_and_budget() -> None:
    hpa = HPAPolicy(HPAConfig(targets={"prefill": 1000.0, "decode": 0.5}), max_gpus=8)
    # decode: 4 replicas at 90% KV: ceil(4 x 1.8) = 8, but prefill 2 + decode 8 > 8 GPUs: decode gets 6
    assert hpa.decide(_snapshot(0.0, (2, 2000.0), (4, 0.9)), 0.0) == {"prefill": 2, "decode": 6}


def test_hpa_holds_on_missing_data() -> None:
    hpa = HPAPolicy()
    snapshot = Snapshot(observed_at=0.0, window_seconds=0.0, missing=("no scrape window yet",))
    assert hpa.decide(snapshot, 0.0) == {}


# --- the planner -------------------------------------------------------------------------------------


def test_predictors() -> None:
    assert predict([], "constant") == 0.0
    assert predict([3.0, 5.0], "trend") == 5.0  # fewer than three points: the last value
    assert predict([1.0, 2.0, 3.0], "constant") == 3.0
    assert predict([1.0, 2.0, 3.0], "trend") == pytest.approx(4.0)  # the line y = x + 1 at x = 3
    assert predict([10.0, 8.0, 6.0, 4.0, 2.0, 0.0], "trend") == 0.0  # extrapolates to -2: clamped
    # only the last five points: 1, 1, 1, 1, 1 after an outlier
    assert predict([100.0, 1.0, 1.0, 1.0, 1.0, 1.0], "trend") == pytest.approx(1.0)


def test_planner_per_replica_throughputs_come_from_perf() -> None:
    profile = load_profile(LLAMA_8B, "H100", 1)
    # prefill, as Dynamo's profiler measures it: ISL / TTFT at batch 1. 1000 tokens alone take
    # 1 + 0.0218 x 1000 = 22.8 ms of linear ops and 6.6e-7 x 1000^2 = 0.66 ms of attention: 42,626 tokens/s
    # (a busy replica packing prompts into 8192-token steps computes more: perf's 44.3k)
    assert profile.prefill_seconds(1000) == pytest.approx(0.02346)
    assert prefill_ttft_alone(profile, 1000) == profile.prefill_seconds(1000)
    assert prefill_replica_tokens_per_second(profile, 1000, 1.0) == pytest.approx(1000 / 0.02346)
    assert prefill_replica_tokens_per_second(profile, 1000, 1.0) < prefill_tokens_per_second(profile, 1000)
    # a 32k prompt alone: 4 chunks of 8192 (1 + 0.0218 x 8192 = 179.6 ms each) and 708.7 ms of attention,
    # 1.427 s; at a 0.5 s TTFT it needs ceil(1.427 / 0.5) = 3 replicas' worth (the latency floor)
    alone = prefill_ttft_alone(profile, 32768)
    assert alone == pytest.approx(4 * 0.1795856 + 6.6e-7 * 32768**2 / 1000)
    assert prefill_replica_tokens_per_second(profile, 32768, 0.5) == pytest.approx(32768 / alone / 3)
    # decode: the batch at the ITL target with sequences at ISL + OSL/2 = 1100 tokens, its step time
    batch = decode_batch_at_tpot(profile, 0.03, 1100.0)
    expected = batch / profile.decode_step_seconds(batch, math.ceil(batch * 1100.0))
    kv = kv_cache_tokens(profile)
    assert decode_replica_tokens_per_second(profile, 1000, 200, 0.03, kv, 1024) == pytest.approx(expected)
    # a small KV cache caps the batch: 110,000 tokens / 1,100 = 100 sequences
    assert decode_replica_tokens_per_second(profile, 1000, 200, 0.03, 110_000, 1024) == pytest.approx(
        100 / profile.decode_step_seconds(100, 110_000)
    )
    # an ITL target under one sequence's step: the lowest-load point (a batch of one), as Dynamo's
    # find_best_throughput_per_gpu falls back to, not 0 (which left decode at min_endpoint)
    one = profile.decode_step_seconds(1, 1100)
    assert decode_batch_at_tpot(profile, one * 0.9, 1100.0) == 0
    assert decode_replica_tokens_per_second(profile, 1000, 200, one * 0.9, kv, 1024) == pytest.approx(1 / one)
    # a sequence longer than the KV cache: nothing
    assert decode_replica_tokens_per_second(profile, 1000, 200, 0.03, 1000, 1024) == 0.0


def _planner(
    interval: float = 180.0, predictor: str = "constant", budget: int | None = None, decode_ranks: int = 1
) -> PlannerPolicy:
    profile = load_profile(LLAMA_8B, "H100", 1)
    return PlannerPolicy(
        PlannerConfig(
            prefill_profile=profile,
            decode_profile=profile,
            ttft_seconds=1.0,
            itl_seconds=0.03,
            decode_kv_capacity_tokens=kv_cache_tokens(profile),
            adjustment_interval_seconds=interval,
            predictor=predictor,  # type: ignore[arg-type]
            max_gpu_budget=budget,
            decode_ranks=decode_ranks,
        ),
        window_seconds=60.0,
    )


def test_planner_sizes_pools_by_hand() -> None:
    planner = _planner()
    profile = planner.config.prefill_profile
    # 36,000 requests in 180 s = 200 req/s of 1000-token prompts and 200-token outputs
    sizes = planner.size(PlannerObservation(num_req=36_000, isl=1000, osl=200))
    p_rate = 1000 / profile.prefill_seconds(1000)  # ~42.6k tokens/s at batch 1
    d_rate = decode_replica_tokens_per_second(profile, 1000, 200, 0.03, kv_cache_tokens(profile), 1024)
    assert sizes == {"prefill": math.ceil(200_000 / p_rate), "decode": math.ceil(40_000 / d_rate)}
    assert sizes["prefill"] == 5  # 200,000 / 42,626
    # no load: one replica per pool (min_endpoint)
    assert planner.size(PlannerObservation(num_req=0, isl=1000, osl=200)) == {"prefill": 1, "decode": 1}


@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_planner_sizes_decode_in_groups_of_its_ranks(ranks: int) -> None:
    """Decode replicas of `ranks` data-parallel engines: the same demand over a group's throughput (ranks
    engines'); prefill as before."""
    profile = load_profile(LLAMA_8B, "H100", 1)
    d_rate = decode_replica_tokens_per_second(profile, 1000, 200, 0.03, kv_cache_tokens(profile), 1024)
    sizes = _planner(decode_ranks=ranks).size(PlannerObservation(num_req=36_000, isl=1000, osl=200))
    assert sizes == {"prefill": 5, "decode": math.ceil(40_000 / (ranks * d_rate))}


def test_planner_budget_counts_a_decode_groups_gpus() -> None:
    # 5 prefill + 1 decode group of 4 = 9 GPUs: within 9, over 8 (then prefill first, decode the rest)
    load = PlannerObservation(num_req=36_000, isl=1000, osl=200)
    assert _planner(budget=9, decode_ranks=4).size(load) == {"prefill": 5, "decode": 1}
    assert _planner(budget=8, decode_ranks=4).size(load) == {"prefill": round(5 * 8 / 9), "decode": 1}


def test_planner_refuses_a_group_of_no_rank() -> None:
    with pytest.raises(ValueError, match="at least one rank"):
        _planner(decode_ranks=0)


def test_planner_budget_scales_both_pools_prefill_first() -> None:
    planner = _planner(budget=6)
    want = _planner().size(PlannerObservation(num_req=36_000, isl=1000, osl=200))
    p, d = want["prefill"], want["decode"]
    assert p + d > 6
    sizes = planner.size(PlannerObservation(num_req=36_000, isl=1000, osl=200))
    expected_p = max(1, round(p * 6 / (p + d)))
    assert sizes == {"prefill": expected_p, "decode": max(1, 6 - expected_p)}


def _window(
    now: float,
    requests: float,
    isl: float,
    osl: float,
    arrived: float | None = None,
    arrived_isl: float = 0.0,
) -> Snapshot:
    rate = requests / 60.0
    arrivals = None if arrived is None else ArrivalSignals(arrived / 60.0, arrived_isl)
    return Snapshot(
        observed_at=now,
        window_seconds=60.0,
        sizes={"prefill": PoolSize(1, 1), "decode": PoolSize(1, 1)},
        pools={
            "prefill": PoolSignals(scraped_targets=1, request_rate=rate),
            "decode": PoolSignals(
                scraped_targets=1, request_rate=rate, mean_prompt_tokens=isl, mean_output_tokens=osl
            ),
        },
        paths={"disaggregated": PathSignals(request_rate=rate, within_slo_rate=rate)},
        arrivals=arrivals,
    )


def test_planner_acts_once_per_interval_on_the_interval_sums() -> None:
    planner = _planner(interval=180.0)
    assert planner.interval_seconds == 60.0
    assert planner.decide(_window(60.0, 12_000, 1000, 100), 60.0) == {}
    assert planner.decide(_window(120.0, 12_000, 1000, 300), 120.0) == {}
    sizes = planner.decide(_window(180.0, 12_000, 1000, 200), 180.0)
    # 36,000 requests, ISL 1000, OSL the request-weighted mean of 100, 300, 200 = 200
    assert planner.history == [PlannerObservation(36_000, 1000, 200)]
    assert sizes == planner.size(PlannerObservation(36_000, 1000, 200))
    assert planner.decide(_window(240.0, 0, 0, 0), 240.0) == {}


def test_planner_counts_arrivals_not_finished_requests() -> None:
    """An overloaded pool finishes what it can (its own capacity); the frontend sees what arrives: 60,000
    requests of 2000 tokens arrived while 30,000 of 1000 finished (with 200 output tokens each)."""
    planner = _planner(interval=60.0)
    sizes = planner.decide(_window(60.0, 30_000, 1000, 200, arrived=60_000, arrived_isl=2000), 60.0)
    assert planner.history == [PlannerObservation(60_000, 2000, 200)]
    assert sizes == planner.size(PlannerObservation(60_000, 2000, 200))
    finished_only = _planner(interval=60.0)
    assert finished_only.decide(_window(60.0, 30_000, 1000, 200), 60.0)["prefill"] < sizes["prefill"]
    assert finished_only.history == [PlannerObservation(30_000, 1000, 200)]


def test_planner_skips_an_interval_without_traffic() -> None:
    planner = _planner(interval=60.0)
    assert planner.decide(_window(60.0, 0, 0, 0), 60.0) == {}
    assert planner.history == []


def test_trend_planner_sizes_for_the_rising_load() -> None:
    constant, trend = _planner(interval=60.0), _planner(interval=60.0, predictor="trend")
    for i, n in enumerate([6_000, 9_000, 12_000], start=1):
        a = constant.decide(_window(60.0 * i, n, 1000, 200), 60.0 * i)
        b = trend.decide(_window(60.0 * i, n, 1000, 200), 60.0 * i)
    # constant predicts 12,000 (200 req/s); trend 15,000 (250 req/s)
    assert a == constant.size(PlannerObservation(12_000, 1000, 200))
    assert b == trend.size(PlannerObservation(15_000, 1000, 200))
    assert b["prefill"] > a["prefill"]


# --- static searches -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeOutcome:
    attainment: float
    ttft_attainment: float
    tpot_attainment: float


def _fake_pd(p_need: int, d_need: int, calls: list[StaticLayout]) -> Callable[[StaticLayout], FakeOutcome]:
    """A layout meets TTFT with p >= p_need (less: below 80%) and TPOT with d >= d_need; shares multiply."""

    def evaluate(layout: StaticLayout) -> FakeOutcome:
        calls.append(layout)
        ttft = 0.99 if layout.prefill >= p_need else 0.8 * layout.prefill / p_need
        tpot = 0.99 if layout.decode >= d_need else 0.8 * layout.decode / d_need
        return FakeOutcome(ttft * tpot, ttft, tpot)

    return evaluate


def test_static_pd_search_finds_the_fewest_gpus_in_few_simulations() -> None:
    calls: list[StaticLayout] = []
    # both pools at their need: 0.99 x 0.99 = 98% >= 95%
    result = search_static_pd(_fake_pd(5, 3, calls), budget_gpus=32)
    assert result.layout == StaticLayout(5, 3)
    assert result.gpus == 8
    assert result.simulations == len(set(calls)) <= 14


def test_static_pd_search_adds_to_the_pool_that_misses_more() -> None:
    # each pool alone reaches 96% at its need, but 0.96 x 0.96 < 95%: one more of either lifts it to 99%
    def evaluate(layout: StaticLayout) -> FakeOutcome:
        ttft = 0.96 if layout.prefill == 4 else (0.99 if layout.prefill > 4 else 0.5)
        tpot = 0.97 if layout.decode == 2 else (0.99 if layout.decode > 2 else 0.5)
        return FakeOutcome(ttft * tpot, ttft, tpot)

    result = search_static_pd(evaluate, budget_gpus=32)
    assert result.layout == StaticLayout(5, 2)  # prefill misses more (4%) than decode (3%)
    assert result.gpus == 7


def test_static_pd_search_grows_decode_when_its_shortage_shows_as_ttft_misses() -> None:
    # decode below 4 replicas delays KV pulls: requests miss TTFT, while every TPOT is fine
    def evaluate(layout: StaticLayout) -> FakeOutcome:
        short_decode = 0.3 + 0.1 * layout.decode
        ttft = short_decode if layout.decode < 4 else (0.99 if layout.prefill >= 3 else 0.5)
        return FakeOutcome(ttft, ttft, 1.0)

    result = search_static_pd(evaluate, budget_gpus=16)
    assert result.layout == StaticLayout(3, 4)
    assert result.gpus == 7


def test_static_pd_search_says_when_the_budget_is_not_enough() -> None:
    result = search_static_pd(_fake_pd(6, 5, []), budget_gpus=10)
    assert result.layout is None
    assert result.gpus is None
    assert "no P/D layout within 10 GPUs reaches 95%" in result.note
    # a pool that cannot reach the target at any size in the budget
    result = search_static_pd(_fake_pd(40, 2, []), budget_gpus=10)
    assert result.layout is None
    assert "prefill alone cannot" in result.note


def test_static_pd_search_counts_gpus_per_replica() -> None:
    result = search_static_pd(_fake_pd(2, 2, []), budget_gpus=16, gpus_per_prefill=2, gpus_per_decode=4)
    assert result.layout == StaticLayout(2, 2)
    assert result.gpus == 12


def test_static_colocated_search_bisects() -> None:
    calls: list[StaticLayout] = []

    def evaluate(layout: StaticLayout) -> FakeOutcome:
        calls.append(layout)
        share = 0.97 if layout.colocated >= 7 else 0.5
        return FakeOutcome(share, share, share)

    result = search_static_colocated(evaluate, budget_gpus=32)
    assert result.layout == StaticLayout(colocated=7)
    assert result.gpus == 7
    assert len(calls) <= 6  # log2(32) + 1
    none = search_static_colocated(evaluate, budget_gpus=6)
    assert none.layout is None
    assert "no colocated layout within 6 GPUs" in none.note


# --- tandem's decide() as a policy ----------------------------------------------------------------------


def test_tandem_policy_starts_from_the_operators_seed_and_carries_its_state() -> None:
    spec = autoscaled_spec(
        LLAMA_8B, ttft_ms=1000, tpot_ms=30, max_gpus=16, initial={"prefill": 3, "decode": 2}
    )
    policy = TandemPolicy(spec)
    assert policy.interval_seconds == 30.0
    # no data: every size holds, and the state is the operator's seed (spec sizes, first recommendation)
    missing = Snapshot(observed_at=0.0, window_seconds=0.0, missing=("no scrape window yet",))
    assert policy.decide(missing, 0.0) == {}
    assert policy.held == 1
    assert policy.state.pools.prefill.desired_replicas == 3
    assert policy.state.pools.decode.desired_replicas == 2
    assert [r.replicas for r in policy.state.pools.prefill.recommendations] == [3, 3]
    # no traffic is data: the pools would go to minReplicas, but not before the 600-s window (default)
    window = spec.autoscaling.scale_down.stabilization_seconds
    assert window == 600
    idle = _snapshot(30.0, (3, 0.0), (2, 0.0))
    assert policy.decide(idle, 30.0) == {"prefill": 3, "decode": 2}
    assert policy.decisions == []
    for t in range(60, window, 30):
        policy.decide(_snapshot(float(t), (3, 0.0), (2, 0.0)), float(t))
    assert policy.decisions == []
    sizes = policy.decide(_snapshot(window + 30.0, (3, 0.0), (2, 0.0)), window + 30.0)
    assert sizes["prefill"] < 3  # the scale-down step (1 by default) once the window has passed
    assert policy.decisions[-1].role in ("prefill", "decode")
    assert policy.decisions[0].time == window + 30.0


def test_autoscaled_spec_is_valid_for_both_modes() -> None:
    spec = autoscaled_spec(LLAMA_8B, ttft_ms=500, tpot_ms=20, max_gpus=8, initial={"colocated": 2})
    assert spec.serving.mode == "Colocated"
    assert spec.colocated.autoscaling is not None
    assert spec.colocated.autoscaling.max_replicas == 8
    assert spec.max_gpus == 8


@pytest.mark.parametrize("answer", [1, 2, 3, 5, 8, 13, 20, 31, 32])
@pytest.mark.parametrize("guess", [1, 4, 9, 16, 40])
def test_search_near_a_guess_finds_the_same_smallest(answer: int, guess: int) -> None:
    from tandem.sim.baselines import _smallest, _smallest_near

    calls: list[int] = []

    def ok(n: int) -> bool:
        calls.append(n)
        return n >= answer

    assert _smallest_near(guess, 1, 32, ok) == answer == _smallest(1, 32, lambda n: n >= answer)
    assert len(set(calls)) <= 2 + 2 * math.ceil(math.log2(abs(answer - guess) + 1)) + 1
    assert _smallest_near(guess, 1, 32, lambda n: False) is None


def test_static_pd_search_from_a_good_guess_needs_fewer_simulations() -> None:
    blind: list[StaticLayout] = []
    guided: list[StaticLayout] = []
    a = search_static_pd(_fake_pd(5, 3, blind), budget_gpus=48)
    b = search_static_pd(_fake_pd(5, 3, guided), budget_gpus=48, guess=(5, 3))
    assert a.layout == b.layout == StaticLayout(5, 3)
    assert len(set(guided)) < len(set(blind))
    assert max(layout.prefill for layout in guided) <= 12  # no 47-replica probes
    c = search_static_colocated(
        lambda layout: FakeOutcome(*(3 * [0.99 if layout.colocated >= 7 else 0.5])), 32, guess=6
    )
    assert c.layout == StaticLayout(colocated=7)
    assert c.simulations <= 3


def test_peak_size_is_the_planners_arithmetic_on_the_busiest_window() -> None:
    from tandem.sim.baselines import peak_size
    from tandem.sim.requests import Request

    planner = _planner(interval=60.0)
    quiet = [Request(float(t), 1000, 200) for t in range(60)]  # 1 req/s in the first minute
    busy = [Request(60.0 + i / 200, 1000, 200) for i in range(12_000)]  # 200 req/s in the second
    size = peak_size(planner.config, quiet + busy)
    assert size == planner.size(PlannerObservation(12_000, 1000, 200))
    assert peak_size(planner.config, quiet) == planner.size(PlannerObservation(60, 1000, 200))


# --- the planner's tightness -----------------------------------------------------------------------------


def _config(tightness: float = 1.0, **kwargs: object) -> PlannerConfig:
    profile = load_profile(LLAMA_8B, "H100", 1)
    return PlannerConfig(
        prefill_profile=profile,
        decode_profile=profile,
        ttft_seconds=1.0,
        itl_seconds=0.03,
        decode_kv_capacity_tokens=kv_cache_tokens(profile),
        tightness=tightness,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("tightness", [0.0, -0.5, 1.01, math.nan, math.inf])
def test_a_tightness_outside_zero_to_one_is_refused(tightness: float) -> None:
    with pytest.raises(ValueError, match="tightness"):
        _config(tightness)


@pytest.mark.parametrize(
    ("tightness", "ttft", "itl"),
    [(1.0, 1.0, 0.03), (0.5, 0.5, 0.015), (0.25, 0.25, 0.0075)],
)
def test_tightness_scales_the_targets_not_the_slo(tightness: float, ttft: float, itl: float) -> None:
    config = _config(tightness)
    assert (config.ttft_seconds, config.itl_seconds) == (1.0, 0.03)  # what requests are scored on
    assert config.ttft_target_seconds == pytest.approx(ttft)
    assert config.itl_target_seconds == pytest.approx(itl)


def test_a_tighter_planner_sizes_decode_at_the_tighter_itl() -> None:
    load = PlannerObservation(num_req=36_000, isl=1000, osl=200)
    profile = load_profile(LLAMA_8B, "H100", 1)
    kv = kv_cache_tokens(profile)
    sizes = {}
    for tightness in (1.0, 0.6, 0.3):
        sizes[tightness] = PlannerPolicy(_config(tightness)).size(load)
        d_rate = decode_replica_tokens_per_second(profile, 1000, 200, 0.03 * tightness, kv, 1024)
        assert sizes[tightness]["decode"] == math.ceil(36_000 * 200 / 180 / d_rate)
    assert sizes[1.0]["decode"] <= sizes[0.6]["decode"] < sizes[0.3]["decode"]
    # prefill at batch 1 is ISL / TTFT alone (23 ms for 1000 tokens): any target above it gives the same
    # throughput per replica, so tightening the TTFT target does not change prefill (Dynamo's profile)
    assert sizes[1.0]["prefill"] == sizes[0.6]["prefill"] == sizes[0.3]["prefill"]
    # ...until one prompt alone misses it: 32k tokens alone take 1.43 s, over 0.6 x 1 s: the latency floor
    long = PlannerObservation(num_req=1800, isl=32768, osl=200)
    assert (
        PlannerPolicy(_config(0.6)).size(long)["prefill"] > PlannerPolicy(_config(1.0)).size(long)["prefill"]
    )


# --- Dynamo's load-based loop ---------------------------------------------------------------------------


def test_prefill_tokens_at_ttft_is_the_most_that_fit() -> None:
    profile = load_profile(LLAMA_8B, "H100", 1)
    for isl, ttft in [(1000, 1.0), (1000, 0.5), (4000, 1.0), (300, 0.2)]:
        x = prefill_tokens_at_ttft(profile, isl, ttft)
        assert (
            prefill_seconds_for_tokens(profile, x, isl)
            <= ttft
            < prefill_seconds_for_tokens(profile, x + 1, isl)
        )
    # one 8192-token step (179.6 ms of linear ops) plus 8.2 prompts' attention (0.66 ms each) fits 0.2 s
    assert prefill_seconds_for_tokens(profile, 8192, 1000) == pytest.approx(0.1795856 + 8.192 * 0.00066)
    assert prefill_tokens_at_ttft(profile, 1000, 0.001) == 0  # under one step's floor: nothing fits


def test_decode_tokens_at_itl_is_the_batch_at_the_target_times_the_context() -> None:
    profile = load_profile(LLAMA_8B, "H100", 1)
    assert (
        decode_tokens_at_itl(profile, 1100.0, 0.03, 1024)
        == decode_batch_at_tpot(profile, 0.03, 1100.0) * 1100.0
    )
    assert decode_tokens_at_itl(profile, 1100.0, 0.005, 1024) == 0  # under the 6.7-ms step: unreachable


def _load_planner(
    tightness: float = 1.0,
    budget: int | None = None,
    throughput: PlannerConfig | None = None,
    decode_ranks: int = 1,
) -> LoadPlannerPolicy:
    profile = load_profile(LLAMA_8B, "H100", 1)
    return LoadPlannerPolicy(
        LoadPlannerConfig(
            prefill_profile=profile,
            decode_profile=profile,
            ttft_seconds=1.0,
            itl_seconds=0.03,
            decode_kv_capacity_tokens=kv_cache_tokens(profile),
            tightness=tightness,
            max_gpu_budget=budget,
            throughput=throughput,
            decode_ranks=decode_ranks,
        )
    )


def _load_snapshot(
    prefill: tuple[int, int, int, float],
    decode: tuple[int, int, int, float, float],
    isl: float = 1000.0,
    osl: float = 200.0,
    now: float = 5.0,
    arrived: float = 0.0,
) -> Snapshot:
    """prefill: (replicas, ready, scraped pods, queued prompt tokens in total); decode: (replicas, ready,
    scraped pods, mean KV usage, waiting requests in total); isl/osl: the window's finished requests'."""
    return Snapshot(
        observed_at=now,
        window_seconds=60.0,
        sizes={"prefill": PoolSize(prefill[0], prefill[1]), "decode": PoolSize(decode[0], decode[1])},
        pools={
            "prefill": PoolSignals(
                scraped_targets=prefill[2], queued_prompt_tokens=prefill[3], mean_prompt_tokens=isl
            ),
            "decode": PoolSignals(
                scraped_targets=decode[2],
                kv_usage_mean=decode[3],
                waiting_requests=decode[4],
                mean_prompt_tokens=isl,
                mean_output_tokens=osl,
                request_rate=arrived / 60.0,
            ),
        },
        paths={"disaggregated": PathSignals(request_rate=1.0, within_slo_rate=1.0)},
        arrivals=ArrivalSignals(arrived / 60.0, isl),
    )


def _targets(tightness: float = 1.0) -> tuple[float, float]:
    """(prefill target active tokens per replica, decode target KV tokens per replica) at ISL 1000/OSL 200."""
    profile = load_profile(LLAMA_8B, "H100", 1)
    prefill = prefill_tokens_at_ttft(profile, 1000, 1.0 * tightness) - 1000
    decode = decode_tokens_at_itl(profile, 1100.0, 0.03 * tightness, 1024)
    return prefill, decode


KV = kv_cache_tokens(load_profile(LLAMA_8B, "H100", 1))
P_TARGET, D_TARGET = _targets()


@pytest.mark.parametrize(
    ("name", "prefill", "decode", "expected"),
    [
        # 3 prefill replicas over the target each: +1; decode in the hold band: kept
        ("prefill over", (3, 3, 3, 3 * (P_TARGET + 1)), (2, 2, 2, 0.6 * D_TARGET / KV, 0), {"prefill": 4}),
        # under target x (N-1)/N x 0.8 = x 0.533 at N=3: -1
        ("prefill under", (3, 3, 3, 3 * 0.5 * P_TARGET), (2, 2, 2, 0.6 * D_TARGET / KV, 0), {"prefill": 2}),
        ("prefill in band", (3, 3, 3, 3 * 0.6 * P_TARGET), (2, 2, 2, 0.6 * D_TARGET / KV, 0), {}),
        # one replica never goes (min_endpoint)
        ("prefill at one", (1, 1, 1, 0.0), (2, 2, 2, 0.6 * D_TARGET / KV, 0), {}),
        # a replica still loading: the pool waits (Dynamo scales blocking)
        ("prefill starting", (4, 3, 3, 4 * 2 * P_TARGET), (2, 2, 2, 0.6 * D_TARGET / KV, 0), {}),
        # a draining replica still reports: counts differ, the tick is skipped
        ("prefill mismatch", (3, 3, 4, 3 * 2 * P_TARGET), (2, 2, 2, 0.6 * D_TARGET / KV, 0), {}),
        # decode: KV in use over the target: +1
        ("decode over", (2, 2, 2, 2 * 0.6 * P_TARGET), (2, 2, 2, (D_TARGET + 1100) / KV, 0), {"decode": 3}),
        # waiting requests count at ISL each: 0.9 of target in KV + 200 waiting x 1000 / 2 replicas
        (
            "decode waiting",
            (2, 2, 2, 2 * 0.6 * P_TARGET),
            (2, 2, 2, 0.9 * D_TARGET / KV, 200),
            {"decode": 3} if 0.9 * D_TARGET + 100_000 > D_TARGET else {},
        ),
        # under x_sla x 1/2 x 0.8 at N=2: -1
        ("decode under", (2, 2, 2, 2 * 0.6 * P_TARGET), (2, 2, 2, 0.3 * D_TARGET / KV, 0), {"decode": 1}),
        (
            "both over",
            (2, 2, 2, 2 * 2 * P_TARGET),
            (2, 2, 2, 1.1 * D_TARGET / KV, 0),
            {"prefill": 3, "decode": 3},
        ),
    ],
)
def test_load_planner_steps_one_replica_on_its_thresholds(
    name: str,
    prefill: tuple[int, int, int, float],
    decode: tuple[int, int, int, float, float],
    expected: dict[str, int],
) -> None:
    planner = _load_planner()
    assert planner.interval_seconds == 5.0
    assert planner.decide(_load_snapshot(prefill, decode), 5.0) == expected, name


# 2 decode groups, KV at 0.9 of the per-engine target, and waiting requests that push one engine over it
# when 2 engines share them (x 1000 / 2) but not when 8 do (2 groups of 4 ranks: x 1000 / 8)
WAITING = 0.1 * D_TARGET / 250
QUIET_PREFILL = (2, 2, 2, 2 * 0.6 * P_TARGET)


@pytest.mark.parametrize(
    ("name", "ranks", "decode", "budget", "expected"),
    [
        ("waiting over 8 engines", 4, (2, 2, 2, 0.9 * D_TARGET / KV, WAITING), None, {}),
        ("the same over 2 engines", 1, (2, 2, 2, 0.9 * D_TARGET / KV, WAITING), None, {"decode": 3}),
        ("over per engine: one group more", 4, (2, 2, 2, (D_TARGET + 1100) / KV, 0), None, {"decode": 3}),
        ("under: one group less", 4, (2, 2, 2, 0.3 * D_TARGET / KV, 0), None, {"decode": 1}),
        # 2 prefill GPUs + 3 groups of 4 = 14 > 10: the growth is cut; single engines: 5 GPUs fit
        ("a group's GPUs against the budget", 4, (2, 2, 2, 1.1 * D_TARGET / KV, 0), 10, {"decode": 2}),
        ("single engines within it", 1, (2, 2, 2, 1.1 * D_TARGET / KV, 0), 10, {"decode": 3}),
    ],
)
def test_load_planner_steps_decode_groups_on_per_engine_thresholds(
    name: str,
    ranks: int,
    decode: tuple[int, int, int, float, float],
    budget: int | None,
    expected: dict[str, int],
) -> None:
    planner = _load_planner(budget=budget, decode_ranks=ranks)
    assert planner.gpus_per_replica == {"prefill": 1, "decode": ranks}
    assert planner.decide(_load_snapshot(QUIET_PREFILL, decode), 5.0) == expected, name


def test_load_planner_tightness_lowers_its_thresholds() -> None:
    tight_p, tight_d = _targets(0.5)
    assert tight_p < P_TARGET
    assert tight_d < D_TARGET
    between = ((2, 2, 2, 2 * (tight_p + P_TARGET) / 2), (2, 2, 2, (tight_d + D_TARGET) / 2 / KV, 0))
    assert _load_planner(1.0).decide(_load_snapshot(*between), 5.0) == {}
    assert _load_planner(0.5).decide(_load_snapshot(*between), 5.0) == {"prefill": 3, "decode": 3}


def test_load_planner_holds_without_lengths_or_data() -> None:
    planner = _load_planner()
    busy = ((2, 2, 2, 4 * P_TARGET), (2, 2, 2, 0.9, 0))
    assert planner.decide(_load_snapshot(*busy, isl=0.0), 5.0) == {}
    missing = Snapshot(observed_at=5.0, window_seconds=0.0, missing=("no scrape window yet",))
    assert planner.decide(missing, 5.0) == {}


def test_load_planner_caps_growth_at_the_budget() -> None:
    planner = _load_planner(budget=4)
    assert planner.decide(_load_snapshot((2, 2, 2, 4 * P_TARGET), (2, 2, 2, 1.0, 0)), 5.0) == {
        "prefill": 2,
        "decode": 2,
    }


def test_load_planner_with_throughput_floor() -> None:
    """The throughput planner reads one snapshot per window (60 s) and acts every 180 s; its sizes then
    floor every load-based proposal (Dynamo with both modes on), and only proposals: a hold stays."""
    planner = _load_planner(throughput=_config(adjustment_interval_seconds=180.0))
    quiet = ((3, 3, 3, 0.0), (3, 3, 3, 0.0, 0))
    for now in range(5, 180, 5):
        planner.decide(_load_snapshot(*quiet, now=float(now), arrived=12_000), float(now))
    assert planner.floors == {}
    assert planner.throughput is not None
    assert planner.throughput.history == []
    # at 180 s the throughput planner has three windows of 12,000 arrivals: 200 req/s, 5 prefill replicas
    floor = planner.throughput.size(PlannerObservation(36_000, 1000, 200))
    got = planner.decide(_load_snapshot(*quiet, now=180.0, arrived=12_000), 180.0)
    assert len(planner.throughput.history) == 1
    assert planner.floors == floor
    assert floor["prefill"] == 5
    # the load loop proposed 3 -> 2 for both pools; the floor lifts each proposal
    assert got == {role: n for role, n in floor.items() if n != 3}


def test_load_planner_floors_are_the_throughput_planners_sizes_before_the_budget() -> None:
    """Dynamo publishes the unbudgeted throughput sizes as lower bounds; the budget is the load loop's,
    applied to growth after the floor. A floor squeezed by the throughput planner's own budget fit would
    give prefill its share of a decode ask beyond the budget."""
    budget = 6
    throughput = _config(adjustment_interval_seconds=180.0, max_gpu_budget=budget)
    planner = _load_planner(budget=budget, throughput=throughput)
    quiet = ((3, 3, 3, 0.0), (3, 3, 3, 0.0, 0))
    for now in range(5, 180, 5):
        planner.decide(_load_snapshot(*quiet, now=float(now), arrived=12_000), float(now))
    got = planner.decide(_load_snapshot(*quiet, now=180.0, arrived=12_000), 180.0)
    load = PlannerObservation(36_000, 1000, 200)
    unbudgeted = PlannerPolicy(replace(throughput, max_gpu_budget=None)).size(load)
    squeezed = PlannerPolicy(throughput).size(load)
    assert unbudgeted["prefill"] + unbudgeted["decode"] > budget  # the budget binds here
    assert squeezed["prefill"] < unbudgeted["prefill"]  # and would have squeezed the floor
    assert planner.floors == unbudgeted
    # the proposals (3 -> 2 each) lifted to the floors, then the growth cut to the 6 GPUs
    assert sum({"prefill": 3, "decode": 3, **got}.values()) <= budget
