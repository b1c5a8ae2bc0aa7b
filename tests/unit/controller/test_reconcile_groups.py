"""Reconcile passes of a PDDeployment with a multi-node pool (a LeaderWorkerSet) against an in-memory
API: the LeaderWorkerSet is applied, owned and pruned; status.pools counts its groups (instances),
ready only as the LeaderWorkerSet's status counts them; a cluster without the CRD gets nothing and a
Stalled condition that names it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tandem.api.testing import stored
from tandem.controller.drain import DRAIN_SETTLE_SECONDS
from tandem.kube.rest import Kind, KubeError

from .test_reconcile_autoscaling import DRAINING, NAME, NS, T0, World
from .test_reconcile_autoscaling import manifest as autoscaling_manifest

LWS = ("LeaderWorkerSet", NS, f"{NAME}-decode")


def manifest(decode_replicas: int = 2, external: bool = False) -> dict[str, Any]:
    # Each decode replica: one group of 2 pods x 8 GPUs (TP16).
    decode: dict[str, Any] = {"replicas": decode_replicas, "tensorParallelSize": 16, "nodesPerInstance": 2}
    spec: dict[str, Any] = {
        "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"image": "img"},
        "prefill": {"replicas": 1, "tensorParallelSize": 8},
        "decode": decode,
        "router": {"replicas": 1},
    }
    if external:  # an HPA or KEDA sizes decode, in groups, through the LeaderWorkerSet's scale subresource
        decode["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4, "external": True}
        spec["slo"] = {"ttftMs": 1000, "tpotMs": 50}
        spec["autoscaling"] = {"enabled": True, "intervalSeconds": 5}
    return stored(spec, name=NAME, namespace=NS)


def group_status(world: World, replicas: int, ready: int) -> None:
    """What the LeaderWorkerSet controller reports: groups created, and groups whose every pod is Ready."""
    obj = world.kube.objects[LWS]
    obj["metadata"]["generation"] = 1
    obj["status"] = {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas}


def conditions(world: World) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in world.pdd["status"]["conditions"]}


def test_a_multi_node_pool_is_applied_as_an_owned_leaderworkerset() -> None:
    world = World(manifest())
    result = world.run()
    assert f"LeaderWorkerSet/{NAME}-decode" in result.applied
    assert f"StatefulSet/{NAME}-prefill" in result.applied
    assert ("StatefulSet", NS, f"{NAME}-decode") not in world.kube.objects
    lws = world.kube.objects[LWS]
    assert lws["spec"]["replicas"] == 2
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["metadata"]["ownerReferences"][0]["uid"] == world.pdd["metadata"]["uid"]
    assert "Stalled" not in conditions(world) or conditions(world)["Stalled"][0] == "False"


def test_pool_status_counts_groups_and_is_ready_only_when_every_group_is() -> None:
    world = World(manifest())
    world.run()
    group_status(world, replicas=2, ready=1)  # one group has a rank that is not Ready yet
    world.run(1.0)
    decode = world.pdd["status"]["pools"]["decode"]
    assert (decode["replicas"], decode["readyReplicas"], decode["desiredReplicas"]) == (2, 1, 2)
    assert decode["gpus"] == 2 * 16  # GPUs of whole groups
    assert decode["ready"] == "1/2"
    assert conditions(world)["Ready"][:2] == ("False", "WaitingForReplicas")
    group_status(world, replicas=2, ready=2)
    world.run(1.0)
    assert conditions(world)["Ready"][:2] == ("True", "AllReplicasReady")
    assert world.pdd["status"]["phase"] == "Healthy"


def test_a_spec_change_of_groups_reapplies_and_a_steady_pass_writes_nothing() -> None:
    world = World(manifest())
    world.run()
    group_status(world, replicas=2, ready=2)
    world.run(1.0)
    writes = len(world.kube.writes)
    assert world.run(1.0).applied == []
    assert len(world.kube.writes) == writes
    world.kube.objects[("PDDeployment", NS, NAME)] = {
        **manifest(decode_replicas=3),
        "status": world.pdd["status"],
    }
    result = world.run(1.0)
    assert result.applied == [f"LeaderWorkerSet/{NAME}-decode"]
    assert world.kube.objects[LWS]["spec"]["replicas"] == 3


def unserved(world: World, kind_name: str) -> None:
    """The world's API answers 404 for every list of `kind_name` (its CRD or API is not there)."""
    real_list = world.kube.list

    def list_(kind: Kind, namespace: str | None, label_selector: str = "") -> list[dict[str, Any]]:
        if kind.kind == kind_name:
            raise KubeError(404, "NotFound", "the server could not find the requested resource")
        return real_list(kind, namespace, label_selector)

    world.kube.list = list_  # type: ignore[method-assign]


def test_without_the_crd_nothing_is_applied_and_stalled_names_it() -> None:
    world = World(manifest())
    unserved(world, "LeaderWorkerSet")
    before = copy.deepcopy(world.kube.objects)
    result = world.run()
    assert result.applied == []
    assert [w for w in world.kube.writes if w[0] in ("apply", "delete", "annotate")] == []
    assert {k for k in world.kube.objects if k[0] != "PDDeployment"} == {
        k for k in before if k[0] != "PDDeployment"
    }
    status, reason, message = conditions(world)["Stalled"]
    assert (status, reason) == ("True", "CRDNotInstalled")
    assert "leaderworkersets.leaderworkerset.x-k8s.io" in message
    assert "(decode)" in message
    assert world.pdd["status"]["phase"] == "Degraded"
    assert "CRDNotInstalled" in world.events()


def test_an_external_pool_of_groups_is_handed_over_and_back_without_moving() -> None:
    """The HPA hand-over by field ownership works on a LeaderWorkerSet's spec.replicas as on a
    StatefulSet's: a second manager pins the group count, the operator's configuration leaves it out,
    the HPA's count is reported, and the hand-back takes it over where the HPA left it."""
    world = World(manifest())
    world.run()
    group_status(world, replicas=2, ready=2)
    world.kube.objects[("PDDeployment", NS, NAME)] = {
        **manifest(external=True),
        "status": world.pdd["status"],
    }
    world.pdd["metadata"]["generation"] = 2
    world.run(1.0)
    applies = [w for w in world.kube.writes if w[0] == "apply" and w[1] == "LeaderWorkerSet"]
    assert applies[-2:] == [
        ("apply", "LeaderWorkerSet", f"{NAME}-decode", "tandem-handover", 2),
        ("apply", "LeaderWorkerSet", f"{NAME}-decode", "tandem-operator", None),
    ]
    assert world.kube.objects[LWS]["spec"]["replicas"] == 2
    world.kube.objects[LWS]["spec"]["replicas"] = 3  # the HPA scales by one group
    group_status(world, replicas=3, ready=3)
    world.run(5.0)
    decode = world.pdd["status"]["pools"]["decode"]
    assert (decode["source"], decode["desiredReplicas"], decode["gpus"]) == ("external", 3, 3 * 16)
    world.kube.objects[("PDDeployment", NS, NAME)] = {
        **manifest(decode_replicas=3),
        "status": world.pdd["status"],
    }
    world.pdd["metadata"]["generation"] = 3
    world.run(5.0)
    assert world.kube.objects[LWS]["spec"]["replicas"] == 3, "the hand-back moved the count"
    assert {e["manager"] for e in world.kube.objects[LWS]["metadata"]["managedFields"]} == {"tandem-operator"}


def test_the_leaderworkerset_goes_after_its_headless_service_and_not_without_it() -> None:
    """LeaderWorkerSet's controller makes a Service of the set's name, as its controller, where none
    exists; the operator's would then never apply. So the set is applied after its Service, and not
    at all in a pass whose Service failed."""
    world = World(manifest())
    world.run()
    applies = [(w[1], w[2]) for w in world.kube.writes if w[0] == "apply"]
    assert applies.index(("Service", f"{NAME}-decode")) < applies.index(("LeaderWorkerSet", f"{NAME}-decode"))
    assert applies[-1] == ("LeaderWorkerSet", f"{NAME}-decode")

    failing = World(manifest())
    real_apply = failing.kube.apply

    def apply(kind: Kind, obj: dict[str, Any], field_manager: str | None = None) -> dict[str, Any]:
        if (obj["kind"], obj["metadata"]["name"]) == ("Service", f"{NAME}-decode"):
            raise KubeError(422, "Invalid", "bad service")
        return real_apply(kind, obj, field_manager)

    failing.kube.apply = apply  # type: ignore[method-assign]
    result = failing.run()
    assert f"LeaderWorkerSet/{NAME}-decode" not in result.applied
    assert LWS not in failing.kube.objects
    status, reason, message = conditions(failing)["Stalled"]
    assert (status, reason) == ("True", "ApplyFailed")
    assert f"LeaderWorkerSet/{NAME}-decode: not applied: its Service {NAME}-decode is not there" in message


def autoscaled_groups() -> dict[str, Any]:
    """Decode in groups of 2 sim pods (a rank each, Internal), sized by tandem's autoscaler in [1, 3]."""
    doc = autoscaling_manifest()
    doc["spec"]["decode"].update({"nodesPerInstance": 2, "parallelism": {"data": 2}})
    return doc


class GroupWorld(World):
    """The fake API plus what LeaderWorkerSet's controller and the kubelet would do between passes: a
    group's leader `<lws>-<g>` (scraped) and worker `<lws>-<g>-1` (headless: not scraped) per group,
    for every LeaderWorkerSet (of any revision's pair)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        super().__init__(doc)
        scripted = self.reader.pod_load

        def pod_load(namespace: str, pods: Any, now: float | None = None, *, targets: Any) -> dict[str, Any]:
            """As Prometheus: loads of the pods it scrapes only (a headless worker has none)."""
            loads = scripted(namespace, pods, now, targets=targets)
            return {name: load for name, load in loads.items() if self._scraped(namespace, name)}

        self.reader.pod_load = pod_load  # type: ignore[method-assign]

    def _scraped(self, namespace: str, name: str) -> bool:
        pod = self.kube.objects.get(("Pod", namespace, name)) or {}
        annotations = (pod.get("metadata") or {}).get("annotations")
        return annotations is None or annotations.get("prometheus.io/scrape") == "true"

    def settle(self) -> None:
        super().settle()
        for (kind, ns, name), obj in list(self.kube.objects.items()):
            if kind != "LeaderWorkerSet":
                continue
            count = obj["spec"].get("replicas") or 0
            obj["metadata"]["generation"] = 1
            obj["status"] = {"replicas": count, "readyReplicas": count, "updatedReplicas": count}
            labels = {
                k: v
                for k, v in obj["metadata"]["labels"].items()
                if k in ("tandem.dev/pddeployment", "tandem.dev/role", "tandem.dev/revision")
            }
            for group in range(6):
                for pod_name, worker in ((f"{name}-{group}", "0"), (f"{name}-{group}-1", "1")):
                    key = ("Pod", ns, pod_name)
                    if group >= count:
                        self.kube.objects.pop(key, None)
                    elif key not in self.kube.objects:
                        annotations = {"prometheus.io/scrape": "true"} if worker == "0" else {}
                        self.kube.objects[key] = {
                            "metadata": {
                                "name": pod_name,
                                "labels": {**labels, "leaderworkerset.sigs.k8s.io/worker-index": worker},
                                "annotations": annotations,
                            },
                            "status": {"phase": "Running", "podIP": "127.20.0.9"},
                        }


def test_scale_in_drains_a_whole_group_then_removes_it_when_its_leader_is_idle() -> None:
    world = GroupWorld(autoscaled_groups())
    world.reader.busy = {f"{NAME}-decode-1"}  # the leader of group 1: its /metrics counts both ranks
    world.run()
    assert world.kube.objects[LWS]["spec"]["replicas"] == 2
    while world.pdd["status"]["autoscaling"]["pools"]["decode"]["desiredReplicas"] == 2:
        world.run(5.0)
        assert world.now - T0 <= 30, "no scale-in"
    group_1 = [f"{NAME}-decode-1", f"{NAME}-decode-1-1"]
    for name in group_1:
        assert DRAINING in world.kube.objects[("Pod", NS, name)]["metadata"]["annotations"], name
    for name in (f"{NAME}-decode-0", f"{NAME}-decode-0-1"):
        assert DRAINING not in world.kube.objects[("Pod", NS, name)]["metadata"]["annotations"], name
    assert world.pdd["status"]["autoscaling"]["pools"]["decode"]["draining"]["pods"] == group_1
    assert world.kube.objects[LWS]["spec"]["replicas"] == 2
    assert world.pdd["status"]["pools"]["decode"]["limitedBy"] == "drain"
    world.run(DRAIN_SETTLE_SECONDS + 5.0)
    assert world.kube.objects[LWS]["spec"]["replicas"] == 2, "shrank while the group's leader streamed"
    world.reader.busy = set()  # the headless worker has no load of its own: the leader's counts
    world.run(5.0)
    assert world.kube.objects[LWS]["spec"]["replicas"] == 1
    assert all(("Pod", NS, name) not in world.kube.objects for name in group_1)
    assert "draining" not in world.pdd["status"]["autoscaling"]["pools"]["decode"]
    events = world.events()
    assert events.index("ScaledDown") < events.index("Draining") < events.index("Drained")


SINGLE_NODE_DECODE: dict[str, Any] = {"replicas": 1, "tensorParallelSize": 8}
GROUP_DECODE: dict[str, Any] = {"replicas": 1, "tensorParallelSize": 16, "nodesPerInstance": 2}


def deleted(world: World) -> set[tuple[str, str]]:
    return {(w[1], w[2]) for w in world.kube.writes if w[0] == "delete"}


@pytest.mark.parametrize(
    ("before", "after", "old_kind", "new_kind"),
    [
        (SINGLE_NODE_DECODE, GROUP_DECODE, "StatefulSet", "LeaderWorkerSet"),
        (GROUP_DECODE, SINGLE_NODE_DECODE, "LeaderWorkerSet", "StatefulSet"),
    ],
    ids=["statefulset-to-groups", "groups-to-statefulset"],
)
def test_a_revision_moves_decode_between_a_statefulset_and_groups_through_the_rollout(
    before: dict[str, Any], after: dict[str, Any], old_kind: str, new_kind: str
) -> None:
    """A revision change that moves decode between one pod a replica and groups: the new pair is
    rendered beside the old one (kept, not pruned, whatever its kind), gets the weight once its every
    workload is Ready, and the old pair goes once idle."""
    doc = manifest()
    doc["spec"]["decode"] = dict(before)
    world = GroupWorld(doc)
    world.run()
    world.run(1.0)
    legacy = copy.deepcopy(world.pdd["status"]["revisions"]["current"])
    assert legacy["legacy"] is True
    assert (old_kind, NS, f"{NAME}-decode") in world.kube.objects

    spec = world.kube.objects[("PDDeployment", NS, NAME)]
    spec["spec"]["decode"] = dict(after)
    spec["metadata"]["generation"] = spec["metadata"].get("generation", 1) + 1
    world.run(1.0)
    revs = world.pdd["status"]["revisions"]
    new = revs["current"]
    assert revs["previous"]["id"] == legacy["id"]
    assert (new_kind, NS, f"{new['prefix']}-decode") in world.kube.objects
    assert (old_kind, f"{NAME}-decode") not in deleted(world), "the old pair is kept while it serves"
    world.run(1.0)  # the new pair's workloads report Ready (settled): the weight moves to it
    assert world.pdd["status"]["revisions"]["weight"] == 100
    assert (old_kind, f"{NAME}-decode") not in deleted(world), "the old pair drains first"
    for _ in range(6):
        world.run(5.0)  # settle, then idle (every scraped pod of the old pair reports no load)
    assert "previous" not in world.pdd["status"]["revisions"], world.pdd["status"]["revisions"]
    assert "RevisionRemoved" in world.events()
    assert (old_kind, f"{NAME}-decode") in deleted(world)
    assert (new_kind, f"{new['prefix']}-decode") not in deleted(world)


GANG = {"groupPlacement": {"gangScheduling": "Kubernetes"}}


def pod_groups(world: World) -> set[str]:
    return {name for kind, _, name in world.kube.objects if kind == "PodGroup"}


def test_a_gang_scheduled_pool_has_a_pod_group_per_group_pruned_with_its_group() -> None:
    doc = manifest(decode_replicas=2)
    doc["spec"]["decode"] |= GANG
    world = World(doc)
    result = world.run()
    assert pod_groups(world) == {f"{NAME}-decode-0", f"{NAME}-decode-1"}
    assert f"PodGroup/{NAME}-decode-1" in result.applied
    group = world.kube.objects[("PodGroup", NS, f"{NAME}-decode-0")]
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 2}}}
    assert group["metadata"]["ownerReferences"][0]["uid"] == world.pdd["metadata"]["uid"]
    group_status(world, replicas=2, ready=2)
    world.run(1.0)
    assert world.run(1.0).applied == []  # steady: nothing rewritten
    world.kube.objects[("PDDeployment", NS, NAME)]["spec"]["decode"]["replicas"] = 1
    world.run(1.0)
    assert {name for kind, name in deleted(world) if kind == "PodGroup"} == {f"{NAME}-decode-1"}


def test_a_revision_keeps_the_old_pairs_pod_groups_until_the_pair_goes() -> None:
    doc = manifest()
    doc["spec"]["decode"] = {**GROUP_DECODE, **GANG}
    world = GroupWorld(doc)
    world.run()
    world.run(1.0)
    old = copy.deepcopy(world.pdd["status"]["revisions"]["current"])
    assert pod_groups(world) == {f"{old['prefix']}-decode-0"}
    spec = world.kube.objects[("PDDeployment", NS, NAME)]
    spec["spec"]["engine"]["image"] = "img:2"
    spec["metadata"]["generation"] = spec["metadata"].get("generation", 1) + 1
    world.run(1.0)
    new = world.pdd["status"]["revisions"]["current"]
    assert new["id"] != old["id"]
    assert pod_groups(world) == {f"{old['prefix']}-decode-0", f"{new['prefix']}-decode-0"}
    world.run(1.0)  # the new pair Ready: the weight moves, the old pair drains
    assert world.pdd["status"]["revisions"]["weight"] == 100
    assert ("PodGroup", f"{old['prefix']}-decode-0") not in deleted(world), "kept while its pair is"
    for _ in range(6):
        world.run(5.0)
    assert "previous" not in world.pdd["status"]["revisions"]
    assert {name for kind, name in deleted(world) if kind == "PodGroup"} == {f"{old['prefix']}-decode-0"}


def test_without_the_pod_group_api_nothing_is_applied_and_stalled_names_the_gates() -> None:
    doc = manifest()
    doc["spec"]["decode"] |= GANG
    world = World(doc)
    unserved(world, "PodGroup")
    result = world.run()
    assert result.applied == []
    status, reason, message = conditions(world)["Stalled"]
    assert (status, reason) == ("True", "CRDNotInstalled")
    assert "podgroups.scheduling.k8s.io/v1alpha2" in message
    assert "GangScheduling and GenericWorkload" in message
    assert "(decode)" in message
