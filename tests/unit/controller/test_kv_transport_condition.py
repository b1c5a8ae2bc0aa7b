"""The KVTransportDegraded condition: a sequence of readings on a virtual clock -> condition, status
figures and Events; reads once per interval; never flips on a single slow window."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from tandem.api.models import PDDeployment, ServingMode
from tandem.api.status import Condition, KVTransportMeasurement, PDDeploymentStatus
from tandem.controller.kv_transport import DEGRADED_READINGS, HOLD_INTERVALS, KvTransportCheck, due, evaluate
from tandem.engine.metrics import NIXL_BYTES_BUCKETS, NIXL_XFER_BUCKETS
from tandem.metrics.kv_transport import KvTransportReading

PROMETHEUS = "http://127.0.0.1:9090"  # never dialled: the reader is scripted

T0 = 1_800_000_000.0
MiB = 1 << 20


def pdd(**kv: Any) -> PDDeployment:
    return PDDeployment.model_validate(
        {
            "apiVersion": "tandem.dev/v1alpha1",
            "kind": "PDDeployment",
            "metadata": {"name": "llama", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": {
                "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"type": "vllm", "image": "img"},
                "prefill": {"replicas": 1},
                "decode": {"replicas": 1},
                "router": {"replicas": 1},
                "kvTransfer": {"bandwidthGbps": 100, **kv},
                "autoscaling": {"intervalSeconds": 5, "prometheus": {"url": PROMETHEUS}},
            },
        }
    )


def reading(
    ratio: float | None, *, missing: tuple[str, ...] = (), nixl: bool = True, at: float = T0
) -> KvTransportReading:
    return KvTransportReading(
        observed_at=at,
        window_seconds=10,
        transfers=20 if ratio is not None else 0,
        failed_transfers=0,
        failure_rate=0.0 if ratio is not None else None,
        judged_transfers=20 if ratio is not None else 0,
        judged_above_bytes=32 * MiB,
        effective_gbps=None if ratio is None else ratio * 100,
        effective_gbps_floor=None if ratio is None else ratio * 100,
        link_gbps=100,
        bandwidth_ratio=ratio,
        nixl_metrics=nixl,
        not_judged="" if ratio is not None else "no KV transfer in the window",
        missing=missing,
    )


def run(ratios: Sequence[float | None], **kv: Any) -> list[tuple[str, str]]:
    """(status, reason) after each reading, one interval apart, carrying measurement and condition
    along (None: a window with too few transfers to judge)."""
    spec = pdd(**kv).spec
    measured: KVTransportMeasurement | None = None
    prior: Condition | None = None
    out: list[tuple[str, str]] = []
    for i, ratio in enumerate(ratios):
        at = T0 + i * spec.autoscaling.interval_seconds
        measured, (status, reason, message) = evaluate(reading(ratio, at=at), spec, measured, prior)
        prior = Condition(
            type="KVTransportDegraded",
            status=status,
            reason=reason,
            message=message,
            last_transition_time="2027-01-15T08:00:00Z",
        )
        out.append((status, reason))
    return out


HEALTHY = ("False", "BandwidthHealthy")
DEGRADED = ("True", "BandwidthBelowThreshold")
UNKNOWN = ("Unknown", "NotEnoughTransfers")


@pytest.mark.parametrize(
    ("name", "ratios", "expected"),
    [
        ("healthy", [1.0, 0.9], [HEALTHY, HEALTHY]),
        ("at the threshold is healthy", [0.5], [HEALTHY]),
        (
            "degraded after three slow readings",
            [1.0, 0.1, 0.1, 0.1],
            [
                HEALTHY,
                ("False", "BandwidthBelowThresholdPending"),
                ("False", "BandwidthBelowThresholdPending"),
                DEGRADED,
            ],
        ),
        (
            "one slow window never flips it",
            [1.0, 0.1, 1.0, 0.1, 0.1, 1.0],
            [
                HEALTHY,
                ("False", "BandwidthBelowThresholdPending"),
                HEALTHY,
                ("False", "BandwidthBelowThresholdPending"),
                ("False", "BandwidthBelowThresholdPending"),
                HEALTHY,
            ],
        ),
        (
            "recovers on a healthy reading",
            [0.1, 0.1, 0.1, 0.8],
            [
                ("Unknown", "BandwidthBelowThresholdPending"),
                ("Unknown", "BandwidthBelowThresholdPending"),
                DEGRADED,
                HEALTHY,
            ],
        ),
        (
            "no transfer is unknown and restarts the count",
            [0.1, 0.1, None, 0.1, 0.1, 0.1],
            [
                ("Unknown", "BandwidthBelowThresholdPending"),
                ("Unknown", "BandwidthBelowThresholdPending"),
                UNKNOWN,
                ("Unknown", "BandwidthBelowThresholdPending"),
                ("Unknown", "BandwidthBelowThresholdPending"),
                DEGRADED,
            ],
        ),
        (
            "stays degraded",
            [0.2] * 5,
            [*[("Unknown", "BandwidthBelowThresholdPending")] * 2, *[DEGRADED] * 3],
        ),
        # Light load: windows with too few transfers hold the verdict (no flapping, no Events) for
        # HOLD_INTERVALS intervals after the last judged reading, then it is unknown.
        ("healthy holds over light load", [1.0, None, None, 1.0, None], [HEALTHY] * 5),
        (
            "degraded holds over light load",
            [0.1, 0.1, 0.1, None, None],
            [*[("Unknown", "BandwidthBelowThresholdPending")] * 2, *[DEGRADED] * 3],
        ),
        (
            "held for the hold, then unknown",
            [1.0, *[None] * HOLD_INTERVALS],
            [*[HEALTHY] * HOLD_INTERVALS, UNKNOWN],
        ),
        (
            "a pending count is not a verdict to hold",
            [0.1, None],
            [("Unknown", "BandwidthBelowThresholdPending"), UNKNOWN],
        ),
    ],
)
def test_sequences(name: str, ratios: list[float | None], expected: list[tuple[str, str]]) -> None:
    assert run(ratios) == expected


def test_the_threshold_is_the_specs() -> None:
    assert run([0.7] * DEGRADED_READINGS, degradedBelowPercent=80)[-1] == DEGRADED
    assert run([0.7] * DEGRADED_READINGS, degradedBelowPercent=70)[-1] == HEALTHY


def test_the_message_has_the_figures() -> None:
    spec = pdd().spec
    measured = KVTransportMeasurement(observed_at=T0 - 5, window_seconds=10, link_gbps=100, readings_below=2)
    got, (status, reason, message) = evaluate(reading(0.1), spec, measured, None)
    assert (status, reason) == DEGRADED
    assert "effective KV bandwidth 10 Gb/s, 10% of the configured 100 Gb/s (threshold 50%)" in message
    assert "over 20 transfers above 32 MiB in the last 10s" in message
    assert got.readings_below == 3
    assert got.bandwidth_percent == 10
    assert got.effective_gbps == 10


@pytest.mark.parametrize(
    ("r", "reason"),
    [
        (
            reading(None, missing=("kv_bytes: Prometheus at http://127.0.0.1:9 unreachable",)),
            "MetricsUnavailable",
        ),
        (reading(None, nixl=False), "NoNIXLMetrics"),
        (reading(None), "NotEnoughTransfers"),
    ],
)
def test_unknown(r: KvTransportReading, reason: str) -> None:
    got, (status, why, _) = evaluate(r, pdd().spec, None, None)
    assert (status, why) == ("Unknown", reason)
    assert got.readings_below == 0
    assert got.bandwidth_percent is None


@pytest.mark.parametrize(
    ("observed", "last_read", "now", "expected"),
    [
        (None, None, T0, True),
        (T0 - 4.9, None, T0, False),
        (T0 - 5, None, T0, True),
        (T0 - 60, T0 - 2, T0, False),  # the status is stale, but this process read 2 s ago
        (T0 + 30, None, T0, True),  # a clock that went back
    ],
)
def test_due(observed: float | None, last_read: float | None, now: float, expected: bool) -> None:
    measured = (
        None
        if observed is None
        else KVTransportMeasurement(observed_at=observed, window_seconds=10, link_gbps=1)
    )
    assert due(measured, 5.0, now, last_read) is expected


# --- the step, with a scripted Prometheus ---------------------------------------------------------


class ScriptedReader:
    """Answers `read_kv_transport`'s queries with windows of explicit transfers."""

    def __init__(self) -> None:
        self.transfers: list[tuple[float, float]] = []
        self.runs: list[float] = []

    def run(self, queries: Mapping[str, str], at: float) -> tuple[dict[str, Any], dict[str, str]]:
        self.runs.append(at)
        sizes, times = [b for b, _ in self.transfers], [s for _, s in self.transfers]

        def scalar(v: float) -> list[dict[str, Any]]:
            return [{"metric": {}, "value": [at, str(v)]}]

        def hist(values: list[float], bounds: Sequence[float]) -> list[dict[str, Any]]:
            return [
                {
                    "metric": {"le": "+Inf" if math.isinf(le) else str(le)},
                    "value": [at, str(sum(1 for v in values if v <= le))],
                }
                for le in (*bounds, math.inf)
            ]

        answers = {
            "kv_series": scalar(1),
            "kv_transfers": scalar(len(sizes)),
            "kv_failed": scalar(0),
            "kv_seconds": scalar(sum(times)),
            "kv_bytes": scalar(sum(sizes)),
            "kv_seconds_buckets": hist(times, NIXL_XFER_BUCKETS),
            "kv_bytes_buckets": hist(sizes, NIXL_BYTES_BUCKETS),
        }
        return {name: answers[name] for name in queries}, {}


def status_with(previous: PDDeploymentStatus | None, outcome: Any) -> PDDeploymentStatus:
    base = previous or PDDeploymentStatus()
    conditions = [c for c in base.conditions if c.type != "KVTransportDegraded"]
    if outcome.condition is not None:
        status, reason, message = outcome.condition
        conditions.append(
            Condition(
                type="KVTransportDegraded",
                status=status,
                reason=reason,
                message=message,
                last_transition_time="2027-01-15T08:00:00Z",
            )
        )
    else:
        conditions = list(base.conditions)
    kv = base.kv_transfer.model_copy(update={"measured": outcome.measured})
    return base.model_copy(update={"conditions": conditions, "kv_transfer": kv})


def serving(reader: ScriptedReader) -> Callable[[str, float], ScriptedReader]:
    """A `reader_for` that gives `reader` for the spec's Prometheus and its timeout only."""

    def reader_for(url: str, timeout: float) -> ScriptedReader:
        assert (url, timeout) == (PROMETHEUS, 5.0)
        return reader

    return reader_for


def test_step_reads_once_per_interval_and_posts_events_on_change() -> None:
    reader = ScriptedReader()
    check = KvTransportCheck(None, serving(reader))
    obj = pdd()
    link = 100e9 / 8  # bytes/s
    healthy: list[tuple[float, float]] = [(256 * MiB, 256 * MiB / link)] * 10
    slow: list[tuple[float, float]] = [(256 * MiB, 10 * 256 * MiB / link)] * 10
    status: PDDeploymentStatus | None = None
    seen: list[tuple[float, str | None, list[str]]] = []
    for k in range(12):
        now = T0 + 2.5 * k  # passes every 2.5 s, interval 5 s
        reader.transfers = slow if 2 <= k < 9 else healthy
        outcome = check.step(obj, status, now)
        status = status_with(status, outcome)
        seen.append(
            (now, outcome.condition[0] if outcome.condition else None, [e[1] for e in outcome.events])
        )
    assert reader.runs == [T0 + 5 * i for i in range(6)]  # once per interval
    conditions = [c for _, c, _ in seen]
    assert conditions[1::2] == [None] * 6  # between reads the condition is left as it is
    events = [e for _, _, evs in seen for e in evs]
    assert events == ["KVTransportHealthy", "KVTransportDegraded", "KVTransportHealthy"]
    assert status is not None
    assert status.kv_transfer.measured is not None
    assert status.kv_transfer.measured.bandwidth_percent == 100


def test_without_prometheus_or_p_d_nothing_is_read_or_set() -> None:
    obj = pdd()
    obj.spec.autoscaling.prometheus.url = None
    reader = ScriptedReader()
    got = KvTransportCheck(None, serving(reader)).step(obj, None, T0)
    assert (got.measured, got.condition, got.events) == (None, None, [])
    colocated = pdd()
    colocated.spec.serving.mode = ServingMode.Colocated
    check = KvTransportCheck(PROMETHEUS, serving(reader))
    assert check.step(colocated, None, T0).condition is None
    assert reader.runs == []


def test_an_idle_deployment_keeps_its_status_as_it_is() -> None:
    reader = ScriptedReader()  # no transfer at all
    check = KvTransportCheck(None, serving(reader))
    obj = pdd()
    first = check.step(obj, None, T0)
    status = status_with(None, first)
    second = check.step(obj, status, T0 + 5)
    assert len(reader.runs) == 2
    assert second.measured == first.measured  # observedAt included: nothing to write
    assert second.condition == first.condition
    assert second.condition is not None
    assert second.condition[:2] == ("Unknown", "NotEnoughTransfers")
    assert second.events == []


def test_failed_metrics_are_unknown_at_once_even_after_a_verdict() -> None:
    spec = pdd().spec
    measured, condition = evaluate(reading(1.0), spec, None, None)
    prior = Condition(
        type="KVTransportDegraded",
        status=condition[0],
        reason=condition[1],
        message=condition[2],
        last_transition_time="2027-01-15T08:00:00Z",
    )
    unreachable = ("kv_bytes: Prometheus at http://127.0.0.1:9 unreachable",)
    _, held = evaluate(reading(None, at=T0 + 5), spec, measured, prior)
    _, failed = evaluate(reading(None, missing=unreachable, at=T0 + 5), spec, measured, prior)
    assert held == condition  # message and all: nothing to write
    assert failed[:2] == ("Unknown", "MetricsUnavailable")
