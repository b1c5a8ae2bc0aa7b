"""The GitOps examples in docs/examples stay true: the Argo CD snippet is health.lua verbatim, Flux
paths and health checks point at things that exist, the example model is examples/sim-pd.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .helm import CHART, REPO

DOCS = REPO / "docs" / "examples"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_argocd_snippet_is_health_lua_verbatim() -> None:
    patch = docs(DOCS / "argocd" / "argocd-cm-patch.yaml")[0]
    script = patch["data"]["resource.customizations.health.tandem.dev_PDDeployment"]
    assert script == (CHART / "health.lua").read_text()


def test_argocd_applications_point_at_the_chart_and_the_models() -> None:
    apps = {a["metadata"]["name"]: a for a in docs(DOCS / "argocd" / "application.yaml")}
    assert (REPO / apps["tandem-operator"]["spec"]["source"]["path"] / "Chart.yaml").exists()
    assert (REPO / apps["tandem-models"]["spec"]["source"]["path"] / "kustomization.yaml").exists()
    waves = [int(a["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]) for a in apps.values()]
    assert waves == sorted(waves)


def test_flux_kustomizations_reference_existing_paths_and_models() -> None:
    flux = DOCS / "flux"
    kustomizations = {k["metadata"]["name"]: k for k in docs(flux / "kustomizations.yaml")}
    for k in kustomizations.values():
        assert (REPO / k["spec"]["path"] / "kustomization.yaml").exists(), k["spec"]["path"]
    models = kustomizations["tandem-models"]
    assert models["spec"]["dependsOn"] == [{"name": "tandem-operator"}]
    assert kustomizations["tandem-operator"]["spec"]["wait"] is True
    applied = {
        d["metadata"]["name"]: d for d in docs(flux / "models" / "sim-pd.yaml") if d["kind"] == "PDDeployment"
    }
    for check in models["spec"]["healthChecks"]:
        assert check["apiVersion"] == "tandem.dev/v1alpha1"
        assert check["kind"] == "PDDeployment"
        assert check["name"] in applied
        assert check["namespace"] == models["spec"]["targetNamespace"]
    release = docs(flux / "operator" / "helmrelease.yaml")[0]
    assert (REPO / release["spec"]["chart"]["spec"]["chart"] / "Chart.yaml").exists()


def test_flux_model_is_the_sim_example() -> None:
    ours = docs(DOCS / "flux" / "models" / "sim-pd.yaml")[0]
    example = docs(REPO / "examples" / "sim-pd.yaml")[0]
    assert ours["spec"] == example["spec"]
    assert "namespace" not in ours["metadata"]


def test_flux_helmrelease_values_pass_the_chart_schema() -> None:
    from .helm import template

    release = docs(DOCS / "flux" / "operator" / "helmrelease.yaml")[0]
    rendered = template(release["spec"]["values"])
    assert rendered.get("Deployment", "tandem", "tandem-system")["spec"]["replicas"] == 2
