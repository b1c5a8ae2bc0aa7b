"""Within-SLO counting: the per-request rule, the SLO buckets, where the SLO comes from."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from tandem.kube.pods import pdd_info_from
from tandem.router.main import build, parse_args
from tandem.router.metrics import ITL_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS, RouterMetrics
from tandem.router.slo import SloTargets, within_slo
from tandem.routing.balancer import Balancer

SLO = SloTargets.from_ms(500, 50)


def verdict(
    status: int = 200,
    first: float | None = 0.4,
    last: float | None = 0.4 + 9 * 0.04,
    tokens: int = 10,
    ended: float | None = None,
) -> bool:
    end = ended if ended is not None else (last if last is not None else 0.0)
    return within_slo(
        SLO,
        status=status,
        arrived=0.0,
        first_token_at=first,
        last_token_at=last,
        output_tokens=tokens,
        ended=end,
    )


def test_both_targets_met() -> None:
    assert verdict()


@pytest.mark.parametrize(
    ("first", "last", "tokens"),
    [
        (0.6, 0.6 + 9 * 0.04, 10),  # TTFT over
        (0.4, 0.4 + 9 * 0.06, 10),  # TPOT over
    ],
)
def test_either_target_missed(first: float, last: float, tokens: int) -> None:
    assert not verdict(first=first, last=last, tokens=tokens)


def test_targets_are_inclusive() -> None:
    assert within_slo(
        SloTargets(0.5, 0.0625), status=200, arrived=1.0, first_token_at=1.5, last_token_at=1.5625,
        output_tokens=2, ended=1.6,
    )  # fmt: skip


def test_one_output_token_is_judged_on_ttft_alone() -> None:
    assert verdict(first=0.4, last=0.4, tokens=1)
    assert not verdict(first=0.7, last=0.7, tokens=1)


def test_a_failed_or_refused_request_is_never_within() -> None:
    for status in (499, 500, 502, 503, 404):
        assert not verdict(status=status)


def test_a_non_streamed_answer_has_its_first_token_at_the_end() -> None:
    assert verdict(first=None, last=None, tokens=100, ended=0.45)
    assert not verdict(first=None, last=None, tokens=100, ended=0.55)


def test_slo_buckets_bound_common_targets() -> None:
    for bound in (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0):
        assert bound in TTFT_BUCKETS
    for bound in (0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1):
        assert bound in ITL_BUCKETS
        assert bound in TPOT_BUCKETS
    for buckets in (TTFT_BUCKETS, ITL_BUCKETS):
        assert list(buckets) == sorted(set(buckets))


def test_the_counter_exists_only_with_an_slo() -> None:
    metrics = RouterMetrics()
    name = "tandem_router_requests_within_slo_total"
    assert f"{name}{{" not in generate_latest(metrics.registry).decode()
    metrics.set_slo(SLO)
    text = generate_latest(metrics.registry).decode()
    assert f'{name}{{path="disaggregated"}} 0.0' in text
    assert 'tandem_router_slo_target_seconds{target="ttft"} 0.5' in text
    metrics.by_path["disaggregated"].within_slo.inc()
    assert metrics.registry.get_sample_value(name, {"path": "disaggregated"}) == 1
    metrics.set_slo(SLO)  # again: the count goes on
    assert metrics.registry.get_sample_value(name, {"path": "disaggregated"}) == 1
    metrics.set_slo(None)
    text = generate_latest(metrics.registry).decode()
    assert f"{name}{{" not in text
    assert "tandem_router_slo_target_seconds{" not in text
    assert metrics.by_path["colocated"].within_slo is None


def test_the_pddeployment_slo_wins_over_the_flags() -> None:
    _, state, _ = build(parse_args(["--pddeployment", "llm", "--slo-ttft-ms", "800", "--slo-tpot-ms", "80"]))
    assert state.slo == SloTargets(0.8, 0.08)
    spec = {"model": {"name": "m"}, "slo": {"ttftMs": 300, "tpotMs": 30, "attainmentPercent": 99}}
    state.on_pdd(pdd_info_from({"metadata": {"name": "llm"}, "spec": spec}))
    assert state.slo == SloTargets(0.3, 0.03)
    assert (
        state.metrics.registry.get_sample_value("tandem_router_slo_target_seconds", {"target": "tpot"})
        == 0.03
    )
    state.on_pdd(pdd_info_from({"metadata": {"name": "llm"}, "spec": {"model": {"name": "m"}}}))
    assert state.slo == SloTargets(0.8, 0.08)  # spec.slo removed: back to the flags


def test_no_slo_anywhere_means_no_counting() -> None:
    _, state, _ = build(parse_args(["--pddeployment", "llm"]))
    state.on_pdd(
        pdd_info_from({"metadata": {"name": "llm"}, "spec": {"slo": {"ttftMs": 300}}})
    )  # half an SLO
    assert state.slo is None
    assert state.metrics.by_path["disaggregated"].within_slo is None


def test_slo_flags_come_in_pairs() -> None:
    with pytest.raises(SystemExit):
        parse_args(
            ["--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--slo-ttft-ms", "500"]
        )
    _, state, _ = build(
        parse_args(["--colocated", "http://127.0.0.1:1", "--slo-ttft-ms", "500", "--slo-tpot-ms", "50"])
    )
    assert state.slo == SLO
    assert state.metrics.by_path["colocated"].within_slo is not None
    assert isinstance(state.balancer, Balancer)


def test_request_counters_start_at_zero() -> None:
    # A counter born at 1 would hide its first request from rate(); within-SLO starts at 0 too.
    metrics = RouterMetrics()
    for path in ("disaggregated", "colocated"):
        for code in ("2xx", "4xx", "5xx"):
            labels = {"path": path, "code": code}
            assert metrics.registry.get_sample_value("tandem_router_requests_total", labels) == 0
