"""The operator at fleet scale: many PDDeployments on many fake GPU nodes, no pod processes.

Starts a dev cluster without the pod runner (KWOK makes every pod Ready at once, the routers'
too: `devcluster.up(pod_runner=False)`), creates `--nodes` fake 8-GPU nodes
(`tandem.devcluster.fleet`), runs `tandem operator` as a process, creates `--deployments`
PDDeployments, 8 requests at a time (`engine.type: vllm`, one prefill, one decode and one router
replica each, 12 child objects) spread over `--namespaces` namespaces, and prints:
- seconds from the first create until every PDDeployment is Ready=True at its generation;
- the operator's API requests per reconcile pass (its own client's counter,
  `tandem_operator_api_requests_total`, by method and resource), while converging and steady;
- the operator's RSS (VmRSS at the start and end, peak VmHWM) and CPU seconds (utime + stime from
  /proc/<pid>/stat), while converging and over the steady window;
- reconcile pass latency p50/p99 (interpolated in `tandem_operator_reconcile_duration_seconds`
  buckets, as Prometheus' histogram_quantile does);
- writes in a steady state of `--steady-seconds`: the apiserver's own `apiserver_request_total` for
  PDDeployments and the child kinds (every client), Events posted about anything but Nodes (the
  node controller posts the fleet's RegisteredNode Events for minutes), and the operator's own
  write counter.
  The operator runs with `--resync-seconds 30`, so the window holds full resyncs.

    nice -n 10 .venv/bin/python bench/operator_scale.py [--nodes 1000] [--deployments 100] \\
        [--namespaces 4] [--steady-seconds 60] [--workers N] [--child-event-delay S]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tandem.devcluster import cluster as devcluster
from tandem.devcluster import fleet, kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.layout import ClusterDir
from tandem.devcluster.testing import OperatorProcess

REPO = Path(__file__).parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def apiserver_writes(cluster: ClusterHandle) -> Counter[str]:
    """Writes the apiserver served for PDDeployments and their child kinds. Events are counted
    apart (`event_counts`): the node controller posts a thousand nodes' RegisteredNode Events
    rate-limited, for minutes after the nodes."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    return fleet.apiserver_writes(text, fleet.OPERATOR_RESOURCES - {"events"})


def event_counts(cluster: ClusterHandle) -> dict[str, int]:
    """Every Event about anything but a Node: uid -> count (a repeated Event bumps its count)."""
    items = json.loads(cluster.kubectl("get", "events", "-A", "-o", "json").stdout)["items"]
    return {
        e["metadata"]["uid"]: int(e.get("count") or 1)
        for e in items
        if (e.get("involvedObject") or {}).get("kind") != "Node"
    }


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            out.append((labels, float(line.rsplit(" ", 1)[1])))
    return out


@dataclass
class Snapshot:
    """The operator's counters and /proc figures at one moment."""

    at: float
    requests: Counter[str]
    writes: float
    passes: float
    buckets: dict[float, float]
    cpu_seconds: float
    rss_mb: float
    hwm_mb: float

    @classmethod
    def take(cls, operator: OperatorProcess) -> Snapshot:
        text = operator.metrics()
        requests: Counter[str] = Counter()
        for labels, value in samples(text, "tandem_operator_api_requests_total"):
            requests[f"{labels['method']} {labels['resource']}"] += int(value)
        buckets = {
            float(labels["le"]): value
            for labels, value in samples(text, "tandem_operator_reconcile_duration_seconds_bucket")
        }
        pid = operator.proc.pid
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / CLK_TCK  # utime, stime (fields 14, 15)
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        return cls(
            at=time.monotonic(),
            requests=requests,
            writes=sum(v for _, v in samples(text, "tandem_operator_api_writes_total")),
            passes=sum(v for _, v in samples(text, "tandem_operator_reconciles_total")),
            buckets=buckets,
            cpu_seconds=cpu,
            rss_mb=int(status["VmRSS"].split()[0]) / 1024,
            hwm_mb=int(status["VmHWM"].split()[0]) / 1024,
        )


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float:
    """histogram_quantile over the increase of cumulative buckets between two snapshots."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return float("nan")
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = bound, count
    return lower


def ready_at_generation(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return conds.get("Ready") == "True" and status.get("observedGeneration") == obj["metadata"]["generation"]


def report_phase(title: str, before: Snapshot, after: Snapshot) -> None:
    passes = after.passes - before.passes
    requests = after.requests - before.requests
    total = sum(requests.values())
    per = f"{total / passes:.1f}" if passes else "-"
    print(f"{title}: {after.at - before.at:.1f} s, {passes:.0f} reconcile passes")
    print(f"  operator API requests: {total} ({per} per pass) {dict(sorted(requests.items()))}")
    print(
        f"  reconcile pass p50 {quantile(0.5, before.buckets, after.buckets):.3f} s, "
        f"p99 {quantile(0.99, before.buckets, after.buckets):.3f} s"
    )
    print(
        f"  operator CPU {after.cpu_seconds - before.cpu_seconds:.1f} s; RSS {before.rss_mb:.0f} -> "
        f"{after.rss_mb:.0f} MB, peak (VmHWM) {after.hwm_mb:.0f} MB; operator writes "
        f"{after.writes - before.writes:.0f}"
    )


def run(cluster: ClusterHandle, args: argparse.Namespace) -> int:
    api = cluster.api_client()
    started = time.monotonic()
    fleet.create(api, fleet.fleet_nodes(args.nodes, _octet(cluster)))
    while fleet.ready_count(api) < args.nodes:
        if time.monotonic() - started > 600:
            print(f"only {fleet.ready_count(api)} of {args.nodes} nodes Ready after 600 s")
            return 1
        fleet.untaint(api)
        time.sleep(2)
    print(f"{args.nodes} fake GPU nodes created, Ready and untainted in {time.monotonic() - started:.1f} s")
    kube.apply_crd(api, yaml.safe_load((REPO / "crds" / "pddeployment.yaml").read_text()), timeout=300)
    namespaces = [f"scale-{i}" for i in range(args.namespaces)]
    for ns in namespaces:
        cluster.kubectl("create", "namespace", ns, check=False)
    log = Path(tempfile.mkdtemp(prefix="tandem-bench-scale-")) / "operator.log"
    flags = ["--lease-namespace", "default", "--resync-seconds", "30"]
    if args.workers:
        flags += ["--workers", str(args.workers)]
    if args.api_parallelism:
        flags += ["--api-parallelism", str(args.api_parallelism)]
    if args.child_event_delay is not None:
        flags += ["--child-event-delay-seconds", str(args.child_event_delay)]
    operator = OperatorProcess(cluster, flags, log)
    try:
        operator.wait_leader(timeout=120)
        idle = Snapshot.take(operator)
        docs: dict[str, list[dict[str, Any]]] = {ns: [] for ns in namespaces}
        for i in range(args.deployments):
            ns = namespaces[i % len(namespaces)]
            docs[ns].append(fleet.pddeployment(f"scale-{i}", ns))
        custom = client.CustomObjectsApi(api)

        def create(doc: dict[str, Any]) -> None:
            ns = doc["metadata"]["namespace"]
            custom.create_namespaced_custom_object("tandem.dev", "v1alpha1", ns, "pddeployments", doc)

        # Created 8 at a time, as a GitOps sync would (kubectl apply sends one object at a time).
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, [doc for items in docs.values() for doc in items]))
        applied = time.monotonic() - t0
        ready = 0
        peak_rss = 0.0
        converged_at = None
        while time.monotonic() - t0 < args.timeout:
            out = cluster.kubectl("get", "pdd", "-A", "-o", "json", check=False)
            if out.returncode == 0:
                ready = sum(1 for item in json.loads(out.stdout)["items"] if ready_at_generation(item))
            peak_rss = max(peak_rss, Snapshot.take(operator).rss_mb)
            if ready >= args.deployments:
                converged_at = time.monotonic() - t0
                break
            time.sleep(max(1.0, args.deployments / 200))  # the list itself weighs on the apiserver
        converged = Snapshot.take(operator)
        print(
            f"{args.deployments} PDDeployments in {len(namespaces)} namespaces on {args.nodes} nodes, "
            f"all created in {applied:.1f} s"
        )
        if converged_at is None:
            print(f"NOT converged: {ready} of {args.deployments} Ready after {args.timeout:.0f} s")
        else:
            print(f"first create -> every PDDeployment Ready=True at its generation: {converged_at:.1f} s")
        report_phase("converging", idle, converged)
        time.sleep(5)  # the last passes' status writes settle
        before_writes, before_events = apiserver_writes(cluster), event_counts(cluster)
        before = Snapshot.take(operator)
        time.sleep(args.steady_seconds)
        after_writes, after = apiserver_writes(cluster), Snapshot.take(operator)
        after_events = event_counts(cluster)
        delta = after_writes - before_writes
        new_events = sum(n - before_events.get(uid, 0) for uid, n in after_events.items())
        report_phase(f"steady state ({args.steady_seconds:.0f} s, resync every 30 s)", before, after)
        print(
            f"  apiserver writes to PDDeployments and child kinds, all clients: {sum(delta.values())} "
            f"{dict(delta)}; Events posted about anything but Nodes: {new_events}"
        )
        print(f"operator RSS peak while converging (sampled): {peak_rss:.0f} MB; log: {log}")
        return 0 if converged_at is not None else 1
    finally:
        operator.stop()
        kube.close(api)


def _octet(cluster: ClusterHandle) -> int:
    state = devcluster.load_state(ClusterDir(cluster.dir))
    return state.pod_octet if state is not None else devcluster.POD_OCTETS[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--deployments", type=int, default=100)
    parser.add_argument("--namespaces", type=int, default=4)
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="give up converging after this")
    parser.add_argument("--workers", type=int, default=0, help="operator --workers (0: its default)")
    parser.add_argument(
        "--api-parallelism", type=int, default=0, help="operator --api-parallelism (0: its default)"
    )
    parser.add_argument(
        "--child-event-delay",
        type=float,
        help="operator --child-event-delay-seconds (unset: its default, 1 s; 0: a pass per event)",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="use this running dev cluster (started with pod_runner=False)"
    )
    args = parser.parse_args()
    # A plain `kill` stops the operator and the cluster too (finally blocks run on SystemExit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.kubeconfig:
        return run(ClusterHandle.from_kubeconfig(args.kubeconfig), args)
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        cdir = ClusterDir(Path(tmp))
        devcluster.up(cdir, pod_runner=False, owner_pid=os.getpid())
        try:
            return run(ClusterHandle.from_dir(cdir.path, owned=True), args)
        finally:
            devcluster.down(cdir)


if __name__ == "__main__":
    sys.exit(main())
