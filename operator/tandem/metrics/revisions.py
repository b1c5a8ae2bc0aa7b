"""A revision rollout's analysis window from Prometheus: the new and the old serving revision's P/D
pairs over the same interval, as a `judge.Window`.

The routers count every finished P/D request by the revision of the pair that served it
(`tandem_router_revision_requests_total{revision, code}`, and within both SLO targets
`tandem_router_revision_requests_within_slo_total{revision}`; the legacy revision is `legacy`) and
time its successful ones (`tandem_router_revision_time_to_first_token_seconds`,
`..._time_per_output_token_seconds`, by `revision`). Per arm: requests, attainment, error rate,
TTFT and TPOT at the SLO's quantile (reported, as for a mode rollout), and from the engines' NIXL
metrics of that revision's pods (`tandem_dev_revision`, the pod label; none on the legacy pods) the
KV-transfer failure rate and bandwidth ratio (judged, as for the P/D arm of a mode rollout).
`revision_queries` and `build_revision_window` are pure; `read_revision_window` never raises (a
failed query is named in `metrics_missing`, which `judge()` turns into Inconclusive; a failed KV
read leaves the KV figures unjudged).
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

LEGACY_LABEL: Final = "legacy"  # the router's revision label value for the legacy revision

REVISION_QUERIES: Final[tuple[Query, ...]] = (
    Query(
        "revision_requests",
        "sum by (revision) (increase(tandem_router_revision_requests_total SEL [WINDOW]))",
        "P/D requests finished on each serving revision in the window",
    ),
    Query(
        "revision_within_slo",
        "sum by (revision) (increase(tandem_router_revision_requests_within_slo_total SEL [WINDOW]))",
        "P/D requests within both SLO targets on each serving revision in the window",
    ),
)
REVISION_LATENCY_QUERIES: Final[tuple[Query, ...]] = (
    Query(
        "revision_ttft",
        "histogram_quantile(QUANTILE, sum by (revision, le)"
        " (rate(tandem_router_revision_time_to_first_token_seconds_bucket SEL [WINDOW])))",
        "TTFT at the SLO's quantile on each serving revision",
    ),
    Query(
        "revision_tpot",
        "histogram_quantile(QUANTILE, sum by (revision, le)"
        " (rate(tandem_router_revision_time_per_output_token_seconds_bucket SEL [WINDOW])))",
        "TPOT at the SLO's quantile on each serving revision",
    ),
)
REVISION_ERRORS: Final = Query(
    "revision_errors",
    "sum by (revision) (increase(tandem_router_revision_requests_total SEL [WINDOW]))",
    "P/D requests that failed (5xx) on each serving revision in the window",
)


def revision_label(revision_id: str, legacy: bool) -> str:
    """The routers' `revision` label value of a revision."""
    return LEGACY_LABEL if legacy else revision_id


def pod_revision_label(revision_id: str, legacy: bool) -> str:
    """The engines' `tandem_dev_revision` value of a revision's pods ("": the legacy pods have none)."""
    return "" if legacy else revision_id


def revision_queries(
    namespace: str, pdd_name: str, window_seconds: float, quantile: float = DEFAULT_QUANTILE
) -> dict[str, str]:
    window = duration(window_seconds)
    routers = router_selector(namespace, pdd_name)
    errors = selector(namespace=namespace, **{LABEL_PDD: pdd_name, LABEL_ROLE: ROUTER_ROLE, "code": "5xx"})
    out = {q.name: q.render(routers, window) for q in REVISION_QUERIES}
    out |= {q.name: q.render(routers, window, quantile) for q in REVISION_LATENCY_QUERIES}
    out[REVISION_ERRORS.name] = REVISION_ERRORS.render(errors, window)
    return out


@dataclass(frozen=True, slots=True)
class KvFigures:
    """One revision's KV transport over the window (None: not judged)."""

    failure_rate: float | None = None
    bandwidth_ratio: float | None = None


def _count(values: Mapping[str, float], label: str) -> float:
    value = values.get(label, 0.0)
    return value if math.isfinite(value) and value > 0 else 0.0


def _latency(values: Mapping[str, float], label: str) -> float | None:
    value = values.get(label)
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def arm_of(results: Mapping[str, Result], label: str, kv: KvFigures = KvFigures()) -> ArmWindow:
    requests = _count(by_label(results.get("revision_requests") or [], "revision"), label)
    within = _count(by_label(results.get("revision_within_slo") or [], "revision"), label)
    errors = _count(by_label(results.get("revision_errors") or [], "revision"), label)
    return ArmWindow(
        requests=round(requests),
        attainment=min(1.0, within / requests) if requests > 0 else None,
        ttft_seconds=_latency(by_label(results.get("revision_ttft") or [], "revision"), label),
        tpot_seconds=_latency(by_label(results.get("revision_tpot") or [], "revision"), label),
        error_rate=min(1.0, errors / requests) if requests > 0 else 0.0,
        kv_failure_rate=kv.failure_rate,
        kv_bandwidth_ratio=kv.bandwidth_ratio,
    )


def build_revision_window(
    results: Mapping[str, Result],
    errors: Mapping[str, str],
    *,
    now: float,
    window_seconds: float,
    target: str,
    baseline: str,
    slo_set: bool,
    target_kv: KvFigures = KvFigures(),
    baseline_kv: KvFigures = KvFigures(),
) -> Window:
    """`target`/`baseline`: the router's revision labels of the new and the old pair."""
    missing = failed_queries(errors)
    if not slo_set:
        missing.append("spec.slo is not set: the routers count no request within SLO")
    return Window(
        start=now - window_seconds,
        end=now,
        target=arm_of(results, target, target_kv),
        baseline=arm_of(results, baseline, baseline_kv),
        metrics_missing=tuple(missing),
    )


def _kv(
    reader: QueryRunner,
    spec: PDDeploymentSpec | None,
    namespace: str,
    pdd_name: str,
    window_seconds: float,
    now: float,
    pod_label: str | None,
) -> KvFigures:
    """A revision's KV figures; its own failed queries leave them unjudged (the arm is still judged
    on what the routers saw), as for a mode rollout."""
    if spec is None or pod_label is None:
        return KvFigures()
    reading = read_kv_transport(
        reader, namespace, pdd_name, window_seconds, now, spec=spec, revision=pod_label
    )
    if reading.missing:
        return KvFigures()
    return KvFigures(reading.failure_rate, reading.bandwidth_ratio)


def read_revision_window(
    reader: QueryRunner,
    namespace: str,
    pdd_name: str,
    *,
    target: str,
    baseline: str,
    window_seconds: float,
    now: float,
    slo_set: bool,
    quantile: float = DEFAULT_QUANTILE,
    spec: PDDeploymentSpec | None = None,
    target_pods: str | None = None,
    baseline_pods: str | None = None,
) -> Window:
    """`target_pods`/`baseline_pods`: the revisions' pod labels (`pod_revision_label`) to read their
    KV transport with `spec`'s link; None: not read."""
    results, errors = reader.run(revision_queries(namespace, pdd_name, window_seconds, quantile), now)
    kv_args = (reader, spec, namespace, pdd_name, window_seconds, now)
    return build_revision_window(
        results,
        errors,
        now=now,
        window_seconds=window_seconds,
        target=target,
        baseline=baseline,
        slo_set=slo_set,
        target_kv=_kv(*kv_args, target_pods),
        baseline_kv=_kv(*kv_args, baseline_pods),
    )
