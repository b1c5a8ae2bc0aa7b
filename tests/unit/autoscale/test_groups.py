"""The autoscaler on multi-node pools (issue 27 item 5): a replica is a LeaderWorkerSet group, whose
capacity is every data-parallel rank's (each an engine at the pool's TP), decided in whole groups,
with maxGPUs counting every GPU of a group (docs/multinode.md, "The autoscaler in groups").

Loads are in engines' worth (the Kit's capacities are one engine's, at the pool's TP: a TP16 engine
spanning two pods is one engine of that profile): a decode pool
of 2-rank groups running 3.4 engines' worth of sequences needs 2 groups.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from tandem.api.status import (
    AutoscalingPoolsStatus,
    AutoscalingStatus,
    DrainStatus,
    PoolAutoscalingStatus,
)
from tandem.autoscale.decide import decide
from tandem.autoscale.recommend import engines
from tandem.signals import Snapshot

if TYPE_CHECKING:
    from conftest import Kit

T0 = 1_800_000_000.0

# Groups of 2 pods, one rank each (Internal: the leader reports both ranks), 2 GPUs a group.
INTERNAL: dict[str, Any] = {"nodesPerInstance": 2, "parallelism": {"data": 2}}
# Groups of 2 pods of 2 ranks each, every pod serving and reporting its own ranks, 4 GPUs a group.
HYBRID: dict[str, Any] = {"nodesPerInstance": 2, "parallelism": {"data": 4, "loadBalancing": "Hybrid"}}
# Groups of 2 pods of 2 ranks each, a port per rank: Prometheus scrapes every rank's port (its own
# engine's /metrics), so the pool's sums hold every rank, and each port is a scrape target that reports.
MULTI_PORT: dict[str, Any] = {
    "nodesPerInstance": 2,
    "parallelism": {"data": 4, "loadBalancing": "MultiPortExternal"},
}
# One pod (a StatefulSet, no group) of 2 ranks, a port each: 2 scrape targets a replica.
MULTI_PORT_ONE_POD: dict[str, Any] = {"parallelism": {"data": 2, "loadBalancing": "MultiPortExternal"}}
# Groups of 2 pods, one rank each serving itself.
EXTERNAL: dict[str, Any] = {"nodesPerInstance": 2, "parallelism": {"data": 2, "loadBalancing": "External"}}
# One rank over 2 pods of 8 GPUs (multi-node TP16): one engine a group, the leader reports it.
SPANNING: dict[str, Any] = {"nodesPerInstance": 2, "tensorParallelSize": 16}


def at(desired: dict[str, int]) -> AutoscalingStatus:
    pools = {role: PoolAutoscalingStatus(desired_replicas=n) for role, n in desired.items()}
    return AutoscalingStatus(mode="Active", last_evaluated=T0 - 30, pools=AutoscalingPoolsStatus(**pools))


def scraped(snapshot: Snapshot, role: str, targets: int) -> Snapshot:
    """`snapshot` with `targets` scrape targets of `role` (pods, or ports of rank pods) reporting."""
    pool = dataclasses.replace(snapshot.pools[role], scraped_targets=targets)
    return dataclasses.replace(snapshot, pools={**snapshot.pools, role: pool})


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ({}, (1, 1)),
        (INTERNAL, (2, 1)),
        (HYBRID, (4, 2)),
        (MULTI_PORT, (4, 4)),  # 2 pods x 2 rank ports
        (MULTI_PORT_ONE_POD, (2, 2)),
        (EXTERNAL, (2, 2)),
        (SPANNING, (1, 1)),
    ],
    ids=["single", "internal", "hybrid", "multi-port", "multi-port-one-pod", "external", "spanning"],
)
def test_a_replica_in_engines_and_scrape_targets(
    kit: Kit, shape: dict[str, Any], expected: tuple[int, int]
) -> None:
    assert engines(kit.with_spec(decode=shape).spec, "decode") == expected


DECODE_CASES = [
    # id, decode shape, groups now (ready), targets reporting, load (engines' worth), kv, expected groups
    ("internal-running", INTERNAL, 2, 2, {"decode": 3.4}, 0.3, 2),  # 3.4 / 2 ranks = 1.7
    ("internal-running-grows", INTERNAL, 2, 2, {"decode": 5.4}, 0.3, 3),  # 2.7
    ("internal-waiting", INTERNAL, 2, 2, {"decode": 1.9, "waiting": 2.5}, 0.3, 3),  # 2.2
    ("internal-output-tokens", INTERNAL, 2, 2, {"decode": 0.4, "generation": 6.6}, 0.3, 4),  # 3.3
    # mean KV usage over the ranks x 2 groups reporting / 0.85: 2 x 0.95 / 0.85 = 2.24
    ("internal-kv", INTERNAL, 2, 2, {"decode": 0.5}, 0.95, 3),
    ("hybrid-running", HYBRID, 2, 4, {"decode": 10.5}, 0.3, 3),  # 10.5 / 4 ranks = 2.6
    # the same mean usage over 4 reporting pods is still 2 groups' KV: 2.24
    ("hybrid-kv", HYBRID, 2, 4, {"decode": 0.5}, 0.95, 3),
    ("multi-port-running", MULTI_PORT, 2, 8, {"decode": 10.5}, 0.3, 3),  # 10.5 / 4 ranks = 2.6
    ("multi-port-kv", MULTI_PORT, 2, 8, {"decode": 0.5}, 0.95, 3),  # mean over every rank's port: 2.24
    ("multi-port-one-pod-running", MULTI_PORT_ONE_POD, 2, 4, {"decode": 5.4}, 0.3, 3),  # 2.7
    ("multi-port-one-pod-kv", MULTI_PORT_ONE_POD, 2, 4, {"decode": 0.5}, 0.95, 3),  # 2.24
    ("external-running", EXTERNAL, 2, 4, {"decode": 5.4}, 0.3, 3),  # 2.7
    ("spanning-running", SPANNING, 2, 2, {"decode": 3.4}, 0.3, 4),  # one engine a group
]


@pytest.mark.parametrize(
    ("shape", "groups", "targets", "load", "kv", "target"),
    [c[1:] for c in DECODE_CASES],
    ids=[c[0] for c in DECODE_CASES],
)
def test_decode_is_decided_in_groups_of_their_ranks_capacity(
    kit: Kit, shape: dict[str, Any], groups: int, targets: int, load: dict[str, float], kv: float, target: int
) -> None:
    k = kit.with_spec(decode={**shape, "replicas": groups}, autoscaling={"scaleUp": {"maxStep": 8}})
    snapshot = k.snapshot(
        T0, sizes={"prefill": (2, 2), "decode": (groups, groups)}, prefill=1.5, kv=kv, **load
    )
    decision = decide(k.spec, scraped(snapshot, "decode", targets), at({"prefill": 2, "decode": groups}), T0)
    pool = decision.pools["decode"]
    assert pool.target == target, pool.reason
    ranks = engines(k.spec, "decode")[0]
    assert pool.figures["capacitySequences"] == pytest.approx(k.sequence_capacity * ranks)
    assert pool.figures["kvTokensPerReplica"] == pytest.approx(k.kv_tokens * ranks)


PREFILL_CASES = [
    # id, prefill shape, groups, targets reporting, prompt load (engines' worth at target), expected groups
    ("internal", INTERNAL, 1, 1, 3.5, 2),
    ("internal-idle", INTERNAL, 2, 2, 1.2, 1),  # scale-down: the window's highest recommendation
    ("hybrid", HYBRID, 1, 2, 6.5, 2),
    ("multi-port", MULTI_PORT, 1, 4, 6.5, 2),
    ("multi-port-idle", MULTI_PORT, 2, 8, 2.5, 1),
    ("multi-port-one-pod-idle", MULTI_PORT_ONE_POD, 2, 4, 1.2, 1),
    ("external", EXTERNAL, 2, 4, 4.5, 3),
    ("single-node-data-parallel", {"parallelism": {"data": 2}}, 1, 1, 3.5, 2),
]


@pytest.mark.parametrize(
    ("shape", "groups", "targets", "prompt", "target"),
    [c[1:] for c in PREFILL_CASES],
    ids=[c[0] for c in PREFILL_CASES],
)
def test_prefill_is_decided_in_groups(
    kit: Kit, shape: dict[str, Any], groups: int, targets: int, prompt: float, target: int
) -> None:
    k = kit.with_spec(
        prefill={**shape, "replicas": groups},
        autoscaling={"scaleUp": {"maxStep": 8}, "scaleDown": {"stabilizationSeconds": 0}},
    )
    snapshot = k.snapshot(
        T0, sizes={"prefill": (groups, groups), "decode": (2, 2)}, prefill=prompt, decode=1.0
    )
    decision = decide(k.spec, scraped(snapshot, "prefill", targets), at({"prefill": groups, "decode": 2}), T0)
    pool = decision.pools["prefill"]
    assert pool.target == target, pool.reason
    ranks = engines(k.spec, "prefill")[0]
    assert pool.figures["capacityTokensPerSecond"] == pytest.approx(k.prompt_capacity * ranks)


PARTIAL_CASES = [
    # id, decode shape (2 ready replicas), its scrape targets when all report, targets reporting
    ("hybrid-half-the-pods", HYBRID, 4, 2),  # 2 groups x 2 serving pods
    ("external-a-silent-pod", EXTERNAL, 4, 3),
    # A rank's port fails to scrape while its pod's other port answers: that rank's load is unseen.
    ("multi-port-a-silent-rank", MULTI_PORT, 8, 7),
    ("multi-port-one-pod-a-silent-rank", MULTI_PORT_ONE_POD, 4, 3),
]


@pytest.mark.parametrize(
    ("shape", "every", "reporting"), [c[1:] for c in PARTIAL_CASES], ids=[c[0] for c in PARTIAL_CASES]
)
def test_a_pool_whose_targets_do_not_all_report_is_partial_and_never_scales_down(
    kit: Kit, shape: dict[str, Any], every: int, reporting: int
) -> None:
    """2 ready replicas with `every` scrape targets: idle enough for one replica when every target
    reports; with one or more silent (a pod, or one rank's port), the pool is partial and holds."""
    k = kit.with_spec(decode={**shape, "replicas": 2}, autoscaling={"scaleDown": {"stabilizationSeconds": 0}})
    snapshot = k.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, prefill=1.5, decode=0.5, kv=0.1)
    full = decide(k.spec, scraped(snapshot, "decode", every), at({"prefill": 2, "decode": 2}), T0)
    assert full.pools["decode"].target == 1, full.pools["decode"].reason
    partial = decide(k.spec, scraped(snapshot, "decode", reporting), at({"prefill": 2, "decode": 2}), T0)
    assert partial.pools["decode"].target == 2, partial.pools["decode"].reason


def test_learning_is_per_engine(kit: Kit) -> None:
    """A saturated prefill pool of 2 groups x 2 ranks computing half the profile's rate per engine
    learns the same correction as 4 single-engine replicas computing it."""
    grouped = kit.with_spec(prefill={**INTERNAL, "replicas": 2})
    flat = kit.with_spec(prefill={"replicas": 4})
    load = {"busy": 2.0, "queue": 6.0, "queue_before": 6.0, "decode": 1.0}
    g = grouped.snapshot(T0, sizes={"prefill": (2, 2), "decode": (2, 2)}, **load)
    f = flat.snapshot(T0, sizes={"prefill": (4, 4), "decode": (2, 2)}, **load)
    # both compute 2 engines' busy rate: 4 engines at half of it; the queues are 4 engines' deep
    g = dataclasses.replace(
        g, pools={**g.pools, "prefill": dataclasses.replace(g.pools["prefill"], waiting_requests=8.0)}
    )
    f = dataclasses.replace(
        f, pools={**f.pools, "prefill": dataclasses.replace(f.pools["prefill"], waiting_requests=8.0)}
    )
    learnt_g = decide(grouped.spec, g, at({"prefill": 2, "decode": 2}), T0).state.pools.prefill
    learnt_f = decide(flat.spec, f, at({"prefill": 4, "decode": 2}), T0).state.pools.prefill
    assert learnt_f.capacity_correction < 1.0  # it learnt
    assert learnt_g.capacity_correction == pytest.approx(learnt_f.capacity_correction)


BUDGET_CASES = [
    # id, maxGPUs, decode wanted (engines' worth), expected decode groups: prefill 1 group (2 GPUs) fixed
    ("fits", 8, 5.4, 3),  # 3 groups x 2 GPUs + 2
    ("whole-groups-only", 7, 5.4, 2),  # 7 - 2 = 5 GPUs: 2 groups, never a half group
    ("tight", 6, 5.4, 2),
]


@pytest.mark.parametrize(
    ("max_gpus", "load", "target"), [c[1:] for c in BUDGET_CASES], ids=[c[0] for c in BUDGET_CASES]
)
def test_max_gpus_counts_whole_groups(kit: Kit, max_gpus: int, load: float, target: int) -> None:
    k = kit.with_spec(
        maxGPUs=max_gpus,
        prefill={**INTERNAL, "replicas": 1, "autoscaling": None},
        decode={**INTERNAL, "replicas": 2},
        autoscaling={"scaleUp": {"maxStep": 8}},
    )
    snapshot = k.snapshot(T0, sizes={"prefill": (1, 1), "decode": (2, 2)}, prefill=1.0, decode=load, kv=0.3)
    decision = decide(k.spec, snapshot, at({"decode": 2}), T0)
    pool = decision.pools["decode"]
    assert pool.recommendation == 3
    assert pool.target == target
    assert 2 + 2 * pool.target <= max_gpus
    if target < 3:
        assert pool.limited_by == "maxGPUs"


@pytest.mark.parametrize(
    ("decode_wants", "prefill_gets"),
    [
        (1.0, 2),  # decode keeps draining group 1 (2 pods, 2 GPUs): 8 = prefill 2 + decode 1 + 1 draining
        (3.4, 2),  # decode wants its draining group back (the drain is cancelled): prefill 2 + decode 2
    ],
)
def test_max_gpus_counts_a_draining_group_once(kit: Kit, decode_wants: float, prefill_gets: int) -> None:
    """A drain names both pods of the group it empties; the budget counts the group's GPUs once."""
    k = kit.with_spec(
        maxGPUs=8,
        prefill={**INTERNAL, "replicas": 1},
        decode={**INTERNAL, "replicas": 1},
        autoscaling={"scaleUp": {"maxStep": 8}},
    )
    drain = DrainStatus(pod="d-1", pods=["d-1", "d-1-1"], started_at=T0 - 10, target_replicas=1)
    state = at({"prefill": 1, "decode": 1})
    state.pools.decode = state.pools.decode.model_copy(update={"draining": drain})
    snapshot = k.snapshot(
        T0, sizes={"prefill": (1, 1), "decode": (2, 2)}, busy=2, queue=6.0, decode=decode_wants, kv=0.3
    )
    decision = decide(k.spec, snapshot, state, T0)
    assert decision.pools["prefill"].target == prefill_gets
    assert decision.pools["prefill"].recommendation > prefill_gets  # it wanted more: the budget held it
    held = decision.pools["prefill"].target + max(decision.pools["decode"].target, 2)
    assert 2 * held <= 8
