"""How fast the SLO autoscaler reacts on the local control plane, and how fast `decide()` is.

Starts a dev cluster (or uses the one named by TANDEM_KUBECONFIG), the CRD and `tandem operator`
with `--prometheus-url` (the cluster's Prometheus, scraping every 2 s), applies a sim P/D
PDDeployment with the prefill pool autoscaled, and repeats a load step through its router (at the
router's pod IP): quiet until prefill is back at 1 replica, then a step that one prefill pod cannot
serve within the TTFT target. Per repetition it prints, in seconds and in decision intervals:

- step -> decision: the decision that raised prefill (`status.autoscaling.pools.prefill.lastDecision`);
- decision -> Ready: the StatefulSet's new pods Ready (the sim engine's model load is part of it);
- step -> Ready: the whole reaction;
- the SLO breach: the first request whose TTFT passed the target (the client knows at sent + target),
  and how long the decision came before it (negative: after it). The decision sees the prompt-token
  rate and the queue, not only the measured TTFT, so it usually comes first,

then medians over the repetitions, and decisions per second of `decide()` (bench/decide_rate.py).

Settings (stated, compressed like the e2e tests): decisions every 5 s, scale-up at once by up to 2,
scale-down after 15 s by 1; the sim engine at TANDEM_SIM_TIME_SCALE=3 with prefill's
`--max-num-batched-tokens 32 --max-num-seqs 32` (one prefill pod ~1.6k prompt tokens/s) and an 8 s
model load (TANDEM_SIM_LOAD_SECONDS); SLO TTFT 3000 ms at p90; the step is 2 requests/s of
1000-token prompts with 4-token answers. Prometheus scrapes every 2 s.

    .venv/bin/python bench/autoscale_reaction.py [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client

from tandem.api import meta
from tandem.api.times import parse_rfc3339
from tandem.demo import e2e
from tandem.demo.load import BackgroundLoad, Phase
from tandem.devcluster import cluster as devcluster
from tandem.devcluster import kube, layout
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess

sys.path.insert(0, str(Path(__file__).parent))
from decide_rate import decide_rate

T = TypeVar("T")
REPO = Path(__file__).parents[1]
INTERVAL = 5
LOAD_SECONDS = 8
TIME_SCALE = 3
TTFT_MS = 3000
STEP = Phase(2.0, 1000, 4, "step")
PREFILL_ARGS = ["--max-num-batched-tokens", "32", "--max-num-seqs", "32"]
NAME = "reaction"


def manifest() -> dict[str, Any]:
    return e2e.pddeployment(
        NAME,
        {
            "engine": {"type": "sim", "image": e2e.IMAGE, "env": e2e.engine_env(TIME_SCALE, LOAD_SECONDS)},
            "prefill": e2e.pool(1, (1, 3), *PREFILL_ARGS),
            "decode": e2e.pool(1),
            "slo": {"ttftMs": TTFT_MS, "tpotMs": 100, "attainmentPercent": 90},
            "autoscaling": {
                "enabled": True,
                "intervalSeconds": INTERVAL,
                "scaleUp": {"stabilizationSeconds": 0, "maxStep": 2},
                "scaleDown": {"stabilizationSeconds": 15, "maxStep": 1},
                "drainTimeoutSeconds": 20,
            },
        },
    )


@dataclass
class Reaction:
    step_to_decision_s: float
    decision_to_ready_s: float
    step_to_ready_s: float
    step_to_breach_s: float  # nan: no request missed the TTFT target
    decision_before_breach_s: float  # negative: the decision came after the breach
    replicas: int
    reason: str


class Cluster:
    def __init__(self, handle: ClusterHandle, namespace: str) -> None:
        self.handle, self.namespace = handle, namespace
        self.api = handle.api_client()

    def pdd(self) -> dict[str, Any]:
        custom = client.CustomObjectsApi(self.api)
        return kube.raw(
            custom.get_namespaced_custom_object(
                meta.GROUP, meta.VERSION, self.namespace, meta.PLURAL, NAME, _preload_content=False
            )
        )

    def prefill(self) -> tuple[int, int]:
        """The prefill StatefulSet's (spec.replicas, readyReplicas)."""
        sts = kube.raw(
            client.AppsV1Api(self.api).read_namespaced_stateful_set(
                f"{NAME}-prefill", self.namespace, _preload_content=False
            )
        )
        return int(sts["spec"].get("replicas") or 0), int((sts.get("status") or {}).get("readyReplicas") or 0)

    def router(self) -> str:
        pods = kube.raw(
            client.CoreV1Api(self.api).list_namespaced_pod(
                self.namespace,
                label_selector=f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}=router",
                _preload_content=False,
            )
        )["items"]
        ips = sorted(p["status"]["podIP"] for p in pods if kube.is_ready(p) and p["status"].get("podIP"))
        if not ips:
            raise SystemExit("no Ready router pod")
        return f"http://{ips[0]}:{meta.ROUTER_PORT}"


def poll(what: str, check: Callable[[], T | None], timeout: float) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(1.0)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def ready(obj: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions", [])}
    return (
        conds.get("Ready") == "True"
        and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
    )


def one(cluster: Cluster, load: BackgroundLoad) -> Reaction:
    poll("prefill back at 1 replica", lambda: cluster.prefill() == (1, 1), 180)
    before = (cluster.pdd()["status"]["autoscaling"]["pools"]["prefill"].get("lastDecision") or {}).get(
        "time"
    )
    step = time.time()
    load.set(STEP)

    def decided() -> dict[str, Any] | None:
        d = cluster.pdd()["status"]["autoscaling"]["pools"]["prefill"].get("lastDecision") or {}
        return d if d.get("time") != before and d.get("to", 0) > d.get("from", 0) else None

    decision = poll("prefill's scale-out decision", decided, 120)
    target = int(decision["to"])
    ready_at = poll(
        "the new prefill pods Ready", lambda: time.time() if cluster.prefill()[1] >= target else None, 120
    )
    load.set(Phase(0.0, 1, 1, "quiet"))
    breaches = [s for s in load.samples(since=step) if s.ok and s.ttft_s * 1000 > TTFT_MS]
    breach = min((s.sent_at + TTFT_MS / 1000 for s in breaches), default=math.nan)
    decided_at = parse_rfc3339(decision["time"])
    return Reaction(
        step_to_decision_s=round(decided_at - step, 1),
        decision_to_ready_s=round(ready_at - decided_at, 1),
        step_to_ready_s=round(ready_at - step, 1),
        step_to_breach_s=round(breach - step, 1),
        decision_before_breach_s=round(breach - decided_at, 1),
        replicas=target,
        reason=str(decision.get("reason", "")),
    )


def run(handle: ClusterHandle, repeats: int, as_json: bool) -> None:
    handle.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds" / "pddeployment.yaml")
    )
    handle.kubectl("wait", "--for=condition=Established", "crd/pddeployments.tandem.dev", "--timeout=60s")
    log = Path(tempfile.mkdtemp(prefix="tandem-bench-autoscale-")) / "operator.log"
    lease = f"tandem-bench-autoscale-{uuid.uuid4().hex[:6]}"
    operator = OperatorProcess(
        handle,
        ["--lease-namespace", "default", "--lease-name", lease, "--prometheus-url", handle.prometheus_url],
        log,
    )
    namespace = f"bench-autoscale-{int(time.time())}"
    load: BackgroundLoad | None = None
    cluster = Cluster(handle, namespace)
    try:
        operator.wait_leader(timeout=90)
        handle.kubectl("create", "namespace", namespace)
        handle.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest()))
        poll("Ready", lambda: ready(cluster.pdd()), 300)
        load = BackgroundLoad(cluster.router(), e2e.MODEL, max_requests=5000, max_seconds=1800).start(
            Phase(0.0, 1, 1, "quiet")
        )
        reactions = []
        for i in range(repeats):
            r = one(cluster, load)
            reactions.append(r)
            if not as_json:
                print(
                    f"#{i + 1}: step -> decision {r.step_to_decision_s:.1f}s "
                    f"({r.step_to_decision_s / INTERVAL:.1f} intervals), decision -> Ready "
                    f"{r.decision_to_ready_s:.1f}s (load {LOAD_SECONDS}s), "
                    f"step -> Ready {r.step_to_ready_s:.1f}s ({r.step_to_ready_s / INTERVAL:.1f} intervals); "
                    f"prefill 1 -> {r.replicas}; first TTFT over {TTFT_MS} ms at step + "
                    f"{r.step_to_breach_s:.1f}s, {r.decision_before_breach_s:.1f}s after the decision"
                    f"\n    reason: {r.reason}",
                    flush=True,
                )
        rate = decide_rate(5000)
        medians = {
            key: round(statistics.median(getattr(r, key) for r in reactions), 1)
            for key in (
                "step_to_decision_s",
                "decision_to_ready_s",
                "step_to_ready_s",
                "step_to_breach_s",
                "decision_before_breach_s",
            )
        }
        failed = len(load.tally.failed)
        result = {
            "settings": {
                "interval_s": INTERVAL,
                "load_seconds": LOAD_SECONDS,
                "time_scale": TIME_SCALE,
                "ttft_slo_ms": TTFT_MS,
                "step": asdict(STEP),
                "scrape_interval_s": 2,
            },
            "reactions": [asdict(r) for r in reactions],
            "medians": medians,
            "medians_in_intervals": {k: round(v / INTERVAL, 2) for k, v in medians.items()},
            "failed_requests": failed,
            "decide": asdict(rate),
        }
        if as_json:
            print(json.dumps(result))
            return
        m = medians
        print(
            f"median over {len(reactions)}: step -> decision {m['step_to_decision_s']}s "
            f"({m['step_to_decision_s'] / INTERVAL:.1f} intervals of {INTERVAL}s), decision -> Ready "
            f"{m['decision_to_ready_s']}s, step -> Ready {m['step_to_ready_s']}s "
            f"({m['step_to_ready_s'] / INTERVAL:.1f} intervals); the client's first TTFT over the target "
            f"at step + {m['step_to_breach_s']}s, {m['decision_before_breach_s']}s after the decision; "
            f"{failed} failed requests"
        )
        each = rate.microseconds_per_decision
        print(f"decide(): {rate.decisions_per_second:,.0f} decisions/s ({each:.0f} us each)")
    finally:
        if load is not None:
            load.stop(timeout=60)
        kube.close(cluster.api)
        operator.stop()
        handle.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        handle.kubectl("delete", "lease", lease, "-n", "default", check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if kubeconfig := os.environ.get("TANDEM_KUBECONFIG"):
        run(ClusterHandle.from_kubeconfig(Path(kubeconfig)), args.repeats, args.json)
        return
    cdir = layout.ClusterDir(Path(tempfile.mkdtemp(prefix="tandem-bench-cluster-")))
    devcluster.up(cdir, owner_pid=os.getpid())
    try:
        run(ClusterHandle.from_dir(cdir.path, owned=True), args.repeats, args.json)
    finally:
        devcluster.down(cdir)


if __name__ == "__main__":
    main()
