"""The Grafana dashboard ConfigMap: off by default, on with the sidecar's label, the chart's JSON."""

from __future__ import annotations

import json

from tandem.dashboard.model import Dashboard
from tandem.dashboard.panels import dashboard

from .helm import template, template_error

NS = "tandem-system"


def test_no_dashboard_by_default() -> None:
    assert not [o for o in template().of_kind("ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]


def test_dashboard_configmap_carries_the_sidecar_label_and_the_json() -> None:
    r = template({"dashboards": {"enabled": True}})
    cm = r.get("ConfigMap", "tandem-dashboard", NS)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(cm["data"]["tandem.json"])
    assert shipped == dashboard()
    Dashboard.model_validate(shipped)


def test_label_namespace_and_annotations_are_configurable() -> None:
    values = {
        "dashboards": {
            "enabled": True, "namespace": "monitoring", "label": "grafana.example/dashboard",
            "labelValue": "tandem", "annotations": {"grafana_folder": "LLM"},
        }
    }  # fmt: skip
    cm = template(values).get("ConfigMap", "tandem-dashboard", "monitoring")
    assert cm["metadata"]["labels"]["grafana.example/dashboard"] == "tandem"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}


def test_bad_dashboard_values_are_refused() -> None:
    assert "label" in template_error({"dashboards": {"enabled": True, "label": "bad label!"}})
    assert "dashboards" in template_error({"dashboards": {"enabled": "yes"}})


def test_operator_podmonitor_keeps_the_gauges_namespace_label() -> None:
    pm = template({"podMonitor": {"enabled": True}}).get("PodMonitor", "tandem", NS)
    assert pm["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
