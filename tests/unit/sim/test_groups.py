"""Data-parallel groups in the simulator (`parallelism.data` = D): a replica is a group of D ranks, each
an engine on the pool's per-rank profile, started and removed as a unit, balanced over as the pool's
`loadBalancing` says; GPU-hours count the group's GPUs.

The D=1 runs below are pinned to fingerprints taken before groups were modelled (commit d1eb9ec): the
summary, every request's first token, finish, path and preemptions, the scrape series and the
autoscaler's decisions, hashed; a D=1 pool must give exactly the same run."""

from __future__ import annotations

import copy
import hashlib
import itertools
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tandem.api.models import PDDeployment, PDDeploymentSpec
from tandem.api.shape import Shape
from tandem.autoscale.decide import Decision
from tandem.perf import load_profile
from tandem.routing.disaggregation import DisaggregationKnobs
from tandem.signals import Snapshot
from tandem.sim import Request, ScheduledPolicy, SimResult, Summary, simulate
from tandem.sim import advise as adv
from tandem.sim.cluster import Cluster
from tandem.sim.group import Endpoint
from tandem.sim.layout import SLO, Layout, PoolSpec, ReplicaSpec, SimConfig
from tandem.sim.tandem_policy import TandemPolicy
from tandem.sim.traces.prefix import SessionParams, sessions
from tandem.sim.traces.readers import read_azure
from tandem.sim.traces.transform import scale_rate, window

if TYPE_CHECKING:
    from conftest import SimKit

ROOT = Path(__file__).resolve().parents[3]


def fingerprint(result: SimResult, extra: str = "") -> str:
    digest = hashlib.sha256()
    digest.update(result.summary.model_dump_json().encode())
    records = result.records
    for column in (records.first, records.finished, records.path, records.preemptions):
        digest.update(column.tobytes())
    digest.update(repr(result.series).encode())
    digest.update(extra.encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def azure() -> list[Request]:
    """The Azure conversation trace's seconds 600-1800 at 4x its rate: 7,241 requests in 300 s."""
    trace = read_azure(ROOT / "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
    return scale_rate(window(trace, 600, 1200), 4)


def test_d1_autoscaled_run_is_unchanged(azure: list[Request]) -> None:
    """examples/sim-pd-autoscaling.yaml under tandem's autoscaler (it scales decode up twice)."""
    spec = PDDeployment.from_object(
        yaml.safe_load((ROOT / "examples/sim-pd-autoscaling.yaml").read_text())
    ).spec
    sim = adv.layout_of_spec(spec)
    assert sim.slo is not None
    policy = TandemPolicy(spec)
    result = simulate(azure, sim.layout, SimConfig(slo=sim.slo), policy)
    assert len(policy.decisions) == 2
    assert (result.summary.attainment, result.summary.gpu_hours) == (0.8103853058969755, 0.23122099951151437)
    assert fingerprint(result, repr(policy.decisions)) == "6e1dc926f994f4a7"


def test_d1_prefix_routing_and_auto_prefill_are_unchanged(kit: SimKit) -> None:
    base = [Request(0.5 * i, 150, 60) for i in range(600)]
    trace = sessions(base, SessionParams(turns=4, think_seconds=5.0, system_prompt_tokens=1500, seed=2))
    config = kit.config().model_copy(
        update={"disaggregation": DisaggregationKnobs(mode="Auto"), "routing": "prefix"}
    )
    result = simulate(trace, kit.pd(prefill=2, decode=2), config)
    assert result.summary.gpu_hours == 0.36900178645229903
    assert fingerprint(result) == "8e5f741b09dff3dd"


def test_d1_scheduled_colocated_run_is_unchanged(kit: SimKit, azure: list[Request]) -> None:
    policy = ScheduledPolicy([(0.0, {"colocated": 1}), (60.0, {"colocated": 3}), (200.0, {"colocated": 1})])
    config = kit.config().model_copy(update={"routing": "least-loaded"})
    result = simulate(azure, kit.colocated(replicas=1, load=30.0), config, policy)
    assert result.summary.scale_actions == 2
    assert (result.summary.attainment, result.summary.gpu_hours) == (0.41803618284767297, 0.17992101660446622)
    assert fingerprint(result) == "71f832eb3ba0aa9b"


# --- groups of D ranks -------------------------------------------------------------------------------

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
# 800 requests within 0.8 s (1,000-2,000 prompt tokens, 20-69 output): a backlog that keeps every engine
# busy to the end, so the run's length is the pool's throughput.
BURST = [Request(0.001 * i, 1000 + (i * 37) % 1000, 20 + i % 50) for i in range(800)]
BURST_TOKENS = sum(r.prompt_tokens + r.output_tokens for r in BURST)

# id, the pool's shape: every balancing mode over 4 ranks, in one pod or over pods
SHAPES = [
    ("internal-1-pod", Shape(data=4)),
    ("internal-4-pods", Shape(data=4, nodes=4)),
    ("hybrid-2-pods", Shape(data=4, nodes=2, load_balancing="Hybrid")),
    ("external-4-pods", Shape(data=4, nodes=4, load_balancing="External")),
    ("multi-port-2-pods", Shape(data=4, nodes=2, load_balancing="MultiPortExternal")),
]


def colocated(kit: SimKit, shape: Shape | None, replicas: int = 1, load: float = 120.0) -> Layout:
    pool = PoolSpec(replica=kit.spec(), replicas=replicas, shape=shape)
    return Layout(pools={"colocated": pool}, model_load_seconds=load)


def throughput(summary: Summary) -> float:
    return BURST_TOKENS / summary.duration_seconds


@pytest.mark.parametrize("shape", [s for _, s in SHAPES], ids=[i for i, _ in SHAPES])
def test_a_group_of_4_ranks_serves_4_ranks_worth(kit: SimKit, shape: Shape) -> None:
    one = simulate(BURST, colocated(kit, None), kit.config()).summary
    group = simulate(BURST, colocated(kit, shape), kit.config()).summary
    four = simulate(BURST, colocated(kit, None, replicas=4), kit.config()).summary
    assert one.finished == group.finished == len(BURST)
    # Measured 3.88x (the last engine to finish sets the run's end); 4 single replicas the same.
    assert 3.8 <= throughput(group) / throughput(one) <= 4.0
    assert throughput(group) == pytest.approx(throughput(four), rel=0.01)


@pytest.mark.parametrize(
    ("model", "tp", "shape", "gpus_per_replica"),
    [
        (LLAMA_8B, 1, None, 1),
        (LLAMA_8B, 1, Shape(data=4), 4),
        (LLAMA_8B, 1, Shape(data=8, nodes=2, load_balancing="Hybrid"), 8),
        (LLAMA_8B, 1, Shape(data=2, pipeline=2, nodes=2), 4),  # TP x PP x DP
        (LLAMA_70B, 4, Shape(tensor=4, data=2), 8),
        (LLAMA_70B, 4, Shape(tensor=4, data=4, nodes=2), 16),
    ],
)
def test_gpu_hours_are_the_groups_gpus_per_replica_hour(
    model: str, tp: int, shape: Shape | None, gpus_per_replica: int
) -> None:
    replica = ReplicaSpec.from_profile(load_profile(model, "H100", tp))
    pools = {"colocated": PoolSpec(replica=replica, replicas=2, shape=shape)}
    requests = [Request(0.5 * i, 500, 20) for i in range(40)]
    result = simulate(requests, Layout(pools=pools), SimConfig(slo=SLO(ttft_ms=1000, tpot_ms=50)))
    end = result.summary.duration_seconds
    assert result.summary.gpu_hours == pytest.approx(2 * gpus_per_replica * end / 3600, rel=1e-12)
    assert result.summary.peak_gpus == 2 * gpus_per_replica
    assert result.summary.mean_gpus == pytest.approx(2 * gpus_per_replica)


@pytest.mark.parametrize(
    ("shape", "endpoints"),
    [
        (Shape(data=4), ["colocated-0", "colocated-1"]),
        (
            Shape(data=4, nodes=2, load_balancing="Hybrid"),
            [f"colocated-{g}.p{p}" for g in (0, 1) for p in (0, 1)],
        ),
        (
            Shape(data=4, nodes=4, load_balancing="External"),
            [f"colocated-{g}.r{k}" for g in (0, 1) for k in range(4)],
        ),
        (
            Shape(data=4, nodes=2, load_balancing="MultiPortExternal"),
            [f"colocated-{g}.r{k}" for g in (0, 1) for k in range(4)],
        ),
        (None, ["colocated-0", "colocated-1"]),
    ],
    ids=["internal", "hybrid", "external", "multi-port", "single"],
)
def test_the_router_sees_the_endpoints_the_balancing_mode_gives(
    kit: SimKit, shape: Shape | None, endpoints: list[str]
) -> None:
    """Internal: the group's leader; Hybrid: each pod; External and MultiPortExternal: each rank."""
    cluster = Cluster(BURST, colocated(kit, shape, replicas=2), kit.config(), None)
    assert [e.name for e in cluster.ready["colocated"]] == endpoints
    cluster.run()
    ranks = cluster.all_replicas
    assert len(ranks) == 2 * (shape.data if shape else 1)
    # every rank of both groups served a share of the burst, none more than twice the fair share
    busy = [r.busy_seconds for r in ranks]
    assert min(busy) > 0
    assert max(busy) <= 2 * sum(busy) / len(busy)


def test_an_endpoint_sends_each_request_to_its_least_busy_rank(kit: SimKit) -> None:
    cluster = Cluster(BURST, colocated(kit, Shape(data=4)), kit.config(), None)
    (leader,) = cluster.ready["colocated"]
    assert isinstance(leader, Endpoint)
    ranks = leader.ranks
    for rank, in_flight in zip(ranks, (3, 1, 2, 1), strict=True):
        rank.load_requests = in_flight
    ranks[1].load_tokens = 5000  # a tie on requests goes to the lower rank, whatever the tokens
    assert cluster._pick(cluster.ready["colocated"]) is ranks[1]
    assert leader.load_requests == 7
    assert leader.cost() == 7 + 5000 / 512


@pytest.mark.parametrize("shape", [s for _, s in SHAPES], ids=[i for i, _ in SHAPES])
def test_a_scale_out_adds_a_whole_group_ready_after_one_load_time(kit: SimKit, shape: Shape) -> None:
    requests = [Request(0.1 * t, 200, 200) for t in range(2000)]  # about 14 in flight at any time
    policy = ScheduledPolicy(steps=[(15.0, {"colocated": 2})], interval_seconds=15.0)
    cluster = Cluster(requests, colocated(kit, shape, load=60.0), kit.config(), policy)
    cluster.begin()
    cluster.advance(74.999, len(requests))
    added = cluster.all_groups[1]
    assert len(added.ranks) == 4
    assert all((r.requested_at, r.ready_at) == (15.0, 75.0) for r in added.ranks)
    assert not any(e in cluster.ready["colocated"] for e in added.endpoints)  # no rank is ready before all
    assert all(r.busy_seconds == 0 for r in added.ranks)
    cluster.advance(75.0, len(requests))
    assert all(e in cluster.ready["colocated"] for e in added.endpoints)
    cluster.advance(math.inf, len(requests))
    result = cluster._result()
    by_time = {round(s.time): s for s in result.series}
    assert (by_time[30].replicas["colocated"], by_time[30].ready["colocated"], by_time[30].gpus) == (2, 1, 8)
    assert (by_time[75].replicas["colocated"], by_time[75].ready["colocated"]) == (2, 2)
    assert all(r.busy_seconds > 0 for r in added.ranks)
    end = result.summary.duration_seconds
    assert result.summary.gpu_hours == pytest.approx(4 * (end + (end - 15.0)) / 3600)
    assert (result.summary.scale_actions, result.summary.peak_gpus) == (1, 8)


def test_a_scale_in_drains_every_rank_of_the_newest_group_and_counts_it_until_its_last_rank_is_done(
    kit: SimKit,
) -> None:
    # Eight long requests over two groups of 4 ranks (External: the router spreads them over the 8
    # ranks); at 15 s the pool shrinks to one group: its ranks take nothing new, an idle one goes at
    # once, a busy one when its work is done, and the group (its GPUs) with the last.
    shape = Shape(data=4, nodes=4, load_balancing="External")
    requests = [Request(0.001 * i, 100, 20_000 - 1000 * i) for i in range(8)] + [Request(20.0, 100, 10)]
    policy = ScheduledPolicy(steps=[(15.0, {"colocated": 1})], interval_seconds=15.0)
    cluster = Cluster(requests, colocated(kit, shape, replicas=2), kit.config(), policy)
    result = cluster.run()
    kept, removed = cluster.all_groups
    finished = set(result.records.finished)
    assert all(r.gone_at == 15.0 or r.gone_at in finished for r in removed.ranks)
    assert removed.gone_at == max(r.gone_at for r in removed.ranks) > 100.0
    assert removed.gone_at in finished
    assert result.records.finished[8] < removed.gone_at  # the request at 20 s went to the kept group
    assert cluster.ready["colocated"] == kept.endpoints
    end = result.summary.duration_seconds
    assert result.summary.gpu_hours == pytest.approx(4 * (end + removed.gone_at) / 3600)


# --- the autoscaler's view of groups: the policy and the simulator agree -------------------------------

EXAMPLE = yaml.safe_load((ROOT / "examples/sim-pd-autoscaling.yaml").read_text())


def deployment(decode: dict[str, Any], *, mode: str = "Active", vllm: bool = False) -> PDDeploymentSpec:
    """examples/sim-pd-autoscaling.yaml with 3 prefill replicas (not autoscaled), decode as given
    (autoscaled within [1, 8] replicas) and room for them in maxGPUs."""
    obj = copy.deepcopy(EXAMPLE)
    spec = obj["spec"]
    spec["autoscaling"]["mode"] = mode
    spec["maxGPUs"] = 40
    spec["prefill"]["replicas"] = 3
    del spec["prefill"]["autoscaling"]
    spec["decode"].update(decode)
    spec["decode"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 8}
    if vllm:  # the API refuses Hybrid balancing for sim engines; the simulator models it either way
        del spec["engine"]["type"], spec["engine"]["sim"]
    return PDDeployment.from_object(obj).spec


@dataclass
class Recording:
    """tandem's autoscaler, keeping every pass's Snapshot and Decision."""

    inner: TandemPolicy
    seen: list[tuple[Snapshot, Decision]] = field(default_factory=list)
    interval_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.interval_seconds = self.inner.interval_seconds

    def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
        wanted = self.inner.decide(snapshot, now)
        assert self.inner.last is not None
        self.seen.append((snapshot, self.inner.last))
        return wanted


def steady(rate: float, seconds: float, seed: int = 3) -> list[Request]:
    """Poisson arrivals, prompts 200-1,500 tokens and outputs 300-1,500 (uniform)."""
    rng = random.Random(seed)
    t, requests = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return requests
        requests.append(Request(t, rng.randint(200, 1500), rng.randint(300, 1500)))


def advised(
    spec: PDDeploymentSpec, requests: list[Request]
) -> tuple[Summary, list[tuple[Snapshot, Decision]]]:
    sim = adv.layout_of_spec(spec)
    assert sim.slo is not None
    policy = Recording(TandemPolicy(spec))
    result = simulate(requests, sim.layout, SimConfig(slo=sim.slo), policy)
    return result.summary, policy.seen


GROUPS = [
    # id, decode fields, vLLM engine, scrape targets per group (pods with engine metrics x their ports)
    ("internal", {"replicas": 1, "nodesPerInstance": 4, "parallelism": {"data": 4}}, False, 1),
    (
        "hybrid",
        {"replicas": 1, "nodesPerInstance": 2, "parallelism": {"data": 4, "loadBalancing": "Hybrid"}},
        True,
        2,
    ),
]


@pytest.mark.parametrize(
    ("decode", "vllm", "metrics_targets"), [c[1:] for c in GROUPS], ids=[c[0] for c in GROUPS]
)
def test_the_autoscaler_sizes_a_simulated_group_as_its_ranks(
    decode: dict[str, Any], vllm: bool, metrics_targets: int
) -> None:
    """One decode group of 4 ranks and 4 single decode replicas under the same load (30 req/s, about 3.4
    engines' worth of decode): the same service, and the autoscaler (advisory: sizes kept) asks for a
    quarter as many groups as single replicas at every pass, so it counts in the group the capacity the
    simulator gives it. Before groups were simulated the group was one engine, 3.4x overloaded."""
    requests = steady(30.0, 300.0)
    single, single_seen = advised(deployment({"replicas": 4}, mode="Advisory"), requests)
    group, group_seen = advised(deployment(decode, mode="Advisory", vllm=vllm), requests)
    assert single.attainment == group.attainment == 1.0
    assert group.gpu_hours == pytest.approx(single.gpu_hours, rel=0.002)  # the same 7 GPUs for the run
    assert len(single_seen) == len(group_seen) == 21
    for (one_snap, one), (group_snap, grouped) in itertools.islice(
        zip(single_seen, group_seen, strict=True), 20
    ):
        pool = group_snap.pools["decode"]
        assert (group_snap.sizes["decode"].ready, pool.scraped_targets) == (1, metrics_targets)
        assert pool.running_requests == pytest.approx(one_snap.pools["decode"].running_requests, rel=0.05)
        exact_single = one.pools["decode"].figures["exactReplicas"]  # 2.6 to 3.5 over the run
        exact_group = grouped.pools["decode"].figures["exactReplicas"]
        assert 4 * exact_group == pytest.approx(exact_single, rel=0.05)
        assert grouped.pools["decode"].figures["enginesPerReplica"] == 4


def test_the_autoscaler_grows_a_pool_of_groups_by_whole_groups() -> None:
    """Decode in groups of 2 ranks from 1 group, under load for about 3.4 engines: the autoscaler's
    targets are groups, and the simulator holds 2 GPUs for each group it asks for."""
    spec = deployment({"replicas": 1, "nodesPerInstance": 2, "parallelism": {"data": 2}})
    sim = adv.layout_of_spec(spec)
    assert sim.slo is not None
    policy = TandemPolicy(spec)
    result = simulate(steady(30.0, 300.0), sim.layout, SimConfig(slo=sim.slo), policy)
    targets = [(e.role, e.current, e.target) for e in policy.decisions]
    assert targets[0] == ("decode", 1, 2)
    most = max(t for _, _, t in targets)
    assert result.summary.peak_gpus == 3 + 2 * most
    series = result.series
    assert all(s.gpus == 3 + 2 * s.replicas["decode"] for s in series)
