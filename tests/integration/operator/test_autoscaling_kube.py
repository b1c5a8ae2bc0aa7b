"""The operator's autoscaling loop against the real control plane, without traffic.

The Kubernetes side of the SLO autoscaler: sizes live in status and survive `kubectl apply` of the
unchanged manifest and operator crashes; scale-downs drain the pods the StatefulSet will delete;
a pool handed to an HPA keeps its count both ways, a StatefulSet's pods or a LeaderWorkerSet's groups
(the `lws` fixture runs its controller); an unreachable Prometheus holds every size without a hot
loop. Pods are the sim engine, run by the dev cluster's pod runner and scraped by its Prometheus;
with no traffic the autoscaler recommends each pool's minReplicas (real behaviour, no status written
by the tests). Settings are compressed and stated per test (decisions every 5 s, scale-down windows
of 20-30 s instead of 300 s).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tandem.api import meta
from tandem.demo import e2e
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import RestartableOperator, eventually, free_port, managers_of, metric_total

T = TypeVar("T")

ROOT = Path(__file__).parents[3]
SIM_EXAMPLE = ROOT / "examples" / "sim-pd.yaml"
HPA_EXAMPLE = ROOT / "docs" / "examples" / "hpa-decode.yaml"
DRAINING = "tandem.dev/draining"
PAUSED = "tandem.dev/autoscaling-paused"


def manifest(
    name: str,
    *,
    decode: int = 2,
    bounds: tuple[int, int] = (1, 3),
    interval: int = 5,
    scale_down_window: int = 20,
    drain_timeout: int = 60,
    prometheus_url: str | None = None,
    external: bool = False,
    decode_shape: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """sim-pd (prefill 1 fixed, router 1) with decode autoscaled within `bounds` from `decode`;
    `decode_shape` adds to decode's spec (e.g. `e2e.GROUP_OF_TWO`: a pool of groups)."""
    doc: dict[str, Any] = yaml.safe_load(SIM_EXAMPLE.read_text())
    doc["metadata"] = {"name": name}
    spec = doc["spec"]
    spec["decode"].update(decode_shape or {})
    spec["decode"]["replicas"] = decode
    spec["decode"]["autoscaling"] = {"minReplicas": bounds[0], "maxReplicas": bounds[1], "external": external}
    spec["slo"] = {"ttftMs": 1000, "tpotMs": 50}
    spec["autoscaling"] = {
        "enabled": True,
        "intervalSeconds": interval,
        "scaleUp": {"stabilizationSeconds": 0, "maxStep": 2},
        "scaleDown": {"stabilizationSeconds": scale_down_window, "maxStep": 1},
        "drainTimeoutSeconds": drain_timeout,
    }
    if prometheus_url:
        spec["autoscaling"]["prometheus"] = {"url": prometheus_url, "timeoutSeconds": 2}
    return doc


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 180) -> T:
    return eventually(check, timeout=timeout, what=what, interval=1.0)


def kubectl_apply(cluster: ClusterHandle, namespace: str, doc: dict[str, Any], *flags: str) -> None:
    """`kubectl apply` of a manifest as a user or a GitOps tool would (client-side unless flags say)."""
    cluster.kubectl("apply", "-n", namespace, *flags, "-f", "-", input=yaml.safe_dump(doc))


def get(cluster: ClusterHandle, namespace: str, *what: str) -> dict[str, Any]:
    result = cluster.kubectl("get", "-n", namespace, *what, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def pdd_when(
    cluster: ClusterHandle, namespace: str, name: str, predicate: Callable[[dict[str, Any]], bool]
) -> Callable[[], dict[str, Any] | None]:
    """A check for `wait_for`: the PDDeployment once `predicate` holds for it."""

    def check() -> dict[str, Any] | None:
        pdd = get(cluster, namespace, "pdd", name)
        return pdd if pdd and predicate(pdd) else None

    return check


def condition(pdd: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (pdd.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def pool_state(pdd: dict[str, Any], role: str = "decode") -> dict[str, Any]:
    return dict((((pdd.get("status") or {}).get("autoscaling") or {}).get("pools") or {}).get(role) or {})


def workload_replicas(
    cluster: ClusterHandle, namespace: str, name: str, kind: str = "statefulset"
) -> int | None:
    """A workload's spec.replicas: a StatefulSet's pods, or (`kind` leaderworkerset) its groups."""
    workload = get(cluster, namespace, kind, name)
    return workload["spec"].get("replicas") if workload else None


def events_of(cluster: ClusterHandle, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """The PDDeployment's Events by reason (the first of each)."""
    items = get(cluster, namespace, "events", "--field-selector", f"involvedObject.name={name}")
    by_reason: dict[str, dict[str, Any]] = {}
    for event in sorted(items.get("items", []), key=lambda e: e["metadata"]["creationTimestamp"]):
        by_reason.setdefault(event["reason"], event)
    return by_reason


def ready(cluster: ClusterHandle, namespace: str, name: str) -> dict[str, Any] | None:
    pdd = get(cluster, namespace, "pdd", name)
    assert condition(pdd, "Stalled").get("status") != "True", condition(pdd, "Stalled")
    gen = pdd.get("metadata", {}).get("generation")
    if condition(pdd, "Ready").get("status") == "True" and pdd["status"].get("observedGeneration") == gen:
        return pdd
    return None


def annotate(cluster: ClusterHandle, namespace: str, name: str, annotation: str) -> None:
    cluster.kubectl("annotate", "-n", namespace, "pdd", name, annotation, "--overwrite")


def test_scale_in_without_traffic_drains_first_and_survives_kubectl_apply(
    cluster: ClusterHandle, autoscaling_operator: RestartableOperator, namespace: str
) -> None:
    """intervalSeconds 5, scaleDown 20 s / maxStep 1, drainTimeoutSeconds 60; decode 2 in [1, 3].

    Paused until every pod is ready, so the drain meets a running pod; then, with no traffic, the
    autoscaler recommends minReplicas 1 and, a window later, drains decode-1 and shrinks decode.
    """
    name = "scale-in"
    doc = manifest(name)
    kubectl_apply(cluster, namespace, doc)
    annotate(cluster, namespace, name, f"{PAUSED}=true")
    pdd = wait_for("Ready while paused", lambda: ready(cluster, namespace, name), timeout=300)
    wait_for(
        "mode Paused",
        lambda: (
            (get(cluster, namespace, "pdd", name).get("status") or {}).get("autoscaling", {}).get("mode")
            == "Paused"
        ),
        timeout=60,
    )
    assert pdd["status"]["pools"]["decode"]["source"] == "autoscaler"
    annotate(cluster, namespace, name, f"{PAUSED}-")
    unpaused = time.time()

    def draining() -> dict[str, Any] | None:
        pod = get(cluster, namespace, "pod", f"{name}-decode-1")
        mark = (pod.get("metadata") or {}).get("annotations", {}).get(DRAINING)
        pdd = get(cluster, namespace, "pdd", name)
        state = pool_state(pdd)
        if mark and state.get("draining"):
            return {
                "mark": mark,
                "state": state,
                "limitedBy": pdd["status"]["pools"]["decode"]["limitedBy"],
                "replicas": workload_replicas(cluster, namespace, f"{name}-decode"),
            }
        return None

    seen = wait_for("decode-1 marked draining", draining, timeout=120)
    assert seen["replicas"] == 2, "the StatefulSet keeps the pod while it drains"
    assert seen["state"]["desiredReplicas"] == 1
    assert seen["state"]["draining"]["pods"] == [f"{name}-decode-1"]
    assert seen["state"]["draining"]["targetReplicas"] == 1
    assert seen["limitedBy"] == "drain", "status names the stage that keeps the second pod"
    # paused passes record the held size, so the window runs from the last one (at most 5 s earlier)
    assert time.time() - unpaused >= 20 - 5 - 1, "scaled down inside the window after the pause"
    assert "T" in seen["mark"]  # an RFC 3339 time
    assert not (get(cluster, namespace, "pod", f"{name}-decode-0")["metadata"].get("annotations") or {}).get(
        DRAINING
    )

    wait_for(
        "decode at 1 replica once decode-1 is idle",
        lambda: workload_replicas(cluster, namespace, f"{name}-decode") == 1,
        timeout=120,
    )
    pdd = wait_for("Ready at the new size", lambda: ready(cluster, namespace, name), timeout=180)
    state = pool_state(pdd)
    assert state["desiredReplicas"] == 1
    assert "draining" not in state
    assert state["lastDecision"]["from"] == 2
    assert state["lastDecision"]["to"] == 1
    assert pdd["status"]["pools"]["decode"]["desiredReplicas"] == 1
    assert pdd["status"]["pools"]["decode"]["limitedBy"] == "autoscaler"
    assert condition(pdd, "AutoscalingActive")["status"] == "True"
    events = wait_for(
        "the ScaledDown, Draining and Drained Events",  # posted off the passes
        lambda: (
            e
            if {"ScaledDown", "Draining", "Drained"} <= set(e := events_of(cluster, namespace, name))
            else None
        ),
        timeout=60,
    )
    at = {
        reason: events[reason]["metadata"]["creationTimestamp"]
        for reason in ("ScaledDown", "Draining", "Drained")
    }
    assert at["ScaledDown"] <= at["Draining"] < at["Drained"], at  # one-second stamps: the first two may tie
    assert "decode 2 -> 1" in events["ScaledDown"]["message"], events["ScaledDown"]["message"]
    assert "idle" in events["Drained"]["message"], events["Drained"]["message"]  # not the timeout

    # The unchanged manifest, applied again by kubectl (client-side, then server-side as Argo CD
    # with ServerSideApply would): nothing changes, the size stays the autoscaler's.
    generation = pdd["metadata"]["generation"]
    evaluated = pdd["status"]["autoscaling"]["lastEvaluated"]
    kubectl_apply(cluster, namespace, doc)
    kubectl_apply(cluster, namespace, doc, "--server-side", "--field-manager=argocd-controller")
    wait_for(
        "three more decisions",
        lambda: (
            pool_state(get(cluster, namespace, "pdd", name)).get("desiredReplicas") == 1
            and get(cluster, namespace, "pdd", name)["status"]["autoscaling"]["lastEvaluated"]
            >= evaluated + 15
        ),
        timeout=90,
    )
    pdd = get(cluster, namespace, "pdd", name)
    assert pdd["metadata"]["generation"] == generation
    assert pdd["spec"]["decode"]["replicas"] == 2  # the operator never writes spec
    assert workload_replicas(cluster, namespace, f"{name}-decode") == 1
    assert pdd["status"]["pools"]["decode"]["desiredReplicas"] == 1


def test_crash_keeps_sizes_and_stabilization_history(
    cluster: ClusterHandle, autoscaling_operator: RestartableOperator, namespace: str
) -> None:
    """intervalSeconds 5, scaleDown 30 s / maxStep 1, drainTimeoutSeconds 30; decode 2 in [1, 3].

    kill -9 inside the first window: the new process neither resets decode nor shrinks it before
    the window (counted from the first recommendation, before the crash) has passed. kill -9 again
    after the scale-in: decode stays at 1, not the manifest's 2.
    """
    name = "crash"
    kubectl_apply(cluster, namespace, manifest(name, scale_down_window=30, drain_timeout=30))
    pdd = wait_for(
        "three recommendations",
        pdd_when(cluster, namespace, name, lambda p: len(pool_state(p).get("recommendations", [])) >= 3),
        timeout=60,
    )
    history = pool_state(pdd)["recommendations"]
    first = history[0]["time"]
    assert history[0]["replicas"] == 2  # the starting size opens the window
    assert pool_state(pdd)["desiredReplicas"] == 2
    assert time.time() < first + 25, "the test must crash the operator well inside the window"
    crashed = time.time()
    autoscaling_operator.crash_and_restart()

    pdd = wait_for(
        "the restarted operator's first decision",
        pdd_when(cluster, namespace, name, lambda p: p["status"]["autoscaling"]["lastEvaluated"] > crashed),
        timeout=60,
    )
    state = pool_state(pdd)
    assert state["desiredReplicas"] == 2, "reset or scaled down at once after the crash"
    assert [r for r in state["recommendations"] if r["time"] <= first] == [history[0]], "history lost"
    pdd = wait_for(
        "decode scaled in by the restarted operator",
        pdd_when(cluster, namespace, name, lambda p: pool_state(p).get("desiredReplicas") == 1),
        timeout=120,
    )
    assert pool_state(pdd)["lastScaleTime"] >= first + 30, "scaled down before the window had passed"
    wait_for(
        "decode at 1 replica",
        lambda: workload_replicas(cluster, namespace, f"{name}-decode") == 1,
        timeout=120,
    )

    autoscaling_operator.crash_and_restart()

    def decided_after(moment: float) -> Callable[[], dict[str, Any] | None]:
        def check() -> dict[str, Any] | None:
            pdd = get(cluster, namespace, "pdd", name)
            return pdd if pdd["status"]["autoscaling"]["lastEvaluated"] > moment else None

        return check

    moment = time.time()
    for _ in range(3):  # three decisions of the new process, each leaving decode at 1
        pdd = wait_for("a decision after the restart", decided_after(moment), timeout=60)
        assert pool_state(pdd)["desiredReplicas"] == 1, "reset to the manifest's size after the crash"
        assert workload_replicas(cluster, namespace, f"{name}-decode") == 1
        moment = pdd["status"]["autoscaling"]["lastEvaluated"]
    assert pdd["spec"]["decode"]["replicas"] == 2


@dataclass(frozen=True)
class Workload:
    """A decode pool's workload as the HPA scales it: `kind` at `api_version`, made of replicas of
    `pods` pods each (its pod template at spec.`template`), decode's spec given `shape`; handed over
    at `start` replicas."""

    kind: str
    api_version: str
    start: int
    pods: int = 1
    template: str = "template"
    shape: Mapping[str, Any] = field(default_factory=dict)


STATEFULSET = Workload("StatefulSet", "apps/v1", start=2)
# One group of 2 sim pods to start from and one more from the HPA: the fewest pods that show a group.
GROUPS = Workload(
    meta.LWS_KIND,
    meta.LWS_API_VERSION,
    start=1,
    pods=2,
    template="leaderWorkerTemplate",
    shape=e2e.GROUP_OF_TWO,
)


@pytest.mark.parametrize("workload", [STATEFULSET, GROUPS], ids=lambda w: w.kind)
def test_external_pool_hand_over_and_back_keep_the_count(
    cluster: ClusterHandle,
    autoscaling_operator: RestartableOperator,
    namespace: str,
    workload: Workload,
    request: pytest.FixtureRequest,
) -> None:
    """decode `start` replicas in [1, 4] with a 600 s scale-down window (no change from tandem
    meanwhile); the HPA is docs/examples/hpa-decode.yaml's aimed at decode's workload, with
    minReplicas one above `start` so that it scales without a metrics API (KCM's HPA controller
    decides "below minReplicas" before it reads metrics). A LeaderWorkerSet is scaled through its
    scale subresource, in groups, and LeaderWorkerSet's controller makes the new group's pods."""
    if workload.kind == meta.LWS_KIND:
        request.getfixturevalue("lws")
    name = "handover"
    target = f"{name}-decode"
    kind = workload.kind.lower()
    start, scaled = workload.start, workload.start + 1

    def count() -> int | None:
        return workload_replicas(cluster, namespace, target, kind)

    def decode_pods() -> int:
        selector = f"{meta.LABEL_PDD}={name},{meta.LABEL_ROLE}=decode"
        items = get(cluster, namespace, "pods", "-l", selector).get("items", [])
        return len([p for p in items if not p["metadata"].get("deletionTimestamp")])

    def spec(external: bool = False) -> dict[str, Any]:
        return manifest(
            name,
            decode=start,
            bounds=(1, 4),
            scale_down_window=600,
            external=external,
            decode_shape=workload.shape,
        )

    kubectl_apply(cluster, namespace, spec())
    wait_for("Ready", lambda: ready(cluster, namespace, name), timeout=300)
    assert decode_pods() == start * workload.pods
    assert managers_of(
        get(cluster, namespace, kind, target, "--show-managed-fields"), "spec", "replicas"
    ) == {"tandem-operator:Apply"}

    def watch_count(expected: int, what: str, check: Callable[[], bool], timeout: float = 120) -> None:
        """Waits for `check`, failing at once if the workload's count ever leaves `expected`."""

        def step() -> bool:
            assert count() == expected, f"replicas went to {count()} during: {what}"
            return check()

        wait_for(what, step, timeout=timeout)

    kubectl_apply(cluster, namespace, spec(external=True))
    watch_count(
        start,
        "hand-over to source external",
        lambda: get(cluster, namespace, "pdd", name)["status"]["pools"]["decode"]["source"] == "external",
    )
    live = get(cluster, namespace, kind, target, "--show-managed-fields")
    owners = managers_of(live, "spec", "replicas")
    assert "tandem-handover:Apply" in owners
    assert "tandem-operator:Apply" not in owners
    assert managers_of(live, "spec", workload.template) == {
        "tandem-operator:Apply"
    }  # the rest: the operator's
    for _ in range(2):  # later passes leave it alone too
        time.sleep(5)
        assert count() == start

    hpa = list(yaml.safe_load_all(HPA_EXAMPLE.read_text()))[1]
    hpa["metadata"] = {"name": target}
    hpa["spec"]["scaleTargetRef"] = {
        "apiVersion": workload.api_version,
        "kind": workload.kind,
        "name": target,
    }
    hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"] = scaled, 4
    kubectl_apply(cluster, namespace, hpa)
    applied = time.monotonic()
    wait_for(f"the HPA scales decode to {scaled}", lambda: count() == scaled, timeout=120)
    scaled_s = time.monotonic() - applied
    live = get(cluster, namespace, kind, target, "--show-managed-fields")
    # KCM's HPA controller wrote the count, through the scale subresource.
    assert [
        entry.get("subresource")
        for entry in live["metadata"]["managedFields"]
        if entry["manager"] == "kube-controller-manager"
        and "f:replicas" in entry["fieldsV1"].get("f:spec", {})
    ] == ["scale"], live["metadata"]["managedFields"]
    wait_for("the new replica's pods", lambda: decode_pods() == scaled * workload.pods, timeout=120)
    pdd = wait_for(
        "status follows the HPA",
        pdd_when(
            cluster,
            namespace,
            name,
            lambda p: (
                p["status"]["pools"]["decode"]["desiredReplicas"] == scaled
                and p["status"]["pools"]["decode"].get("readyReplicas") == scaled
            ),
        ),
        timeout=120,
    )
    print(
        f"\n{workload.kind}: the HPA scaled decode {start} -> {scaled} {scaled_s:.0f} s after it was "
        f"applied; {scaled * workload.pods} decode pods and status Ready at {scaled} "
        f"{time.monotonic() - applied:.0f} s after it"
    )
    assert pool_state(pdd)["desiredReplicas"] == scaled
    assert pdd["status"]["pools"]["decode"]["source"] == "external"
    for _ in range(3):
        time.sleep(5)
        assert count() == scaled, "the operator fought the HPA"
    assert "tandem-operator:Apply" not in managers_of(
        get(cluster, namespace, kind, target, "--show-managed-fields"), "spec", "replicas"
    )

    cluster.kubectl("delete", "-n", namespace, "hpa", target)
    kubectl_apply(cluster, namespace, spec())
    watch_count(
        scaled,
        "hand-back to source autoscaler",
        lambda: get(cluster, namespace, "pdd", name)["status"]["pools"]["decode"]["source"] == "autoscaler",
    )
    live = get(cluster, namespace, kind, target, "--show-managed-fields")
    assert "tandem-operator:Apply" in managers_of(live, "spec", "replicas")
    assert all(e["manager"] != "tandem-handover" for e in live["metadata"]["managedFields"])
    for _ in range(2):
        time.sleep(5)
        assert count() == scaled
    assert pool_state(get(cluster, namespace, "pdd", name))["desiredReplicas"] == scaled
    assert decode_pods() == scaled * workload.pods


def test_unreachable_prometheus_holds_sizes_without_a_hot_loop(
    cluster: ClusterHandle, autoscaling_operator: RestartableOperator, namespace: str
) -> None:
    """intervalSeconds 5, scaleDown 20 s; spec.autoscaling.prometheus.url is a loopback port nobody
    listens on (it overrides the operator's flag), timeout 2 s."""
    name = "no-prometheus"
    url = f"http://127.0.0.1:{free_port()}"
    kubectl_apply(cluster, namespace, manifest(name, prometheus_url=url))

    def held() -> dict[str, Any] | None:
        pdd = get(cluster, namespace, "pdd", name)
        cond = condition(pdd, "AutoscalingActive")
        return (
            pdd if cond.get("status") == "False" and cond.get("reason") != "PrometheusNotConfigured" else None
        )

    pdd = wait_for("AutoscalingActive False", held, timeout=60)
    cond = condition(pdd, "AutoscalingActive")
    assert cond["reason"] in ("MetricsUnavailable", "MetricsMissing"), cond
    assert "decode 2" in cond["message"], cond["message"]
    wait_for("Ready", lambda: ready(cluster, namespace, name), timeout=300)

    window = 30.0  # longer than the 20 s scale-down window: no data must never mean a scale-down
    before = autoscaling_operator.metrics()
    time.sleep(window)
    after = autoscaling_operator.metrics()

    def delta(metric: str, **labels: str) -> float:
        return metric_total(after, metric, **labels) - metric_total(before, metric, **labels)

    passes = delta("tandem_operator_reconciles_total")
    errors = delta("tandem_operator_autoscaler_prometheus_errors_total", query="snapshot")
    print(f"\nunreachable Prometheus over {window:.0f}s: {passes:.0f} passes, {errors:.0f} failed reads")
    assert 3 <= errors <= 10, "one read per 5 s decision"
    assert passes <= 40, "a hot loop: one decision's status write is worth one more pass, not many"
    pdd = get(cluster, namespace, "pdd", name)
    assert pool_state(pdd)["desiredReplicas"] == 2
    assert workload_replicas(cluster, namespace, f"{name}-decode") == 2
    assert condition(pdd, "AutoscalingActive")["reason"] == cond["reason"]
    assert "slo" not in pdd["status"]
    assert "ScaledDown" not in events_of(cluster, namespace, name)
