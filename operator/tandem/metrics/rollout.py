"""A rollout's analysis window from Prometheus: both arms over the same interval, as a `judge.Window`.

The routers label every finished request with the path it took (`disaggregated` or `colocated`),
so one set of router queries gives both arms: requests finished (`increase` of
`tandem_router_requests_total`), those that failed (code 5xx), those within both SLO targets, and
TTFT / TPOT at the SLO's quantile. The P/D arm's KV-transfer failure rate and bandwidth ratio
come from `tandem.metrics.kv_transport` (the engines' NIXL metrics; None when not judged).

`rollout_queries` and `build_window` are pure; `read_window` runs the queries and never raises: a
failed query is named in `Window.metrics_missing`, which `judge()` turns into Inconclusive (never a
Pass). Counts are Prometheus' extrapolated increases, rounded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from tandem.api.models import PDDeploymentSpec
from tandem.metrics.kv_transport import read_kv_transport
from tandem.metrics.queries import (
    LABEL_PDD,
    LABEL_ROLE,
    ROUTER_ROLE,
    Query,
    Result,
    by_label,
    duration,
    failed_queries,
    quantile_of,
    router_selector,
    selector,
)
from tandem.metrics.reader import QueryRunner
from tandem.rollout.judge import ArmWindow, Window
from tandem.signals import PATH_COLOCATED, PATH_DISAGGREGATED

ROLLOUT_QUERIES: Final[tuple[Query, ...]] = (
    Query(
        "rollout_requests",
        "sum by (path) (increase(tandem_router_requests_total SEL [WINDOW]))",
        "client requests finished on each path in the window",
    ),
    Query(
        "rollout_within_slo",
        "sum by (path) (increase(tandem_router_requests_within_slo_total SEL [WINDOW]))",
        "client requests within both SLO targets on each path in the window",
    ),
    Query(
        "rollout_ttft",
        "histogram_quantile(QUANTILE,"
        " sum by (path, le) (rate(tandem_router_time_to_first_token_seconds_bucket SEL [WINDOW])))",
        "TTFT at the SLO's quantile on each path",
    ),
    Query(
        "rollout_tpot",
        "histogram_quantile(QUANTILE,"
        " sum by (path, le) (rate(tandem_router_time_per_output_token_seconds_bucket SEL [WINDOW])))",
        "TPOT at the SLO's quantile on each path",
    ),
)
# Same as rollout_requests with code="5xx" (the selector differs, so it is not in the table above).
ERRORS_QUERY: Final = Query(
    "rollout_errors",
    "sum by (path) (increase(tandem_router_requests_total SEL [WINDOW]))",
    "client requests that failed (5xx) on each path in the window",
)

MODE_PATH: Final = {"Disaggregated": PATH_DISAGGREGATED, "Colocated": PATH_COLOCATED}


def rollout_queries(namespace: str, pdd_name: str, window_seconds: float, quantile: float) -> dict[str, str]:
    """Query name -> PromQL for one PDDeployment's analysis window."""
    window = duration(window_seconds)
    routers = router_selector(namespace, pdd_name)
    errors = selector(namespace=namespace, **{LABEL_PDD: pdd_name, LABEL_ROLE: ROUTER_ROLE, "code": "5xx"})
    out = {q.name: q.render(routers, window, quantile) for q in ROLLOUT_QUERIES}
    out[ERRORS_QUERY.name] = ERRORS_QUERY.render(errors, window, quantile)
    return out


def _count(values: Mapping[str, float], path: str) -> float:
    value = values.get(path, 0.0)
    return value if math.isfinite(value) and value > 0 else 0.0


def _latency(values: Mapping[str, float], path: str) -> float | None:
    value = values.get(path)
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def arm_from(
    results: Mapping[str, Result],
    path: str,
    *,
    kv_failure_rate: float | None = None,
    kv_bandwidth_ratio: float | None = None,
) -> ArmWindow:
    """One path's `ArmWindow` from the answers of `rollout_queries`."""
    requests = _count(by_label(results.get("rollout_requests") or [], "path"), path)
    within = _count(by_label(results.get("rollout_within_slo") or [], "path"), path)
    errors = _count(by_label(results.get("rollout_errors") or [], "path"), path)
    count = round(requests)
    return ArmWindow(
        requests=count,
        attainment=min(1.0, within / requests) if requests > 0 else None,
        ttft_seconds=_latency(by_label(results.get("rollout_ttft") or [], "path"), path),
        tpot_seconds=_latency(by_label(results.get("rollout_tpot") or [], "path"), path),
        error_rate=min(1.0, errors / requests) if requests > 0 else 0.0,
        kv_failure_rate=kv_failure_rate,
        kv_bandwidth_ratio=kv_bandwidth_ratio,
    )


def build_window(
    results: Mapping[str, Result],
    errors: Mapping[str, str],
    *,
    now: float,
    window_seconds: float,
    target_mode: str,
    slo_set: bool,
    kv_failure_rate: float | None = None,
    kv_bandwidth_ratio: float | None = None,
) -> Window:
    """The analysis `Window` ending at `now`: the target arm is `target_mode`'s path, the baseline the
    other. KV figures apply to the P/D arm only (a colocated arm moves no KV)."""
    missing = failed_queries(errors)
    if not slo_set:
        missing.append("spec.slo is not set: the routers count no request within SLO")
    target_path = MODE_PATH[target_mode]
    baseline_path = PATH_COLOCATED if target_path == PATH_DISAGGREGATED else PATH_DISAGGREGATED
    kv = {"kv_failure_rate": kv_failure_rate, "kv_bandwidth_ratio": kv_bandwidth_ratio}
    target = arm_from(results, target_path, **(kv if target_path == PATH_DISAGGREGATED else {}))
    baseline = arm_from(results, baseline_path, **(kv if baseline_path == PATH_DISAGGREGATED else {}))
    return Window(
        start=now - window_seconds,
        end=now,
        target=target,
        baseline=baseline,
        metrics_missing=tuple(missing),
    )


def _kv_reading(
    reader: QueryRunner, spec: PDDeploymentSpec, namespace: str, pdd_name: str, window: float, now: float
) -> tuple[float | None, float | None]:
    """(failure rate, bandwidth ratio) of the KV transport over the window (`metrics/kv_transport.py`).

    Its own failed queries are not "metrics unavailable" for the rollout: a colocated arm moves no KV
    and a P/D arm is still judged on what the routers saw; the figures are then None (not judged)."""
    reading = read_kv_transport(reader, namespace, pdd_name, window, now, spec=spec)
    if reading.missing:
        return None, None
    return reading.failure_rate, reading.bandwidth_ratio


def read_window(
    reader: QueryRunner,
    spec: PDDeploymentSpec,
    namespace: str,
    pdd_name: str,
    target_mode: str,
    window_seconds: float,
    now: float,
) -> Window:
    """Both arms over `window_seconds` ending at `now` (unix seconds); never raises."""
    quantile = quantile_of(spec.slo.attainment_percent if spec.slo is not None else None)
    results, errors = reader.run(rollout_queries(namespace, pdd_name, window_seconds, quantile), now)
    failure, ratio = _kv_reading(reader, spec, namespace, pdd_name, window_seconds, now)
    return build_window(
        results,
        errors,
        now=now,
        window_seconds=window_seconds,
        target_mode=target_mode,
        slo_set=spec.slo is not None,
        kv_failure_rate=failure,
        kv_bandwidth_ratio=ratio,
    )
