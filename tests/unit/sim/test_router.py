"""The router as the simulator models it: power-of-two choices, the gray split, fallbacks; policy effects."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tandem.sim import Layout, PoolSpec, Request, ScheduledPolicy, StaticPolicy, simulate
from tandem.sim.cluster import Cluster

if TYPE_CHECKING:
    from conftest import SimKit


def test_the_lighter_of_two_pods_wins(kit: SimKit) -> None:
    cluster = Cluster([Request(0.0, 1, 1)], kit.colocated(replicas=3), kit.config(), None)
    pods = cluster.ready["colocated"]
    pods[0].load_requests, pods[1].load_requests, pods[2].load_requests = 5, 1, 3
    picks = [cluster._pick(pods) for _ in range(600)]
    assert pods[0] not in picks  # the heaviest loses every pair it is drawn in
    assert picks.count(pods[1]) == pytest.approx(400, abs=60)  # it wins the 2 of 3 pairs it is in
    pods[1].load_tokens = 512 * 10  # ten requests' worth of tokens: now the heaviest
    assert pods[1] not in [cluster._pick(pods) for _ in range(300)]


@pytest.mark.parametrize("percent", [0, 30, 100])
def test_the_gray_split_sends_its_share_to_pd(kit: SimKit, percent: int) -> None:
    pools = {role: PoolSpec(replica=kit.spec(), replicas=1) for role in ("prefill", "decode", "colocated")}
    layout = Layout(pools=pools, disaggregated_percent=percent)
    requests = [Request(0.05 * i, 50, 5) for i in range(2000)]
    records = simulate(requests, layout, kit.config()).records
    share = sum(1 for i in range(len(records)) if records[i].path == "disaggregated") / len(records)
    assert share == pytest.approx(percent / 100, abs=0.04)


def test_pd_without_a_ready_prefill_pod_falls_back_to_colocated(kit: SimKit) -> None:
    pools = {
        "prefill": PoolSpec(replica=kit.spec(), replicas=0),
        "decode": PoolSpec(replica=kit.spec(), replicas=1),
        "colocated": PoolSpec(replica=kit.spec(), replicas=1),
    }
    for fallback, path in ((True, "colocated"), (False, None)):
        layout = Layout(pools=pools, disaggregated_percent=100, colocated_fallback=fallback)
        assert simulate([Request(0.0, 50, 5)], layout, kit.config()).records[0].path == path


def test_a_decode_pool_scaled_to_zero_refuses_after_prefill(kit: SimKit) -> None:
    requests = [Request(0.0, 50, 5), Request(20.0, 50, 5)]
    policy = ScheduledPolicy(steps=[(15.0, {"decode": 0})], interval_seconds=15.0)
    result = simulate(requests, kit.pd(), kit.config(), policy)
    assert [result.records[i].path for i in range(2)] == ["disaggregated", None]


def test_a_policy_sizing_an_unknown_pool_is_an_error(kit: SimKit) -> None:
    with pytest.raises(ValueError, match="'colocated', which the layout does not have"):
        simulate(
            [Request(0.0, 1, 1), Request(40.0, 1, 1)],
            kit.pd(),
            kit.config(),
            StaticPolicy({"colocated": 1}, 15.0),
        )


def test_scale_up_then_down_counts_actions_and_peak(kit: SimKit) -> None:
    requests = [Request(float(t), 20, 5) for t in range(300)]
    steps = [(15.0, {"colocated": 3}), (200.0, {"colocated": 1})]
    result = simulate(requests, kit.colocated(load=60.0), kit.config(), ScheduledPolicy(steps=steps))
    assert result.summary.scale_actions == 2
    assert result.summary.peak_gpus == 3
    by_time = {round(s.time): s for s in result.series}
    assert by_time[60].ready["colocated"] == 1
    assert by_time[90].ready["colocated"] == 3
    assert by_time[240].replicas["colocated"] == 1  # the two newest drained (idle: at once)
    end = result.summary.duration_seconds
    assert result.summary.gpu_hours == pytest.approx((end + 2 * (210.0 - 15.0)) / 3600)


def test_unsorted_requests_are_an_error(kit: SimKit) -> None:
    with pytest.raises(ValueError, match="not sorted by arrival"):
        simulate([Request(1.0, 1, 1), Request(0.5, 1, 1)], kit.colocated(), kit.config())
    with pytest.raises(ValueError, match="no requests"):
        simulate([], kit.colocated(), kit.config())
