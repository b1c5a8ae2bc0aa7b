"""The operator at fleet scale: many PDDeployments on many fake GPU nodes, no pod processes.

Each of `--runs` runs, on the same cluster and fleet, in namespaces of its own: first the floor, the
same child objects (`tandem.render.render` of each spec, without owner references) created by a bare
client (server-side apply, 16 at a time) and timed until every StatefulSet and Deployment is ready;
then the operator on the same specs. The operator's time is printed as a ratio of the floor's.

Starts a dev cluster without the pod runner (KWOK makes every pod Ready at once, the routers'
too: `devcluster.up(pod_runner=False)`) and stops its Prometheus (`--with-prometheus` keeps it),
creates `--nodes` fake 8-GPU nodes (`tandem.devcluster.fleet`), runs `tandem operator` as a
process, creates `--deployments` PDDeployments, 8 requests at a time (`engine.type: vllm`, one
prefill, one decode and one router replica each, 12 child objects) spread over `--namespaces`
namespaces, and prints:
- seconds from the first create until every PDDeployment is Ready=True at its generation;
- the operator's API requests per reconcile pass (its own client's counter,
  `tandem_operator_api_requests_total`, by method and resource), while converging and steady;
- the operator's RSS (VmRSS at the start and end, peak VmHWM) and CPU seconds (utime + stime from
  /proc/<pid>/stat), while converging and over the steady window;
- reconcile pass latency p50/p99 (interpolated in `tandem_operator_reconcile_duration_seconds`
  buckets, as Prometheus' histogram_quantile does);
- reads in the steady state: the apiserver's own `apiserver_request_total` GET/LIST of the
  operator's kinds (every client: the metric has no user-agent label), per resync, and the
  operator's own request counter (`tandem_operator_api_requests_total`: its REST layer, informers
  included; kopf's PDDeployment watch is not in it);
- the same window in the apiserver's audit log (`devcluster.up(audit=True)`), which has each
  request's user agent: the operator's process (its REST client, `tandem-operator/...`, and kopf's
  PDDeployment watch) reads and writes but its Lease's, per resync;
- a profile of steady-state passes: after the steady window, every PDDeployment reconciled once in
  this process (the operator's `Reconciler` over its watch caches, `controller.main.build_cache`),
  each step timed (read, desire, apply, derive, write) and the top functions by cProfile;
- writes in a steady state of `--steady-seconds`: the apiserver's own `apiserver_request_total` for
  PDDeployments and the child kinds (every client), Events posted about anything but Nodes (the
  node controller posts the fleet's RegisteredNode Events for minutes), and the operator's own
  write counter.
  The operator runs with `--resync-seconds 30`, so the window holds full resyncs;
- CPU seconds by process over the floor's phase and the operator's convergence (every control-plane
  process, the operator, and this bench with the kubectl it ran), from /proc: which process took
  the two cores in each phase;
- with `--apiserver-pprof DIR`, a CPU profile of kube-apiserver (Go's pprof, the dev cluster started
  with `devcluster.up(profiling=True)`) over the first `--pprof-seconds` of each phase, saved as
  `DIR/run<N>-floor.pprof` and `DIR/run<N>-operator.pprof` (`go tool pprof -top FILE` reads them).

    nice -n 10 .venv/bin/python bench/operator_scale.py [--nodes 1000] [--deployments 100] \\
        [--namespaces 4] [--steady-seconds 60] [--runs 3] [--workers N] [--child-event-delay S] \\
        [--apiserver-pprof DIR [--pprof-seconds 60]]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tandem.api.models import PDDeployment
from tandem.api.times import rfc3339
from tandem.controller.events import EventRecorder
from tandem.controller.main import build_cache
from tandem.controller.reconcile import KINDS, Reconciler
from tandem.devcluster import cluster as devcluster
from tandem.devcluster import fleet, kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.layout import ClusterDir
from tandem.devcluster.testing import OperatorProcess
from tandem.kube.informer import Cache
from tandem.kube.rest import PDDEPLOYMENT, USER_AGENT, Kind, KubeRest, load_api_client
from tandem.render import render

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


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def audit_latency(path: Path, offset: int) -> None:
    """Every request the apiserver's audit log holds after byte `offset` (the operator's kinds,
    pods, Secrets, Leases; not Events), by client and verb: how many, and how long the apiserver
    took (receipt to response complete), watches apart. Whether a phase waited on the apiserver
    or on its client."""
    latencies: dict[tuple[str, str], list[float]] = {}
    for event in fleet.audit_events(path, offset):
        if event.get("verb") == "watch" or event.get("stage") != "ResponseComplete":
            continue
        agent = str(event.get("userAgent", "")).split("/")[0].split(" ")[0]
        took = _stamp(event["stageTimestamp"]) - _stamp(event["requestReceivedTimestamp"])
        latencies.setdefault((agent, str(event.get("verb"))), []).append(took)
    for (agent, verb), values in sorted(latencies.items(), key=lambda item: -len(item[1]))[:8]:
        values.sort()
        print(
            f"  apiserver (audit): {agent} {verb}: {len(values)}, latency mean "
            f"{1000 * sum(values) / len(values):.0f} ms, p50 {1000 * values[len(values) // 2]:.0f} ms, "
            f"p99 {1000 * values[int(len(values) * 0.99)]:.0f} ms"
        )


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
        cpu = _cpu_seconds(pid) or 0.0
        status = proc_status(pid)
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


def proc_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a mapping (VmRSS, VmHWM, ...)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(stat[11]) + int(stat[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def process_cpu(cluster: ClusterHandle, operator: OperatorProcess | None = None) -> dict[str, float]:
    """CPU seconds so far of each control-plane process, the operator's, and this bench's own with
    the children it has waited for (kubectl)."""
    state = devcluster.load_state(ClusterDir(cluster.dir))
    pids = dict(state.pids) if state is not None else {}
    if operator is not None:
        pids["operator"] = operator.proc.pid
    out = {name: cpu for name, pid in pids.items() if (cpu := _cpu_seconds(pid)) is not None}
    times = os.times()
    out["bench+kubectl"] = times.user + times.system + times.children_user + times.children_system
    return out


def report_cpu(title: str, before: dict[str, float], after: dict[str, float], wall: float) -> None:
    used = {name: after[name] - before.get(name, 0.0) for name in after}
    total = sum(used.values())
    parts = ", ".join(
        f"{name} {sec:.1f} s ({sec / wall:.2f} cores)"
        for name, sec in sorted(used.items(), key=lambda item: -item[1])
        if sec >= 0.05
    )
    print(f"  CPU by process, {title} ({wall:.1f} s, {total:.1f} s of CPU in all): {parts}")


def start_pprof(
    cluster: ClusterHandle, out: Path | None, name: str, seconds: float
) -> threading.Thread | None:
    """A CPU profile of kube-apiserver over the next `seconds`, written to `out/name.pprof` by a
    thread (join it before reading); None without `out`."""
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)

    def fetch() -> None:
        proc = subprocess.run(
            [
                str(cluster.bin_dir / "kubectl"),
                "get",
                "--raw",
                f"/debug/pprof/profile?seconds={int(seconds)}",
            ],
            env=cluster.env(),
            capture_output=True,
            timeout=seconds + 120,
            check=False,
        )
        if proc.returncode != 0:
            print(f"  apiserver profile {name}: failed: {proc.stderr.decode(errors='replace').strip()}")
            return
        (out / f"{name}.pprof").write_bytes(proc.stdout)
        print(f"  apiserver profile {name}: {out / f'{name}.pprof'} ({len(proc.stdout)} bytes)")

    thread = threading.Thread(target=fetch, name=f"pprof-{name}", daemon=True)
    thread.start()
    return thread


def join_pprof(thread: threading.Thread | None) -> None:
    if thread is not None:
        thread.join()


def rss_mb(operator: OperatorProcess) -> float:
    return int(proc_status(operator.proc.pid)["VmRSS"].split()[0]) / 1024


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


def specs(args: argparse.Namespace, prefix: str) -> dict[str, list[dict[str, Any]]]:
    """The run's PDDeployments by namespace: `--deployments` spread over `--namespaces`."""
    namespaces = [f"{prefix}-{i}" for i in range(args.namespaces)]
    docs: dict[str, list[dict[str, Any]]] = {ns: [] for ns in namespaces}
    for i in range(args.deployments):
        ns = namespaces[i % len(namespaces)]
        docs[ns].append(fleet.pddeployment(f"scale-{i}", ns))
    return docs


def workload_ready(obj: dict[str, Any]) -> bool:
    """A StatefulSet or Deployment whose every replica is ready."""
    return int((obj.get("status") or {}).get("readyReplicas", 0)) == int(
        (obj.get("spec") or {}).get("replicas", 1)
    )


class ReadyTally:
    """Which objects of some kinds in some namespaces are ready, kept by watches (tandem's own
    informers, in this process) and judged as each event arrives: a poll counts a dict. Listing every
    object again at each poll (`kubectl get -A -o json` every 5 s at 1,000 PDDeployments) took the
    apiserver 1 s a list and this bench and its kubectl 0.2 of the two cores, in both phases."""

    def __init__(
        self, api: Any, kinds: list[Kind], namespaces: list[str], ready: Callable[[dict[str, Any]], bool]
    ) -> None:
        self._ready_of = ready
        self._lock = threading.Lock()
        self._ready: dict[tuple[str, str, str], bool] = {}
        self._cache = Cache()
        rest = KubeRest(api, field_manager="bench-watch")
        for kind in kinds:
            self._cache.add(rest, kind, namespaces, self._on_event)

    def _on_event(self, kind: Kind, event_type: str, obj: dict[str, Any]) -> None:
        key = (kind.plural, obj["metadata"]["namespace"], obj["metadata"]["name"])
        with self._lock:
            if event_type == "DELETED":
                self._ready.pop(key, None)
            else:
                self._ready[key] = self._ready_of(obj)

    def start(self) -> None:
        """Lists and watches; back once every list is in."""
        self._cache.start()
        if not self._cache.wait_synced(timeout=120):
            raise RuntimeError("the bench's watches did not list in 120 s")

    def stop(self) -> None:
        self._cache.stop()

    def __enter__(self) -> ReadyTally:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ready(self) -> int:
        """How many of the objects seen are ready."""
        with self._lock:
            return sum(self._ready.values())


def floor(
    cluster: ClusterHandle, api: Any, args: argparse.Namespace, prefix: str, number: int
) -> float | None:
    """The bare client's time: every child object of the run's specs, server-side applied 16 at a
    time (`KubeRest.apply`: one request each, no reads, no logic), until every workload is ready."""
    docs = specs(args, prefix)
    objects = []
    for ns, items in docs.items():
        cluster.kubectl("create", "namespace", ns, check=False)
        for doc in items:
            stored = {**doc, "metadata": {**doc["metadata"], "uid": "00000000-0000-0000-0000-000000000000"}}
            for obj in render(PDDeployment.from_object(stored)):
                obj["metadata"].pop("ownerReferences", None)  # no owner: the GC would delete them
                objects.append(obj)
    rest = KubeRest(api, field_manager="bench-floor")
    audit_log = ClusterDir(cluster.dir).audit_log
    audit_from = fleet.audit_offset(audit_log)
    workloads = sum(1 for o in objects if o["kind"] in ("StatefulSet", "Deployment"))
    kinds = [KINDS["StatefulSet"], KINDS["Deployment"]]
    with ReadyTally(api, kinds, list(docs), workload_ready) as tally:
        cpu_before = process_cpu(cluster)
        pprof = start_pprof(cluster, args.apiserver_pprof, f"run{number + 1}-floor", args.pprof_seconds)
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda o: rest.apply(KINDS[o["kind"]], o), objects))
        created = time.monotonic() - t0
        print(f"floor: {len(objects)} objects applied in {created:.1f} s")
        audit_latency(audit_log, audit_from)
        while time.monotonic() - t0 < args.timeout:
            if tally.ready() >= workloads:
                took = time.monotonic() - t0
                print(
                    f"floor: {len(objects)} objects created in {created:.1f} s, "
                    f"{workloads} workloads ready in {took:.1f} s"
                )
                report_cpu("the floor", cpu_before, process_cpu(cluster), took)
                join_pprof(pprof)
                return took
            time.sleep(0.5)
    print(f"floor: NOT ready after {args.timeout:.0f} s")
    join_pprof(pprof)
    return None


def profile_passes(cluster: ClusterHandle, namespaces: list[str]) -> None:
    """Every PDDeployment of the run reconciled once here, over watch caches of our own, each step
    timed; then the top functions of those passes by cumulative time."""
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kube_rest = KubeRest(load_api_client(pool_size=64))
    cache = build_cache(kube_rest, namespaces, None)
    tracemalloc.start()
    cache.start()
    if not cache.wait_synced(120):
        print("profile: the caches did not sync")
        return
    time.sleep(2)  # the last lists' responses freed
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    counts = {plural: len(store) for plural, store in cache.stores.items()}
    print(
        f"profile: the caches hold {sum(counts.values())} objects in {held / 2**20:.1f} MB "
        f"(tracemalloc, Python allocations since their start) {counts}"
    )
    reconciler = Reconciler(kube_rest, EventRecorder(kube_rest), cache=cache)
    steps: dict[str, float] = dict.fromkeys(("read", "desire", "apply", "derive", "write"), 0.0)

    def timed(step: str, method: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                steps[step] += time.perf_counter() - t

        return wrapper

    for step in ("_read", "_desire", "_apply", "_derive", "_write"):
        setattr(reconciler, step, timed(step.strip("_"), getattr(reconciler, step)))
    keys = cache.stores[PDDEPLOYMENT.plural].names()
    requests_before = sum(kube_rest.requests.values())
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    for ns, name in keys:
        body = cache.get(PDDEPLOYMENT, ns, name)
        if body is not None:
            reconciler.reconcile(body, rfc3339(time.time()), time.time())
    profiler.disable()
    wall = time.perf_counter() - t0
    cache.stop()
    requests = sum(kube_rest.requests.values()) - requests_before
    print(
        f"profile: {len(keys)} steady passes in {wall:.2f} s "
        f"({1000 * wall / max(1, len(keys)):.1f} ms a pass; "
        f"{requests} API requests, {sum(kube_rest.writes.values())} writes)"
    )
    print("  per pass: " + ", ".join(f"{k} {1000 * v / max(1, len(keys)):.2f} ms" for k, v in steps.items()))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(18)
    print("\n".join("  " + line for line in text.getvalue().splitlines() if line.strip())[-4000:])


def start_py_spy(out: Path | None, pid: int, number: int) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the operator's process (on CPU only, not pausing it) until `stop_py_spy`:
    collapsed stacks in `out`/operator-r<number>.txt. py-spy is not a project dependency."""
    if out is None:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"operator-r{number + 1}.txt"
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--nonblocking",
            "--rate",
            "50",
            "--output",
            str(target),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_py_spy(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()


def run_once(cluster: ClusterHandle, api: Any, args: argparse.Namespace, number: int) -> dict[str, float]:
    """One run: the floor, then the operator on the same specs; its figures."""
    figures: dict[str, float] = {}
    floor_s = floor(cluster, api, args, f"r{number}-floor", number)
    if floor_s is not None:
        figures["floor_s"] = floor_s
    docs = specs(args, f"r{number}-scale")
    namespaces = list(docs)
    for ns in namespaces:
        cluster.kubectl("create", "namespace", ns, check=False)
    log = Path(tempfile.mkdtemp(prefix="tandem-bench-scale-")) / "operator.log"
    flags = [
        "--lease-namespace",
        "default",
        "--lease-name",
        f"tandem-bench-{number}",
        "--resync-seconds",
        "30",
    ]
    for ns in namespaces:
        flags += ["--namespace", ns]
    if args.workers:
        flags += ["--workers", str(args.workers)]
    if args.api_parallelism:
        flags += ["--api-parallelism", str(args.api_parallelism)]
    if args.child_event_delay is not None:
        flags += ["--child-event-delay-seconds", str(args.child_event_delay)]
    operator = OperatorProcess(cluster, flags, log)
    spy = None
    try:
        operator.wait_leader(timeout=120)
        spy = start_py_spy(args.py_spy, operator.proc.pid, number)  # once the interpreter is up
        idle = Snapshot.take(operator)
        custom = client.CustomObjectsApi(api)

        def create(doc: dict[str, Any]) -> None:
            ns = doc["metadata"]["namespace"]
            custom.create_namespaced_custom_object("tandem.dev", "v1alpha1", ns, "pddeployments", doc)

        # Created 8 at a time, as a GitOps sync would (kubectl apply sends one object at a time).
        audit_log = ClusterDir(cluster.dir).audit_log
        converging_from = fleet.audit_offset(audit_log)
        tally = ReadyTally(api, [PDDEPLOYMENT], namespaces, ready_at_generation)
        tally.start()
        cpu_before = process_cpu(cluster, operator)
        pprof = start_pprof(cluster, args.apiserver_pprof, f"run{number + 1}-operator", args.pprof_seconds)
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, [doc for items in docs.values() for doc in items]))
        applied = time.monotonic() - t0
        ready = 0
        peak_rss = 0.0
        converged_at = None
        while time.monotonic() - t0 < args.timeout:
            ready = tally.ready()
            # From /proc only: a scrape of the operator's /metrics each poll (a thousand PDDeployments'
            # gauges) weighed on the operator it measures.
            peak_rss = max(peak_rss, rss_mb(operator))
            if ready >= args.deployments:
                converged_at = time.monotonic() - t0
                break
            time.sleep(0.5)
        tally.stop()
        converged = Snapshot.take(operator)
        cpu_after = process_cpu(cluster, operator)
        print(
            f"{args.deployments} PDDeployments in {len(namespaces)} namespaces on {args.nodes} nodes, "
            f"all created in {applied:.1f} s"
        )
        if converged_at is None:
            print(f"NOT converged: {ready} of {args.deployments} Ready after {args.timeout:.0f} s")
        else:
            figures["ready_s"] = converged_at
            ratio = f" = {converged_at / floor_s:.2f}x the floor ({floor_s:.1f} s)" if floor_s else ""
            print(
                f"first create -> every PDDeployment Ready=True at its generation: "
                f"{converged_at:.1f} s{ratio}"
            )
        report_phase("converging", idle, converged)
        report_cpu("converging", cpu_before, cpu_after, converged.at - t0)
        join_pprof(pprof)
        audit_latency(audit_log, converging_from)
        time.sleep(args.settle_seconds)  # the last passes' writes, the garbage collector's owner checks
        audit_from = fleet.audit_offset(audit_log)
        before_text = cluster.kubectl("get", "--raw", "/metrics").stdout
        before_writes, before_events = apiserver_writes(cluster), event_counts(cluster)
        before = Snapshot.take(operator)
        time.sleep(args.steady_seconds)
        after_writes, after = apiserver_writes(cluster), Snapshot.take(operator)
        after_text = cluster.kubectl("get", "--raw", "/metrics").stdout
        after_events = event_counts(cluster)
        delta = after_writes - before_writes
        reads = fleet.apiserver_reads(after_text) - fleet.apiserver_reads(before_text)
        new_events = sum(n - before_events.get(uid, 0) for uid, n in after_events.items())
        audited = fleet.audit_requests(audit_log, audit_from, USER_AGENT) + fleet.audit_requests(
            audit_log, audit_from, "kopf"
        )
        resyncs = args.steady_seconds / 30
        report_phase(f"steady state ({args.steady_seconds:.0f} s, resync every 30 s)", before, after)
        own = after.requests - before.requests
        own_reads = sum(v for k, v in own.items() if k.startswith("GET ") and k != "GET leases")
        print(
            f"  apiserver writes to PDDeployments and child kinds, all clients: {sum(delta.values())} "
            f"{dict(delta)}; Events posted about anything but Nodes: {new_events}"
        )
        print(
            f"  apiserver reads (GET/LIST) of PDDeployments, children, pods, Secrets, all clients: "
            f"{sum(reads.values())} ({sum(reads.values()) / resyncs:.1f} per resync) {dict(reads)}; "
            f"the operator's own GETs but its lease's: {own_reads} ({own_reads / resyncs:.1f} per resync)"
        )
        audited_reads = sum(
            v for k, v in audited.items() if k.split()[0] in ("get", "list") and "leases" not in k
        )
        audited_writes = sum(
            v
            for k, v in audited.items()
            if k.split()[0] not in ("get", "list", "watch") and "leases" not in k
        )
        print(
            f"  the operator's process (user agents {USER_AGENT}, kopf) by the apiserver's audit log: "
            f"{dict(audited)}; reads but its Lease's {audited_reads} ({audited_reads / resyncs:.1f} per "
            f"resync), writes but its Lease's {audited_writes}"
        )
        print(f"operator RSS peak while converging (sampled): {peak_rss:.0f} MB; log: {log}")
        figures.update(
            rss_peak_mb=after.hwm_mb,
            steady_writes=float(sum(delta.values())),
            steady_reads_per_resync=sum(reads.values()) / resyncs,
            own_reads_per_resync=own_reads / resyncs,
            audited_reads_per_resync=audited_reads / resyncs,
            audited_writes=float(audited_writes),
        )
    finally:
        stop_py_spy(spy)
        operator.stop()
    if args.profile:
        profile_passes(cluster, namespaces)
    return figures


def run(cluster: ClusterHandle, args: argparse.Namespace) -> int:
    api = cluster.api_client()
    try:
        started = time.monotonic()
        fleet.create(api, fleet.fleet_nodes(args.nodes, _octet(cluster)))
        while fleet.ready_count(api) < args.nodes:
            if time.monotonic() - started > 600:
                print(f"only {fleet.ready_count(api)} of {args.nodes} nodes Ready after 600 s")
                return 1
            fleet.untaint(api)
            time.sleep(2)
        print(
            f"{args.nodes} fake GPU nodes created, Ready and untainted in {time.monotonic() - started:.1f} s"
        )
        kube.apply_crd(api, yaml.safe_load((REPO / "crds" / "pddeployment.yaml").read_text()), timeout=300)
        results = []
        for number in range(args.runs):
            print(f"--- run {number + 1} of {args.runs} (load average {os.getloadavg()[0]:.1f})")
            results.append(run_once(cluster, api, args, number))
        print("--- summary")
        for number, figures in enumerate(results):
            ratio = (
                f"{figures['ready_s'] / figures['floor_s']:.2f}x"
                if "ready_s" in figures and "floor_s" in figures
                else "-"
            )
            print(
                f"run {number + 1}: "
                + ", ".join(f"{k} {v:.1f}" for k, v in figures.items())
                + f"; ratio {ratio}"
            )
        return 0 if all("ready_s" in f for f in results) else 1
    finally:
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
    parser.add_argument("--settle-seconds", type=float, default=30.0, help="wait before the steady window")
    parser.add_argument("--runs", type=int, default=1, help="floor + operator runs on the same fleet")
    parser.add_argument("--profile", action="store_true", help="profile one steady pass of each PDDeployment")
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
        "--py-spy", type=Path, help="sample the operator with py-spy (installed apart) into this folder"
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="use this running dev cluster (started with pod_runner=False)"
    )
    parser.add_argument(
        "--with-prometheus",
        action="store_true",
        help="keep the dev cluster's Prometheus running (stopped by default: not part of the control plane)",
    )
    parser.add_argument(
        "--apiserver-pprof",
        type=Path,
        help="save a CPU profile of kube-apiserver over the start of each phase into this folder",
    )
    parser.add_argument(
        "--pprof-seconds", type=float, default=60.0, help="how long each apiserver profile samples"
    )
    args = parser.parse_args()
    # A plain `kill` stops the operator and the cluster too (finally blocks run on SystemExit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.kubeconfig:
        return run(ClusterHandle.from_kubeconfig(args.kubeconfig), args)
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        cdir = ClusterDir(Path(tmp))
        devcluster.up(
            cdir,
            pod_runner=False,
            owner_pid=os.getpid(),
            audit=True,
            profiling=args.apiserver_pprof is not None,
        )
        if not args.with_prometheus:
            # It scrapes every annotated pod every 2 s (e2e/prometheus/prometheus.yml): thousands of
            # fake pods, none answering, and the pod watch behind them took 0.27 of the two cores in
            # the floor's phase at 1,000 and more in the operator's, whose pods come on top
            # (docs/operator-scale.md). Nothing here reads it: the specs do not autoscale.
            devcluster.stop_prometheus(cdir)
        try:
            return run(ClusterHandle.from_dir(cdir.path, owned=True), args)
        finally:
            devcluster.down(cdir)


if __name__ == "__main__":
    sys.exit(main())
