"""The KV-transport check of a reconcile pass: is the P->D link as fast as `spec.kvTransfer` says?

Once per `spec.autoscaling.intervalSeconds` (the autoscaler's interval, whether or not autoscaling is
on), where a Prometheus URL is known (`spec.autoscaling.prometheus.url`, else the operator's
`--prometheus-url`; without one the transport is not watched and the condition is not set) and the
deployment serves P/D, the pass reads the engines' NIXL metrics over
the last `window_seconds(spec)` (`tandem.metrics.kv_transport`) and sets `KVTransportDegraded`:

- True (BandwidthBelowThreshold) once DEGRADED_READINGS judged readings in a row put the
  effective bandwidth of the transfers over `kvTransfer.minJudgedTransferBytes` below
  `kvTransfer.degradedBelowPercent` of `kvTransfer.bandwidthGbps`: one slow window (a burst, a
  noisy neighbour, a scrape landing mid-transfer) never sets it;
- False (BandwidthHealthy) on the first judged reading at or over the threshold;
- Unknown when nothing can be judged (no Prometheus, failed queries, no NIXL metrics); the count of
  readings below restarts. Too few large transfers in a window (light load) holds the last verdict,
  True or False, for HOLD_INTERVALS intervals after the last judged reading (`judgedAt`), then goes
  Unknown: at light load the condition (and its Events) would otherwise flap between a verdict and
  Unknown every few windows.

A reading below the threshold short of DEGRADED_READINGS keeps the status and says so
(reason BandwidthBelowThresholdPending). The figures and the count live in
`status.kvTransfer.measured` (so an operator restart keeps them; `observedAt` is the reading that
produced them: a reading with the same figures changes nothing, so status is not rewritten); a
read is due when the last is an interval old (kept in memory too, so a pass that sees a stale or
unchanged status does not read again).
An Event is posted when the condition's status changes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from tandem.api.models import PDDeployment, PDDeploymentSpec, ServingMode
from tandem.api.status import Condition, ConditionType, KVTransportMeasurement, PDDeploymentStatus
from tandem.controller import metrics
from tandem.metrics import ReaderFactory
from tandem.metrics.kv_transport import KvTransportReading, read_kv_transport
from tandem.status.derive import ConditionValue

log = logging.getLogger(__name__)

DEGRADED_READINGS = 3  # judged readings in a row below the threshold before the condition is set
HOLD_INTERVALS = 10  # a verdict outlives readings with too few transfers for this many intervals


def window_seconds(spec: PDDeploymentSpec) -> float:
    """Two intervals: at the 5 s minimum, a 10 s window holds several scrapes at usual intervals."""
    return 2.0 * spec.autoscaling.interval_seconds


def applicable(spec: PDDeploymentSpec) -> bool:
    """KV moves from prefill to decode: P/D serving, or a rollout that runs both arms."""
    return spec.serving.mode is ServingMode.Disaggregated or spec.rollout is not None


def due(
    previous: KVTransportMeasurement | None, interval: float, now: float, last_read: float | None
) -> bool:
    """A read is due once the last (in status, or in this process's memory) is an interval old."""
    for at in (previous.observed_at if previous else None, last_read):
        if at is not None and 0 <= now - at < interval:
            return False
    return True


def _sig3(x: float) -> float:
    """Three significant digits: the figure a status shows, steady under a steady link."""
    return float(f"{x:.3g}")


def _size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def evaluate(
    reading: KvTransportReading,
    spec: PDDeploymentSpec,
    previous: KVTransportMeasurement | None,
    prior: Condition | None,
) -> tuple[KVTransportMeasurement, ConditionValue]:
    """This reading's measurement and the condition it sets (pure; `prior`: the condition as it stands)."""
    kv = spec.kv_transfer
    threshold = kv.degraded_below_percent / 100.0
    ratio = reading.bandwidth_ratio
    below = ratio is not None and ratio < threshold
    count = (previous.readings_below if previous else 0) + 1 if below else 0
    judged_at = reading.observed_at if ratio is not None else previous.judged_at if previous else None
    measured = _measurement(reading, count, judged_at)
    failures = (
        f"; {reading.failed_transfers:.0f} of {reading.transfers:.0f} transfers failed"
        if reading.transfers > 0
        else ""
    )
    effective = reading.effective_gbps
    if ratio is None or effective is None:
        return measured, _not_judged(reading, spec, prior, judged_at, failures)
    figures = _figures(reading, ratio, effective, kv.degraded_below_percent, failures)
    if not below:
        return measured, ("False", "BandwidthHealthy", figures)
    if count >= DEGRADED_READINGS:
        return measured, (
            "True",
            "BandwidthBelowThreshold",
            f"{figures}; below the threshold in {count} readings in a row (a silent TCP fallback?)",
        )
    status = prior.status if prior is not None else "Unknown"
    return measured, (
        status,
        "BandwidthBelowThresholdPending",
        f"{figures}; below the threshold in {count} of the {DEGRADED_READINGS} readings in a row needed",
    )


def _measurement(reading: KvTransportReading, count: int, judged_at: float | None) -> KVTransportMeasurement:
    """status.kvTransfer.measured for a reading, at the precision status shows."""
    ratio = reading.bandwidth_ratio
    return KVTransportMeasurement(
        observed_at=reading.observed_at,
        window_seconds=round(reading.window_seconds),
        transfers=round(reading.transfers),
        failed_transfers=round(reading.failed_transfers),
        judged_transfers=round(reading.judged_transfers),
        effective_gbps=None if reading.effective_gbps is None else _sig3(reading.effective_gbps),
        link_gbps=round(reading.link_gbps, 3),
        bandwidth_percent=None if ratio is None else round(ratio * 100),
        readings_below=count,
        judged_at=judged_at,
    )


def _not_judged(
    reading: KvTransportReading,
    spec: PDDeploymentSpec,
    prior: Condition | None,
    judged_at: float | None,
    failures: str,
) -> ConditionValue:
    """The condition when the reading cannot be judged: why, or the verdict held at light load."""
    if reading.missing:
        return ("Unknown", "MetricsUnavailable", "; ".join(reading.missing)[:1000])
    if not reading.nixl_metrics:
        return ("Unknown", "NoNIXLMetrics", "no engine pod exports vllm:nixl_* metrics")
    held = (
        prior is not None
        and prior.status in ("True", "False")
        and judged_at is not None
        and 0 <= reading.observed_at - judged_at < HOLD_INTERVALS * spec.autoscaling.interval_seconds
    )
    if held and prior is not None:  # the verdict as it stands, message and all: no write, no Event
        return (prior.status, prior.reason, prior.message)
    text = f"not judged over the last {reading.window_seconds:.0f}s: {reading.not_judged}{failures}"
    return ("Unknown", "NotEnoughTransfers", text)


def _figures(
    reading: KvTransportReading, ratio: float, effective: float, threshold_percent: int, failures: str
) -> str:
    """What a judged reading measured, for the condition's message."""
    floor = reading.effective_gbps_floor
    between = (
        f"at least {floor:.3g} and at most {effective:.3g} Gb/s"
        if floor is not None and floor < 0.95 * effective
        else f"{effective:.3g} Gb/s"
    )
    return (
        f"effective KV bandwidth {between}, {ratio * 100:.0f}% of the configured {reading.link_gbps:.4g} Gb/s"
        f" (threshold {threshold_percent}%), over {reading.judged_transfers:.0f} transfers above"
        f" {_size(reading.judged_above_bytes)} in the last {reading.window_seconds:.0f}s{failures}"
    )


@dataclass
class KvOutcome:
    measured: KVTransportMeasurement | None  # status.kvTransfer.measured after this pass
    condition: ConditionValue | None  # None: leave KVTransportDegraded as it is
    requeue_after: float | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


def _events(prior: Condition | None, condition: ConditionValue) -> list[tuple[str, str, str]]:
    status, _, message = condition
    if prior is not None and prior.status == status:
        return []
    if status == "True":
        return [("Warning", "KVTransportDegraded", message)]
    if status == "False":
        return [("Normal", "KVTransportHealthy", message)]
    if prior is not None:  # True or False -> Unknown: say why it is no longer known
        return [("Normal", "KVTransportUnknown", message)]
    return []


class KvTransportCheck:
    """The I/O around `evaluate()`; one per operator, shared by the workers."""

    def __init__(self, prometheus_url: str | None, reader_for: ReaderFactory) -> None:
        """`reader_for(url, timeout)` gives the reader of a Prometheus: the autoscaler's
        (`Autoscaler.reader`), so both share one per Prometheus."""
        self.prometheus_url = prometheus_url or None
        self._reader = reader_for
        self._last_read: dict[tuple[str, str], float] = {}

    def step(self, pdd: PDDeployment, previous: PDDeploymentStatus | None, now: float) -> KvOutcome:
        spec = pdd.spec
        measured = previous.kv_transfer.measured if previous is not None else None
        conditions = previous.conditions if previous is not None else []
        prior = next((c for c in conditions if c.type == ConditionType.KVTransportDegraded), None)
        url = spec.autoscaling.prometheus.url or self.prometheus_url
        if not applicable(spec) or not url:
            # Colocated (no KV moves) or no Prometheus to read: not watched; a condition set
            # before is left as it was, the figures are dropped.
            return KvOutcome(None, None)
        key = (pdd.metadata.namespace, pdd.metadata.name)
        interval = float(spec.autoscaling.interval_seconds)
        if not due(measured, interval, now, self._last_read.get(key)):
            last = max(measured.observed_at if measured else 0.0, self._last_read.get(key, 0.0))
            return KvOutcome(measured, None, requeue_after=max(1.0, last + interval - now))
        self._last_read[key] = now
        started = time.monotonic()
        try:
            reader = self._reader(url, spec.autoscaling.prometheus.timeout_seconds)
            reading = read_kv_transport(reader, key[0], key[1], window_seconds(spec), now, spec=spec)
        except Exception as exc:  # the reader never raises for a failed query; this is a bug or a crash
            log.warning("%s/%s: KV transport from %s: %s", key[0], key[1], url, exc)
            metrics.PROMETHEUS_ERRORS.labels(query="kv_transport").inc()
            why = f"Prometheus at {url}: {exc}"[:1000]
            condition: ConditionValue = ("Unknown", "MetricsUnavailable", why)
            return KvOutcome(measured, condition, interval, _events(prior, condition))
        if reading.missing:
            metrics.PROMETHEUS_ERRORS.labels(query="kv_transport").inc()
        log.debug("%s/%s: KV transport read in %.3fs", key[0], key[1], time.monotonic() - started)
        new, condition = evaluate(reading, spec, measured, prior)
        if measured is not None and new.model_copy(update={"observed_at": measured.observed_at}) == measured:
            new = measured  # the same figures: keep the status as it is (no write for a timestamp)
        return KvOutcome(new, condition, interval, _events(prior, condition))

    def forget(self, namespace: str, name: str) -> None:
        self._last_read.pop((namespace, name), None)
