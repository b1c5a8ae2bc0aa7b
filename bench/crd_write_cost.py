"""What one write costs the apiserver, by kind: why the operator's own writes weigh more than its
children's.

The operator writes each PDDeployment's status (two or three merge patches while it converges), and
the bench's client creates the PDDeployments; `bench/operator_scale.py`'s floor makes neither. A
PDDeployment is a custom resource with a large schema and its CEL rules, which the apiserver
evaluates on every write, a status patch included (the spec's rules too, the spec unchanged). This
bench times, on one dev cluster with nothing else running on it, `--writes` requests of each kind,
16 at a time, and prints each kind's writes per second and its cost as a multiple of a
ServiceAccount's apply measured in the same run:

- ServiceAccount and Service server-side applies (two of the twelve children; a Service allocates a
  cluster IP);
- PDDeployment creates (server-side apply of examples/sim-pd.yaml under new names) and status merge
  patches (the fields a first pass writes), with the CRD as shipped, each spec rule on the object it
  reads (`crdgen.place_rule`);
- the same two with every spec rule on `spec` itself (the CRD before that placement), then with the
  CRD's CEL rules (`x-kubernetes-validations`) removed, each on a namespace of its own of the same
  cluster after the CRD is replaced: what the placement saves, and what the rules cost.

    .venv/bin/python bench/crd_write_cost.py [--writes 300] [--rounds 2]
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from tandem.api import crdgen
from tandem.controller.reconcile import KINDS
from tandem.devcluster import cluster as devcluster
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.layout import ClusterDir
from tandem.devcluster.testing import install_crd
from tandem.kube.rest import PDDEPLOYMENT, KubeRest, load_api_client

REPO = Path(__file__).parents[1]
CRD = REPO / "crds" / "pddeployment.yaml"
EXAMPLE = REPO / "examples" / "sim-pd.yaml"
PARALLEL = 16
FIRST_STATUS = {
    "phase": "Progressing",
    "observedGeneration": 1,
    "conditions": [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Progressing",
            "message": "waiting for prefill, decode, router",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ],
}


def without_cel(schema: Any) -> Any:
    """`schema` with every `x-kubernetes-validations` list removed, at any depth."""
    if isinstance(schema, dict):
        return {k: without_cel(v) for k, v in schema.items() if k != "x-kubernetes-validations"}
    if isinstance(schema, list):
        return [without_cel(v) for v in schema]
    return schema


def rate(write: Callable[[int], object], writes: int) -> float:
    """Writes per second of `write(i)` for i in range(writes), PARALLEL at a time."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        started = time.monotonic()
        list(pool.map(write, range(writes)))
        return writes / (time.monotonic() - started)


def measure(cluster: ClusterHandle, rest: KubeRest, args: argparse.Namespace) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    rows: dict[str, list[float]] = {}

    def kinds(ns: str, tag: str) -> dict[str, Callable[[int], object]]:
        def service_account(i: int) -> object:
            body = {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": f"sa-{tag}{i}", "namespace": ns},
            }
            return rest.apply(KINDS["ServiceAccount"], body)

        def service(i: int) -> object:
            body = {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": f"svc-{tag}{i}", "namespace": ns},
                "spec": {"ports": [{"port": 8000}], "selector": {"app": f"a{i}"}},
            }
            return rest.apply(KINDS["Service"], body)

        def pdd_create(i: int) -> object:
            body = copy.deepcopy(example)
            body["metadata"] = {"name": f"pdd-{tag}{i}", "namespace": ns}
            return rest.apply(PDDEPLOYMENT, body)

        def pdd_status(i: int) -> object:
            return rest.patch_status(PDDEPLOYMENT, ns, f"pdd-{tag}{i}", FIRST_STATUS)

        return {
            "ServiceAccount apply": service_account,
            "Service apply": service,
            "PDDeployment create": pdd_create,
            "PDDeployment status patch": pdd_status,
        }

    for number in range(args.rounds):
        ns = f"cost-{number}"
        cluster.kubectl("create", "namespace", ns)
        for what, write in kinds(ns, "r").items():
            rows.setdefault(what, []).append(rate(write, args.writes))
    variants = {
        "every rule on spec": crdgen.crd(place_rules=False),
        "no CEL rules": without_cel(yaml.safe_load(CRD.read_text())),
    }
    for tag, (variant, crd) in zip("un", variants.items(), strict=True):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "crd.yaml"
            path.write_text(yaml.safe_dump(crd))
            install_crd(cluster, path)
        for number in range(args.rounds):
            ns = f"{tag}-{number}"
            cluster.kubectl("create", "namespace", ns)
            for what, write in kinds(ns, tag).items():
                if what.startswith("PDDeployment"):
                    rows.setdefault(f"{what}, {variant}", []).append(rate(write, args.writes))
    base = sum(rows["ServiceAccount apply"]) / len(rows["ServiceAccount apply"])
    print(
        f"{args.writes} writes of each kind, {PARALLEL} at a time, {args.rounds} rounds (writes/s per round)"
    )
    for what, rates in rows.items():
        mean = sum(rates) / len(rates)
        each = ", ".join(f"{r:.0f}" for r in rates)
        print(f"  {what:42s} {mean:7.0f}/s ({each})  cost {base / mean:4.1f}x a ServiceAccount apply")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        cdir = ClusterDir(Path(tmp))
        devcluster.up(cdir, pod_runner=False, owner_pid=os.getpid())
        try:
            cluster = ClusterHandle.from_dir(cdir.path, owned=True)
            install_crd(cluster, CRD)
            os.environ["KUBECONFIG"] = str(cdir.kubeconfig)
            rest = KubeRest(load_api_client(pool_size=PARALLEL + 4), field_manager="bench-cost")
            measure(cluster, rest, args)
        finally:
            devcluster.down(cdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
