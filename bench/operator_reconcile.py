"""Operator figures on the local control plane: apply-to-children and apply-to-Ready times, and
API writes during a steady state.

Starts a dev cluster (or uses the one named by TANDEM_KUBECONFIG), installs the CRD, runs
`tandem operator`, applies an example, and prints:
- seconds from `kubectl apply` to every child object existing, and to Ready=True;
- write requests the apiserver served for PDDeployments and their child kinds during the steady
  state (from the apiserver's own `apiserver_request_total`), and the operator's passes meanwhile.

    .venv/bin/python bench/operator_reconcile.py [--example examples/sim-pd.yaml] [--steady-seconds 300]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from tandem.devcluster import cluster as devcluster
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.layout import ClusterDir
from tandem.devcluster.testing import OperatorProcess

REPO = Path(__file__).parents[1]
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE"}
RESOURCES = {
    "pddeployments", "statefulsets", "deployments", "services", "poddisruptionbudgets",
    "serviceaccounts", "roles", "rolebindings", "events",
}  # fmt: skip


def writes(cluster: ClusterHandle) -> Counter[str]:
    """Write requests served so far, by verb and resource (the apiserver has no per-client count)."""
    totals: Counter[str] = Counter()
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if labels.get("verb") in WRITE_VERBS and labels.get("resource") in RESOURCES:
                totals[f"{labels['verb']} {labels['resource']}"] += int(float(line.rsplit(" ", 1)[1]))
    return totals


def operator_writes(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tandem_operator_api_writes_total{")
    )


def passes(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tandem_operator_reconciles_total{")
    )


def pdd(cluster: ClusterHandle, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "-n", namespace, "pdd", name, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def ready(obj: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions", [])}
    return (
        conds.get("Ready") == "True"
        and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
    )


def run(cluster: ClusterHandle, example: Path, steady_seconds: float) -> None:
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds" / "pddeployment.yaml")
    )
    cluster.kubectl("wait", "--for=condition=Established", "crd/pddeployments.tandem.dev", "--timeout=60s")
    log = Path(tempfile.mkdtemp(prefix="tandem-bench-operator-")) / "operator.log"
    operator = OperatorProcess(cluster, ["--lease-namespace", "default", "--resync-seconds", "60"], log)
    url = operator.url
    tandem = str(Path(sys.executable).with_name("tandem"))
    namespace = f"bench-{int(time.time())}"
    try:
        operator.wait_leader(timeout=60)
        cluster.kubectl("create", "namespace", namespace)
        doc = yaml.safe_load(example.read_text())
        doc["metadata"].pop("namespace", None)
        name = doc["metadata"]["name"]
        kinds = "statefulsets,deployments,services,poddisruptionbudgets,serviceaccounts,roles,rolebindings"
        rendered = subprocess.run(
            [tandem, "render", "-f", str(example)], capture_output=True, text=True, check=True
        ).stdout
        expected = len([d for d in yaml.safe_load_all(rendered) if d])

        started = time.monotonic()
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
        children_at = ready_at = None
        while time.monotonic() - started < 600 and ready_at is None:
            if children_at is None:
                items = json.loads(
                    cluster.kubectl(
                        "get", "-n", namespace, kinds, "-l", f"tandem.dev/pddeployment={name}", "-o", "json"
                    ).stdout
                )["items"]
                if len(items) >= expected:
                    children_at = time.monotonic() - started
            if ready(pdd(cluster, namespace, name)):
                ready_at = time.monotonic() - started
            time.sleep(0.2)
        print(f"example: {example.name} ({expected} child objects)")
        print(
            f"apply -> all children created: {children_at:.1f} s"
            if children_at
            else "children: not all created"
        )
        print(
            f"apply -> Ready=True (all pods ready): {ready_at:.1f} s"
            if ready_at
            else "Ready: not reached in 600 s"
        )

        time.sleep(5)
        before_writes, before_passes, before_own = writes(cluster), passes(url), operator_writes(url)
        time.sleep(steady_seconds)
        after_writes, after_passes, after_own = writes(cluster), passes(url), operator_writes(url)
        delta = after_writes - before_writes
        print(
            f"steady state {steady_seconds:.0f} s, {after_passes - before_passes:.0f} reconcile passes "
            f"(resync every 60 s): operator writes {after_own - before_own:.0f}; apiserver writes to "
            f"PDDeployments, child kinds and events from all clients {sum(delta.values())} {dict(delta)}"
        )
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        operator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--example", type=Path, default=REPO / "examples" / "sim-pd.yaml")
    parser.add_argument("--steady-seconds", type=float, default=300.0)
    parser.add_argument("--kubeconfig", type=Path, help="use this running dev cluster")
    args = parser.parse_args()
    if args.kubeconfig:
        run(ClusterHandle.from_kubeconfig(args.kubeconfig), args.example, args.steady_seconds)
        return 0
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        cdir = ClusterDir(Path(tmp))
        devcluster.up(cdir)
        try:
            run(ClusterHandle.from_dir(cdir.path, owned=True), args.example, args.steady_seconds)
        finally:
            devcluster.down(cdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
