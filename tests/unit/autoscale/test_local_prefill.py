"""Requests prefilled on their decode pod (spec.router.disaggregation Auto or Threshold) count on decode's
capacity, not prefill's: decode's sizing adds the share of a replica's time its engines spend computing
those prompts (vllm:prompt_tokens_by_source{source="local_compute"}, less the one token a decode engine
recomputes per pulled request), prefill's demand is only what the prefill engines compute; the live
reader's query and the simulator's snapshots carry the figure."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import pytest

from tandem.api.status import AutoscalingPoolsStatus, AutoscalingStatus, PoolAutoscalingStatus
from tandem.autoscale.capacity import busy_prefill_tokens_per_second, pool_model
from tandem.autoscale.decide import decide
from tandem.autoscale.recommend import local_prefill_tokens_rate
from tandem.metrics.queries import build_snapshot, snapshot_queries
from tandem.perf import load_profile
from tandem.routing.disaggregation import DisaggregationKnobs
from tandem.signals import PathSignals, PoolSignals, Snapshot
from tandem.sim import SLO, Layout, PoolSpec, ReplicaSpec, Request, SimConfig, simulate

if TYPE_CHECKING:
    from conftest import Kit

T0 = 1_800_000_000.0
PROMPT = 1000.0

LOCAL_CASES = [
    # id, decode local_compute tokens/s, decode requests/s finished, local requests/s, expected tokens/s
    ("nothing-exported", 0.0, 10.0, 0.0, 0.0),
    ("all-pulled", 10.0, 10.0, 0.0, 0.0),  # one recomputed token per pulled request: no local prefill
    ("some-local", 4010.0, 10.0, 2.0, 4002.0),  # 8 pulled requests' tokens taken out
    ("all-local", 5000.0, 5.0, 5.0, 5000.0),
    ("extrapolation-below-zero", 9.0, 10.0, 0.5, 0.0),
    ("none-counted-local", 500.0, 10.0, 0.0, 0.0),  # Always: first tokens and ends fall in other windows
]


@pytest.mark.parametrize(
    ("computed", "finished", "local", "expected"),
    [c[1:] for c in LOCAL_CASES],
    ids=[c[0] for c in LOCAL_CASES],
)
def test_local_prefill_tokens_rate(computed: float, finished: float, local: float, expected: float) -> None:
    decode = PoolSignals(local_prompt_tokens_rate=computed, request_rate=finished)
    path = PathSignals(local_prefill_rate=local)
    assert local_prefill_tokens_rate(decode, path) == pytest.approx(expected)


def _at(prefill: int, decode: int) -> AutoscalingStatus:
    pools = {
        role: PoolAutoscalingStatus(desired_replicas=n)
        for role, n in (("prefill", prefill), ("decode", decode))
    }
    return AutoscalingStatus(mode="Active", last_evaluated=T0 - 30, pools=AutoscalingPoolsStatus(**pools))


def _with_local(kit: Kit, snapshot: Snapshot, replicas_worth: float, local_requests: float) -> Snapshot:
    """`replicas_worth` decode replicas' busy time of local prefill tokens/s, from `local_requests`/s."""
    model = pool_model(kit.spec, "decode")
    each = busy_prefill_tokens_per_second(model.profile, PROMPT, 0.0, model.limits.max_num_batched_tokens)
    pools = dict(snapshot.pools)
    decode = pools["decode"]
    pulled = max(0.0, decode.request_rate - local_requests)
    pools["decode"] = dataclasses.replace(
        decode, local_prompt_tokens_rate=replicas_worth * each + pulled, mean_prompt_tokens=PROMPT
    )
    paths = dict(snapshot.paths)
    paths["disaggregated"] = dataclasses.replace(
        paths["disaggregated"], local_prefill_rate=local_requests, remote_prefill_rate=pulled
    )
    return dataclasses.replace(snapshot, pools=pools, paths=paths)


SIZING_CASES = [
    # id, decode replicas' worth of output tokens/s, replicas' worth of local prefill, decode recommended
    ("no-local", 2.5, 0.0, 3),
    ("half-a-replica-local", 2.5, 0.5, 3),
    ("a-replica-and-a-half-local", 2.5, 1.5, 4),
    ("local-only", 0.0, 2.2, 3),
]


@pytest.mark.parametrize(
    ("generation", "local", "expected"), [c[1:] for c in SIZING_CASES], ids=[c[0] for c in SIZING_CASES]
)
def test_local_prefills_count_on_decode_not_prefill(
    kit: Kit, generation: float, local: float, expected: int
) -> None:
    base = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (4, 4)}, prefill=1.5, generation=generation)
    snapshot = _with_local(kit, base, local, local_requests=3.0 if local else 0.0)
    decision = decide(kit.spec, snapshot, _at(2, 4), T0)
    decode = decision.pools["decode"]
    assert decode.recommendation == expected
    if local:
        assert decode.figures["localPrefillReplicas"] == pytest.approx(local)
        assert "local prefills" in decode.reason
    else:
        assert "localPrefillReplicas" not in decode.figures
    # prefill's demand is what the prefill engines compute: the same with or without local prefills
    alone = decide(kit.spec, base, _at(2, 4), T0).pools["prefill"]
    assert decision.pools["prefill"].recommendation == alone.recommendation == 2
    assert decision.pools["prefill"].figures == alone.figures


def test_requests_prefilled_on_decode_arrive_at_decode(kit: Kit) -> None:
    """Decode's arriving output tokens count the requests prefill finished and those prefilled locally."""
    base = kit.snapshot(T0, sizes={"prefill": (2, 2), "decode": (4, 4)}, prefill=1.0, arriving=1.0)
    with_local = _with_local(kit, base, 0.1, local_requests=base.pools["prefill"].request_rate)
    plain = decide(kit.spec, base, _at(2, 4), T0).pools["decode"].figures["arrivingTokensPerSecond"]
    more = decide(kit.spec, with_local, _at(2, 4), T0).pools["decode"].figures["arrivingTokensPerSecond"]
    assert more == pytest.approx(2 * plain)


def test_the_live_reader_takes_the_locally_computed_source() -> None:
    queries = snapshot_queries("ns", "llm", 60, 0.95)
    assert queries["local_prompt_tokens_rate"].startswith(
        "sum by (tandem_dev_role, source) (rate(vllm:prompt_tokens_by_source_total {namespace="
    )
    role = "tandem_dev_role"

    def sample(value: float, **labels: str) -> dict[str, Any]:
        return {"metric": labels, "value": [T0, str(value)]}

    answers = {
        "engine_age": [sample(1.0, pod="d-0", **{role: "decode"})],
        "engine_samples": [sample(60, pod="d-0", **{role: "decode"})],
        "local_prompt_tokens_rate": [
            sample(900.0, source="external_kv_transfer", **{role: "decode"}),
            sample(120.0, source="local_compute", **{role: "decode"}),
            sample(40.0, source="local_cache_hit", **{role: "decode"}),
            sample(3000.0, source="local_compute", **{role: "prefill"}),
        ],
    }
    snapshot = build_snapshot(answers, {}, now=T0, window_seconds=60, slo_set=False)
    assert snapshot.pools["decode"].local_prompt_tokens_rate == 120.0
    assert snapshot.pools["prefill"].local_prompt_tokens_rate == 3000.0
    assert snapshot.pools["colocated"].local_prompt_tokens_rate == 0.0


def test_the_simulator_counts_local_prefills_in_its_snapshots() -> None:
    replica = ReplicaSpec.from_profile(load_profile("meta-llama/Llama-3.1-8B-Instruct", "H100", 1))
    layout = Layout(
        pools={
            "prefill": PoolSpec(replica=replica, replicas=1),
            "decode": PoolSpec(replica=replica, replicas=1),
        }
    )
    # one request a second: 200-token prompts (local under Threshold 256), 2,000-token ones (remote)
    requests = [Request(float(i), 200 if i % 2 else 2000, 20) for i in range(120)]
    seen: list[Snapshot] = []

    class Recorder:
        interval_seconds = 30.0

        def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
            seen.append(snapshot)
            return {"prefill": 1, "decode": 1}

    knobs = DisaggregationKnobs(mode="Threshold", threshold_tokens=256)
    simulate(requests, layout, SimConfig(slo=SLO(ttft_ms=1000, tpot_ms=50), disaggregation=knobs), Recorder())
    full = [s for s in seen if s.window_seconds >= 60 and s.observed_at <= 120]
    assert full
    for snap in full:
        decode, path = snap.pools["decode"], snap.paths["disaggregated"]
        assert path.local_prefill_rate == pytest.approx(path.remote_prefill_rate, rel=0.1)
        # half the requests (0.5/s) prefilled locally, 200 tokens each; one token per pulled request
        assert local_prefill_tokens_rate(decode, path) == pytest.approx(100.0, rel=0.1)
        assert decode.local_prompt_tokens_rate == pytest.approx(100.0 + path.remote_prefill_rate, rel=0.1)
        assert not math.isnan(decode.local_prompt_tokens_rate)
