"""The operator's autoscaling loop against the real control plane, without traffic.

The Kubernetes side of the SLO autoscaler: sizes live in status and survive `kubectl apply` of the
unchanged manifest and operator crashes; scale-downs drain the pods the StatefulSet will delete;
a pool handed to an HPA keeps its count both ways; an unreachable Prometheus holds every size
without a hot loop. Pods are the sim engine, run by the dev cluster's pod runner and scraped by its
Prometheus; with no traffic the autoscaler recommends each pool's minReplicas (real behaviour, no
status written by the tests). Settings are compressed and stated per test (decisions every 5 s,
scale-down windows of 20-30 s instead of 300 s).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

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
) -> dict[str, Any]:
    """sim-pd (prefill 1 fixed, router 1) with decode autoscaled within `bounds` from `decode`."""
    doc: dict[str, Any] = yaml.safe_load(SIM_EXAMPLE.read_text())
    doc["metadata"] = {"name": name}
    spec = doc["spec"]
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


def sts_replicas(cluster: ClusterHandle, namespace: str, name: str) -> int | None:
    sts = get(cluster, namespace, "statefulset", name)
    return sts["spec"].get("replicas") if sts else None


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
                "replicas": sts_replicas(cluster, namespace, f"{name}-decode"),
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
        lambda: sts_replicas(cluster, namespace, f"{name}-decode") == 1,
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
    events = events_of(cluster, namespace, name)
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
    assert sts_replicas(cluster, namespace, f"{name}-decode") == 1
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
        lambda: sts_replicas(cluster, namespace, f"{name}-decode") == 1,
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
        assert sts_replicas(cluster, namespace, f"{name}-decode") == 1
        moment = pdd["status"]["autoscaling"]["lastEvaluated"]
    assert pdd["spec"]["decode"]["replicas"] == 2


def test_external_pool_hand_over_and_back_keep_the_count(
    cluster: ClusterHandle, autoscaling_operator: RestartableOperator, namespace: str
) -> None:
    """decode 2 in [1, 4] with a 600 s scale-down window (no change from tandem meanwhile); the HPA
    is docs/examples/hpa-decode.yaml's, with minReplicas 3 so that it scales without a metrics API."""
    name = "handover"
    sts = f"{name}-decode"
    kubectl_apply(cluster, namespace, manifest(name, bounds=(1, 4), scale_down_window=600))
    wait_for("Ready", lambda: ready(cluster, namespace, name), timeout=300)
    assert managers_of(
        get(cluster, namespace, "statefulset", sts, "--show-managed-fields"), "spec", "replicas"
    ) == {"tandem-operator:Apply"}

    def watch_count(expected: int, what: str, check: Callable[[], bool], timeout: float = 120) -> None:
        """Waits for `check`, failing at once if the StatefulSet's count ever leaves `expected`."""

        def step() -> bool:
            count = sts_replicas(cluster, namespace, sts)
            assert count == expected, f"replicas went to {count} during: {what}"
            return check()

        wait_for(what, step, timeout=timeout)

    kubectl_apply(cluster, namespace, manifest(name, bounds=(1, 4), scale_down_window=600, external=True))
    watch_count(
        2,
        "hand-over to source external",
        lambda: get(cluster, namespace, "pdd", name)["status"]["pools"]["decode"]["source"] == "external",
    )
    live = get(cluster, namespace, "statefulset", sts, "--show-managed-fields")
    owners = managers_of(live, "spec", "replicas")
    assert "tandem-handover:Apply" in owners
    assert "tandem-operator:Apply" not in owners
    assert "f:template" in json.dumps(live["metadata"]["managedFields"])  # the rest stays the operator's
    for _ in range(2):  # later passes leave it alone too
        time.sleep(5)
        assert sts_replicas(cluster, namespace, sts) == 2

    hpa = list(yaml.safe_load_all(HPA_EXAMPLE.read_text()))[1]
    hpa["metadata"] = {"name": sts}
    hpa["spec"]["scaleTargetRef"]["name"] = sts
    hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"] = 3, 4
    kubectl_apply(cluster, namespace, hpa)
    wait_for("the HPA scales decode to 3", lambda: sts_replicas(cluster, namespace, sts) == 3, timeout=120)
    pdd = wait_for(
        "status follows the HPA",
        pdd_when(cluster, namespace, name, lambda p: p["status"]["pools"]["decode"]["desiredReplicas"] == 3),
        timeout=60,
    )
    assert pool_state(pdd)["desiredReplicas"] == 3
    for _ in range(3):
        time.sleep(5)
        assert sts_replicas(cluster, namespace, sts) == 3, "the operator fought the HPA"
    assert "tandem-operator:Apply" not in managers_of(
        get(cluster, namespace, "statefulset", sts, "--show-managed-fields"), "spec", "replicas"
    )

    cluster.kubectl("delete", "-n", namespace, "hpa", sts)
    kubectl_apply(cluster, namespace, manifest(name, bounds=(1, 4), scale_down_window=600))
    watch_count(
        3,
        "hand-back to source autoscaler",
        lambda: get(cluster, namespace, "pdd", name)["status"]["pools"]["decode"]["source"] == "autoscaler",
    )
    live = get(cluster, namespace, "statefulset", sts, "--show-managed-fields")
    assert "tandem-operator:Apply" in managers_of(live, "spec", "replicas")
    assert all(e["manager"] != "tandem-handover" for e in live["metadata"]["managedFields"])
    for _ in range(2):
        time.sleep(5)
        assert sts_replicas(cluster, namespace, sts) == 3
    assert pool_state(get(cluster, namespace, "pdd", name))["desiredReplicas"] == 3


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
    assert sts_replicas(cluster, namespace, f"{name}-decode") == 2
    assert condition(pdd, "AutoscalingActive")["reason"] == cond["reason"]
    assert "slo" not in pdd["status"]
    assert "ScaledDown" not in events_of(cluster, namespace, name)
