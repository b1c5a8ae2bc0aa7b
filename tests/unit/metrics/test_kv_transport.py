"""The KV-transport arithmetic: bandwidth of the large transfers from two histograms, table-driven.

Windows are built from explicit transfers (bytes, seconds) bucketed with vLLM's NIXL buckets
(tandem.engine.metrics), as Prometheus' increase() of the engines' histograms would give them."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeploymentSpec
from tandem.engine.metrics import NIXL_BYTES_BUCKETS, NIXL_XFER_BUCKETS
from tandem.metrics.kv_transport import judge, reading_from, reference_link_gbps
from tandem.metrics.queries import KV_QUERIES, kv_transport_queries

MiB = 1024 * 1024
GBIT = 1e9 / 8  # bytes per second of 1 Gb/s


def histogram(values: Sequence[float], bounds: Sequence[float]) -> list[tuple[float, float]]:
    return [(le, float(sum(1 for v in values if v <= le))) for le in (*bounds, math.inf)]


def window(transfers: Sequence[tuple[float, float]], min_bytes: float = 32 * MiB, **kw: Any) -> Any:
    sizes, times = [b for b, _ in transfers], [s for _, s in transfers]
    return judge(
        transfers=len(transfers),
        bytes_sum=sum(sizes),
        seconds_sum=sum(times),
        bytes_buckets=histogram(sizes, NIXL_BYTES_BUCKETS),
        seconds_buckets=histogram(times, NIXL_XFER_BUCKETS),
        min_judged_bytes=min_bytes,
        **kw,
    )


def link(size: float, gbps: float, latency: float = 0.002) -> tuple[float, float]:
    """One transfer of `size` bytes over a `gbps` link with a fixed latency."""
    return size, latency + size / (gbps * GBIT)


@pytest.mark.parametrize(
    ("name", "transfers", "floor", "ceiling"),
    [
        # Only large transfers: exact, both bounds equal bytes / seconds.
        ("large only, healthy 400", [(256 * MiB, 256 * MiB / (400 * GBIT))] * 8, 400, 400),
        ("large only, TCP 10", [(256 * MiB, 256 * MiB / (10 * GBIT))] * 8, 10, 10),
        # Small latency-bound transfers pull the naive figure down; the ceiling excludes them.
        (
            "healthy with small ones",
            [link(256 * MiB, 400)] * 6 + [link(64 * 1024, 400)] * 30,
            None,
            None,
        ),
    ],
)
def test_bounds(
    name: str, transfers: list[tuple[float, float]], floor: float | None, ceiling: float | None
) -> None:
    got = window(transfers)
    assert got.reason == ""
    assert got.effective_gbps is not None
    assert got.effective_gbps_floor is not None
    assert got.effective_gbps_floor <= got.effective_gbps * (1 + 1e-9)
    if floor is not None:
        assert got.effective_gbps_floor == pytest.approx(floor)
    if ceiling is not None:
        assert got.effective_gbps == pytest.approx(ceiling)


def test_small_transfers_do_not_make_a_healthy_link_look_slow() -> None:
    large = [link(256 * MiB, 400)] * 6
    small = [link(64 * 1024, 400)] * 60  # 2 ms each of latency: 120 ms, vs 6 x 7.4 ms of large
    naive = 8 * sum(b for b, _ in large + small) / sum(s for _, s in large + small) / 1e9
    truth = 8 * sum(b for b, _ in large) / sum(s for _, s in large) / 1e9
    got = window(large + small)
    assert naive < 0.3 * truth  # what bytes_sum / seconds_sum would have said
    assert got.judged_transfers == 6
    assert got.judged_above_bytes == 32 * MiB
    assert got.effective_gbps is not None
    assert got.effective_gbps_floor is not None
    assert got.effective_gbps_floor <= truth <= got.effective_gbps
    assert got.effective_gbps >= truth  # never reads slower than the large transfers ran


def test_a_slow_link_reads_slow_despite_small_transfers() -> None:
    got = window([link(256 * MiB, 10)] * 6 + [link(8 * 1024, 10)] * 20)
    assert got.effective_gbps is not None
    assert got.effective_gbps < 11  # a 10 Gb/s link (the ceiling: proven slow)
    assert got.effective_gbps_floor is not None
    assert got.effective_gbps_floor > 9


@pytest.mark.parametrize(
    ("name", "transfers", "min_bytes", "reason"),
    [
        ("no transfer", [], 32 * MiB, "no KV transfer in the window"),
        ("all small", [link(1 * MiB, 400)] * 50, 32 * MiB, "0 transfer(s) over 32 MiB"),
        ("too few large", [link(256 * MiB, 400)] * 4, 32 * MiB, "4 transfer(s) over 32 MiB"),
        # 40 MiB rounds up to the 128 MiB bound: 100 MiB transfers are not judged.
        ("minimum rounds up", [link(100 * MiB, 400)] * 9, 40 * MiB, "0 transfer(s) over 128 MiB"),
        ("over the buckets", [link(100 * MiB, 400)] * 9, 16 * 1024**3, "minimum size above"),
        # Large and small transfers all in the first duration bucket (under 5 ms): the small ones
        # may have taken all the time, so there is no ceiling.
        ("unbounded", [(64 * MiB, 0.001)] * 6 + [(8 * 1024, 0.004)] * 10, 32 * MiB, "unbounded"),
    ],
)
def test_not_judged(name: str, transfers: list[tuple[float, float]], min_bytes: float, reason: str) -> None:
    got = window(transfers, min_bytes)
    assert got.effective_gbps is None
    assert reason in got.reason


def test_a_link_slower_than_the_last_duration_bound_is_still_bounded() -> None:
    got = window([(256 * MiB, 6.0)] * 6 + [(8 * 1024, 6.0)])  # over 5 s each: the +Inf bucket
    assert got.effective_gbps is not None
    assert got.effective_gbps_floor is not None
    assert got.effective_gbps_floor <= 8 * 256 * MiB / 6.0 / 1e9 <= got.effective_gbps < 1


def test_the_minimum_count_is_a_parameter() -> None:
    assert window([link(256 * MiB, 400)] * 2, min_judged_transfers=2).effective_gbps is not None
    assert window([link(256 * MiB, 400)] * 2, min_judged_transfers=3).effective_gbps is None


def test_extrapolated_counts_that_dip_are_made_monotone() -> None:
    sizes = [(2048.0, 0.0), (32 * MiB, 0.0), (128 * MiB, 0.2), (512 * MiB, 6.1), (math.inf, 6.0)]
    times = [(0.005, 0.0), (0.01, 6.0), (math.inf, 5.9)]
    got = judge(
        transfers=6.0,
        bytes_sum=6 * 256 * MiB,
        seconds_sum=6 * 0.008,
        bytes_buckets=sizes,
        seconds_buckets=times,
        min_judged_bytes=32 * MiB,
    )
    assert got.judged_transfers == pytest.approx(6.1)
    assert got.effective_gbps is not None


# --- answers -> reading ---------------------------------------------------------------------------


def scalar(value: float) -> list[dict[str, Any]]:
    return [{"metric": {}, "value": [0, str(value)]}]


def by_le(pairs: Sequence[tuple[float, float]]) -> list[dict[str, Any]]:
    return [
        {"metric": {"le": "+Inf" if math.isinf(le) else f"{le:g}"}, "value": [0, str(v)]} for le, v in pairs
    ]


def answers(transfers: Sequence[tuple[float, float]], failed: float = 0.0) -> dict[str, list[dict[str, Any]]]:
    sizes, times = [b for b, _ in transfers], [s for _, s in transfers]
    return {
        "kv_series": scalar(2),
        "kv_transfers": scalar(len(transfers)),
        "kv_failed": scalar(failed),
        "kv_seconds": scalar(sum(times)),
        "kv_bytes": scalar(sum(sizes)),
        "kv_seconds_buckets": by_le(histogram(times, NIXL_XFER_BUCKETS)),
        "kv_bytes_buckets": by_le(histogram(sizes, NIXL_BYTES_BUCKETS)),
    }


def read(
    results: dict[str, list[dict[str, Any]]], errors: dict[str, str] | None = None, link_gbps: float = 400
) -> Any:
    return reading_from(
        results, errors or {}, now=1000.0, window_seconds=60, link_gbps=link_gbps, min_judged_bytes=32 * MiB
    )


def test_a_healthy_reading() -> None:
    got = read(answers([(256 * MiB, 256 * MiB / (400 * GBIT))] * 10, failed=0))
    assert got.nixl_metrics
    assert (got.transfers, got.failed_transfers, got.failure_rate) == (10, 0, 0.0)
    assert got.bandwidth_ratio == pytest.approx(1.0)
    assert got.missing == ()


def test_a_slow_reading_with_failures() -> None:
    got = read(answers([(256 * MiB, 256 * MiB / (40 * GBIT))] * 9, failed=1))
    assert got.transfers == 10  # failed transfers are attempts too
    assert got.failure_rate == pytest.approx(0.1)
    assert got.effective_gbps == pytest.approx(40)
    assert got.bandwidth_ratio == pytest.approx(0.1)


def test_only_failures() -> None:
    got = read(answers([], failed=3))
    assert got.failure_rate == 1.0
    assert got.bandwidth_ratio is None
    assert got.not_judged == "no KV transfer in the window"


def test_no_nixl_metrics() -> None:
    results: dict[str, list[dict[str, Any]]] = {q.name: [] for q in KV_QUERIES}
    got = read(results)
    assert not got.nixl_metrics
    assert got.failure_rate is None
    assert got.bandwidth_ratio is None


def test_failed_queries_are_missing_and_nothing_is_judged() -> None:
    results = answers([(256 * MiB, 0.01)] * 10)
    del results["kv_bytes"]
    got = read(results, {"kv_bytes": "Prometheus at http://127.0.0.1:9 unreachable (ConnectionError)"})
    assert got.missing == ("kv_bytes: Prometheus at http://127.0.0.1:9 unreachable (ConnectionError)",)
    assert got.bandwidth_ratio is None
    assert got.failure_rate is None


def test_queries_select_the_deployment_engines_over_the_window() -> None:
    queries = kv_transport_queries("team-a", "llama", 90)
    assert set(queries) == {q.name for q in KV_QUERIES}
    assert "[90s]" in queries["kv_bytes_buckets"]
    assert 'tandem_dev_pddeployment="llama"' in queries["kv_failed"]
    assert "vllm:nixl_num_failed_transfers_total" in queries["kv_failed"]
    by_revision = kv_transport_queries("team-a", "llama", 90, revision="b2")
    assert all('tandem_dev_revision="b2"}' in q for q in by_revision.values())
    legacy = kv_transport_queries("team-a", "llama", 90, revision="")
    assert all('tandem_dev_revision=""}' in q for q in legacy.values()), "no label: the legacy pods"
    assert all("tandem_dev_revision" not in q for q in queries.values())


BASE = yaml.safe_load((Path(__file__).parents[2] / "data" / "invalid-specs.yaml").read_text())["base"]


def scale(value: str) -> list[dict[str, str]]:
    return [{"name": "TANDEM_SIM_TIME_SCALE", "value": value}]


@pytest.mark.parametrize(
    ("engine_type", "env", "expected"),
    [
        ("vllm", [], 400.0),
        ("sim", [], 400.0),
        ("sim", scale("4"), 100.0),  # a sim 4x slower than the GPU it models: its link too
        ("sim", scale("0.5"), 800.0),
        ("sim", scale("0"), 400.0),  # "as fast as the CPU allows": judged at the spec's
        ("sim", scale("x"), 400.0),
        ("vllm", scale("4"), 400.0),  # only the sim engine reads it
    ],
)
def test_reference_link(engine_type: str, env: list[dict[str, str]], expected: float) -> None:
    raw = copy.deepcopy(BASE)
    raw["engine"] = {**raw.get("engine", {}), "type": engine_type, "env": env}
    raw["kvTransfer"] = {"bandwidthGbps": 400}
    assert reference_link_gbps(PDDeploymentSpec.model_validate(raw)) == expected
