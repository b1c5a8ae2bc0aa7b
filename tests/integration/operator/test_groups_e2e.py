"""Multi-node pools end to end on the local cluster (issue 27 items 1, 4 and 7): the operator applies
the LeaderWorkerSets of a PDDeployment whose prefill and decode pools are groups of 2 sim-engine pods
(one data-parallel rank per pod, the leader balancing: `Internal`), requests are served through the
operator's router from a prefill group to a decode group, a pool grows by one group (within maxGPUs,
which counts every GPU of a group), and a killed rank takes its group down until LeaderWorkerSet has
recreated it and it serves again.

The dev cluster runs LeaderWorkerSet's controller (`devcluster.start_lws`); every address is a
loopback one (127.0.0.0/8).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tandem.api import meta
from tandem.demo import e2e
from tandem.devcluster import cluster as devcluster
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.layout import ClusterDir
from tandem.devcluster.testing import OperatorProcess, eventually, scratch_namespace

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

NAME = "mn"
GPUS_PER_GROUP = 2  # 2 pods x 1 GPU (TP1, a data-parallel rank per pod)
MAX_GPUS = 3 * GPUS_PER_GROUP  # prefill 1 group + decode 2 groups
REQUEST = {"model": e2e.MODEL, "prompt": "the quick brown fox jumps over the lazy dog", "max_tokens": 8}


def group_pool(replicas: int) -> dict[str, Any]:
    return {
        **e2e.pool(replicas, requests=e2e.SMALL_POD_REQUESTS),
        "nodesPerInstance": 2,
        "parallelism": {"data": 2},
    }


def manifest(decode_groups: int) -> dict[str, Any]:
    return e2e.pddeployment(
        NAME,
        {
            "engine": {"type": "sim", "image": e2e.IMAGE},
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

    def pods(self, role: str) -> list[dict[str, Any]]:
        items = self.get("pods", "-l", f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}={role}").get("items", [])
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def ready(self, groups: dict[str, int]) -> dict[str, Any] | None:
        """The PDDeployment once Ready with these ready groups per pool."""
        pdd = self.pdd()
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
def deployed(cluster: ClusterHandle, operator: OperatorProcess) -> Iterator[Deployed]:
    try:
        devcluster.start_lws(ClusterDir(cluster.dir))
    except devcluster.ClusterError as e:
        pytest.fail(f"the LeaderWorkerSet controller did not start: {e}", pytrace=False)
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
