"""Multi-node pools end to end on the local cluster (issue 27 items 1, 2, 4, 5 and 7): the operator
applies the LeaderWorkerSets of a PDDeployment whose prefill and decode pools are groups of 2
sim-engine pods (one data-parallel rank per pod, the leader balancing: `Internal`), requests are
served through the operator's router from a prefill group to a decode group, a pool grows by one
group (within maxGPUs, which counts every GPU of a group), and a killed rank takes its group down
until LeaderWorkerSet has recreated it and it serves again; revisions replace the groups, move
decode from groups to a StatefulSet and back, under load; `groupPlacement.exclusiveTopology` puts each decode
group in a fabric domain of its own and holds a group that finds none. tandem's own autoscaler
sizing a pool in groups (grown by a group on both ranks' capacity, the highest group drained whole
with no failed stream) runs on the dev cluster in test_dp_ranks_e2e.py, on groups of two External
ranks.

The dev cluster runs LeaderWorkerSet's controller (`devcluster.start_lws`); every address is a
loopback one (127.0.0.0/8).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tandem.api import meta
from tandem.demo import e2e
from tandem.demo.load import BackgroundLoad, Phase
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import RestartableOperator, eventually, scratch_namespace

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

NAME = "mn"
GPUS_PER_GROUP = 2  # 2 pods x 1 GPU (TP1, a data-parallel rank per pod)
MAX_GPUS = 3 * GPUS_PER_GROUP  # prefill 1 group + decode 2 groups
REQUEST = {"model": e2e.MODEL, "prompt": "the quick brown fox jumps over the lazy dog", "max_tokens": 8}


def group_pool(replicas: int) -> dict[str, Any]:
    return {**e2e.pool(replicas, requests=e2e.SMALL_POD_REQUESTS), **e2e.GROUP_OF_TWO}


def manifest(decode_groups: int, image: str = e2e.IMAGE) -> dict[str, Any]:
    return e2e.pddeployment(
        NAME,
        {
            "engine": {"type": "sim", "image": image},
            "prefill": group_pool(1),
            "decode": group_pool(decode_groups),
            "maxGPUs": MAX_GPUS,
        },
    )


@dataclass
class Deployed:
    cluster: ClusterHandle
    namespace: str

    def get(self, *what: str) -> dict[str, Any]:
        out = self.cluster.kubectl("get", "-n", self.namespace, *what, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def pdd(self) -> dict[str, Any]:
        return self.get("pdd", NAME)

    def condition(self, kind: str) -> dict[str, Any]:
        for cond in (self.pdd().get("status") or {}).get("conditions") or []:
            if cond["type"] == kind:
                return dict(cond)
        return {}

    def pool(self, role: str) -> dict[str, Any]:
        return dict(((self.pdd().get("status") or {}).get("pools") or {}).get(role) or {})

    def pods(self, role: str, name: str = NAME) -> list[dict[str, Any]]:
        items = self.get("pods", "-l", f"{meta.LABEL_PDD}={name},{meta.LABEL_ROLE}={role}").get("items", [])
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def ready(self, groups: dict[str, int], name: str = NAME) -> dict[str, Any] | None:
        """The PDDeployment once Ready with these ready groups per pool."""
        pdd = self.get("pdd", name)
        status = pdd.get("status") or {}
        if status.get("observedGeneration") != pdd.get("metadata", {}).get("generation"):
            return None
        ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        pools = status.get("pools") or {}
        if ready.get("status") != "True":
            return None
        if any((pools.get(role) or {}).get("readyReplicas") != n for role, n in groups.items()):
            return None
        return pdd


def call(url: str, body: dict[str, Any] | None = None, timeout: float = 30) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError as error:
        return 0, str(error).encode()


def serve_some(router: str, count: int) -> list[int]:
    return [call(router + "/v1/completions", REQUEST)[0] for _ in range(count)]


def all_served(router: str, count: int) -> list[int] | None:
    codes = serve_some(router, count)
    return codes if codes == [200] * count else None


def served_at_once(router: str, count: int) -> list[int]:
    """`count` requests sent together (so a group's leader has several in flight to spread)."""
    long = {**REQUEST, "max_tokens": 64}
    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(lambda _: call(router + "/v1/completions", long, timeout=60)[0], range(count)))


@pytest.fixture(scope="module")
def deployed(lws: ClusterHandle, autoscaling_operator: RestartableOperator) -> Iterator[Deployed]:
    cluster = lws
    with scratch_namespace(cluster, f"t-groups-{uuid.uuid4().hex[:6]}") as namespace:
        yield Deployed(cluster, namespace)


def test_groups_are_created_and_serve_through_the_router(deployed: Deployed) -> None:
    started = time.monotonic()
    deployed.cluster.kubectl("apply", "-n", deployed.namespace, "-f", "-", input=yaml.safe_dump(manifest(1)))
    pdd = eventually(
        lambda: deployed.ready({"prefill": 1, "decode": 1}), timeout=300, what="Ready, 1+1 groups"
    )
    print(f"\n1 prefill + 1 decode group Ready {time.monotonic() - started:.1f} s after apply")
    lws = deployed.get("leaderworkerset", f"{NAME}-decode")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["metadata"]["ownerReferences"][0]["uid"] == pdd["metadata"]["uid"]
    # The StatefulSet of the same name is LeaderWorkerSet's own (its leaders), not the operator's.
    leaders = deployed.get("statefulset", f"{NAME}-decode")
    assert [ref["kind"] for ref in leaders["metadata"]["ownerReferences"]] == ["LeaderWorkerSet"]
    for role in ("prefill", "decode"):
        pool = deployed.pool(role)
        assert (pool["replicas"], pool["readyReplicas"], pool["gpus"]) == (1, 1, GPUS_PER_GROUP), pool
        pods = deployed.pods(role)
        assert len(pods) == 2
        assert {p["metadata"]["labels"][meta.LWS_WORKER_INDEX_LABEL] for p in pods} == {"0", "1"}

    router = e2e.router_url(deployed.cluster, deployed.namespace, NAME)
    codes = eventually(
        lambda: all_served(router, 12),
        timeout=120,
        what="12 requests served through the router",
    )
    assert codes == [200] * 12
    assert served_at_once(router, 16) == [200] * 16
    # P/D through the groups: each leader handed some of the requests in flight together to its
    # worker's rank (one at a time, every request finds rank 0 idle and stays on the leader).
    for role in ("prefill", "decode"):
        by_index = {p["metadata"]["labels"][meta.LWS_WORKER_INDEX_LABEL]: p for p in deployed.pods(role)}
        seen = {
            index: json.loads(call(f"http://{pod['status']['podIP']}:{meta.ENGINE_PORT}/debug/state")[1])
            for index, pod in by_index.items()
        }
        print(f"{role}: the leader took {seen['0']['requests_seen']}, its worker served "
              f"{seen['1']['requests_seen']}")  # fmt: skip
        assert seen["0"]["group"]["formed"] is True
        assert seen["0"]["requests_seen"] >= 28  # more when the first round found no route yet
        assert 0 < seen["1"]["requests_seen"] < seen["0"]["requests_seen"]


def test_a_pool_grows_by_one_group_within_max_gpus(deployed: Deployed) -> None:
    started = time.monotonic()
    deployed.cluster.kubectl("apply", "-n", deployed.namespace, "-f", "-", input=yaml.safe_dump(manifest(2)))
    eventually(lambda: deployed.ready({"prefill": 1, "decode": 2}), timeout=300, what="Ready, 1+2 groups")
    print(f"\ndecode grew by one group, Ready {time.monotonic() - started:.1f} s after the apply")
    decode = deployed.pool("decode")
    assert (decode["replicas"], decode["readyReplicas"], decode["gpus"]) == (2, 2, 2 * GPUS_PER_GROUP)
    assert len(deployed.pods("decode")) == 4
    # One more group would be 8 GPUs of whole groups, over maxGPUs 6: the apiserver refuses it.
    refused = deployed.cluster.kubectl(
        "apply", "-n", deployed.namespace, "-f", "-", input=yaml.safe_dump(manifest(3)), check=False
    )
    assert refused.returncode != 0
    assert "spec.maxGPUs must be at least the GPUs the pools request" in refused.stderr
    router = e2e.router_url(deployed.cluster, deployed.namespace, NAME)
    assert serve_some(router, 8) == [200] * 8


def test_a_killed_rank_takes_its_group_down_until_it_is_recreated(deployed: Deployed) -> None:
    router = e2e.router_url(deployed.cluster, deployed.namespace, NAME)
    pods = deployed.pods("prefill")
    worker = next(p for p in pods if p["metadata"]["labels"][meta.LWS_WORKER_INDEX_LABEL] == "1")
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    started = time.monotonic()
    # The worker's engine process dies (exit 1 at once): its container restarts, and vLLM's group
    # with it; the leader's engine leaves too.
    status, _ = call(f"http://{worker['status']['podIP']}:{meta.ENGINE_PORT}/admin/faults", {"crash": True})
    assert status in (0, 200)  # the process may die before it answers

    def down() -> bool:
        return deployed.pool("prefill").get("readyReplicas") == 0

    eventually(down, timeout=120, what="the prefill group not ready")
    print(f"\nprefill group down {time.monotonic() - started:.1f} s after its worker was killed")
    # With its only prefill group down, the router has no prefill endpoint: no request is served by P/D.

    def recreated() -> bool:
        now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in deployed.pods("prefill")}
        return set(now) == set(before) and all(now[n] != before[n] for n in now)

    eventually(recreated, timeout=240, what="both prefill pods recreated (RecreateGroupOnPodRestart)")
    eventually(lambda: deployed.ready({"prefill": 1, "decode": 2}), timeout=300, what="Ready again")
    print(f"prefill group recreated and Ready {time.monotonic() - started:.1f} s after the kill")
    codes = eventually(
        lambda: all_served(router, 6),
        timeout=120,
        what="requests served again",
    )
    assert codes == [200] * 6


NEW_IMAGE = "ghcr.io/tandem-dev/tandem:0.1.1"  # a revision field: a new P/D pair of groups
STEADY = Phase(1.0, 200, 16, "steady")


@dataclass
class Rolled:
    """A revision change as `roll_revision` saw it."""

    old: dict[str, Any]  # status.revisions.current before the change
    revs: dict[str, Any]  # status.revisions once the weight was on the new pair
    switch_s: float  # from the apply to the weight on the new pair
    removed_s: float  # from the apply to the old pair's workloads gone


def roll_revision(
    deployed: Deployed,
    doc: dict[str, Any],
    old_workloads: Callable[[dict[str, Any]], list[tuple[str, str]]],
    at_switch: Callable[[dict[str, Any]], None],
) -> Rolled:
    """Applies `doc` (a revision change) under a steady load through the router; waits for the weight
    on the new pair (then calls `at_switch(status.revisions)`) and for the old pair's workloads
    (`old_workloads(old current revision)`: (kind, name)) to go; checks that the old pair went once
    idle and that no request failed meanwhile."""
    cluster, ns = deployed.cluster, deployed.namespace
    old = deployed.pdd()["status"]["revisions"]["current"]
    gone = old_workloads(old)
    router = e2e.router_url(cluster, ns, NAME)
    load = BackgroundLoad(router, e2e.MODEL, max_requests=1200, max_seconds=420).start(STEADY)
    try:
        time.sleep(5)
        began = time.monotonic()
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))

        def switched() -> dict[str, Any] | None:
            revs = (deployed.pdd().get("status") or {}).get("revisions") or {}
            current = revs.get("current") or {}
            if current.get("id") == old["id"] or revs.get("weight") != 100 or not revs.get("previous"):
                return None
            return dict(revs)

        revs = eventually(switched, timeout=300, what="the weight on the new revision's pair")
        switch_s = time.monotonic() - began
        for kind, name in gone:
            assert deployed.get(kind, name), f"the old pair's {kind}/{name} gone early"
        at_switch(revs)

        def removed() -> bool:
            revs = (deployed.pdd().get("status") or {}).get("revisions") or {}
            return not revs.get("previous") and not any(deployed.get(kind, name) for kind, name in gone)

        eventually(removed, timeout=420, what="the old pair's workloads removed")
        removed_s = time.monotonic() - began
        time.sleep(3)
    finally:
        load.stop(timeout=90)
    message = next(
        (
            e.get("message", "")
            for e in e2e.events(cluster, ns, NAME)
            if e["reason"] == "RevisionRemoved" and old["id"] in e.get("message", "")
        ),
        "",
    )
    print(
        f"\nrevision {old['id']} -> {revs['current']['id']}: weight moved {switch_s:.0f} s after the "
        f"apply, old pair removed after {removed_s:.0f} s ({message})"
    )
    assert "idle" in message, message
    samples = load.samples()
    failed = e2e.failures(samples)
    print(f"{len(samples)} requests through the router during the change, {len(failed)} failed")
    assert len(samples) >= 20
    assert not failed, failed[:3]
    assert {p["metadata"]["labels"].get(meta.LABEL_REVISION) for p in deployed.pods("decode")} == {
        revs["current"]["id"]
    }
    return Rolled(old, revs, switch_s, removed_s)


def test_a_revision_change_replaces_the_groups_through_the_revision_rollout(deployed: Deployed) -> None:
    """An image change (a revision field) on the groups deployment: the new revision's prefill and
    decode LeaderWorkerSets start beside the old ones, the weight moves to them once every group of
    theirs is Ready, and the old pair's LeaderWorkerSets go once their leaders report nothing in
    flight, with requests served all along."""
    cluster, ns = deployed.cluster, deployed.namespace
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest(1)))  # fewer pods
    eventually(lambda: deployed.ready({"prefill": 1, "decode": 1}), timeout=300, what="1+1 groups")
    eventually(lambda: len(deployed.pods("decode")) == 2, timeout=120, what="decode's 2nd group gone")

    def new_groups(revs: dict[str, Any]) -> None:
        for role in ("prefill", "decode"):
            lws = deployed.get("leaderworkerset", f"{revs['current']['prefix']}-{role}")
            assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2, lws
            assert lws["status"]["readyReplicas"] == 1, lws["status"]

    roll_revision(
        deployed,
        manifest(1, NEW_IMAGE),
        lambda old: [("leaderworkerset", f"{NAME}-{role}") for role in ("prefill", "decode")],
        new_groups,
    )


def test_a_revision_moves_decode_from_groups_to_a_statefulset_through_the_revision_rollout(
    deployed: Deployed,
) -> None:
    """Decode changes shape (a group of 2 pods a replica -> one pod a replica): the new revision's pair
    is a prefill LeaderWorkerSet and a decode StatefulSet beside the old pair's two LeaderWorkerSets;
    the weight moves once the new pair is Ready, the old pair goes once idle, requests served all
    along (both directions' objects also in tests/unit/controller/test_reconcile_groups.py)."""
    eventually(lambda: deployed.ready({"prefill": 1, "decode": 1}), timeout=300, what="1+1 groups")
    doc = manifest(1, NEW_IMAGE)
    doc["spec"]["decode"] = e2e.pool(1, requests=e2e.SMALL_POD_REQUESTS)

    def new_pair(revs: dict[str, Any]) -> None:
        prefix = revs["current"]["prefix"]
        assert deployed.get("leaderworkerset", f"{prefix}-prefill")["status"]["readyReplicas"] == 1
        sts = deployed.get("statefulset", f"{prefix}-decode")
        assert sts["status"]["readyReplicas"] == 1, sts["status"]
        assert not deployed.get("leaderworkerset", f"{prefix}-decode")

    rolled = roll_revision(
        deployed,
        doc,
        lambda old: [("leaderworkerset", f"{old['prefix']}-{role}") for role in ("prefill", "decode")],
        new_pair,
    )
    decode = deployed.pods("decode")
    assert len(decode) == 1, [p["metadata"]["name"] for p in decode]
    assert decode[0]["metadata"]["name"] == f"{rolled.revs['current']['prefix']}-decode-0"


def test_a_revision_moves_decode_from_a_statefulset_back_to_groups_through_the_revision_rollout(
    deployed: Deployed,
) -> None:
    """The other direction, from where the last test left decode (one pod a replica, a StatefulSet):
    back to groups of 2 pods and the first image. The new pair is two LeaderWorkerSets beside the old
    pair's prefill LeaderWorkerSet and decode StatefulSet; the weight moves once every new group is
    Ready, the old pair goes once idle, requests served all along."""
    old_decode = deployed.get("pdd", NAME)["status"]["revisions"]["current"]["prefix"] + "-decode"
    if not deployed.get("statefulset", old_decode):
        pytest.fail(f"decode is not a StatefulSet ({old_decode}): the previous test did not leave it one")
    eventually(lambda: deployed.ready({"prefill": 1, "decode": 1}), timeout=300, what="1 + 1 Ready")

    def new_pair(revs: dict[str, Any]) -> None:
        prefix = revs["current"]["prefix"]
        for role in ("prefill", "decode"):
            lws = deployed.get("leaderworkerset", f"{prefix}-{role}")
            assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2, lws
            assert lws["status"]["readyReplicas"] == 1, lws["status"]
        # The only StatefulSet of that name is the LeaderWorkerSet's own (its leaders).
        owners = deployed.get("statefulset", f"{prefix}-decode")["metadata"].get("ownerReferences") or []
        assert [o["kind"] for o in owners] == ["LeaderWorkerSet"], owners

    rolled = roll_revision(
        deployed,
        manifest(1),
        lambda old: [
            ("leaderworkerset", f"{old['prefix']}-prefill"),
            ("statefulset", f"{old['prefix']}-decode"),
        ],
        new_pair,
    )
    prefix = rolled.revs["current"]["prefix"]
    names = sorted(p["metadata"]["name"] for p in deployed.pods("decode"))
    assert names == [f"{prefix}-decode-0", f"{prefix}-decode-0-1"], names


# --- all-or-nothing placement: one group per topology domain -----------------------------------

PLACED = "placed"
FABRIC = "network.tandem.dev/fabric"  # e2e/nodes/h100-rdma.yaml: fabric-a and fabric-b, 2 nodes each


def placed_manifest(decode_groups: int) -> dict[str, Any]:
    """Prefill one pod (a StatefulSet: no group of its own), decode groups of 2 pods, one group per
    fabric domain (`groupPlacement.exclusiveTopology`)."""
    decode = {**group_pool(decode_groups), "groupPlacement": {"exclusiveTopology": FABRIC}}
    return e2e.pddeployment(
        PLACED,
        {
            "engine": {"type": "sim", "image": e2e.IMAGE},
            "prefill": e2e.pool(1, requests=e2e.SMALL_POD_REQUESTS),
            "decode": decode,
            "maxGPUs": 1 + 3 * GPUS_PER_GROUP,
        },
    )


def group_pods(cluster: ClusterHandle) -> list[dict[str, Any]]:
    """Every LeaderWorkerSet pod in the cluster (any namespace): they all take part in exclusive
    placement (its anti-affinity is to pods of any other group)."""
    out = cluster.kubectl("get", "pods", "-A", "-l", meta.LWS_GROUP_KEY_LABEL, "-o", "json")
    return list(json.loads(out.stdout)["items"])


def test_exclusive_topology_places_each_group_in_its_own_domain_and_holds_one_with_none_left(
    deployed: Deployed,
) -> None:
    """`groupPlacement.exclusiveTopology` through LeaderWorkerSet's own controller and pod webhook:
    each decode group's two pods land in one fabric domain and the two groups in different ones; a
    third group finds no free domain, so its leader stays Pending (Unschedulable) and LeaderWorkerSet
    creates none of its workers (it waits for the leader's node): no half-placed group holds GPUs,
    and the two placed groups keep serving."""
    cluster, ns = deployed.cluster, deployed.namespace
    cluster.kubectl("delete", "pdd", NAME, "-n", ns, "--wait=false", check=False)
    eventually(lambda: not group_pods(cluster), timeout=240, what="no group pod left in the cluster")
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    fabric_of = {n["metadata"]["name"]: n["metadata"]["labels"].get(FABRIC) for n in nodes}
    started = time.monotonic()
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(placed_manifest(2)))

    def decode_groups_ready() -> int:
        pools = (deployed.get("pdd", PLACED).get("status") or {}).get("pools") or {}
        return int((pools.get("decode") or {}).get("readyReplicas") or 0)

    eventually(lambda: decode_groups_ready() == 2, timeout=300, what="2 decode groups Ready")
    print(f"\n{PLACED}: 2 decode groups Ready {time.monotonic() - started:.1f} s after the apply")
    lws = deployed.get("leaderworkerset", f"{PLACED}-decode")
    assert lws["metadata"]["annotations"][meta.LWS_EXCLUSIVE_TOPOLOGY] == FABRIC
    by_group: dict[str, set[str]] = {}
    for pod in deployed.pods("decode", PLACED):
        domain = str(fabric_of[pod["spec"]["nodeName"]])
        if pod["metadata"]["labels"][meta.LWS_WORKER_INDEX_LABEL] == "0":
            # LeaderWorkerSet's pod webhook gave the leader the placement terms: an affinity to its
            # group's pods and an anti-affinity to every other group's, both over the fabric label.
            affinity = pod["spec"]["affinity"]
            for kind in ("podAffinity", "podAntiAffinity"):
                terms = affinity[kind].get("requiredDuringSchedulingIgnoredDuringExecution") or []
                assert any(t["topologyKey"] == FABRIC for t in terms), (kind, affinity)
        else:  # its controller pinned the workers to the leader's domain once the leader had a node
            assert pod["spec"]["nodeSelector"][FABRIC] == domain, pod["spec"].get("nodeSelector")
        group = pod["metadata"]["labels"][meta.LWS_GROUP_INDEX_LABEL]
        by_group.setdefault(group, set()).add(domain)
    print(f"decode groups by fabric domain: {by_group}")
    assert set(by_group) == {"0", "1"}
    assert all(len(domains) == 1 for domains in by_group.values()), by_group
    assert by_group["0"] != by_group["1"], by_group
    # The decode groups may be Ready before the router's pod is.
    router = eventually(lambda: e2e.router_url(cluster, ns, PLACED), timeout=120, what="a Ready router pod")
    eventually(lambda: all_served(router, 6), timeout=120, what="served through the router")

    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(placed_manifest(3)))

    def third_leader_unschedulable() -> dict[str, Any] | None:
        leader = deployed.get("pod", f"{PLACED}-decode-2")
        conditions = (leader.get("status") or {}).get("conditions") or []
        scheduled = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        return leader if scheduled.get("reason") == "Unschedulable" else None

    leader = eventually(
        third_leader_unschedulable, timeout=120, what="the third group's leader Unschedulable"
    )
    message = next(c for c in leader["status"]["conditions"] if c["type"] == "PodScheduled")["message"]
    print(f"the third group's leader: {message}")
    assert "anti-affinity" in message or "affinity" in message, message

    # (The PDDeployment turns Stalled, reason Unschedulable, once the pod has waited the operator's
    # grace, 60 s: test_reconcile.py's test_unschedulable_shows_in_status, not waited for here.)
    time.sleep(5)  # LeaderWorkerSet had time to (wrongly) create workers for the unplaced leader
    assert not deployed.get("pod", f"{PLACED}-decode-2-1"), "a worker made for a leader without a node"
    assert decode_groups_ready() == 2
    assert all_served(router, 6) == [200] * 6
    cluster.kubectl("delete", "pdd", PLACED, "-n", ns, "--wait=false", check=False)


# --- all-or-nothing placement: Kubernetes' own gang scheduling ---------------------------------

GANG = "gang"
FILLER = "filler"
ACCELERATORS = {"type": "sim", "image": e2e.IMAGE, "sim": {"requestAccelerators": True}}


def gang_manifest() -> dict[str, Any]:
    """Prefill one pod of 1 GPU in fabric-a; decode one group of 2 pods of 8 GPUs each (TP8 x DP2,
    a rank per pod) in fabric-b, placed by Kubernetes' gang scheduling."""
    small = e2e.SMALL_POD_REQUESTS
    decode = {
        **e2e.pool(1, requests=small),
        "nodesPerInstance": 2,
        "tensorParallelSize": 8,
        "parallelism": {"data": 2},
        "nodeSelector": {FABRIC: "fabric-b"},
        "groupPlacement": {"gangScheduling": "Kubernetes"},
    }
    prefill = {**e2e.pool(1, requests=small), "nodeSelector": {FABRIC: "fabric-a"}}
    return e2e.pddeployment(
        GANG, {"engine": ACCELERATORS, "prefill": prefill, "decode": decode, "maxGPUs": 24}
    )


def filler_manifest() -> dict[str, Any]:
    """Another workload holding 4 of fabric-b's 16 GPUs: a colocated pod of TP4."""
    colocated = {**e2e.pool(1, requests=e2e.SMALL_POD_REQUESTS), "tensorParallelSize": 4}
    return e2e.pddeployment(
        FILLER,
        {
            "engine": ACCELERATORS,
            "serving": {"mode": "Colocated"},
            "prefill": {"replicas": 0},
            "decode": {"replicas": 0},
            "colocated": {**colocated, "nodeSelector": {FABRIC: "fabric-b"}},
        },
    )


def test_kubernetes_gang_scheduling_binds_a_group_all_together_or_not_at_all(deployed: Deployed) -> None:
    """`groupPlacement.gangScheduling: Kubernetes` on the dev cluster's own scheduler (the
    GangScheduling and GenericWorkload gates) and LeaderWorkerSet: the operator keeps a PodGroup per
    decode group (gang minCount 2) and tandem's MutatingAdmissionPolicy names it in each pod's
    spec.schedulingGroup. With another workload holding 4 of fabric-b's 16 GPUs there is room for one
    8-GPU pod, not the group's two: neither pod is bound (without the gang the leader would take the
    free node and hold it). Once the other workload goes, both are bound together, the group is Ready
    and serves through the router."""
    cluster, ns = deployed.cluster, deployed.namespace
    cluster.kubectl("delete", "pdd", "--all", "-n", ns, "--wait=false", check=False)  # GPUs free
    eventually(lambda: not group_pods(cluster), timeout=240, what="no group pod left in the cluster")
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(filler_manifest()))
    eventually(
        lambda: [p for p in deployed.pods("colocated", FILLER) if p["spec"].get("nodeName")],
        timeout=180,
        what="the filler pod bound",
    )
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(gang_manifest()))
    group = f"{GANG}-decode-0"
    pod_group = eventually(lambda: deployed.get("podgroup", group), timeout=120, what=f"PodGroup {group}")
    assert pod_group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}, pod_group["spec"]
    assert [o["kind"] for o in pod_group["metadata"]["ownerReferences"]] == ["PDDeployment"]

    def both_created() -> list[dict[str, Any]] | None:
        found = deployed.pods("decode", GANG)
        return found if len(found) == 2 else None

    pods = eventually(both_created, timeout=180, what="the decode group's 2 pods created")
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {group}, [p["spec"] for p in pods]
    eventually(
        lambda: [p for p in deployed.pods("prefill", GANG) if p["spec"].get("nodeName")],
        timeout=180,
        what="the prefill pod bound (the scheduler has run since the group's pods exist)",
    )
    time.sleep(10)  # scheduling cycles for both decode pods; a partial placement would show by now
    pods = deployed.pods("decode", GANG)
    bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
    conditions = [c for p in pods for c in (p.get("status") or {}).get("conditions") or []]
    print(f"\nwith 12 of fabric-b's 16 GPUs free: decode pods {bound}; {conditions}")
    assert len(pods) == 2, bound
    assert not any(bound.values()), bound

    freed = time.monotonic()
    cluster.kubectl("delete", "pdd", FILLER, "-n", ns, "--wait=false")

    def both_bound() -> dict[str, str] | None:
        nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in deployed.pods("decode", GANG)}
        return nodes if len(nodes) == 2 and all(nodes.values()) else None

    nodes = eventually(both_bound, timeout=240, what="both decode pods bound")
    print(f"both decode pods bound {time.monotonic() - freed:.1f} s after the filler's delete: {nodes}")
    assert len(set(nodes.values())) == 2, nodes  # 8 GPUs each: a node each
    status = eventually(
        lambda: deployed.get("podgroup", group).get("status"), timeout=60, what="PodGroup status"
    )
    print(f"PodGroup {group} status: {status}")
    eventually(lambda: deployed.ready({"prefill": 1, "decode": 1}, GANG), timeout=300, what=f"{GANG} Ready")
    router = eventually(lambda: e2e.router_url(cluster, ns, GANG), timeout=120, what="a Ready router pod")
    eventually(lambda: all_served(router, 6), timeout=120, what="served through the router")
    cluster.kubectl("delete", "pdd", GANG, "-n", ns, "--wait=false", check=False)
