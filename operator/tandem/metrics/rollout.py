"""A rollout's analysis window from Prometheus: both arms over the same interval, as a `judge.Window`.

The routers label every finished request with the path it took (`disaggregated` or `colocated`),
so one set of router queries gives both arms: requests finished (`increase` of
`tandem_router_requests_total`), those that failed (code 5xx), those within both SLO targets, and
TTFT / TPOT at the SLO's quantile. The P/D arm's KV-transfer failure rate and bandwidth ratio
come from `tandem.metrics.kv_transport` (the engines' NIXL metrics; None when not judged).

The queries, the arms' figures and the read are `metrics/arms.py`'s, shared with the revision
rollout (`metrics/revisions.py`); this module names the series (`PATHS`) and which arm is the P/D one.
`rollout_queries` and `build_window` are pure; `read_window` runs the queries and never raises: a
failed query is named in `Window.metrics_missing`, which `judge()` turns into Inconclusive (never a
Pass). Counts are Prometheus' extrapolated increases, rounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from tandem.api.models import PDDeploymentSpec
from tandem.metrics.arms import (
    NOT_JUDGED,
    Arm,
    ArmSeries,
    KvFigures,
    arm_queries,
    build_arm_window,
    read_arm_window,
)
from tandem.metrics.queries import Result, quantile_of
from tandem.metrics.reader import QueryRunner
from tandem.rollout.judge import Window
from tandem.signals import PATH_COLOCATED, PATH_DISAGGREGATED

PATHS: Final = ArmSeries(
    prefix="rollout",
    label="path",
    requests="tandem_router_requests_total",
    within_slo="tandem_router_requests_within_slo_total",
    ttft="tandem_router_time_to_first_token_seconds",
    tpot="tandem_router_time_per_output_token_seconds",
    what="client requests on each path",
    stood_in="tandem_router_path_stood_in_total",
)

MODE_PATH: Final = {"Disaggregated": PATH_DISAGGREGATED, "Colocated": PATH_COLOCATED}


def rollout_queries(namespace: str, pdd_name: str, window_seconds: float, quantile: float) -> dict[str, str]:
    """Query name -> PromQL for one PDDeployment's analysis window."""
    return arm_queries(PATHS, namespace, pdd_name, window_seconds, quantile)


def _arms(target_mode: str) -> tuple[Arm, Arm]:
    """(target, baseline): the target is `target_mode`'s path, the baseline the other; the P/D arm
    is judged on the whole deployment's KV transport (a colocated arm moves no KV)."""
    target = MODE_PATH[target_mode]
    baseline = PATH_COLOCATED if target == PATH_DISAGGREGATED else PATH_DISAGGREGATED
    pd = PATH_DISAGGREGATED
    return Arm(target, reads_kv=target == pd), Arm(baseline, reads_kv=baseline == pd)


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
    target, baseline = _arms(target_mode)
    kv = KvFigures(kv_failure_rate, kv_bandwidth_ratio)
    return build_arm_window(
        results,
        errors,
        series=PATHS,
        now=now,
        window_seconds=window_seconds,
        target=target.value,
        baseline=baseline.value,
        slo_set=slo_set,
        target_kv=kv if target.reads_kv else NOT_JUDGED,
        baseline_kv=kv if baseline.reads_kv else NOT_JUDGED,
    )


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
    target, baseline = _arms(target_mode)
    return read_arm_window(
        reader,
        PATHS,
        namespace,
        pdd_name,
        target=target,
        baseline=baseline,
        window_seconds=window_seconds,
        now=now,
        slo_set=spec.slo is not None,
        quantile=quantile_of(spec.slo.attainment_percent if spec.slo is not None else None),
        spec=spec,
    )
