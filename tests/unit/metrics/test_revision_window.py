"""metrics.revisions: the per-revision analysis window from the routers' counters (pure parts)."""

from __future__ import annotations

from typing import Any

from tandem.metrics.revisions import build_revision_window, revision_label, revision_queries


def sample(revision: str, value: float) -> dict[str, Any]:
    return {"metric": {"revision": revision}, "value": [0, str(value)]}


def test_queries_select_the_deployments_routers_and_group_by_revision() -> None:
    queries = revision_queries("ns", "demo", 10)
    assert set(queries) == {"revision_requests", "revision_within_slo", "revision_errors"}
    assert 'code="5xx"' in queries["revision_errors"]
    for query in queries.values():
        assert "sum by (revision)" in query
        assert 'namespace="ns"' in query
        assert "[10s]" in query


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
