"""Prometheus-like windows: histogram_quantile as PromQL does it, increases over a window, the Snapshot."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest

from tandem.autoscale.attribution import Floors, attribute_ttft
from tandem.router.metrics import ITL_BUCKETS, TTFT_BUCKETS
from tandem.routing.disaggregation import DisaggregationKnobs
from tandem.signals import PoolSignals, TtftBreakdown
from tandem.sim import PoolSpec, Request, StaticPolicy, simulate
from tandem.sim.layout import Layout, Role
from tandem.sim.windows import PoolGauges, Windows, histogram_quantile

if TYPE_CHECKING:
    from conftest import SimKit

BOUNDS = (1.0, 2.0, 4.0)


@pytest.mark.parametrize(
    ("q", "counts", "expected"),
    [
        (0.5, [0, 10, 0, 0], 1.5),  # interpolated inside (1, 2]
        (0.9, [10, 0, 0, 0], 0.9),  # the first bucket starts at 0
        (0.5, [2, 2, 4, 2], 2.5),  # rank 5: one of the four in (2, 4]
        (0.9, [2, 2, 4, 2], 4.0),  # rank 9 is in +Inf: the highest finite bound
        (1.0, [0, 0, 0, 5], 4.0),
        (-0.1, [1, 0, 0, 0], -math.inf),
        (1.1, [1, 0, 0, 0], math.inf),
    ],
)
def test_histogram_quantile_as_promql(q: float, counts: list[int], expected: float) -> None:
    assert histogram_quantile(q, BOUNDS, counts) == pytest.approx(expected)


def test_histogram_quantile_without_observations_is_nan() -> None:
    assert math.isnan(histogram_quantile(0.9, BOUNDS, [0, 0, 0, 0]))


def gauges(running: int) -> dict[Role, PoolGauges]:
    return {"colocated": PoolGauges(1, 0, 0, running, 0, 0, 0.0, 0.0, 1, 1)}


def test_a_window_is_the_increase_since_the_sample_one_window_back() -> None:
    windows = Windows(window_seconds=60.0)
    for t in range(0, 91, 15):
        windows.totals.arrivals = t * 2  # 2 requests/s
        windows.totals.observe_latency(0, 0.3, 0.02)
        windows.scrape(float(t), gauges(running=t))
    view = windows.view(90.0)
    assert view.seconds == 60.0
    assert view.increase.arrivals == 120
    assert view.rate(view.increase.arrivals) == 2.0
    assert sum(view.increase.ttft[0]) == 4  # observed at 45, 60, 75, 90: after the 30 s sample
    assert view.gauges["colocated"].running == 90
    assert {0.25, 0.5} <= set(TTFT_BUCKETS)
    assert 0.25 < view.ttft_quantile(0.9) <= 0.5  # all observations 0.3 s: in the bucket (0.25, 0.5]
    assert {0.01, 0.025} <= set(ITL_BUCKETS)
    assert 0.01 < view.tpot_quantile(0.5, path=0) <= 0.025


def test_a_window_shorter_than_its_length_at_the_start() -> None:
    windows = Windows(window_seconds=60.0)
    windows.scrape(0.0, {})
    windows.totals.arrivals = 30
    windows.scrape(15.0, {})
    view = windows.view(15.0)
    assert (view.seconds, view.increase.arrivals) == (15.0, 30)


def test_the_policy_sees_a_snapshot_of_the_window(kit: SimKit) -> None:
    requests = [Request(0.1 * i, 200, 30) for i in range(1200)]  # 10 requests/s for two minutes
    policy = StaticPolicy(interval_seconds=30.0, keep_snapshots=True)
    result = simulate(requests, kit.pd(prefill=1, decode=2), kit.config(), policy)
    assert [s.observed_at for s in policy.seen[:4]] == [30.0, 60.0, 90.0, 120.0]
    snapshot = policy.seen[2]  # at 90 s: the window 30..90 s
    assert snapshot.window_seconds == 60.0
    assert snapshot.has_data
    assert snapshot.sizes["prefill"].replicas == 1
    assert snapshot.sizes["decode"].ready == 2
    path = snapshot.paths["disaggregated"]
    assert path.request_rate == pytest.approx(10.0, rel=0.05)
    assert path.attainment == 1.0
    assert path.ttft_seconds is not None
    assert path.ttft_seconds < 0.1
    assert path.tpot_seconds is not None
    assert path.tpot_seconds < 0.025
    assert "colocated" not in snapshot.paths
    prefill, decode = snapshot.pools["prefill"], snapshot.pools["decode"]
    assert prefill.request_rate == pytest.approx(10.0, rel=0.05)
    assert prefill.mean_prompt_tokens == 200.0
    assert decode.mean_output_tokens == 30.0
    assert decode.generation_tokens_rate == pytest.approx(300.0, rel=0.05)
    assert decode.prompt_tokens_rate == pytest.approx(2000.0, rel=0.05)
    assert 0.0 < decode.kv_usage_mean < 0.01
    assert decode.scraped_targets == 2
    assert result.summary.attainment == 1.0


def _parts_at_90s(kit: SimKit, requests: list[Request], layout: Layout) -> TtftBreakdown:
    policy = StaticPolicy(interval_seconds=30.0, keep_snapshots=True)
    simulate(requests, layout, kit.config(), policy)
    parts = policy.seen[2].paths["disaggregated"].ttft_breakdown  # the window 30..90 s
    assert parts is not None
    return parts


def test_the_snapshot_splits_the_pd_ttft_into_its_parts(kit: SimKit) -> None:
    """The window's mean TTFT is its parts' sum (the simulated router never queues); an idle pool's
    parts are the floors, a saturated prefill's is its queue, a slow link's the KV read."""
    floors = Floors(prefill_compute=0.05, kv_transfer=0.002, decode_step=0.01)
    light = [Request(0.1 * i, 2000, 30) for i in range(1200)]  # 10 requests/s of 2k-token prompts
    parts = _parts_at_90s(kit, light, kit.pd(prefill=2, decode=2))
    assert parts.router_queue == pytest.approx(0.0, abs=1e-9)
    assert parts.prefill_leg + parts.decode_first_token == pytest.approx(parts.ttft)
    assert parts.prefill_queue is not None
    assert parts.kv_transfer is not None
    assert 0 <= parts.prefill_queue < parts.prefill_leg
    # 2k tokens x 128 KiB over 400 Gb/s: 5.4 ms a read
    assert parts.kv_transfer == pytest.approx(2000 * 131072 * 8 / 400e9, rel=0.01)

    heavy = [Request(0.02 * i, 2000, 30) for i in range(6000)]  # 50 requests/s: 100k prompt tokens/s
    parts = _parts_at_90s(kit, heavy, kit.pd(prefill=1, decode=2))
    assert parts.prefill_queue is not None
    assert parts.prefill_queue > 0.5 * parts.ttft
    attribution = attribute_ttft(parts, floors, decode_full=False, prefill_queued=True)
    assert (attribution.cause, attribution.charged) == ("prefillQueue", "prefill")

    slow = kit.pd(kit.spec(bandwidth=1.0), prefill=2, decode=2)  # 1 Gb/s: a 2k-token read takes 2.1 s
    parts = _parts_at_90s(kit, light, slow)
    assert parts.kv_transfer is not None
    assert parts.kv_transfer > 0.5 * parts.ttft
    attribution = attribute_ttft(parts, floors, decode_full=False, prefill_queued=False)
    assert (attribution.cause, attribution.charged) == ("kvTransfer", None)


@pytest.mark.parametrize(("threshold", "share"), [(100, 0.5), (4000, 1.0)])
def test_local_prefills_are_in_the_breakdown_as_decode_legs(
    kit: SimKit, threshold: int, share: float
) -> None:
    """Threshold 100 (4,000) over prompts of 50 and 2,000 tokens in turn: half (all) the requests are
    prefilled on their decode replica, with no prefill leg and no read; their TTFT is all decode leg.
    The parts still add up to the mean TTFT, the prefill leg and the read weighed by the remote share;
    with every request local, a miss is decode's."""
    requests = [Request(0.1 * i, 50 if i % 2 else 2000, 30) for i in range(1200)]
    knobs = DisaggregationKnobs(mode="Threshold", threshold_tokens=threshold)
    policy = StaticPolicy(interval_seconds=30.0, keep_snapshots=True)
    config = kit.config().model_copy(update={"disaggregation": knobs})
    simulate(requests, kit.pd(prefill=2, decode=2), config, policy)
    parts = policy.seen[2].paths["disaggregated"].ttft_breakdown
    assert parts is not None
    assert parts.local_share == pytest.approx(share, abs=0.02)
    assert parts.router_queue == pytest.approx(0.0, abs=1e-9)
    assert parts.remote_share * parts.prefill_leg + parts.decode_first_token == pytest.approx(parts.ttft)
    if share < 1:  # the remote ones' means: 2k-token prompts, 5.4 ms reads at 400 Gb/s
        assert parts.kv_transfer == pytest.approx(2000 * 131072 * 8 / 400e9, rel=0.01)
    else:
        assert parts.prefill_leg == 0.0
        floors = Floors(prefill_compute=0.05, kv_transfer=0.002, decode_step=0.001)
        attribution = attribute_ttft(parts, floors, decode_full=False, prefill_queued=False)
        assert (attribution.cause, attribution.charged) == ("decodeWait", "decode")


def test_the_time_series_follows_the_load(kit: SimKit) -> None:
    requests = [Request(0.05 * i, 100, 10) for i in range(2400)] + [
        Request(120 + 0.5 * i, 100, 10) for i in range(240)
    ]
    result = simulate(requests, kit.colocated(replicas=2), kit.config())
    by_time = {round(s.time): s for s in result.series}
    assert by_time[60].arrival_rate == pytest.approx(20.0, rel=0.02)
    assert by_time[225].arrival_rate == pytest.approx(2.0, rel=0.02)
    assert by_time[60].gpus == 2
    assert by_time[60].ttft_p90 < 0.1
    assert math.isnan(by_time[0].ttft_p90)


def test_the_snapshot_carries_prompt_spread_arrivals_and_the_queue_a_window_back(kit: SimKit) -> None:
    """Prompts alternate 100 and 900 tokens (E[n] 500, E[n^2] 410,000: 1.64 E[n]^2), 10 requests/s. The
    histogram has vLLM's buckets, (50, 100] and (500, 1000]; uniform within each, the bucketed E[n] is
    (75 + 750) / 2 = 412.5 and E[n^2] ((50^2 + 50*100 + 100^2) / 3 + (500^2 + 500*1000 + 1000^2) / 3) / 2
    = 294,583.3, a ratio of 1.731 (the exact 1.64 is within 6%), times the exact 500^2: 432,813."""
    requests = [Request(0.1 * i, 100 if i % 2 else 900, 30) for i in range(1200)]
    policy = StaticPolicy(interval_seconds=30.0, keep_snapshots=True)
    simulate(requests, kit.pd(prefill=1, decode=2), kit.config(), policy)
    snapshot = policy.seen[2]  # at 90 s: the window 30..90 s
    prefill = snapshot.pools["prefill"]
    assert prefill.mean_prompt_tokens == pytest.approx(500.0, rel=0.01)
    expected = (((50**2 + 50 * 100 + 100**2) / 3 + (500**2 + 500 * 1000 + 1000**2) / 3) / 2) / 412.5**2
    assert expected == pytest.approx(1.731, abs=1e-3)
    assert prefill.prompt_tokens_second_moment == pytest.approx(
        expected * prefill.mean_prompt_tokens**2, rel=1e-9
    )
    assert snapshot.arrivals is not None
    assert snapshot.arrivals.request_rate == pytest.approx(10.0, rel=0.01)
    assert snapshot.arrivals.mean_prompt_tokens == pytest.approx(500.0, rel=0.01)
    assert prefill.queued_prompt_tokens_before is not None  # the 30-s scrape's gauge
    assert prefill.queued_prompt_tokens_before >= 0


def test_arrivals_are_counted_before_service() -> None:
    """A window counts the requests that arrived in it, served or not (the planner baseline's signal)."""
    windows = Windows(window_seconds=60.0)
    windows.scrape(0.0, {})
    windows.totals.arrivals, windows.totals.arrival_prompt = 120, 120 * 300
    windows.scrape(60.0, {})
    view = windows.view(60.0)
    assert view.rate(view.increase.arrivals) == 2.0
    assert view.increase.arrival_prompt / view.increase.arrivals == 300.0
    assert view.gauges_before == {}


def test_the_snapshot_carries_output_spread_and_preemptions(kit: SimKit) -> None:
    """Outputs alternate 100 and 900 tokens: decode's second moment comes from vLLM's
    vllm:request_generation_tokens buckets as the prompts' does (the same ratio, 1.731, as above). A
    decode replica whose KV cache holds 20k tokens, with ~50 sequences each growing to 1k, preempts;
    one holding 450k does not."""

    def decode_at_90s(cap: int) -> PoolSignals:
        requests = [Request(0.1 * i, 100, 100 if i % 2 else 900) for i in range(1200)]
        policy = StaticPolicy(interval_seconds=30.0, keep_snapshots=True)
        layout = Layout(
            pools={
                "prefill": PoolSpec(replica=kit.spec(), replicas=1),
                "decode": PoolSpec(replica=kit.spec(cap=cap), replicas=1),
            },
            model_load_seconds=120.0,
        )
        simulate(requests, layout, kit.config(), policy)
        return policy.seen[2].pools["decode"]  # the window 30..90 s

    roomy = decode_at_90s(450_000)
    assert roomy.mean_output_tokens == pytest.approx(500.0, rel=0.01)
    expected = (((50**2 + 50 * 100 + 100**2) / 3 + (500**2 + 500 * 1000 + 1000**2) / 3) / 2) / 412.5**2
    assert roomy.output_tokens_second_moment == pytest.approx(
        expected * roomy.mean_output_tokens**2, rel=0.02
    )
    assert roomy.preemptions_rate == 0.0
    tight = decode_at_90s(20_000)
    assert tight.preemptions_rate > 0.1
    assert tight.kv_usage_max > 0.9
