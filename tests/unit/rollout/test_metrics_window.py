"""The analysis window from recorded Prometheus answers (pure): both arms by the routers' path
label, errors from code 5xx, requests the other arm stood in for counted as the arm's failures, failed
queries named as missing (never a Pass), and the queries."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.metrics.rollout import build_window, rollout_queries
from tandem.rollout.config import Analysis
from tandem.rollout.judge import Result, judge

T = 1_800_000_000.0


def answer(label: str = "path", **by_path: float) -> list[dict[str, Any]]:
    return [{"metric": {label: path}, "value": [T, str(value)]} for path, value in by_path.items()]


def results(**overrides: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    base = {
        "rollout_requests": answer(disaggregated=200.4, colocated=600.0),
        "rollout_within_slo": answer(disaggregated=190.0, colocated=594.0),
        "rollout_errors": answer(disaggregated=2.0),
        "rollout_ttft": answer(disaggregated=0.4, colocated=0.3),
        "rollout_tpot": answer(disaggregated=0.02, colocated=float("nan")),
    }
    return {**base, **overrides}


def test_both_arms_by_path() -> None:
    w = build_window(
        results(),
        {},
        now=T,
        window_seconds=30,
        target_mode="Disaggregated",
        slo_set=True,
        kv_failure_rate=0.0,
    )
    assert (w.start, w.end, w.metrics_missing) == (T - 30, T, ())
    assert w.target.requests == 200
    assert abs((w.target.attainment or 0) - 190 / 200.4) < 1e-9
    assert abs(w.target.error_rate - 2 / 200.4) < 1e-9
    assert w.target.kv_failure_rate == 0.0
    assert w.baseline.requests == 600
    assert w.baseline.kv_failure_rate is None
    assert w.baseline.tpot_seconds is None, "NaN quantile (no multi-token request) is no figure"
    verdict = judge(w, Analysis(window_seconds=30, min_samples=100, attainment_floor=0.9))
    assert verdict.result is Result.Pass


def test_colocated_target_swaps_the_arms() -> None:
    w = build_window(
        results(), {}, now=T, window_seconds=30, target_mode="Colocated", slo_set=True, kv_failure_rate=0.5
    )
    assert w.target.requests == 600
    assert w.target.kv_failure_rate is None
    assert w.baseline.kv_failure_rate == 0.5


def test_a_failed_query_is_missing_and_never_passes() -> None:
    w = build_window(
        results(),
        {"rollout_within_slo": "Prometheus at http://127.0.0.1:9 unreachable"},
        now=T,
        window_seconds=30,
        target_mode="Disaggregated",
        slo_set=True,
    )
    assert w.metrics_missing
    verdict = judge(w, Analysis(window_seconds=30, min_samples=10))
    assert verdict.result is Result.Inconclusive
    assert verdict.missing


def test_no_slo_is_missing() -> None:
    w = build_window(results(), {}, now=T, window_seconds=30, target_mode="Disaggregated", slo_set=False)
    assert any("spec.slo" in m for m in w.metrics_missing)


def test_no_traffic_is_no_sample() -> None:
    w = build_window({}, {}, now=T, window_seconds=30, target_mode="Disaggregated", slo_set=True)
    assert (w.target.requests, w.target.attainment, w.target.error_rate) == (0, None, 0.0)
    assert judge(w, Analysis(window_seconds=30, min_samples=1)).result is Result.Inconclusive


# (served on P/D, of them within SLO, failed, stood in for by colocated) -> (requests, attainment,
# error rate, stood in, verdict): requests the P/D arm could not take count as its failures and misses.
STOOD_IN_CASES = [
    pytest.param(40, 40, 0, 0, (40, 1.0, 0.0, 0, Result.Pass), id="none-stood-in"),
    pytest.param(0, 0, 0, 12, (12, 0.0, 1.0, 12, Result.Fail), id="arm-lost-its-pods-no-traffic-of-its-own"),
    pytest.param(6, 6, 2, 4, (10, 0.6, 0.6, 4, Result.Fail), id="killed-mid-window"),
    pytest.param(99, 99, 0, 1, (100, 0.99, 0.01, 1, Result.Pass), id="one-blip-within-the-error-budget"),
]


@pytest.mark.parametrize(("served", "within", "failed", "stood_in", "expected"), STOOD_IN_CASES)
def test_requests_stood_in_for_count_as_the_arms_failures(
    served: float, within: float, failed: float, stood_in: float, expected: tuple[Any, ...]
) -> None:
    overrides = results(
        rollout_requests=answer(disaggregated=served, colocated=600.0),
        rollout_within_slo=answer(disaggregated=within, colocated=594.0),
        rollout_errors=answer(disaggregated=failed),
        rollout_stood_in=answer("wanted", disaggregated=stood_in),
    )
    w = build_window(overrides, {}, now=T, window_seconds=30, target_mode="Disaggregated", slo_set=True)
    requests, attainment, error_rate, stood, result = expected
    assert (w.target.requests, w.target.stood_in) == (requests, stood)
    assert w.target.attainment == pytest.approx(attainment)
    assert w.target.error_rate == pytest.approx(error_rate)
    assert w.baseline.requests == 600, "the arm that stood in keeps only what it served"
    verdict = judge(w, Analysis(window_seconds=30, min_samples=10, attainment_floor=0.9, max_error_rate=0.05))
    assert verdict.result is result, verdict.reason
    if result is Result.Fail and stood:
        assert f"{stood} of them served by the other arm" in verdict.reason
        assert verdict.figures["targetStoodIn"] == stood


def test_queries_select_this_deployment_and_5xx() -> None:
    q = rollout_queries("ns", "llama", 30, 0.95)
    assert set(q) == {
        "rollout_requests",
        "rollout_within_slo",
        "rollout_errors",
        "rollout_stood_in",
        "rollout_ttft",
        "rollout_tpot",
    }
    assert q["rollout_stood_in"].startswith("sum by (wanted) (increase(tandem_router_path_stood_in_total {")
    assert 'code="5xx"' in q["rollout_errors"]
    assert 'code="5xx"' not in q["rollout_requests"]
    for promql in q.values():
        assert 'namespace="ns"' in promql
        assert 'tandem_dev_pddeployment="llama"' in promql
        assert "[30s]" in promql
    assert "histogram_quantile(0.95," in q["rollout_ttft"]
