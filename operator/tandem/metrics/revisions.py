"""A revision rollout's analysis window from Prometheus: the new and the old serving revision's P/D
pairs over the same interval, as a `judge.Window`.

The routers count every finished P/D request by the revision of the pair that served it
(`tandem_router_revision_requests_total{revision, code}`, and within both SLO targets
`tandem_router_revision_requests_within_slo_total{revision}`; the legacy revision is `legacy`) and
time its successful ones (`tandem_router_revision_time_to_first_token_seconds`,
`..._time_per_output_token_seconds`, by `revision`), and count the requests the weights meant for a
revision that another revision's pair served because the one meant had no ready pair
(`tandem_router_revision_stood_in_total{wanted}`: the arm's requests, each failed). Per arm:
requests, attainment, error rate, TTFT and TPOT at the SLO's quantile (reported, as for a mode
rollout), and from the engines' NIXL metrics of that revision's pods (`tandem_dev_revision`, the pod
label; none on the legacy pods) the KV-transfer failure rate and bandwidth ratio (judged, as for the
P/D arm of a mode rollout).
The queries, the arms' figures and the read are `metrics/arms.py`'s, shared with the mode rollout
(`metrics/rollout.py`); this module names the series (`REVISIONS`) and the revisions' labels.
`revision_queries` and `build_revision_window` are pure; `read_revision_window` never raises (a
failed query is named in `metrics_missing`, which `judge()` turns into Inconclusive; a failed KV
read leaves the KV figures unjudged).
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
from tandem.metrics.queries import DEFAULT_QUANTILE, Result
from tandem.metrics.reader import QueryRunner
from tandem.rollout.judge import Window

__all__ = [
    "LEGACY_LABEL",
    "REVISIONS",
    "KvFigures",
    "build_revision_window",
    "pod_revision_label",
    "read_revision_window",
    "revision_label",
    "revision_queries",
]

LEGACY_LABEL: Final = "legacy"  # the router's revision label value for the legacy revision

REVISIONS: Final = ArmSeries(
    prefix="revision",
    label="revision",
    requests="tandem_router_revision_requests_total",
    within_slo="tandem_router_revision_requests_within_slo_total",
    ttft="tandem_router_revision_time_to_first_token_seconds",
    tpot="tandem_router_revision_time_per_output_token_seconds",
    what="P/D requests on each serving revision",
    stood_in="tandem_router_revision_stood_in_total",
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
    return arm_queries(REVISIONS, namespace, pdd_name, window_seconds, quantile)


def build_revision_window(
    results: Mapping[str, Result],
    errors: Mapping[str, str],
    *,
    now: float,
    window_seconds: float,
    target: str,
    baseline: str,
    slo_set: bool,
    target_kv: KvFigures = NOT_JUDGED,
    baseline_kv: KvFigures = NOT_JUDGED,
) -> Window:
    """`target`/`baseline`: the router's revision labels of the new and the old pair."""
    return build_arm_window(
        results,
        errors,
        series=REVISIONS,
        now=now,
        window_seconds=window_seconds,
        target=target,
        baseline=baseline,
        slo_set=slo_set,
        target_kv=target_kv,
        baseline_kv=baseline_kv,
    )


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
    return read_arm_window(
        reader,
        REVISIONS,
        namespace,
        pdd_name,
        target=Arm(target, reads_kv=target_pods is not None, kv_revision=target_pods),
        baseline=Arm(baseline, reads_kv=baseline_pods is not None, kv_revision=baseline_pods),
        window_seconds=window_seconds,
        now=now,
        slo_set=slo_set,
        quantile=quantile,
        spec=spec,
    )
