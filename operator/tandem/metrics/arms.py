"""One analysis window of two arms from the routers' per-arm series, as a `judge.Window`.

A rollout compares two arms over the same interval: a mode rollout the routers' two paths
(`tandem_router_requests_total{path}`, ...; `metrics/rollout.py`), a revision rollout the serving
revisions of the P/D pairs (`tandem_router_revision_requests_total{revision}`, ...;
`metrics/revisions.py`). Both are one family of router series (`ArmSeries`): finished requests by
arm and HTTP status class, those within both SLO targets, and TTFT / TPOT histograms. Per arm:
requests (Prometheus' extrapolated increase, rounded), attainment, error rate (code 5xx), TTFT and
TPOT at the SLO's quantile, and, for an arm judged on its KV transport, the failure rate and
bandwidth ratio of the engines' NIXL metrics (`metrics/kv_transport.py`; its own failed queries
leave the KV figures unjudged: the arm is still judged on what the routers saw). The paths' family
also counts the requests meant for an arm that the other arm served because this one had no ready pod
(`tandem_router_path_stood_in_total{wanted}`): they are the arm's requests, each failed and not within
SLO, so an arm that loses its pods fails its windows at any load instead of leaving them short of
samples.

`arm_queries` and `build_arm_window` are pure; `read_arm_window` never raises: a failed query is
named in `Window.metrics_missing`, which `judge()` turns into Inconclusive (never a Pass).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from tandem.api.models import PDDeploymentSpec
from tandem.metrics.kv_transport import read_kv_transport
from tandem.metrics.queries import (
    DEFAULT_QUANTILE,
    LABEL_PDD,
    LABEL_ROLE,
    ROUTER_ROLE,
    Query,
    Result,
    by_label,
    duration,
    failed_queries,
    router_selector,
    selector,
)
from tandem.metrics.reader import QueryRunner
from tandem.rollout.judge import ArmWindow, Window


@dataclass(frozen=True, slots=True)
class ArmSeries:
    """One family of the routers' per-arm series. Its queries are named `<prefix>_requests`,
    `_within_slo`, `_errors`, `_ttft`, `_tpot`."""

    prefix: str  # of the query names
    label: str  # the label whose value names an arm
    requests: str  # counter of finished requests, by `label` and `code`
    within_slo: str  # counter of requests within both SLO targets, by `label`
    ttft: str  # histograms (without `_bucket`), by `label`
    tpot: str
    what: str  # the requests counted, "... on each <arm>", for the queries' meanings
    # Counter of requests meant for an arm that the other arm served (it had no ready pod), by `wanted`;
    # None: the family has none (each arm's requests are only what it served).
    stood_in: str | None = None

    def queries(self) -> tuple[Query, ...]:
        """`_errors` is `_requests` over the 5xx selector (`arm_queries`)."""
        by, by_le = f"sum by ({self.label})", f"sum by ({self.label}, le)"
        return (
            Query(
                f"{self.prefix}_requests",
                f"{by} (increase({self.requests} SEL [WINDOW]))",
                f"finished {self.what} in the window",
            ),
            Query(
                f"{self.prefix}_within_slo",
                f"{by} (increase({self.within_slo} SEL [WINDOW]))",
                f"{self.what} within both SLO targets in the window",
            ),
            Query(
                f"{self.prefix}_errors",
                f"{by} (increase({self.requests} SEL [WINDOW]))",
                f"{self.what} that failed (5xx) in the window",
            ),
            *(
                ()
                if self.stood_in is None
                else (
                    Query(
                        f"{self.prefix}_stood_in",
                        f"sum by (wanted) (increase({self.stood_in} SEL [WINDOW]))",
                        f"{self.what} meant for it that the other arm served (no ready pod)",
                    ),
                )
            ),
            Query(
                f"{self.prefix}_ttft",
                f"histogram_quantile(QUANTILE, {by_le} (rate({self.ttft}_bucket SEL [WINDOW])))",
                f"TTFT at the SLO's quantile of the {self.what}",
            ),
            Query(
                f"{self.prefix}_tpot",
                f"histogram_quantile(QUANTILE, {by_le} (rate({self.tpot}_bucket SEL [WINDOW])))",
                f"TPOT at the SLO's quantile of the {self.what}",
            ),
        )


@dataclass(frozen=True, slots=True)
class KvFigures:
    """One arm's KV transport over the window (None: not judged)."""

    failure_rate: float | None = None
    bandwidth_ratio: float | None = None


NOT_JUDGED: Final = KvFigures()


@dataclass(frozen=True, slots=True)
class Arm:
    """One arm to read: its value of the series' label and whether it is judged on its KV transport."""

    value: str
    reads_kv: bool = False  # a P/D arm: its KV transport is read with the spec's link
    kv_revision: str | None = None  # ... over only this serving revision's pods (None: all the deployment's)


def arm_queries(
    series: ArmSeries,
    namespace: str,
    pdd_name: str,
    window_seconds: float,
    quantile: float = DEFAULT_QUANTILE,
) -> dict[str, str]:
    """Query name -> PromQL over one PDDeployment's routers."""
    window = duration(window_seconds)
    routers = router_selector(namespace, pdd_name)
    errors = selector(namespace=namespace, **{LABEL_PDD: pdd_name, LABEL_ROLE: ROUTER_ROLE, "code": "5xx"})
    return {
        q.name: q.render(errors if q.name == f"{series.prefix}_errors" else routers, window, quantile)
        for q in series.queries()
    }


def _count(values: Mapping[str, float], arm: str) -> float:
    value = values.get(arm, 0.0)
    return value if math.isfinite(value) and value > 0 else 0.0


def _latency(values: Mapping[str, float], arm: str) -> float | None:
    value = values.get(arm)
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def arm_window(
    results: Mapping[str, Result], series: ArmSeries, arm: str, kv: KvFigures = NOT_JUDGED
) -> ArmWindow:
    """One arm's `ArmWindow` from the answers of `arm_queries`."""

    def values(query: str, label: str = series.label) -> dict[str, float]:
        return by_label(results.get(f"{series.prefix}_{query}") or [], label)

    stood_in = round(_count(values("stood_in", "wanted"), arm))  # meant for the arm, served by the other
    requests = _count(values("requests"), arm) + stood_in
    within = _count(values("within_slo"), arm)
    errors = _count(values("errors"), arm) + stood_in
    return ArmWindow(
        requests=round(requests),
        attainment=min(1.0, within / requests) if requests > 0 else None,
        ttft_seconds=_latency(values("ttft"), arm),
        tpot_seconds=_latency(values("tpot"), arm),
        error_rate=min(1.0, errors / requests) if requests > 0 else 0.0,
        stood_in=stood_in,
        kv_failure_rate=kv.failure_rate,
        kv_bandwidth_ratio=kv.bandwidth_ratio,
    )


def build_arm_window(
    results: Mapping[str, Result],
    errors: Mapping[str, str],
    *,
    series: ArmSeries,
    now: float,
    window_seconds: float,
    target: str,
    baseline: str,
    slo_set: bool,
    target_kv: KvFigures = NOT_JUDGED,
    baseline_kv: KvFigures = NOT_JUDGED,
) -> Window:
    """The `Window` ending at `now`; `target`/`baseline`: the arms' values of the series' label."""
    missing = failed_queries(errors)
    if not slo_set:
        missing.append("spec.slo is not set: the routers count no request within SLO")
    return Window(
        start=now - window_seconds,
        end=now,
        target=arm_window(results, series, target, target_kv),
        baseline=arm_window(results, series, baseline, baseline_kv),
        metrics_missing=tuple(missing),
    )


def kv_figures(
    reader: QueryRunner,
    spec: PDDeploymentSpec | None,
    namespace: str,
    pdd_name: str,
    window_seconds: float,
    now: float,
    arm: Arm,
) -> KvFigures:
    """An arm's KV figures (none without `spec` or for an arm not judged on its KV transport); its own
    failed queries leave them unjudged."""
    if spec is None or not arm.reads_kv:
        return NOT_JUDGED
    reading = read_kv_transport(
        reader, namespace, pdd_name, window_seconds, now, spec=spec, revision=arm.kv_revision
    )
    if reading.missing:
        return NOT_JUDGED
    return KvFigures(reading.failure_rate, reading.bandwidth_ratio)


def read_arm_window(
    reader: QueryRunner,
    series: ArmSeries,
    namespace: str,
    pdd_name: str,
    *,
    target: Arm,
    baseline: Arm,
    window_seconds: float,
    now: float,
    slo_set: bool,
    quantile: float = DEFAULT_QUANTILE,
    spec: PDDeploymentSpec | None = None,
) -> Window:
    """Both arms over `window_seconds` ending at `now` (unix seconds): the routers' queries, then the
    target's KV transport, then the baseline's (with `spec`'s link); never raises."""
    results, errors = reader.run(arm_queries(series, namespace, pdd_name, window_seconds, quantile), now)
    kv_args = (reader, spec, namespace, pdd_name, window_seconds, now)
    return build_arm_window(
        results,
        errors,
        series=series,
        now=now,
        window_seconds=window_seconds,
        target=target.value,
        baseline=baseline.value,
        slo_set=slo_set,
        target_kv=kv_figures(*kv_args, target),
        baseline_kv=kv_figures(*kv_args, baseline),
    )
