"""The length buckets, bounded labels and bucketed series of `router.metrics`, and usage stripping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from tandem.router.metrics import (
    OTHER,
    BatchedHistogram,
    GapCounts,
    LabelBound,
    LengthBuckets,
    RouterMetrics,
    length_labels,
)
from tandem.router.sse import DONE_EVENT, scan
from tandem.routing.buckets import BUCKETED_ITL_BUCKETS

USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 1500, "completion_tokens": 7}}\n\n'
TOKEN = b'data: {"choices":[{"text":" hi"}]}\n\n'


def test_default_checklist_labels() -> None:
    assert length_labels((1024, 4096, 16384)) == ("0-1024", "1024-4096", "4096-16384", "16384+")


@pytest.mark.parametrize(
    ("tokens", "label"),
    [(0, "0-1024"), (1023, "0-1024"), (1024, "1024-4096"), (4095, "1024-4096"), (16383, "4096-16384"),
     (16384, "16384+"), (10**6, "16384+")],
)  # fmt: skip
def test_a_bound_opens_the_next_bucket(tokens: int, label: str) -> None:
    assert LengthBuckets((1024, 4096, 16384)).label(tokens) == label


@pytest.mark.parametrize(
    ("bounds", "message"),
    [((), "must not be empty"), ((0, 10), "positive"), ((-5,), "positive"), ((10, 10), "strictly"),
     ((100, 10), "strictly")],
)  # fmt: skip
def test_bad_bounds_are_refused(bounds: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LengthBuckets(bounds)


def test_label_bound_keeps_configured_values_then_other() -> None:
    bound = LabelBound(cap=2)
    assert [bound(v) for v in ("a", "b", "c", "a", None, "")] == ["a", "b", OTHER, "a", OTHER, OTHER]
    bound.configure(["x"])
    assert [bound(v) for v in ("x", "a")] == ["x", OTHER]
    bound.configure(None)
    assert bound("a") == "a"


def test_series_count_is_bounded_by_tenants_models_and_buckets() -> None:
    metrics = RouterMetrics()
    metrics.tenants = LabelBound(cap=3)
    for i in range(50):  # 50 tenants and 50 models: 3 + other, and 16 + other
        for path in ("disaggregated", "colocated"):
            metrics.observe_request(
                path, tenant=f"t{i}", model=f"m{i}", code="2xx", ttft_s=0.1, tpot_s=0.02,
                prompt_tokens=400 * i, output_tokens=50 * i,
            )  # fmt: skip
    ttft = {
        (s.labels["path"], s.labels["input_length"], s.labels["tenant"], s.labels["model"])
        for s in next(iter(metrics.ttft_by_length.collect())).samples
    }
    tenants = {labels[2] for labels in ttft}
    assert tenants == {"t0", "t1", "t2", OTHER}
    assert len({labels[3] for labels in ttft}) == 16 + 1
    assert {labels[1] for labels in ttft} == {"0-1024", "1024-4096", "4096-16384", "16384+"}


def test_new_bounds_restart_the_bucketed_histograms() -> None:
    metrics = RouterMetrics()
    metrics.observe_request("colocated", tenant="a", model="m", code="2xx", ttft_s=0.1, prompt_tokens=5)
    metrics.set_buckets((10, 20), (5,), (4,))
    metrics.observe_request("colocated", tenant="a", model="m", code="2xx", ttft_s=0.1, prompt_tokens=15)
    reg = metrics.registry
    count = "tandem_router_ttft_by_input_length_seconds_count"
    labels = {"path": "colocated", "tenant": "a", "model": "m"}
    assert reg.get_sample_value(count, {**labels, "input_length": "0-1024"}) is None
    assert reg.get_sample_value(count, {**labels, "input_length": "10-20"}) == 1.0
    bound = {"kind": "input", "bound": "1"}
    assert reg.get_sample_value("tandem_router_length_bucket_bounds_tokens", bound) == 20
    with pytest.raises(ValueError, match="strictly increasing"):
        metrics.set_buckets((20, 10), (5,), (4,))


def test_a_failed_request_counts_for_its_tenant_but_has_no_latency() -> None:
    metrics = RouterMetrics()
    metrics.observe_request("disaggregated", tenant="a", model="m", code="5xx", ttft_s=0.1)
    reg = metrics.registry
    labels = {"tenant": "a", "model": "m", "path": "disaggregated", "code": "5xx"}
    assert reg.get_sample_value("tandem_router_tenant_requests_total", labels) == 1.0
    assert not list(next(iter(metrics.ttft_by_length.collect())).samples)


def test_usage_chunk_is_read_and_stripped_when_asked() -> None:
    stripped = scan([TOKEN, USAGE, DONE_EVENT], strip_usage=True)
    assert stripped.forward == [TOKEN, DONE_EVENT]
    assert (stripped.prompt_tokens, stripped.completion_tokens, stripped.tokens) == (1500, 7, 1)
    kept = scan([TOKEN, USAGE, DONE_EVENT])
    assert kept.forward == [TOKEN, USAGE, DONE_EVENT]
    assert (kept.prompt_tokens, kept.completion_tokens) == (1500, 7)


def test_the_spec_sets_the_router_buckets_and_bad_ones_keep_the_old() -> None:
    import random

    from tandem.kube.pods import pdd_info_from
    from tandem.router.state import RouterState
    from tandem.routing.balancer import Balancer

    state = RouterState(balancer=Balancer(rng=random.Random(0)), metrics=RouterMetrics(), pdd_name="llm")
    metrics = {"inputLengthBuckets": [100, 200], "outputLengthBuckets": [10]}
    state.on_pdd(pdd_info_from({"metadata": {"name": "llm"}, "spec": {"router": {"metrics": metrics}}}))
    assert state.metrics.input_buckets.labels == ("0-100", "100-200", "200+")
    assert state.metrics.output_buckets.labels == ("0-10", "10+")
    bad = {"inputLengthBuckets": [300, 200]}
    state.on_pdd(pdd_info_from({"metadata": {"name": "llm"}, "spec": {"router": {"metrics": bad}}}))
    assert state.metrics.input_buckets.bounds == (100, 200)
    state.on_pdd(pdd_info_from({"metadata": {"name": "llm"}, "spec": {}}))  # unset: the defaults
    assert list(state.metrics.input_buckets.bounds) == [1024, 4096, 16384]
    assert state.metrics.output_buckets.bounds == (128, 512, 2048)
    assert state.metrics.concurrency_buckets.bounds == (4, 16, 64, 256)
    crowd = {"concurrencyBuckets": [2, 8]}
    state.on_pdd(pdd_info_from({"metadata": {"name": "llm"}, "spec": {"router": {"metrics": crowd}}}))
    assert state.metrics.concurrency_buckets.labels == ("0-2", "2-8", "8+")


def test_series_rate_reads_exist_from_zero() -> None:
    """A series born with its first requests shows no increase to rate(): the successful prefill legs
    (the autoscaler's TTFT breakdown) and a known revision's counters and latency histograms (a revision
    rollout's verdict) are exported at 0 before any request."""
    m = RouterMetrics()
    m.know_revision("r1")
    text = generate_latest(m.registry).decode()
    for line in (
        'tandem_router_prefill_leg_seconds_count{outcome="ok"} 0.0',
        'tandem_router_revision_time_to_first_token_seconds_count{revision="r1"} 0.0',
        'tandem_router_revision_time_per_output_token_seconds_count{revision="r1"} 0.0',
        'tandem_router_revision_requests_within_slo_total{revision="r1"} 0.0',
    ):
        assert line in text, line


# --- TPOT and ITL by output length and by concurrency ----------------------------------------------------


def samples_of(
    registry: CollectorRegistry, name: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the metric family `name`: (sample name, labels) -> value, `_created` left out."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        if family.name == name
        for s in family.samples
        if not s.name.endswith("_created")
    }


@given(
    st.lists(st.sampled_from([0.0, 0.005, 0.0051, 0.03, 0.2, 1.0, 1.5, 30.0]) | st.floats(0, 5), max_size=60)
)
def test_gaps_counted_per_request_expose_as_a_histogram_fed_one_by_one(gaps: list[float]) -> None:
    """A request's gaps counted as they come (GapCounts) and added once (BatchedHistogram) read the same
    as prometheus_client's Histogram observing each gap: buckets (a bound is its bucket's upper edge),
    count and sum."""
    registry = CollectorRegistry()
    batched = BatchedHistogram("b_seconds", "batched", ["path"], BUCKETED_ITL_BUCKETS, registry)
    plain = Histogram("p_seconds", "plain", ["path"], buckets=BUCKETED_ITL_BUCKETS, registry=registry)
    counts, child = GapCounts(), plain.labels("colocated")
    for gap in gaps:
        counts.add(gap)
        child.observe(gap)
    batched.add(("colocated",), counts)
    batched_samples = samples_of(registry, "b_seconds")
    got = {(name.replace("b_", "p_", 1), labels): v for (name, labels), v in batched_samples.items()}
    want = samples_of(registry, "p_seconds")
    assert len(want) == len(BUCKETED_ITL_BUCKETS) + 1 + 2  # the buckets, +Inf, _count and _sum
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key


def itl(metrics: RouterMetrics, label: str, value: str, path: str = "disaggregated") -> float | None:
    name = "concurrency" if label == "concurrency" else "output_length"
    metric = f"tandem_router_itl_by_{name}_seconds_count"
    return metrics.registry.get_sample_value(metric, {"path": path, label: value})


@pytest.mark.parametrize(
    ("concurrency", "label"),
    [(1, "0-4"), (3, "0-4"), (4, "4-16"), (63, "16-64"), (256, "256+"), (9999, "256+")],
)
def test_tpot_and_itl_by_concurrency_and_output_length(concurrency: int, label: str) -> None:
    metrics = RouterMetrics()
    gaps = GapCounts()
    for gap in (0.02, 0.03, 0.5):
        gaps.add(gap)
    metrics.observe_request(
        "disaggregated", tenant="a", model="m", code="2xx", ttft_s=0.2, tpot_s=0.04,
        prompt_tokens=100, output_tokens=600, concurrency=concurrency, gaps=gaps,
    )  # fmt: skip
    reg = metrics.registry
    tpot = "tandem_router_tpot_by_concurrency_seconds_count"
    assert reg.get_sample_value(tpot, {"path": "disaggregated", "concurrency": label}) == 1
    assert itl(metrics, "concurrency", label) == 3
    assert itl(metrics, "output_length", "512-2048") == 3
    assert reg.get_sample_value(
        "tandem_router_itl_by_output_length_seconds_sum",
        {"path": "disaggregated", "output_length": "512-2048"},
    ) == pytest.approx(0.55)
    bucket = "tandem_router_itl_by_concurrency_seconds_bucket"
    assert reg.get_sample_value(bucket, {"path": "disaggregated", "concurrency": label, "le": "0.03"}) == 2
    # by path only: no tenant or model label on these
    families = {f.name: f for f in reg.collect()}
    for name in ("tandem_router_tpot_by_concurrency_seconds", "tandem_router_itl_by_concurrency_seconds"):
        assert {tuple(sorted(s.labels)) for s in families[name].samples} <= {
            ("concurrency", "path"),
            ("concurrency", "le", "path"),
        }


def test_a_request_without_gaps_or_tpot_adds_no_itl_or_tpot_series() -> None:
    metrics = RouterMetrics()
    metrics.observe_request("colocated", tenant="a", model="m", code="2xx", ttft_s=0.2, output_tokens=1)
    metrics.observe_request("colocated", tenant="a", model="m", code="5xx", concurrency=3)
    assert samples_of(metrics.registry, "tandem_router_itl_by_output_length_seconds") == {}
    assert samples_of(metrics.registry, "tandem_router_tpot_by_concurrency_seconds") == {}


def test_new_concurrency_bounds_restart_the_tpot_and_itl_series() -> None:
    metrics = RouterMetrics()
    gaps = GapCounts()
    gaps.add(0.02)

    def observe() -> None:
        metrics.observe_request(
            "colocated",
            tenant="a",
            model="m",
            code="2xx",
            tpot_s=0.02,
            output_tokens=2,
            concurrency=5,
            gaps=gaps,
        )

    observe()
    metrics.set_buckets((1024,), (128,), (2, 8))
    assert itl(metrics, "concurrency", "4-16", "colocated") is None
    assert itl(metrics, "output_length", "0-128", "colocated") is None
    observe()
    assert itl(metrics, "concurrency", "2-8", "colocated") == 1
    tpot = "tandem_router_tpot_by_concurrency_seconds_count"
    assert metrics.registry.get_sample_value(tpot, {"path": "colocated", "concurrency": "2-8"}) == 1


def test_the_in_flight_gauge_reads_the_path_count() -> None:
    metrics = RouterMetrics()
    metrics.by_path["disaggregated"].active = 3
    gauge = "tandem_router_in_flight_requests"
    assert metrics.registry.get_sample_value(gauge, {"path": "disaggregated"}) == 3
    assert metrics.registry.get_sample_value(gauge, {"path": "colocated"}) == 0
