"""Control-plane faults under load (issue 14, item 1): the operator killed -9 mid-change, mid-pass
(creating a PDDeployment's children), mid-drain, mid revision change and as the leader of two
replicas; kube-apiserver and etcd restarted; children edited, deleted and pruned; pods that cannot
start (image, config, crash) named in status and recovered by a fix.

One sim PDDeployment for the module (`chaos`: prefill 1, decode 2 with decode autoscaled in [1, 2],
router 1), its autoscaler paused until the drain test, and an open-loop streamed load through the
operator's router at its pod IP (127.0.0.0/8) for the whole module (`tandem.demo.load.BackgroundLoad`).
After every fault `settle` checks, with the load paused: every request sent came back, none failed
(nothing these faults do is a failure the router's rules pass on to a client: no pod with work on
it dies; the decode pods removed are drained first, the router replica removed is not the load's),
every engine pod reports `tandem:kv_held_blocks` 0, and the PDDeployment's children are exactly its
render (no duplicate, no orphan, each owned by it). Faults the other suites already cover without
load are cited in docs/reliability.md ("Control-plane faults"), not repeated.

Compressed settings: sim engines at time scale 1 with a 1 s model load; load 3 requests/s of
32-token prompts and 8 output tokens; the operator resyncs every 10 s with a 10 s lease (conftest);
autoscaling every 5 s (the least the API allows), scale-down window 10 s, drain timeout 60 s.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tandem.api import meta
from tandem.api.models import PDDeployment
from tandem.api.status import RevisionRecord
from tandem.demo import e2e as harness
from tandem.demo.load import BackgroundLoad, Phase
from tandem.demo.stats import Sample
from tandem.devcluster import cluster as devcluster
from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.layout import ClusterDir
from tandem.devcluster.testing import OperatorProcess, RestartableOperator, eventually, metric_total
from tandem.render import CHILD_KINDS, render

from .conftest import operator_args

T = TypeVar("T")


pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

NAME = "chaos"
FAULTY = "faulty"
LOAD = Phase(3.0, 32, 8, "steady")
NEW_IMAGE = "ghcr.io/tandem-dev/tandem:0.1.1"  # the runner runs the same local build for any image
KINDS = ",".join(kind.lower() for _, kind, _ in CHILD_KINDS)
# A pass during the apiserver outage: the operator holds no lease, so none; a few retries at most.
MAX_PASSES_IN_OUTAGE = 5


def manifest(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": {"type": "sim", "image": harness.IMAGE, "env": harness.engine_env(1, 1)},
        "prefill": harness.pool(1),
        "decode": harness.pool(2, (1, 2)),
        "slo": {"ttftMs": 2000, "tpotMs": 200},
        "autoscaling": {
            "enabled": True,
            "intervalSeconds": 5,
            "scaleUp": {"stabilizationSeconds": 0, "maxStep": 1},
            "scaleDown": {"stabilizationSeconds": 10, "maxStep": 1},
            "drainTimeoutSeconds": 60,
        },
    }
    doc: dict[str, Any] = harness.pddeployment(name, spec)
    doc["metadata"]["annotations"] = {meta.ANNOTATION_AUTOSCALING_PAUSED: "true"}
    return doc


@dataclass
class Stack:
    cluster: ClusterHandle
    operator: RestartableOperator
    namespace: str
    load: BackgroundLoad
    figures: dict[str, Any] = field(default_factory=dict)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> Any:
        out = self.cluster.kubectl(*args, "-n", self.namespace, check=False, input=input)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {out.stderr}")
        return out

    def get(self, *args: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return out

    def pdd(self, name: str = NAME) -> dict[str, Any]:
        return self.get("pdd", name)

    def patch(self, spec: dict[str, Any], name: str = NAME) -> int:
        """Merge-patches `spec`; returns the new generation."""
        self.kubectl("patch", "pdd", name, "--type", "merge", "-p", json.dumps({"spec": spec}))
        return int(self.pdd(name)["metadata"]["generation"])

    def converged(self, name: str = NAME, generation: int | None = None) -> dict[str, Any] | None:
        """The PDDeployment once Ready=True at its generation (at least `generation`)."""
        pdd = self.pdd(name)
        gen = int(pdd["metadata"]["generation"])
        status = pdd.get("status") or {}
        conds = {c["type"]: c for c in status.get("conditions") or []}
        ok = (
            status.get("observedGeneration") == gen
            and (generation is None or gen >= generation)
            and conds.get("Ready", {}).get("status") == "True"
        )
        return pdd if ok else None

    def wait_converged(
        self, what: str, name: str = NAME, generation: int | None = None, timeout: float = 120
    ) -> float:
        """Seconds until converged."""
        started = time.monotonic()
        try:
            eventually(lambda: self.converged(name, generation), timeout=timeout, what=what, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.describe(name)}") from None
        return time.monotonic() - started

    def describe(self, name: str = NAME) -> str:
        """The PDDeployment's conditions and its workloads' and pods' state, for a failure message."""
        pdd = self.pdd(name)
        status = pdd.get("status") or {}
        lines = [f"generation {pdd['metadata']['generation']}, observed {status.get('observedGeneration')}"]
        lines += [
            f"  {c['type']}={c['status']} {c.get('reason')}: {c.get('message')}"
            for c in status.get("conditions") or []
        ]
        for kind in ("statefulsets", "deployments", "pods"):
            for item in self.get(kind, "-l", f"{meta.LABEL_PDD}={name}")["items"]:
                owners = [o["kind"] for o in item["metadata"].get("ownerReferences") or []]
                state = json.dumps(item.get("status"))[:300]
                lines.append(f"  {item['kind']} {item['metadata']['name']} owners={owners} status={state}")
        return "\n".join(lines)

    def children(self, name: str = NAME) -> dict[tuple[str, str], dict[str, Any]]:
        """Objects of the kinds the operator renders that carry the PDDeployment's label or an owner
        reference to it."""
        uid = self.pdd(name)["metadata"]["uid"]
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for item in self.get(KINDS)["items"]:
            labels = item["metadata"].get("labels") or {}
            owners = item["metadata"].get("ownerReferences") or []
            if labels.get(meta.LABEL_PDD) == name or any(o.get("uid") == uid for o in owners):
                key = (item["kind"], item["metadata"]["name"])
                assert key not in found, f"two objects named {key}"
                found[key] = item
        return found

    def rendered(self, name: str = NAME) -> set[tuple[str, str]]:
        live = self.pdd(name)
        pdd = PDDeployment.from_object(live)
        current = ((live.get("status") or {}).get("revisions") or {}).get("current")
        revision = RevisionRecord.model_validate(current) if current else None
        return {(o["kind"], o["metadata"]["name"]) for o in render(pdd, None, revision)}

    def children_match_render(self, name: str = NAME) -> dict[tuple[str, str], dict[str, Any]]:
        """Asserts the children are exactly the render, each owned (as controller) by the
        PDDeployment, and that each pool has as many pods as its StatefulSet asks for."""
        uid = self.pdd(name)["metadata"]["uid"]
        live = self.children(name)
        want = self.rendered(name)
        assert set(live) == want, f"extra: {set(live) - want}; missing: {want - set(live)}"
        for key, item in live.items():
            owners = [o for o in item["metadata"].get("ownerReferences") or [] if o.get("controller")]
            assert [o["uid"] for o in owners] == [uid], f"{key} owned by {owners}"
        pods = self.get("pods", "-l", f"{meta.LABEL_PDD}={name}")["items"]
        for (kind, child), item in live.items():
            if kind != "StatefulSet":
                continue
            uid = item["metadata"]["uid"]
            mine = [
                p for p in pods if any(o["uid"] == uid for o in p["metadata"].get("ownerReferences") or [])
            ]
            assert len(mine) == item["spec"]["replicas"], (child, [p["metadata"]["name"] for p in mine])
        return live

    def stray_pods(self, name: str = NAME) -> list[str]:
        """Engine pods of the PDDeployment that no live StatefulSet owns (a deleted pair's, say)."""
        owners = {
            item["metadata"]["uid"]
            for (kind, _), item in self.children(name).items()
            if kind == "StatefulSet"
        }
        return [
            p["metadata"]["name"]
            for p in self.get("pods", "-l", f"{meta.LABEL_PDD}={name}")["items"]
            if p["metadata"]["labels"].get(meta.LABEL_ROLE) != "router"
            and not any(o["uid"] in owners for o in p["metadata"].get("ownerReferences") or [])
        ]

    def engine_ips(self) -> list[str]:
        api = self.cluster.api_client()
        try:
            ips = [
                ip
                for role in ("prefill", "decode")
                for ip in kube.ready_pod_ips(api, self.namespace, NAME, role)
            ]
        finally:
            kube.close(api)
        assert ips, "no Ready engine pod"
        assert all(ip.startswith("127.") for ip in ips), ips
        return ips

    def kv_held(self) -> dict[str, float]:
        held = {}
        for ip in self.engine_ips():
            with urllib.request.urlopen(f"http://{ip}:{meta.ENGINE_PORT}/metrics", timeout=10) as resp:
                held[ip] = metric_total(resp.read().decode(), "tandem:kv_held_blocks")
        return held

    def settle(self, since: float, what: str) -> list[Sample]:
        """Pauses the load, waits for its requests in flight, checks the invariants, resumes it;
        returns the requests sent since `since`."""
        self.load.set(Phase(0.0, 1, 1, "quiet"))
        tally = self.load.tally
        eventually(
            lambda: tally.in_flight == 0 and tally.sent == len(tally.samples),
            timeout=150,
            what=f"every request sent back (a request vanished or hangs: sent {tally.sent}, "
            f"back {len(tally.samples)}, in flight {tally.in_flight})",
        )
        assert self.load.error is None, self.load.error
        samples = self.load.samples(since=since)
        failed = [s.error for s in samples if not s.ok]
        assert not failed, f"{what}: {len(failed)} of {len(samples)} requests failed: {failed[:5]}"
        assert samples, f"{what}: no request was sent"
        eventually(
            lambda: not any(self.kv_held().values()),
            timeout=30,
            what=f"zero KV held on every engine pod once quiet (last: {self.kv_held()})",
        )
        self.children_match_render()
        self.figures[what] = {"requests": len(samples), **self.figures.get(what, {})}
        self.load.set(LOAD)
        return samples

    def operator_metric(self, name: str) -> float:
        return metric_total(self.operator.metrics(), name)


@pytest.fixture(scope="module")
def stack(
    cluster: ClusterHandle, chaos_operator: RestartableOperator, chaos_namespace: str
) -> Iterator[Stack]:
    ns = chaos_namespace
    holder = Stack(cluster, chaos_operator, ns, BackgroundLoad("", harness.MODEL))
    holder.kubectl("apply", "-f", "-", input=json.dumps(manifest(NAME)))
    holder.wait_converged("the chaos PDDeployment Ready", timeout=240)
    url = harness.router_url(cluster, ns, NAME)
    # The load goes to this router pod's IP: when the router scales 2 -> 1 (fail-over test) its
    # ReplicaSet must remove the other one, so this one carries the higher deletion cost.
    routers = holder.get("pods", "-l", f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}=router")["items"]
    (router,) = routers
    holder.kubectl(
        "annotate", "pod", router["metadata"]["name"], "controller.kubernetes.io/pod-deletion-cost=1000"
    )
    holder.load = BackgroundLoad(url, harness.MODEL, max_requests=5000, max_seconds=900, request_timeout=60)
    holder.load.start(LOAD)
    try:
        yield holder
    finally:
        holder.load.stop(timeout=90)
        print(f"\nchaos figures: {json.dumps(holder.figures, indent=1)}")
        cluster.kubectl("delete", "pdd", "--all", "-n", ns, "--wait=false", check=False)


def test_operator_killed_mid_change_converges_without_orphans(stack: Stack) -> None:
    """A spec edit that changes several children (router 1 -> 2 replicas, a new NetworkPolicy);
    kill -9 as soon as the first of them shows the change in the API (polled every few ms), while
    the change is under way (checked: the PDDeployment was not yet Ready at the new generation; a
    pass takes tens of ms here, so whether its own status write had landed is luck, and reported);
    the new process converges to the new generation. Then pruning: the NetworkPolicy turned off is
    deleted and nothing else is (every other child keeps its uid)."""
    since = time.time()
    time.sleep(3)  # requests flowing before the fault
    api = stack.cluster.api_client()
    try:
        apps, net = client.AppsV1Api(api), client.NetworkingV1Api(api)
        custom = client.CustomObjectsApi(api)

        def changed() -> list[str]:
            seen = []
            deployment = kube.raw(
                apps.read_namespaced_deployment(f"{NAME}-router", stack.namespace, _preload_content=False)
            )
            if deployment["spec"]["replicas"] == 2:
                seen.append("Deployment")
            with contextlib.suppress(ApiException):
                net.read_namespaced_network_policy(f"{NAME}-engines", stack.namespace, _preload_content=False)
                seen.append("NetworkPolicy")
            return seen

        generation = stack.patch({"router": {"replicas": 2}, "network": {"policy": {"enabled": True}}})
        first = eventually(changed, timeout=30, interval=0.005, what="the pass's first child write")
        stack.operator.current.kill()
        pdd = kube.raw(
            custom.get_namespaced_custom_object(
                meta.GROUP, meta.VERSION, stack.namespace, meta.PLURAL, NAME, _preload_content=False
            )
        )
    finally:
        kube.close(api)
    status = pdd.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c["type"] == "Ready" and c["status"] == "True"]
    assert not (ready and status.get("observedGeneration") == generation), "converged before the kill"
    restarted = time.monotonic()
    stack.operator.crash_and_restart()
    stack.wait_converged("converged after kill -9", generation=generation, timeout=120)
    stack.figures["kill mid-change"] = {
        "children changed at the kill": first,
        "the pass's status write landed before the kill": status.get("observedGeneration") == generation,
        "restart to converged s": round(time.monotonic() - restarted, 1),
    }
    stack.settle(since, "kill mid-change")
    assert "NetworkPolicy" in {kind for kind, _ in stack.children()}
    assert len(stack.get("pods", "-l", f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}=router")["items"]) == 2

    since = time.time()
    before = {key: item["metadata"]["uid"] for key, item in stack.children().items()}
    generation = stack.patch({"network": {"policy": {"enabled": False}}})
    stack.wait_converged("converged after the NetworkPolicy is turned off", generation=generation)
    eventually(lambda: "NetworkPolicy" not in {k for k, _ in stack.children()}, timeout=60, what="pruned")
    after = {key: item["metadata"]["uid"] for key, item in stack.children().items()}
    gone = set(before) - set(after)
    assert {kind for kind, _ in gone} == {"NetworkPolicy"}, gone
    assert {k: before[k] for k in after} == after, "a child other than the pruned one was re-created"
    stack.settle(since, "pruning")


def test_leader_killed_under_load_hands_over(stack: Stack, tmp_path: Path) -> None:
    """Two replicas on one lease; kill -9 the leader: the standby takes the lease once it lapses
    (10 s) and reconciles a spec edit made after the fail-over (router back to 1 replica)."""
    since = time.time()
    args = operator_args(stack.cluster, stack.namespace, "tandem-chaos")
    standby = OperatorProcess(stack.cluster, [*args, "--identity", "standby"], tmp_path / "standby.log")
    try:
        eventually(lambda: standby.is_leader() is False, timeout=90, what="the standby following")
        assert stack.operator.current.is_leader()
        killed = time.monotonic()
        stack.operator.current.kill()
        standby.wait_leader(timeout=60)
        took_over = time.monotonic() - killed
        holder = stack.kubectl("get", "lease", "tandem-chaos", "-o", "jsonpath={.spec.holderIdentity}").stdout
        assert holder == "standby"
        generation = stack.patch({"router": {"replicas": 1}})
        acted = stack.wait_converged("the standby reconciles an edit", generation=generation)
        eventually(
            lambda: (
                len(stack.get("pods", "-l", f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}=router")["items"])
                == 1
            ),
            timeout=60,
            what="one router pod",
        )
        stack.figures["leader fail-over"] = {
            "kill to new leader s": round(took_over, 1),
            "edit reconciled s": round(acted, 1),
        }
        stack.settle(since, "leader fail-over")
    finally:
        standby.stop()  # hands the lease back at once
    stack.operator.crash_and_restart()  # the module's operator (dead since the kill) leads again


def test_apiserver_and_etcd_restart_under_load(stack: Stack) -> None:
    """kube-apiserver and etcd stopped for 10 s, then started with the same data and flags: requests
    are served throughout (the data path does not read the API), the operator makes no pass while the
    API is gone (it loses its lease) and no hot loop of retries, reconnects by itself, and reconciles
    a spec edit made afterwards."""
    if not stack.cluster.owned:
        pytest.skip("restarts the control plane: needs the cluster this session started")
    cdir = ClusterDir(stack.cluster.dir)
    since = time.time()
    time.sleep(3)
    passes = stack.operator_metric("tandem_operator_reconciles_total")
    down_at = time.time()
    devcluster.stop_control_plane(cdir)
    stopped = time.time() - down_at
    try:
        time.sleep(10)
        passes_in_outage = stack.operator_metric("tandem_operator_reconciles_total") - passes
        led_in_outage = stack.operator.current.is_leader()
    finally:
        starting = time.time()
        devcluster.start_control_plane(cdir)
    up_at = time.time()
    served = [s for s in stack.load.samples(since=down_at, until=up_at) if s.ok]
    assert stack.operator.current.proc.poll() is None, "the operator exited during the outage"
    assert led_in_outage is False, "still leading without the API (it cannot renew its lease)"
    assert passes_in_outage <= MAX_PASSES_IN_OUTAGE, f"{passes_in_outage:.0f} passes while the API was down"
    started = time.monotonic()
    stack.operator.current.wait_leader(timeout=120)
    leads = time.monotonic() - started
    generation = stack.patch({"slo": {"ttftMs": 2500, "tpotMs": 200}})
    reconciled = stack.wait_converged("an edit after the restart reconciled", generation=generation)
    stack.figures["apiserver+etcd restart"] = {
        "outage s": round(up_at - down_at, 1),
        "stop s": round(stopped, 1),
        "start to /readyz s": round(up_at - starting, 1),
        "requests served in the outage": len(served),
        "passes in the outage": passes_in_outage,
        "API up to leader again s": round(leads, 1),
        "edit reconciled s": round(reconciled, 1),
    }
    assert served, "no request was served while the API was down"
    stack.settle(since, "apiserver+etcd restart")


def test_children_edited_and_deleted_by_hand_under_load(stack: Stack) -> None:
    """decode's StatefulSet scaled 2 -> 3 by hand, prefill's StatefulSet deleted without its pods
    (`--cascade=orphan`), the router's Service and prefill's headless Service deleted: all restored,
    the pod the hand scale added drained before decode shrinks back to 2, the orphaned prefill pod
    adopted (same uid: no second pod), requests flowing throughout."""
    since = time.time()
    time.sleep(3)
    prefill_pod = stack.get("pods", "-l", f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}=prefill")["items"]
    assert len(prefill_pod) == 1
    live = stack.children()
    names = {kind: sorted(n for k, n in live if k == kind) for kind in ("StatefulSet", "Service")}
    decode_sts = next(n for n in names["StatefulSet"] if n.endswith("-decode"))
    prefill_sts = next(n for n in names["StatefulSet"] if n.endswith("-prefill"))
    router_svc = f"{NAME}-router"
    prefill_svc = next(n for n in names["Service"] if n.endswith("-prefill"))
    old = {
        key: live[key]["metadata"]["uid"]
        for key in (("Service", router_svc), ("Service", prefill_svc), ("StatefulSet", prefill_sts))
    }
    decode_generation = live[("StatefulSet", decode_sts)]["metadata"]["generation"]
    done: dict[str, float] = {}  # when each hand edit's kubectl returned
    restored_at: dict[str, float] = {}  # when a poll (every 0.2 s, in a thread) first saw it undone
    stop = threading.Event()

    def read(kind: str, name: str) -> dict[str, Any] | None:
        call = apps.read_namespaced_stateful_set if kind == "StatefulSet" else core.read_namespaced_service
        try:
            return kube.raw(call(name, stack.namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def poll() -> None:
        while not stop.wait(0.2):
            with contextlib.suppress(Exception):
                for (kind, name), uid in old.items():
                    obj = read(kind, name)
                    if obj is not None and obj["metadata"]["uid"] != uid:
                        restored_at.setdefault(f"{kind} {name}", time.monotonic())
                pdd = kube.raw(
                    custom.get_namespaced_custom_object(
                        meta.GROUP, meta.VERSION, stack.namespace, meta.PLURAL, NAME, _preload_content=False
                    )
                )
                pools = ((pdd.get("status") or {}).get("autoscaling") or {}).get("pools") or {}
                draining = (pools.get("decode") or {}).get("draining") or {}
                if f"{decode_sts}-2" in (draining.get("pods") or []):
                    restored_at.setdefault("drained", time.monotonic())
                decode = read("StatefulSet", decode_sts)
                # Scaled (one generation) and put back (another): 2 replicas two generations on.
                if (
                    decode
                    and decode["spec"]["replicas"] == 2
                    and decode["metadata"]["generation"] >= decode_generation + 2
                ):
                    restored_at.setdefault(f"StatefulSet {decode_sts} scaled", time.monotonic())

    api = stack.cluster.api_client()
    apps, core, custom = client.AppsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        stack.kubectl("delete", f"service/{router_svc}", f"service/{prefill_svc}")
        done[f"Service {router_svc}"] = done[f"Service {prefill_svc}"] = time.monotonic()
        # kubectl waits until the garbage collector has orphaned the pod and removed the StatefulSet.
        stack.kubectl("delete", f"statefulset/{prefill_sts}", "--cascade=orphan")
        done[f"StatefulSet {prefill_sts}"] = time.monotonic()
        stack.kubectl("scale", f"statefulset/{decode_sts}", "--replicas=3")
        done[f"StatefulSet {decode_sts} scaled"] = time.monotonic()
        eventually(
            lambda: len(restored_at) == len(old) + 2,
            timeout=90,
            what=f"the StatefulSets and Services restored (so far {sorted(restored_at)})",
        )
    finally:
        stop.set()
        poller.join(timeout=10)
        kube.close(api)
    # The pod the hand scale added is drained (the router sends it nothing new) before the StatefulSet
    # shrinks back: a scale-in like the autoscaler's, so no stream on it is cut.
    assert restored_at["drained"] <= restored_at[f"StatefulSet {decode_sts} scaled"], "shrunk before a drain"
    seen = {f"{label} restored s": round(restored_at[label] - done[label], 1) for label in done}
    seen["orphaning delete of the StatefulSet (kubectl, waits for the GC) s"] = round(
        done[f"StatefulSet {prefill_sts}"] - done[f"Service {router_svc}"], 1
    )
    stack.figures["children by hand"] = seen
    stack.wait_converged("Ready again", timeout=90)
    eventually(
        lambda: (
            len(stack.get("pods", "-l", f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}=decode")["items"]) == 2
        ),
        timeout=90,
        what="decode back to 2 pods",
    )
    now_prefill = stack.get("pods", "-l", f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}=prefill")["items"]
    assert [p["metadata"]["uid"] for p in now_prefill] == [prefill_pod[0]["metadata"]["uid"]]
    owner = now_prefill[0]["metadata"]["ownerReferences"][0]
    assert owner["uid"] == stack.children()[("StatefulSet", prefill_sts)]["metadata"]["uid"], "not adopted"
    stack.settle(since, "children by hand")


def test_operator_killed_mid_drain_completes_the_drain(stack: Stack) -> None:
    """Autoscaling unpaused at 3 requests/s: decode 2 -> 1 (its minimum) after the 10 s window, decode-1
    drained first; kill -9 while decode-1 carries the draining mark: the new process finishes the
    drain (the mark and status survive the crash), the pod goes, and no request fails."""
    since = time.time()
    stack.kubectl("annotate", "pdd", NAME, f"{meta.ANNOTATION_AUTOSCALING_PAUSED}-")
    decode1 = f"{NAME}-decode-1"

    def draining() -> bool:
        pod = stack.get("pod", decode1)
        return bool((pod["metadata"].get("annotations") or {}).get(meta.ANNOTATION_DRAINING))

    eventually(draining, timeout=120, interval=0.5, what=f"{decode1} marked draining")
    pools = stack.pdd()["status"]["autoscaling"]["pools"]["decode"]
    assert pools.get("draining"), pools
    restarted = time.monotonic()
    stack.operator.crash_and_restart()

    def gone() -> bool:
        pods = stack.get("pods", "-l", f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}=decode")["items"]
        return [p["metadata"]["name"] for p in pods] == [f"{NAME}-decode-0"]

    eventually(gone, timeout=120, what=f"{decode1} gone after the drain")
    stack.figures["kill mid-drain"] = {
        "restart to drained pod gone s": round(time.monotonic() - restarted, 1)
    }
    stack.wait_converged("Ready at decode 1")
    state = stack.pdd()["status"]["autoscaling"]["pools"]["decode"]
    assert state["desiredReplicas"] == 1
    assert "draining" not in state
    stack.settle(since, "kill mid-drain")


def test_operator_killed_mid_revision_change_completes_it(stack: Stack) -> None:
    """The engine image changed under load: a new serving revision, its P/D pair beside the old one
    (docs/rollout.md, Revisions). kill -9 as soon as status records the change (two revisions); the
    new process finishes it from status: the new pair Ready, the weight moved to it, the old pair
    drained and deleted, no pod left of it, and no request failed."""
    since = time.time()
    time.sleep(3)
    old = stack.pdd()["status"]["revisions"]["current"]
    generation = stack.patch({"engine": {"image": NEW_IMAGE}})

    def revisions() -> dict[str, Any]:
        return dict((stack.pdd().get("status") or {}).get("revisions") or {})

    def changing() -> dict[str, Any] | None:
        r = revisions()
        return r if (r.get("previous") or {}).get("id") == old["id"] else None

    recorded = eventually(changing, timeout=60, interval=0.2, what="the revision change recorded in status")
    restarted = time.monotonic()
    stack.operator.crash_and_restart()

    def done() -> bool:
        r = revisions()
        return bool(
            stack.converged(generation=generation)
            and r["current"]["id"] == recorded["current"]["id"]
            and not r.get("previous")
            and r.get("weight", 100) == 100
            and not stack.stray_pods()
        )

    try:
        eventually(done, timeout=150, what="the change completed and the old pair gone")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrevisions: {revisions()}\n{stack.describe()}") from None
    stack.figures["kill mid-revision change"] = {
        "weight at the kill": recorded.get("weight"),
        "restart to old pair gone s": round(time.monotonic() - restarted, 1),
    }
    names = {n for k, n in stack.children() if k == "StatefulSet"}
    assert names == {f"{recorded['current']['prefix']}-prefill", f"{recorded['current']['prefix']}-decode"}, (
        names
    )
    stack.settle(since, "kill mid-revision change")


def _stalled(stack: Stack, reason: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        conds = {c["type"]: c for c in (stack.pdd(FAULTY).get("status") or {}).get("conditions") or []}
        stalled = conds.get("Stalled", {})
        return stalled if stalled.get("status") == "True" and stalled.get("reason") == reason else None

    return check


def test_pods_that_cannot_start_show_in_status_and_recover(stack: Stack, tmp_path: Path) -> None:
    """A second PDDeployment (no load on it), created with the operator killed -9 as soon as its
    first child exists (the restarted one completes it: children = render, no duplicate). Its
    engine env names a Secret that does not exist (CreateContainerConfigError: ConfigError), fixed
    by creating the Secret; decode's engine args
    break the engine (CrashLoopBackOff), fixed by removing them; the router's image is one no
    registry serves (ImagePullBackOff: ImagePullFailed; the runner's `.invalid` rule), fixed by the
    right image (the router's, not the engines': an engine image change is a new serving revision,
    docs/rollout.md). Each time Stalled names the reason and the pod with its pool, and the fix
    brings Ready back. The main stack's load keeps flowing and its invariants hold."""
    since = time.time()
    doc = harness.pddeployment(
        FAULTY,
        {
            "engine": {"type": "sim", "image": harness.IMAGE},
            "prefill": harness.pool(1),
            "decode": harness.pool(1),
        },
    )
    env = [
        *harness.engine_env(1, 1),
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "chaos-token", "key": "token"}}},
    ]
    doc["spec"]["engine"]["env"] = env
    figures: dict[str, Any] = {}
    # Created with the operator killed -9 as soon as the first of its children exists: the restarted
    # operator creates the rest, no duplicate, nothing orphaned (children_match_render below and at
    # the end). A pass applies its children in parallel, all within a few ms here, so for this step
    # the operator runs with `--api-parallelism 1` (one call at a time): the kill then lands with
    # some children still missing (counted, and asserted).
    stack.operator.current.kill()
    serial = OperatorProcess(
        stack.cluster, [*stack.operator.args, "--api-parallelism", "1"], tmp_path / "serial.log"
    )
    api = stack.cluster.api_client()
    killed = threading.Event()

    def kill_on_first_child() -> None:
        # A watch, not a poll: the SIGKILL follows the ServiceAccount's ADDED event within ms.
        core = client.CoreV1Api(api)
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        for _ in stream.stream(  # type: ignore[no-untyped-call]
            core.list_namespaced_service_account,
            stack.namespace,
            label_selector=f"{meta.LABEL_PDD}={FAULTY}",
            timeout_seconds=90,
        ):
            serial.proc.send_signal(signal.SIGKILL)
            killed.set()
            stream.stop()  # type: ignore[no-untyped-call]
            return

    try:
        serial.wait_leader(timeout=90)
        watcher = threading.Thread(target=kill_on_first_child, daemon=True)
        watcher.start()
        time.sleep(1)  # the watch is open (a late one still gets the ServiceAccount as ADDED)
        stack.kubectl("apply", "-f", "-", input=json.dumps(doc))
        watcher.join(timeout=90)
        assert killed.is_set(), "no child of the new PDDeployment appeared"
    finally:
        serial.kill()
        kube.close(api)
    at_kill, rendered = len(stack.children(FAULTY)), len(stack.rendered(FAULTY))
    figures["children at the kill mid-creation"] = f"{at_kill} of {rendered}"
    stack.operator.crash_and_restart()  # the module's operator (dead since the switch) again
    assert at_kill < rendered, "the pass had created every child before the kill: not mid-pass"

    stalled = eventually(_stalled(stack, "ConfigError"), timeout=120, what="Stalled ConfigError")
    assert "CreateContainerConfigError" in stalled["message"], stalled
    assert "chaos-token" in stalled["message"], stalled
    assert f"pod {FAULTY}-" in stalled["message"], stalled
    stack.children_match_render(FAULTY)
    fixed = time.monotonic()
    stack.kubectl("create", "secret", "generic", "chaos-token", "--from-literal=token=t")
    stack.wait_converged("Ready once the Secret exists", FAULTY, timeout=120)
    figures["ConfigError fix to Ready s"] = round(time.monotonic() - fixed, 1)

    stack.patch({"decode": {"engineArgs": ["--no-such-flag"]}}, FAULTY)
    stalled = eventually(_stalled(stack, "CrashLoopBackOff"), timeout=120, what="Stalled CrashLoopBackOff")
    assert f"pod {FAULTY}-decode-0 (decode)" in stalled["message"], stalled
    # The engine's own error line, from the end of its log (FallbackToLogsOnError, as a kubelet).
    assert "error: unrecognized arguments: --no-such-flag" in stalled["message"], stalled
    fixed = time.monotonic()
    generation = stack.patch({"decode": {"engineArgs": None}}, FAULTY)
    stack.wait_converged("Ready without the bad flag", FAULTY, generation, timeout=120)
    figures["CrashLoopBackOff fix to Ready s"] = round(time.monotonic() - fixed, 1)

    stack.patch({"router": {"image": "registry.invalid/tandem:0.1.0"}}, FAULTY)
    stalled = eventually(_stalled(stack, "ImagePullFailed"), timeout=120, what="Stalled ImagePullFailed")
    assert "registry.invalid/tandem:0.1.0" in stalled["message"], stalled
    assert f"pod {FAULTY}-router-" in stalled["message"], stalled
    assert "(router)" in stalled["message"], stalled
    fixed = time.monotonic()
    generation = stack.patch({"router": {"image": harness.IMAGE}}, FAULTY)
    stack.wait_converged("Ready with the right image", FAULTY, generation, timeout=120)
    figures["ImagePullFailed fix to Ready s"] = round(time.monotonic() - fixed, 1)
    stack.children_match_render(FAULTY)
    stack.figures["pods that cannot start"] = figures
    stack.settle(since, "pods that cannot start")
