"""metrics.revisions: the per-revision analysis window from the routers' counters (pure parts)."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.api.models import PDDeploymentSpec
from tandem.metrics.revisions import (
    KvFigures,
    build_revision_window,
    pod_revision_label,
    read_revision_window,
    revision_label,
    revision_queries,
)
from tandem.rollout.config import Analysis
from tandem.rollout.judge import Result, judge


def sample(revision: str, value: float) -> dict[str, Any]:
    return {"metric": {"revision": revision}, "value": [0, str(value)]}


def test_queries_select_the_deployments_routers_and_group_by_revision() -> None:
    queries = revision_queries("ns", "demo", 10, quantile=0.9)
    assert set(queries) == {
        "revision_requests",
        "revision_within_slo",
        "revision_errors",
        "revision_stood_in",
        "revision_ttft",
        "revision_tpot",
    }
    assert 'code="5xx"' in queries["revision_errors"]
    assert "sum by (wanted) (increase(tandem_router_revision_stood_in_total " in queries["revision_stood_in"]
    for name, query in queries.items():
        assert ("sum by (wanted" if name == "revision_stood_in" else "sum by (revision") in query
        assert 'namespace="ns"' in query
        assert "[10s]" in query
    assert queries["revision_ttft"].startswith("histogram_quantile(0.9, ")
    assert "tandem_router_revision_time_to_first_token_seconds_bucket" in queries["revision_ttft"]
    assert "tandem_router_revision_time_per_output_token_seconds_bucket" in queries["revision_tpot"]


def test_window_has_each_revisions_quantiles_and_kv_figures() -> None:
    results = {
        "revision_requests": [sample("b2", 40), sample("legacy", 60)],
        "revision_within_slo": [sample("b2", 40), sample("legacy", 60)],
        "revision_ttft": [sample("b2", 0.8), sample("legacy", 0.3)],
        "revision_tpot": [sample("b2", 0.05), sample("legacy", float("nan"))],
    }
    window = build_revision_window(
        results,
        {},
        now=100.0,
        window_seconds=10,
        target="b2",
        baseline="legacy",
        slo_set=True,
        target_kv=KvFigures(failure_rate=0.0, bandwidth_ratio=0.1),
        baseline_kv=KvFigures(failure_rate=0.0, bandwidth_ratio=0.95),
    )
    assert (window.target.ttft_seconds, window.target.tpot_seconds) == (0.8, 0.05)
    assert (window.baseline.ttft_seconds, window.baseline.tpot_seconds) == (0.3, None), "NaN: unknown"
    assert (window.target.kv_bandwidth_ratio, window.baseline.kv_bandwidth_ratio) == (0.1, 0.95)
    # judged as a mode rollout's P/D arm: the slow link fails the new revision, with every figure shown
    verdict = judge(window, Analysis(window_seconds=10, min_samples=10, attainment_floor=0.9))
    assert verdict.result is Result.Fail
    assert "KV bandwidth at 10.0% of the link's, below 50.0%" in verdict.reason
    assert verdict.figures["targetTtftSeconds"] == 0.8
    assert verdict.figures["baselineTtftSeconds"] == 0.3
    assert verdict.figures["targetTpotSeconds"] == 0.05
    assert verdict.figures["targetKvBandwidthRatio"] == 0.1
    assert verdict.figures["baselineKvBandwidthRatio"] == 0.95
    assert verdict.figures["targetKvFailureRate"] == 0.0


def test_requests_another_revision_stood_in_for_are_the_new_revisions_failures() -> None:
    """The new revision's pair went unready mid-step: its share went to the old pair (stood in), which
    keeps only what it served; the new revision fails on its error rate with few of its own requests."""
    results = {
        "revision_requests": [sample("b2", 3), sample("legacy", 60)],
        "revision_within_slo": [sample("b2", 3), sample("legacy", 60)],
        "revision_stood_in": [{"metric": {"wanted": "b2"}, "value": [0, "17"]}],
    }
    window = build_revision_window(
        results, {}, now=100.0, window_seconds=10, target="b2", baseline="legacy", slo_set=True
    )
    assert (window.target.requests, window.target.stood_in, window.baseline.requests) == (20, 17, 60)
    assert window.target.error_rate == pytest.approx(0.85)
    verdict = judge(window, Analysis(window_seconds=10, min_samples=10, attainment_floor=0.9))
    assert verdict.result is Result.Fail
    assert "17 of them served by the other arm" in verdict.reason


class KvByRevision:
    """A Prometheus that answers the KV queries per `tandem_dev_revision` selector and the routers'."""

    def __init__(self, slow: str) -> None:
        self.slow = slow
        self.kv_selectors: list[str] = []

    def run(self, queries: dict[str, str], at: float) -> tuple[dict[str, Any], dict[str, str]]:
        if "revision_requests" in queries:
            return {
                "revision_requests": [sample("b2", 40), sample("legacy", 40)],
                "revision_within_slo": [sample("b2", 40), sample("legacy", 40)],
            }, {}
        selector = queries["kv_transfers"]
        self.kv_selectors.append(selector)
        seconds = 10.0 if f'tandem_dev_revision="{self.slow}"' in selector else 1.0  # 20 x 256 MiB
        size = 256 * 1024 * 1024
        scalar = {"kv_series": 1.0, "kv_transfers": 20.0, "kv_failed": 0.0, "kv_seconds": seconds}
        answers: dict[str, Any] = {
            k: [{"metric": {}, "value": [at, str(v)]} for k in (k,)] for k, v in scalar.items()
        }
        answers["kv_bytes"] = [{"metric": {}, "value": [at, str(20.0 * size)]}]
        answers["kv_bytes_buckets"] = [
            {"metric": {"le": le}, "value": [at, v]}
            for le, v in (("134217728", "0"), ("536870912", "20"), ("+Inf", "20"))
        ]
        answers["kv_seconds_buckets"] = [
            {"metric": {"le": le}, "value": [at, v]}
            for le, v in (("0.005", "0"), ("1", "20"), ("+Inf", "20"))
        ]
        return answers, {}


def test_read_revision_window_reads_each_revisions_kv_transport() -> None:
    spec = PDDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"type": "vllm", "image": "img"},
            "kvTransfer": {"bandwidthGbps": 100},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1},
        }
    )
    reader = KvByRevision(slow="b2")
    window = read_revision_window(
        reader,  # type: ignore[arg-type]
        "ns",
        "demo",
        target="b2",
        baseline="legacy",
        window_seconds=10,
        now=100.0,
        slo_set=True,
        spec=spec,
        target_pods=pod_revision_label("b2", legacy=False),
        baseline_pods=pod_revision_label("a1", legacy=True),
    )
    assert [s.count("tandem_dev_revision") for s in reader.kv_selectors] == [1, 1]
    assert 'tandem_dev_revision="b2"' in reader.kv_selectors[0]
    assert 'tandem_dev_revision=""' in reader.kv_selectors[1], "the legacy pods have no revision label"
    size_bits = 20 * 256 * 1024 * 1024 * 8
    assert window.target.kv_bandwidth_ratio == pytest.approx(size_bits / 10.0 / 1e9 / 100)
    assert window.baseline.kv_bandwidth_ratio == pytest.approx(size_bits / 1.0 / 1e9 / 100)
    assert (window.target.kv_failure_rate, window.baseline.kv_failure_rate) == (0.0, 0.0)


def test_window_compares_the_new_revision_with_the_old() -> None:
    results = {
        "revision_requests": [sample("b2", 40), sample("legacy", 60)],
        "revision_within_slo": [sample("b2", 20), sample("legacy", 60)],
        "revision_errors": [sample("b2", 2)],
    }
    window = build_revision_window(
        results, {}, now=100.0, window_seconds=10, target="b2", baseline="legacy", slo_set=True
    )
    assert (window.start, window.end) == (90.0, 100.0)
    assert window.target.requests == 40
    assert window.target.attainment == 0.5
    assert window.target.error_rate == 0.05
    assert window.baseline.requests == 60
    assert window.baseline.attainment == 1.0
    assert window.metrics_missing == ()


def test_missing_queries_and_slo_are_named() -> None:
    window = build_revision_window(
        {},
        {"revision_requests": "timeout"},
        now=1.0,
        window_seconds=10,
        target="x",
        baseline="y",
        slo_set=False,
    )
    assert window.target.requests == 0
    assert window.target.attainment is None
    assert any("revision_requests" in m for m in window.metrics_missing)
    assert any("spec.slo" in m for m in window.metrics_missing)


def test_labels() -> None:
    assert revision_label("a1", legacy=True) == "legacy"
    assert revision_label("a1", legacy=False) == "a1"
    assert pod_revision_label("a1", legacy=True) == ""
    assert pod_revision_label("a1", legacy=False) == "a1"
