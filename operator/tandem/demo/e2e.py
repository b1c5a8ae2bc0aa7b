"""What the e2e tests that drive load through a deployed stack share (autoscaling, rollout, KV
transport, chaos): manifests, a watcher that records the PDDeployment and its StatefulSets once a
second, and small readers of status.

The load itself is `tandem.demo.load.BackgroundLoad` (streamed completions through the router's pod
IP, each measured at the client). Every address is a loopback one (127.0.0.0/8).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes import client

from tandem.api import meta
from tandem.demo.load import BackgroundLoad
from tandem.demo.stats import Sample
from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import eventually
from tandem.perf.stats import percentile

T = TypeVar("T")

MODEL = "llama-3.1-8b"
IMAGE = "ghcr.io/tandem-dev/tandem:0.1.0"
ROLES = ("prefill", "decode")


def engine_env(time_scale: float, load_seconds: float) -> list[dict[str, str]]:
    return [
        {"name": "TANDEM_SIM_TIME_SCALE", "value": f"{time_scale:g}"},
        {"name": "TANDEM_SIM_LOAD_SECONDS", "value": f"{load_seconds:g}"},
    ]


# A sim engine pod's requests: what the scheduler places by (the KWOK nodes' CPU and memory).
POD_REQUESTS = ("500m", "512Mi")
SMALL_POD_REQUESTS = ("100m", "256Mi")  # more pods on the same nodes
# A multi-node pool's shape (added to a pool's spec): groups of 2 pods, a data-parallel rank each, the
# leader balancing (`Internal`); the operator renders a LeaderWorkerSet whose replicas count groups.
GROUP_OF_TWO: dict[str, Any] = {"nodesPerInstance": 2, "parallelism": {"data": 2}}


def pool(
    replicas: int,
    bounds: tuple[int, int] | None = None,
    *engine_args: str,
    requests: tuple[str, str] = POD_REQUESTS,
) -> dict[str, Any]:
    """A pool's spec: sim engine pods with `requests` (CPU, memory) and a 1 GiB memory limit;
    `bounds` (min, max) turns its autoscaling on."""
    cpu, memory = requests
    spec: dict[str, Any] = {
        "replicas": replicas,
        "tensorParallelSize": 1,
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": "1Gi"}},
    }
    if engine_args:
        spec["engineArgs"] = list(engine_args)
    if bounds is not None:
        spec["autoscaling"] = {"minReplicas": bounds[0], "maxReplicas": bounds[1]}
    return spec


def pddeployment(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": MODEL, "uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "maxModelLen": 4096},
        "engine": {"type": "sim", "image": IMAGE},
        "kvTransfer": {"connector": "NixlConnector", "bandwidthGbps": 100},
        "router": {"replicas": 1, "image": IMAGE},
        "serving": {"mode": "Disaggregated"},
    }
    return {
        "apiVersion": meta.API_VERSION,
        "kind": meta.KIND,
        "metadata": {"name": name},
        "spec": base | spec,
    }


@dataclass(frozen=True)
class Seen:
    """The PDDeployment and its pools' StatefulSets at one moment (`at`: wall clock)."""

    at: float
    pdd: dict[str, Any]
    sts: dict[str, tuple[int, int]] = field(default_factory=dict)  # role -> (spec.replicas, ready)

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.pdd.get("status") or {})

    def autoscaling(self, role: str) -> dict[str, Any]:
        pools = (self.status.get("autoscaling") or {}).get("pools") or {}
        return dict(pools.get(role) or {})

    def desired(self, role: str) -> int | None:
        value = self.autoscaling(role).get("desiredReplicas")
        return None if value is None else int(value)

    def replicas(self, role: str) -> int:
        return self.sts.get(role, (0, 0))[0]

    def ready(self, role: str) -> int:
        return self.sts.get(role, (0, 0))[1]

    def condition(self, kind: str) -> dict[str, Any]:
        for cond in self.status.get("conditions") or []:
            if cond.get("type") == kind:
                return dict(cond)
        return {}

    def slo(self) -> dict[str, Any]:
        return dict(self.status.get("slo") or {})

    def mode(self) -> str:
        return str((self.status.get("autoscaling") or {}).get("mode", ""))

    def is_ready(self) -> bool:
        gen = (self.pdd.get("metadata") or {}).get("generation")
        return (
            self.condition("Ready").get("status") == "True" and self.status.get("observedGeneration") == gen
        )

    def brief(self) -> str:
        sizes = ", ".join(
            f"{role} {self.ready(role)}/{self.replicas(role)} (desired {self.desired(role)})"
            for role in ROLES
        )
        active = self.condition("AutoscalingActive")
        slo = self.slo()
        return (
            f"{sizes}; AutoscalingActive={active.get('status')} {active.get('reason')}; "
            f"slo ttft {slo.get('ttftMs')} ms tpot {slo.get('tpotMs')} ms "
            f"attainment {slo.get('attainmentPercent')}%"
        )


class Watcher:
    """Reads the PDDeployment and its StatefulSets once a second in a thread, keeping every reading."""

    def __init__(self, cluster: ClusterHandle, namespace: str, name: str, period: float = 1.0) -> None:
        self.cluster, self.namespace, self.name, self.period = cluster, namespace, name, period
        self.history: list[Seen] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def read(self, api: client.ApiClient) -> Seen:
        custom = client.CustomObjectsApi(api)
        pdd = kube.raw(
            custom.get_namespaced_custom_object(
                meta.GROUP, meta.VERSION, self.namespace, meta.PLURAL, self.name, _preload_content=False
            )
        )
        apps = client.AppsV1Api(api)
        items = kube.raw(
            apps.list_namespaced_stateful_set(
                self.namespace, label_selector=f"{meta.LABEL_PDD}={self.name}", _preload_content=False
            )
        )["items"]
        sts: dict[str, tuple[int, int]] = {}
        for item in items:
            role = item["metadata"].get("labels", {}).get(meta.LABEL_ROLE, "")
            spec_replicas = item["spec"].get("replicas")
            sts[role] = (
                1 if spec_replicas is None else int(spec_replicas),
                int((item.get("status") or {}).get("readyReplicas") or 0),
            )
        return Seen(at=time.time(), pdd=pdd, sts=sts)

    def _run(self) -> None:
        api = self.cluster.api_client()
        try:
            while not self._stop.is_set():
                with contextlib.suppress(Exception):
                    self.history.append(self.read(api))
                self._stop.wait(self.period)
        finally:
            kube.close(api)

    def latest(self) -> Seen:
        if not self.history:
            raise AssertionError("nothing read yet")
        return self.history[-1]

    def since(self, moment: float) -> list[Seen]:
        return [s for s in list(self.history) if s.at >= moment]

    def wait(self, what: str, check: Callable[[Seen], T | None], timeout: float) -> T:
        """Polls the newest reading every second until `check` returns something truthy."""

        def probe() -> T | None:
            if not self.history:
                return None
            return check(self.history[-1])

        try:
            return eventually(probe, timeout=timeout, what=what, interval=1.0)
        except AssertionError as exc:
            last = self.history[-1].brief() if self.history else "nothing read"
            raise AssertionError(f"{exc}\nlast seen: {last}") from None

    def first(self, check: Callable[[Seen], bool], since: float = 0.0) -> Seen | None:
        """The earliest reading since `since` for which `check` holds."""
        return next((s for s in self.since(since) if check(s)), None)


def events(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    api = cluster.api_client()
    try:
        core = client.CoreV1Api(api)
        items = kube.raw(
            core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
            )
        )["items"]
    finally:
        kube.close(api)

    def when(e: dict[str, Any]) -> str:
        return str(e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"])

    return sorted(items, key=when)


def wait_events(
    cluster: ClusterHandle,
    namespace: str,
    name: str,
    check: Callable[[list[dict[str, Any]]], bool],
    what: str,
    timeout: float = 60,
) -> list[dict[str, Any]]:
    """The object's Events once `check` holds for them. The operator posts a pass's Events off the
    pass, after its status patch: a status seen does not mean its Events are in yet."""
    return eventually(
        lambda: found if check(found := events(cluster, namespace, name)) else None,
        timeout=timeout,
        what=what,
        interval=1.0,
    )


def router_url(cluster: ClusterHandle, namespace: str, name: str) -> str:
    api = cluster.api_client()
    try:
        ips = kube.ready_pod_ips(api, namespace, name, "router")
    finally:
        kube.close(api)
    assert ips, "no Ready router pod"
    assert ips[0].startswith("127."), ips
    return f"http://{ips[0]}:{meta.ROUTER_PORT}"


def ttft_quantile(samples: list[Sample], q: float) -> float:
    """TTFT (s) at quantile `q` (percent) of the successful samples; nan without any."""
    return percentile([s.ttft_s for s in samples if s.ok], q)


def failures(samples: list[Sample]) -> list[str]:
    return [s.error for s in samples if not s.ok]


# --- tandem's autoscaler on groups (test_groups_e2e, test_dp_ranks_e2e) -----------------------------


def group_autoscaling(down_window_seconds: int) -> dict[str, Any]:
    """The spec fields of the group-autoscaling e2e tests: an SLO, and tandem's autoscaler deciding
    every 5 s, up at once by one group, down by one after `down_window_seconds`, draining for at most
    90 s."""
    return {
        "slo": {"ttftMs": 3000, "tpotMs": 100, "attainmentPercent": 90},
        "autoscaling": {
            "enabled": True,
            "intervalSeconds": 5,
            "scaleUp": {"stabilizationSeconds": 0, "maxStep": 1},
            "scaleDown": {"stabilizationSeconds": down_window_seconds, "maxStep": 1},
            "drainTimeoutSeconds": 90,
        },
    }


def decided_up(watch: Watcher, role: str, started: float, timeout: float = 180) -> Seen:
    """The first reading whose autoscaler asks for a second replica (group) of `role`; prints the
    decision, seconds after `started` (wall clock)."""
    up = watch.wait(
        f"{role} decided up by a group", lambda s: s if (s.desired(role) or 0) >= 2 else None, timeout
    )
    print(f"+{up.at - started:.0f}s {role} 1 -> 2 groups: {up.autoscaling(role)['lastDecision']['reason']}")
    return up


def stop_and_check_drained(
    load: BackgroundLoad, started: float, cluster: ClusterHandle, namespace: str, name: str
) -> None:
    """Stops `load` and asserts that none of its streams since `started` failed, and that the
    PDDeployment's events say a drain began and ended with its pods idle."""
    time.sleep(3)
    load.stop(timeout=90)
    samples = load.samples(since=started)
    failed = failures(samples)
    print(f"{len(samples)} streams through the router, {len(failed)} failed")
    assert samples
    assert not failed, failed[:3]
    seen = wait_events(
        cluster,
        namespace,
        name,
        lambda found: any(e["reason"] == "Drained" for e in found),
        "the Drained Event",
    )
    reasons = [e["reason"] for e in seen]
    assert "Draining" in reasons, reasons
    drained = [e for e in seen if e["reason"] == "Drained"]
    assert drained, reasons
    print(f"drain: {drained[-1].get('message')}")
    assert "idle" in drained[-1].get("message", ""), drained[-1]
