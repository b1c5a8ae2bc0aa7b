"""A revision rollout's analysis window from Prometheus: the new and the old serving revision's P/D
pairs over the same interval, as a `judge.Window`.

The routers count every finished P/D request by the revision of the pair that served it
(`tandem_router_revision_requests_total{revision, code}`, and within both SLO targets
`tandem_router_revision_requests_within_slo_total{revision}`; the legacy revision is `legacy`).
Judged per arm: requests, attainment, error rate. TTFT/TPOT quantiles and the KV-transfer figures
are not split by revision (None: not judged). `revision_queries` and `build_revision_window` are
pure; `read_revision_window` never raises (a failed query is named in `metrics_missing`, which
`judge()` turns into Inconclusive).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from tandem.metrics.prometheus import PrometheusReader
from tandem.metrics.queries import (
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
REVISION_ERRORS: Final = Query(
    "revision_errors",
    "sum by (revision) (increase(tandem_router_revision_requests_total SEL [WINDOW]))",
    "P/D requests that failed (5xx) on each serving revision in the window",
)


def revision_label(revision_id: str, legacy: bool) -> str:
    return LEGACY_LABEL if legacy else revision_id


def revision_queries(namespace: str, pdd_name: str, window_seconds: float) -> dict[str, str]:
    window = duration(window_seconds)
    routers = router_selector(namespace, pdd_name)
    errors = selector(namespace=namespace, **{LABEL_PDD: pdd_name, LABEL_ROLE: ROUTER_ROLE, "code": "5xx"})
    out = {q.name: q.render(routers, window) for q in REVISION_QUERIES}
    out[REVISION_ERRORS.name] = REVISION_ERRORS.render(errors, window)
    return out


def _count(values: Mapping[str, float], label: str) -> float:
    value = values.get(label, 0.0)
    return value if math.isfinite(value) and value > 0 else 0.0


def arm_of(results: Mapping[str, Result], label: str) -> ArmWindow:
    requests = _count(by_label(results.get("revision_requests") or [], "revision"), label)
    within = _count(by_label(results.get("revision_within_slo") or [], "revision"), label)
    errors = _count(by_label(results.get("revision_errors") or [], "revision"), label)
    return ArmWindow(
        requests=round(requests),
        attainment=min(1.0, within / requests) if requests > 0 else None,
        error_rate=min(1.0, errors / requests) if requests > 0 else 0.0,
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
) -> Window:
    """`target`/`baseline`: the router's revision labels of the new and the old pair."""
    missing = failed_queries(errors)
    if not slo_set:
        missing.append("spec.slo is not set: the routers count no request within SLO")
    return Window(
        start=now - window_seconds,
        end=now,
        target=arm_of(results, target),
        baseline=arm_of(results, baseline),
        metrics_missing=tuple(missing),
    )


def read_revision_window(
    reader: PrometheusReader,
    namespace: str,
    pdd_name: str,
    *,
    target: str,
    baseline: str,
    window_seconds: float,
    now: float,
    slo_set: bool,
) -> Window:
    results, errors = reader.run(revision_queries(namespace, pdd_name, window_seconds), now)
    return build_revision_window(
        results,
        errors,
        now=now,
        window_seconds=window_seconds,
        target=target,
        baseline=baseline,
        slo_set=slo_set,
    )
