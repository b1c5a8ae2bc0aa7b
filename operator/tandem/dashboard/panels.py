"""The dashboard's panels and queries, in one table, and the JSON Grafana imports.

Variables: `datasource` (a Prometheus), `namespace` and `pddeployment` (multi-value: several
PDDeployments side by side). Routers and engines are selected by the pod labels the scrape copies
(`tandem_dev_pddeployment`, `tandem_dev_role`: see metrics/queries.py); the operator's gauges carry
`namespace` and `pddeployment` themselves. `python -m tandem.dashboard.panels` (or `tandem dashboard
json`) rewrites charts/tandem/dashboards/tandem.json; a test checks the file is current.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

UID: Final = "tandem-pd"
DATASOURCE: Final = {"type": "prometheus", "uid": "${datasource}"}
CHART_FILE: Final = Path(__file__).resolve().parents[3] / "charts" / "tandem" / "dashboards" / "tandem.json"
QUANTILES: Final = ((0.5, "p50"), (0.95, "p95"), (0.99, "p99"))

_SEL = 'namespace=~"$namespace", tandem_dev_pddeployment=~"$pddeployment"'
ROUTER: Final = _SEL + ', tandem_dev_role="router"'
OPERATOR: Final = 'namespace=~"$namespace", pddeployment=~"$pddeployment"'
# The operator's gauges as the leading replica sets them (a replica that lost the lease keeps its
# last values until it restarts).
LEADING: Final = " * on (instance) group_left () (tandem_operator_leader == 1)"


def leading(metric: str) -> str:
    return f"({metric}{{{OPERATOR}}}{LEADING})"


def engines(roles: str) -> str:
    return _SEL + f', tandem_dev_role=~"{roles}"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelDef:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    width: int = 12


def _quantiles(metric: str, sel: str, by: str, legend: str) -> tuple[Query, ...]:
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{sel}}}[$__rate_interval])))",
            f"{name} {legend}",
        )
        for q, name in QUANTILES
    )


def _bucketed(kind: str, path: str) -> tuple[Query, ...]:
    metric, by = (
        ("tandem_router_ttft_by_input_length_seconds", "input_length")
        if kind == "ttft"
        else ("tandem_router_tpot_by_output_length_seconds", "output_length")
    )
    return _quantiles(metric, f'{ROUTER}, path="{path}"', by, "{{" + by + "}}")


def _by_path(metric: str, by: str) -> tuple[Query, ...]:
    """p50, p95 and p99 of a router histogram per path and bucket label."""
    return _quantiles(metric, ROUTER, f"path, {by}", "{{path}} {{" + by + "}}")


DISAGGREGATION_REQUESTS: Final = "tandem_router_disaggregation_requests_total"
BY_DEPLOYMENT: Final = "namespace, tandem_dev_pddeployment"  # a share within each PDDeployment
PATH_NAMES: Final = {"disaggregated": "P/D", "colocated": "colocated"}
TITLES: Final = {"ttft": "TTFT by input length", "tpot": "TPOT by output length"}

ROWS: Final[tuple[tuple[str, tuple[PanelDef, ...]], ...]] = (
    (
        "Colocated vs P/D, by length bucket",
        tuple(
            PanelDef(
                f"{TITLES[kind]}: {PATH_NAMES[path]}",
                (
                    "Client-visible time to first token at the router, p50/p95/p99 per input-length bucket"
                    " (the engines' prompt token counts)."
                    if kind == "ttft"
                    else "Time per output token of each request at the router, p50/p95/p99 per"
                    " output-length bucket (the engines' completion token counts)."
                ),
                "s",
                _bucketed(kind, path),
            )
            for kind in ("ttft", "tpot")
            for path in ("disaggregated", "colocated")
        ),
    ),
    (
        "TPOT and ITL by output length and concurrency",
        (
            PanelDef(
                "ITL by output length",
                "Gaps between the router's reads that carried tokens, p50/p95/p99 per path and"
                " output-length bucket of the request (tandem_router_itl_by_output_length_seconds).",
                "s",
                _by_path("tandem_router_itl_by_output_length_seconds", "output_length"),
                width=8,
            ),
            PanelDef(
                "TPOT by concurrency",
                "Time per output token, p50/p95/p99 per path and concurrency bucket: the requests in"
                " flight at the router on the same path when the request arrived"
                " (tandem_router_tpot_by_concurrency_seconds).",
                "s",
                _by_path("tandem_router_tpot_by_concurrency_seconds", "concurrency"),
                width=8,
            ),
            PanelDef(
                "ITL by concurrency",
                "Gaps between reads that carried tokens, p50/p95/p99 per path and concurrency bucket"
                " (tandem_router_itl_by_concurrency_seconds).",
                "s",
                _by_path("tandem_router_itl_by_concurrency_seconds", "concurrency"),
                width=8,
            ),
        ),
    ),
    (
        "Remote or local prefill (spec.router.disaggregation)",
        (
            PanelDef(
                "Share of P/D requests by prefill side",
                "Of each PDDeployment's P/D requests finished, the share whose prompt was prefilled on a"
                " prefill pod (remote) or on their decode pod (local), by the mode that decided"
                " (tandem_router_disaggregation_requests_total; a disaggregation rollout's arms).",
                "percentunit",
                (
                    Query(
                        f"sum by ({BY_DEPLOYMENT}, mode, prefill) (rate({DISAGGREGATION_REQUESTS}"
                        f"{{{ROUTER}}}[$__rate_interval])) / ignoring (mode, prefill) group_left ()"
                        f" sum by ({BY_DEPLOYMENT}) (rate({DISAGGREGATION_REQUESTS}{{{ROUTER}}}"
                        "[$__rate_interval]))",
                        "{{tandem_dev_pddeployment}} {{mode}} {{prefill}}",
                    ),
                ),
                width=8,
            ),
            PanelDef(
                "Prefill choices by reason",
                "tandem_router_disaggregation_total: attempts per second by where the prompt was prefilled"
                " and why (always, below_threshold, too_long, local_cap, unmeasured, tpot_headroom,"
                " local_faster, remote_faster, no_prefill_ready, ...).",
                "reqps",
                (
                    Query(
                        f"sum by (prefill, reason) (rate(tandem_router_disaggregation_total{{{ROUTER}}}"
                        "[$__rate_interval]))",
                        "{{prefill}} {{reason}}",
                    ),
                ),
                width=16,
            ),
            PanelDef(
                "TTFT by prefill side",
                "Client-visible time to first token of P/D requests at the router, p50/p95/p99 by the mode"
                " that decided and the side that prefilled (tandem_router_disaggregation_ttft_seconds).",
                "s",
                _quantiles(
                    "tandem_router_disaggregation_ttft_seconds",
                    ROUTER,
                    "mode, prefill",
                    "{{mode}} {{prefill}}",
                ),
            ),
            PanelDef(
                "TPOT by prefill side",
                "Time per output token of P/D requests, p50/p95/p99 by mode and prefill side"
                " (tandem_router_disaggregation_tpot_seconds): a local prefill runs in the decode pod's"
                " steps.",
                "s",
                _quantiles(
                    "tandem_router_disaggregation_tpot_seconds",
                    ROUTER,
                    "mode, prefill",
                    "{{mode}} {{prefill}}",
                ),
            ),
        ),
    ),
    (
        "Queues and KV transfer",
        (
            PanelDef(
                "Engine queue time (prefill, decode, colocated)",
                "vLLM's vllm:request_queue_time_seconds per pool: the prefill queue, the decode queue"
                " (which includes the wait for the KV pull), the colocated queue.",
                "s",
                _quantiles(
                    "vllm:request_queue_time_seconds",
                    engines("prefill|decode|colocated"),
                    "tandem_dev_role",
                    "{{tandem_dev_role}}",
                )[:2],
            ),
            PanelDef(
                "KV transfer time (NIXL)",
                "vllm:nixl_xfer_time_seconds on the decode pods: one KV pull from a prefill pod.",
                "s",
                _quantiles("vllm:nixl_xfer_time_seconds", engines("decode"), "tandem_dev_role", "KV pull"),
            ),
            PanelDef(
                "Router legs: prefill leg, decode leg to its first token",
                "tandem_router_prefill_leg_seconds (successful legs) and"
                " tandem_router_decode_leg_first_token_seconds (decode queue + KV pull + one step on P/D;"
                " queue + prefill colocated), p95.",
                "s",
                (
                    Query(
                        "histogram_quantile(0.95, sum by (le) (rate(tandem_router_prefill_leg_seconds_bucket"
                        f'{{{ROUTER}, outcome="ok"}}[$__rate_interval])))',
                        "p95 prefill leg",
                    ),
                    Query(
                        "histogram_quantile(0.95, sum by (path, le) (rate("
                        f"tandem_router_decode_leg_first_token_seconds_bucket{{{ROUTER}}}[$__rate_interval])))",
                        "p95 decode leg to first token, {{path}}",
                    ),
                ),
                width=24,
            ),
        ),
    ),
    (
        "Tenants",
        (
            PanelDef(
                "Requests by tenant",
                "tandem_router_tenant_requests_total: requests per second by tenant, path and status class.",
                "reqps",
                (
                    Query(
                        f"sum by (tenant, path, code) (rate(tandem_router_tenant_requests_total{{{ROUTER}}}"
                        "[$__rate_interval]))",
                        "{{tenant}} {{path}} {{code}}",
                    ),
                ),
                width=8,
            ),
            PanelDef(
                "Tokens by tenant",
                "tandem_router_tenant_tokens_total: prompt and generated tokens per second by tenant.",
                "short",
                (
                    Query(
                        f"sum by (tenant, kind) (rate(tandem_router_tenant_tokens_total{{{ROUTER}}}"
                        "[$__rate_interval]))",
                        "{{tenant}} {{kind}}",
                    ),
                ),
                width=8,
            ),
            PanelDef(
                "Refusals by reason",
                "Requests the router answered itself: admission refusals (429,"
                " tandem_router_refusals_total by reason and tenant) and bad or unroutable requests"
                " (tandem_router_rejected_requests_total).",
                "reqps",
                (
                    Query(
                        f"sum by (reason, tenant) (rate(tandem_router_refusals_total{{{ROUTER}}}"
                        "[$__rate_interval]))",
                        "admission {{reason}} {{tenant}}",
                    ),
                    Query(
                        f"sum by (reason) (rate(tandem_router_rejected_requests_total{{{ROUTER}}}"
                        "[$__rate_interval]))",
                        "rejected {{reason}}",
                    ),
                ),
                width=8,
            ),
        ),
    ),
    (
        "Capacity and control",
        (
            PanelDef(
                "Requests by path",
                "tandem_router_requests_total: colocated and P/D requests per second by status class.",
                "reqps",
                (
                    Query(
                        f"sum by (path, code) (rate(tandem_router_requests_total{{{ROUTER}}}"
                        "[$__rate_interval]))",
                        "{{path}} {{code}}",
                    ),
                ),
                width=8,
            ),
            PanelDef(
                "Pool sizes",
                "Ready pods per pool (tandem_operator_pool_ready_replicas) and the size the autoscaler"
                " holds each pool at (tandem_operator_autoscaler_desired_replicas).",
                "short",
                (
                    Query(
                        f"sum by (pool) {leading('tandem_operator_pool_ready_replicas')}", "ready {{pool}}"
                    ),
                    Query(
                        f"sum by (pool) {leading('tandem_operator_autoscaler_desired_replicas')}",
                        "desired {{pool}}",
                    ),
                ),
                width=8,
            ),
            PanelDef(
                "GPUs by pool",
                "GPUs the desired replicas of each pool request (tandem_operator_pool_gpus).",
                "short",
                (Query(f"sum by (pool) {leading('tandem_operator_pool_gpus')}", "{{pool}}"),),
                width=8,
            ),
            PanelDef(
                "Autoscaler decisions",
                "tandem_operator_autoscaler_decisions_total: decisions per interval by pool and direction"
                " (up, down, hold), for every PDDeployment the operator sizes.",
                "short",
                (
                    Query(
                        "sum by (pool, direction) (increase(tandem_operator_autoscaler_decisions_total"
                        "[$__rate_interval]))",
                        "{{pool}} {{direction}}",
                    ),
                ),
            ),
            PanelDef(
                "Rollout weight",
                "Percent of requests the routers send P/D (tandem_operator_disaggregated_weight_percent:"
                " the gray rollout's weight, else 0 or 100 by mode) and percent of P/D requests on the"
                " current serving revision (tandem_operator_revision_weight_percent).",
                "percent",
                (
                    Query(
                        f"max by (pddeployment) {leading('tandem_operator_disaggregated_weight_percent')}",
                        "P/D share {{pddeployment}}",
                    ),
                    Query(
                        f"max by (pddeployment) {leading('tandem_operator_revision_weight_percent')}",
                        "current revision {{pddeployment}}",
                    ),
                ),
            ),
        ),
    ),
)


def _variables() -> list[dict[str, Any]]:
    def query_variable(name: str, label: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DATASOURCE,
            "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "definition": query,
            "refresh": 2,
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {"text": "All", "value": "$__all"},
            "sort": 1,
        }

    return [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
        },
        query_variable(
            "namespace",
            "Namespace",
            'label_values(tandem_router_requests_total{tandem_dev_role="router"}, namespace)',
        ),
        query_variable(
            "pddeployment",
            "PDDeployment",
            'label_values(tandem_router_requests_total{namespace=~"$namespace", tandem_dev_role="router"},'
            " tandem_dev_pddeployment)",
        ),
    ]


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    panels: list[dict[str, Any]] = []
    next_id, y = 1, 0
    for row_title, defs in ROWS:
        panels.append(
            {"id": next_id, "type": "row", "title": row_title, "collapsed": False, "panels": [],
             "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}}
        )  # fmt: skip
        next_id, y, x = next_id + 1, y + 1, 0
        for panel in defs:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(
                {
                    "id": next_id,
                    "type": "timeseries",
                    "title": panel.title,
                    "description": panel.description,
                    "datasource": DATASOURCE,
                    "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
                    "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
                    "targets": [
                        {"refId": chr(ord("A") + i), "expr": q.expr, "legendFormat": q.legend,
                         "datasource": DATASOURCE, "range": True}
                        for i, q in enumerate(panel.queries)
                    ],
                }
            )  # fmt: skip
            next_id, x = next_id + 1, x + panel.width
        y += 8
    return {
        "uid": UID,
        "title": "tandem: P/D serving",
        "description": "Colocated vs P/D latency per length bucket, queues and KV transfer, tenants, pools,"
        " autoscaler and rollout (docs/observability.md).",
        "tags": ["tandem", "vllm", "disaggregation"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "templating": {"list": _variables()},
        "annotations": {"list": []},
        "panels": panels,
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    CHART_FILE.parent.mkdir(parents=True, exist_ok=True)
    CHART_FILE.write_text(dashboard_json())
    print(f"wrote {CHART_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
