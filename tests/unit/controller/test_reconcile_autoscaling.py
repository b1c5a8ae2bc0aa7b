"""Reconcile passes of an autoscaled PDDeployment against an in-memory API and a scripted reader.

The pass wiring, on a virtual clock: the first size comes from the spec, decisions come once per
interval, a scale-down marks the pod and keeps the StatefulSet until the pod is idle, a status
write that loses a race records nothing (and posts no decision Event), and an external pool is
handed over by a second field manager.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from tandem.api.testing import stored
from tandem.api.times import rfc3339
from tandem.controller.autoscaler import Autoscaler
from tandem.controller.drain import DRAIN_SETTLE_SECONDS
from tandem.controller.events import EventRecorder
from tandem.controller.reconcile import PassResult, Reconciler
from tandem.kube.rest import Kind, KubeError
from tandem.signals import PoolSignals, PoolSize, Snapshot

NS, NAME = "ns", "llama"
T0 = 1_800_000_000.0
DRAINING = "tandem.dev/draining"


def manifest(**decode_bounds: Any) -> dict[str, Any]:
    return stored(
        {
            "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"type": "sim", "image": "img"},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 3, **decode_bounds}},
            "router": {"replicas": 1},
            "slo": {"ttftMs": 1000, "tpotMs": 50},
            "autoscaling": {
                "enabled": True,
                "intervalSeconds": 5,
                "scaleDown": {"stabilizationSeconds": 20, "maxStep": 1},
                "drainTimeoutSeconds": 60,
            },
        },
        name=NAME,
        namespace=NS,
    )


class FakeKube:
    """Objects by (kind, namespace, name); apply merges like SSA for the fields tandem sets."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes: list[tuple[Any, ...]] = []
        self.conflict_next_status = False
        self.version = 1

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind.kind, namespace, name)))

    def list(self, kind: Kind, namespace: str | None, label_selector: str = "") -> list[dict[str, Any]]:
        key, _, value = label_selector.partition("=")
        return [
            copy.deepcopy(obj)
            for (k, ns, _), obj in self.objects.items()
            if k == kind.kind and ns == namespace and obj["metadata"].get("labels", {}).get(key) == value
        ]

    def apply(self, kind: Kind, obj: dict[str, Any], field_manager: str | None = None) -> dict[str, Any]:
        manager = field_manager or "tandem-operator"
        md = obj["metadata"]
        self.writes.append(("apply", kind.kind, md["name"], manager, obj.get("spec", {}).get("replicas")))
        key = (kind.kind, md["namespace"], md["name"])
        current = self.objects.get(key) or {"metadata": {"managedFields": []}, "spec": {}}
        merged = copy.deepcopy(obj) if field_manager is None else copy.deepcopy(current)
        if field_manager is not None:
            merged["spec"].update(obj.get("spec", {}))
        fields = [e for e in current["metadata"].get("managedFields", []) if e["manager"] != manager]
        if "spec" in obj:
            owned: dict[str, Any] = {"f:replicas": {}} if "replicas" in obj["spec"] else {}
            fields.append({"manager": manager, "operation": "Apply", "fieldsV1": {"f:spec": owned}})
        if any("f:replicas" in e["fieldsV1"]["f:spec"] for e in fields):  # a field no manager holds goes
            merged["spec"].setdefault("replicas", current["spec"].get("replicas"))
        merged["metadata"]["managedFields"] = fields
        merged["status"] = current.get("status", {})
        self.objects[key] = merged
        return copy.deepcopy(merged)

    def annotate(self, kind: Kind, namespace: str, name: str, annotations: dict[str, str | None]) -> Any:
        self.writes.append(("annotate", name, annotations))
        obj = self.objects.get((kind.kind, namespace, name))
        if obj is None:
            raise KubeError(404, "NotFound", name)
        current = obj["metadata"].setdefault("annotations", {})
        for key, value in annotations.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        return obj

    def delete(self, kind: Kind, namespace: str, name: str, uid: str | None = None) -> None:
        self.writes.append(("delete", kind.kind, name))

    def patch_status(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> Any:
        obj = self.objects[(kind.kind, namespace, name)]
        if self.conflict_next_status or resource_version != obj["metadata"]["resourceVersion"]:
            self.conflict_next_status = False
            raise KubeError(409, "Conflict", "the object has been modified")
        self.writes.append(("status",))
        _merge(obj.setdefault("status", {}), status)
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return obj

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self.writes.append(("event", event["reason"], event["message"]))


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


@dataclass
class Load:
    running: float = 0.0
    waiting: float = 0.0
    kv_blocks_held: float = 0.0


@dataclass
class ScriptedReader:
    """No traffic, every pod scraped; `busy` pods hold a running request; a pod has `ports` scrape
    targets (rank ports; 1 if not named), `silent` of them not reporting."""

    busy: set[str] = field(default_factory=set)
    ports: dict[str, int] = field(default_factory=dict)
    silent: dict[str, int] = field(default_factory=dict)
    targets_per_replica: dict[str, int] = field(default_factory=dict)  # by role; 1 if not named
    reads: int = 0

    def snapshot(
        self,
        namespace: str,
        name: str,
        slo: Any,
        window: float,
        now: float,
        *,
        sizes: Mapping[str, PoolSize] | None = None,
    ) -> Snapshot:
        self.reads += 1
        sizes = sizes or {}
        pools = {
            role: PoolSignals(scraped_targets=size.ready * self.targets_per_replica.get(role, 1))
            for role, size in sizes.items()
            if size.ready
        }
        return Snapshot(observed_at=now, window_seconds=window, sizes=sizes, pools=pools)

    def pod_load(
        self, namespace: str, pods: Sequence[str], now: float | None = None, *, targets: Mapping[str, int]
    ) -> dict[str, Load]:
        """As `metrics.read_pod_loads`: a pod with fewer targets reporting than the caller says it has
        is left out."""
        return {
            pod: Load(running=1.0 if pod in self.busy else 0.0)
            for pod in pods
            if self.ports.get(pod, 1) - self.silent.get(pod, 0) >= targets[pod]
        }


class World:
    """The fake API plus what the StatefulSet controller and kubelet would do between passes."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.kube = FakeKube()
        self.kube.objects[("PDDeployment", NS, NAME)] = doc
        self.reader = ScriptedReader()
        kube: Any = self.kube
        autoscaler = Autoscaler(kube, "http://127.0.0.1:9090", reader_for=self.reader_for)
        self.reconciler = Reconciler(self.kube, EventRecorder(self.kube), autoscaler)  # type: ignore[arg-type]
        self.now = T0

    def reader_for(self, url: str, timeout: float) -> Any:
        """The operator's `ReaderFactory`: the scripted reader for the operator's Prometheus."""
        assert (url, timeout) == ("http://127.0.0.1:9090", 5.0)
        return self.reader

    def settle(self) -> None:
        """StatefulSets reach their replicas with ready pods; pods beyond them go."""
        for (kind, ns, name), obj in list(self.kube.objects.items()):
            if kind not in ("StatefulSet", "Deployment"):
                continue
            count = obj["spec"].get("replicas") or 0
            obj["metadata"]["generation"] = 1
            obj["status"] = {"observedGeneration": 1, "replicas": count, "readyReplicas": count}
            obj["status"]["updatedReplicas"] = count
            if kind != "StatefulSet":
                continue
            role = obj["metadata"]["labels"]["tandem.dev/role"]
            for ordinal in range(8):
                key = ("Pod", ns, f"{name}-{ordinal}")
                if ordinal >= count:
                    self.kube.objects.pop(key, None)
                elif key not in self.kube.objects:
                    labels = {"tandem.dev/pddeployment": NAME, "tandem.dev/role": role}
                    self.kube.objects[key] = {
                        "metadata": {"name": key[2], "labels": labels},
                        "status": {"phase": "Running", "podIP": "127.20.0.9"},
                    }

    def run(self, seconds: float = 0.0) -> PassResult:
        self.now += seconds
        body = copy.deepcopy(self.kube.objects[("PDDeployment", NS, NAME)])
        stamp = rfc3339(self.now)
        result = self.reconciler.reconcile(body, stamp, self.now)
        self.settle()
        return result

    @property
    def pdd(self) -> dict[str, Any]:
        return self.kube.objects[("PDDeployment", NS, NAME)]

    def sts(self, role: str = "decode") -> dict[str, Any]:
        return self.kube.objects[("StatefulSet", NS, f"{NAME}-{role}")]

    def pod(self, ordinal: int) -> dict[str, Any] | None:
        return self.kube.objects.get(("Pod", NS, f"{NAME}-decode-{ordinal}"))

    def events(self) -> list[str]:
        return [w[1] for w in self.kube.writes if w[0] == "event"]


def test_first_pass_sizes_from_the_spec_and_asks_for_the_next_decision() -> None:
    world = World(manifest())
    result = world.run()
    assert world.sts()["spec"]["replicas"] == 2
    pools = world.pdd["status"]["autoscaling"]["pools"]
    assert pools["decode"]["desiredReplicas"] == 2
    assert world.pdd["status"]["pools"]["decode"]["source"] == "autoscaler"
    assert world.pdd["status"]["pools"]["prefill"]["source"] == "spec"
    assert world.pdd["status"]["pools"]["decode"]["limitedBy"] == "autoscaler"
    assert world.pdd["status"]["pools"]["prefill"]["limitedBy"] == "spec"
    assert result.requeue_after == 5.0
    assert world.reader.reads == 1
    world.run(1.0)
    assert world.reader.reads == 1, "a pass between decisions reads nothing"


def test_scale_in_marks_the_pod_then_shrinks_when_it_is_idle() -> None:
    world = World(manifest())
    world.reader.busy = {f"{NAME}-decode-1"}
    world.run()
    while world.pdd["status"]["autoscaling"]["pools"]["decode"]["desiredReplicas"] == 2:
        world.run(5.0)
        assert world.now - T0 <= 30, "no scale-in"
    assert world.now - T0 >= 20, "scaled in inside the 20 s window"
    pod = world.pod(1)
    assert pod is not None
    assert DRAINING in pod["metadata"]["annotations"]
    assert world.sts()["spec"]["replicas"] == 2
    assert world.pdd["status"]["pools"]["decode"]["desiredReplicas"] == 1
    assert world.pdd["status"]["pools"]["decode"]["limitedBy"] == "drain"  # 2 run while one drains
    world.run(DRAIN_SETTLE_SECONDS + 5.0)
    assert world.sts()["spec"]["replicas"] == 2, "shrank while a stream ran"
    world.reader.busy = set()
    world.run(5.0)
    assert world.sts()["spec"]["replicas"] == 1
    assert world.pod(1) is None
    assert "draining" not in world.pdd["status"]["autoscaling"]["pools"]["decode"]
    assert world.pdd["status"]["pools"]["decode"]["limitedBy"] == "autoscaler"
    assert (
        world.events().index("ScaledDown")
        < world.events().index("Draining")
        < world.events().index("Drained")
    )


def test_a_drained_pod_with_a_silent_rank_port_is_not_idle() -> None:
    """A MultiPortExternal decode pod reports from a target per rank port; with one silent, its load is
    unknown (the silent rank may hold streams), so the drain waits for it to report again."""
    doc = manifest()
    doc["spec"]["decode"] |= {
        "tensorParallelSize": 1,
        "parallelism": {"data": 2, "loadBalancing": "MultiPortExternal"},
    }
    world = World(doc)
    world.reader.targets_per_replica = {"decode": 2}
    world.reader.ports = {f"{NAME}-decode-{i}": 2 for i in range(3)}
    world.reader.silent = {f"{NAME}-decode-1": 1}
    world.run()
    while world.pdd["status"]["autoscaling"]["pools"]["decode"]["desiredReplicas"] == 2:
        world.run(5.0)
        assert world.now - T0 <= 30, "no scale-in"
    world.run(DRAIN_SETTLE_SECONDS + 20.0)
    assert world.sts()["spec"]["replicas"] == 2, "shrank while a rank port was silent"
    world.reader.silent = {}
    world.run(5.0)
    assert world.sts()["spec"]["replicas"] == 1
    assert world.events().index("Draining") < world.events().index("Drained")


def test_a_lost_status_race_records_nothing_and_is_retried_at_once() -> None:
    world = World(manifest())
    world.run()
    world.kube.conflict_next_status = True
    evaluated = world.pdd["status"]["autoscaling"]["lastEvaluated"]
    result = world.run(5.0)
    assert result.conflict
    assert result.requeue_after == 1.0
    assert world.pdd["status"]["autoscaling"]["lastEvaluated"] == evaluated
    assert world.run(1.0).status_written


def test_reapplying_the_manifest_changes_nothing() -> None:
    world = World(manifest())
    world.run()
    for _ in range(6):
        world.run(5.0)
    world.run(5.0)
    assert world.pdd["status"]["autoscaling"]["pools"]["decode"]["desiredReplicas"] == 1
    world.pdd["spec"] = manifest()["spec"]  # `kubectl apply` of the same spec: same generation
    writes = len(world.kube.writes)
    world.run(1.0)
    assert world.sts()["spec"]["replicas"] == 1
    assert [w for w in world.kube.writes[writes:] if w[0] == "apply"] == []


@pytest.mark.parametrize("hpa_count", [2, 5])
def test_external_pool_is_handed_over_and_back_without_moving(hpa_count: int) -> None:
    world = World(manifest())
    world.run()
    world.pdd["spec"] = manifest(external=True)["spec"]
    world.pdd["metadata"]["generation"] = 2
    world.run(1.0)
    applies = [
        w for w in world.kube.writes if w[0] == "apply" and w[1] == "StatefulSet" and w[2].endswith("decode")
    ]
    assert applies[-2:] == [
        ("apply", "StatefulSet", f"{NAME}-decode", "tandem-handover", 2),
        ("apply", "StatefulSet", f"{NAME}-decode", "tandem-operator", None),
    ]
    assert world.sts()["spec"]["replicas"] == 2
    assert world.pdd["status"]["pools"]["decode"]["source"] == "external"
    assert world.pdd["status"]["pools"]["decode"]["limitedBy"] == "external"
    world.sts()["spec"]["replicas"] = hpa_count  # the HPA scales
    world.run(5.0)
    assert world.pdd["status"]["pools"]["decode"]["desiredReplicas"] == hpa_count
    world.pdd["spec"] = manifest()["spec"]
    world.pdd["metadata"]["generation"] = 3
    world.run(5.0)
    assert world.sts()["spec"]["replicas"] == hpa_count, "the hand-back moved the count"
    assert world.pdd["status"]["autoscaling"]["pools"]["decode"]["desiredReplicas"] == min(hpa_count, 3)
    managers = {e["manager"] for e in world.sts()["metadata"]["managedFields"]}
    assert managers == {"tandem-operator"}
    if hpa_count > 3:  # above maxReplicas: back within the bounds, by a drain
        assert all(DRAINING in (world.pod(i) or {})["metadata"]["annotations"] for i in (3, 4))
        world.run(DRAIN_SETTLE_SECONDS)
        assert world.sts()["spec"]["replicas"] == 3


def test_advisory_advises_once_per_change_and_runs_the_spec_size() -> None:
    doc = manifest()
    doc["spec"]["autoscaling"]["mode"] = "Advisory"
    world = World(doc)
    for _ in range(8):
        world.run(5.0)
    assert world.events().count("AutoscalerAdvice") == 1
    assert "ScaledDown" not in world.events()
    assert world.sts()["spec"]["replicas"] == 2
    status = world.pdd["status"]
    assert status["pools"]["decode"]["source"] == "spec"
    assert status["pools"]["decode"]["limitedBy"] == "spec"
    assert status["autoscaling"]["pools"]["decode"]["lastDecision"]["to"] == 1
    cond = next(c for c in status["conditions"] if c["type"] == "AutoscalingActive")
    assert (cond["status"], cond["reason"]) == ("False", "Advisory")


def test_paused_holds_every_size() -> None:
    doc = manifest()
    doc["metadata"]["annotations"] = {"tandem.dev/autoscaling-paused": "true"}
    world = World(doc)
    for _ in range(8):
        world.run(5.0)
    assert world.sts()["spec"]["replicas"] == 2
    assert world.pdd["status"]["autoscaling"]["mode"] == "Paused"
    assert world.pdd["status"]["pools"]["decode"]["source"] == "autoscaler"
    cond = next(c for c in world.pdd["status"]["conditions"] if c["type"] == "AutoscalingActive")
    assert (cond["status"], cond["reason"]) == ("False", "Paused")
