"""Reconcile passes of a PDDeployment with a multi-node pool (a LeaderWorkerSet) against an in-memory
API: the LeaderWorkerSet is applied, owned and pruned; status.pools counts its groups (instances),
ready only as the LeaderWorkerSet's status counts them; a cluster without the CRD gets nothing and a
Stalled condition that names it."""

from __future__ import annotations

import copy
from typing import Any

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


def test_a_leaderworkerset_no_longer_rendered_is_pruned() -> None:
    world = World(manifest())
    world.run()
    doc = manifest()
    doc["spec"]["decode"] = {"replicas": 1, "tensorParallelSize": 8}  # back to one node per replica
    world.kube.objects[("PDDeployment", NS, NAME)] = {**doc, "status": world.pdd["status"]}
    result = world.run(1.0)
    assert f"LeaderWorkerSet/{NAME}-decode" in result.deleted
    assert ("delete", "LeaderWorkerSet", f"{NAME}-decode") in world.kube.writes


def test_without_the_crd_nothing_is_applied_and_stalled_names_it() -> None:
    world = World(manifest())
    real_list = world.kube.list

    def list_(kind: Kind, namespace: str | None, label_selector: str = "") -> list[dict[str, Any]]:
        if kind.kind == "LeaderWorkerSet":
            raise KubeError(404, "NotFound", "the server could not find the requested resource")
        return real_list(kind, namespace, label_selector)

    world.kube.list = list_  # type: ignore[method-assign]
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
    group's leader `<lws>-<g>` (scraped) and worker `<lws>-<g>-1` (headless: not scraped) per group."""

    def settle(self) -> None:
        super().settle()
        obj = self.kube.objects.get(LWS)
        if obj is None:
            return
        count = obj["spec"].get("replicas") or 0
        obj["metadata"]["generation"] = 1
        obj["status"] = {"replicas": count, "readyReplicas": count, "updatedReplicas": count}
        labels = {"tandem.dev/pddeployment": NAME, "tandem.dev/role": "decode"}
        for group in range(6):
            for name, scraped in ((f"{LWS[2]}-{group}", True), (f"{LWS[2]}-{group}-1", False)):
                key = ("Pod", NS, name)
                if group >= count:
                    self.kube.objects.pop(key, None)
                elif key not in self.kube.objects:
                    annotations = {"prometheus.io/scrape": "true"} if scraped else {}
                    self.kube.objects[key] = {
                        "metadata": {"name": name, "labels": dict(labels), "annotations": annotations},
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
