"""Runs the helm binary from the tool cache on the chart, hermetically, and parses what it renders."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tandem.devcluster import layout

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tandem"
KUBE_VERSION = "1.36.0"


def helm_binary() -> Path:
    path = layout.bin_dir() / "helm"
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path} missing: run `make tools` (e2e/build-tools.sh)")
    return path


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": f"{home}/cache",
            "HELM_CONFIG_HOME": f"{home}/config",
            "HELM_DATA_HOME": f"{home}/data",
        }
        env.pop("KUBECONFIG", None)
        return subprocess.run(
            [str(helm_binary()), *args], env=env, capture_output=True, text=True, check=check, timeout=120
        )


@dataclass(frozen=True)
class Rendered:
    """The objects of one `helm template`, with lookups by kind and name."""

    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        for o in self.of_kind(kind):
            md = o["metadata"]
            if md["name"] == name and (namespace is None or md.get("namespace") == namespace):
                return o
        raise KeyError(f"no {kind} {name} in {[(o['kind'], o['metadata']['name']) for o in self.objects]}")

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)


def values_args(values: dict[str, Any] | None) -> list[str]:
    if not values:
        return []
    fd, path = tempfile.mkstemp(prefix="values-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(values, f)
    return ["--values", path]


def template(
    values: dict[str, Any] | None = None,
    *,
    release: str = "tandem",
    namespace: str = "tandem-system",
    extra: tuple[str, ...] = (),
) -> Rendered:
    args = values_args(values)
    try:
        out = run_helm(
            "template", release, str(CHART), "--namespace", namespace,
            "--kube-version", KUBE_VERSION, *args, *extra,
        )  # fmt: skip
    finally:
        for a in args[1:]:
            os.unlink(a)
    return Rendered([d for d in yaml.safe_load_all(out.stdout) if d])


def template_error(values: dict[str, Any]) -> str:
    """The error `helm template` prints for values it must reject; fails if it accepts them."""
    args = values_args(values)
    try:
        out = run_helm("template", "tandem", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    finally:
        os.unlink(args[1])
    assert out.returncode != 0, f"helm accepted values {values}"
    return out.stderr
