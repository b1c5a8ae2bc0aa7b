"""The shipped dashboard JSON: current with its definition, valid against the model of Grafana's JSON,
every query PromQL-shaped and selecting what the routers, engines and operator export."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from tandem.dashboard.model import Dashboard, substitute, variables_in
from tandem.dashboard.panels import CHART_FILE, dashboard, dashboard_json


def test_chart_file_is_current() -> None:
    assert CHART_FILE.read_text() == dashboard_json(), "run `python -m tandem.dashboard.panels`"


def test_valid_against_the_model() -> None:
    model = Dashboard.model_validate(json.loads(CHART_FILE.read_text()))
    titles = [p.title for p in model.query_panels()]
    for wanted in (
        "TTFT by input length: P/D", "TTFT by input length: colocated", "TPOT by output length: P/D",
        "TPOT by output length: colocated", "KV transfer time (NIXL)", "Refusals by reason", "Pool sizes",
        "GPUs by pool", "Autoscaler decisions", "Rollout weight", "Requests by tenant",
        "Share of P/D requests by prefill side", "Prefill choices by reason", "TTFT by prefill side",
        "TPOT by prefill side",
    ):  # fmt: skip
        assert wanted in titles


def test_percentiles_of_every_bucketed_panel() -> None:
    for panel in Dashboard.model_validate(dashboard()).query_panels():
        if panel.title.startswith(("TTFT by", "TPOT by")):
            assert [t.expr.split(",")[0] for t in panel.targets] == [
                "histogram_quantile(0.5", "histogram_quantile(0.95", "histogram_quantile(0.99",
            ]  # fmt: skip


def _broken(change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(dashboard())
    change(doc)
    return doc


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["panels"][1].update(id=1), "panel ids repeat"),
        (lambda d: d["panels"][1]["gridPos"].update(x=20), "leaves the 24-column grid"),
        (lambda d: d["panels"][1]["targets"][0].update(expr='up{x="$nope"}'), "nope"),
        (lambda d: d["panels"][1]["targets"][1].update(refId="A"), "repeats a refId"),
        (lambda d: d["panels"][1].update(targets=[]), "has no query"),
        (lambda d: d["panels"][1].update(type="graph"), "type"),
    ],
)
def test_the_model_catches_broken_dashboards(change: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Dashboard.model_validate(_broken(change))


def test_queries_balance_and_name_known_metrics() -> None:
    known = re.compile(r"^(tandem_router_|tandem_operator_|vllm:)")
    for panel in Dashboard.model_validate(dashboard()).query_panels():
        for target in panel.targets:
            expr = target.expr
            for opening, closing in ("()", "{}", "[]"):
                assert expr.count(opening) == expr.count(closing), expr
            metrics = re.findall(r"([a-z_:]+)(?:\{|\[)", expr)
            assert metrics, expr
            assert all(known.match(m) for m in metrics), expr
            assert variables_in(expr) <= {"namespace", "pddeployment", "__rate_interval"}


def test_substitute_replaces_longest_names_first() -> None:
    assert (
        substitute(
            "x[$__range_s] $__range ${namespace}", {"__range": "5m", "__range_s": "300", "namespace": "a"}
        )
        == "x[300] 5m a"
    )
