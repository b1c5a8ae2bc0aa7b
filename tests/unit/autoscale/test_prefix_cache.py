"""The autoscaler counts what costs compute: prefill capacity from the prompt tokens the engines do not
find in their prefix caches (vLLM's prefix_cache_queries / _hits), live and in the simulator."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import pytest

from tandem.api.status import AutoscalingPoolsStatus, AutoscalingStatus, PoolAutoscalingStatus
from tandem.autoscale.capacity import busy_prefill_tokens_per_second, pool_model, prefill_capacity
from tandem.autoscale.decide import decide
from tandem.autoscale.knobs import KNOBS
from tandem.metrics.queries import build_snapshot, snapshot_queries
from tandem.perf import load_profile
from tandem.signals import MIN_UNCACHED_FRACTION, PoolSignals, Snapshot

if TYPE_CHECKING:
    from conftest import Kit

T0 = 1_800_000_000.0

UNCACHED_CASES = [
    # id, queries/s, hits/s, uncached fraction
    ("no-counters", 0.0, 0.0, 1.0),
    ("no-hits", 1000.0, 0.0, 1.0),
    ("a-quarter-hit", 1000.0, 250.0, 0.75),
    ("most-hit", 1000.0, 900.0, 0.1),
    ("all-hit-floored", 1000.0, 1000.0, MIN_UNCACHED_FRACTION),
    ("hits-over-queries-floored", 1000.0, 1200.0, MIN_UNCACHED_FRACTION),  # rate() extrapolation
    ("negative-hits", 1000.0, -5.0, 1.0),
    ("nan-queries", math.nan, 10.0, 1.0),
]


@pytest.mark.parametrize(
    ("queries", "hits", "expected"), [c[1:] for c in UNCACHED_CASES], ids=[c[0] for c in UNCACHED_CASES]
)
def test_uncached_fraction(queries: float, hits: float, expected: float) -> None:
    signals = PoolSignals(prefix_cache_queries_rate=queries, prefix_cache_hits_rate=hits)
    assert signals.uncached_fraction == pytest.approx(expected)


def _simple_profile() -> Any:
    """Linear 0.1 ms per token (no floor or intercept), attention 1e-5 ms per token^2."""
    base = load_profile("meta-llama/Llama-3.1-8B-Instruct", "H100", 1)
    prefill = base.prefill.model_copy(
        update={"floor_ms": 0.0, "intercept_ms": 0.0, "per_token_ms": 0.1, "per_token_sq_ms": 1e-5}
    )
    return base.model_copy(update={"prefill": prefill})


BUSY_CASES = [
    # id, E[n], E[n^2], u, tokens/s = E[n] / (u E[n] x 1e-4 s + u (2 - u) 1e-8 s x E[n^2])
    ("nothing-cached", 1000.0, 1e6, 1.0, 1000 / 0.11),
    # half cached: 0.05 s linear + 0.0075 s attention (the new half attends to the cached half)
    ("half-cached", 1000.0, 1e6, 0.5, 1000 / 0.0575),
    ("nine-tenths-cached", 1000.0, 1e6, 0.1, 1000 / (0.01 + 0.0019)),
    ("half-cached-spread", 1000.0, 2.72e6, 0.5, 1000 / (0.05 + 0.75 * 0.0272)),
]


@pytest.mark.parametrize(
    ("mean", "moment", "uncached", "expected"), [c[1:] for c in BUSY_CASES], ids=[c[0] for c in BUSY_CASES]
)
def test_busy_prefill_counts_only_uncached_compute(
    mean: float, moment: float, uncached: float, expected: float
) -> None:
    profile = _simple_profile()
    assert busy_prefill_tokens_per_second(profile, mean, moment, 8192, uncached) == pytest.approx(expected)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, math.nan])
def test_busy_prefill_refuses_a_fraction_outside_0_1(bad: float) -> None:
    with pytest.raises(ValueError, match="uncached_fraction"):
        busy_prefill_tokens_per_second(_simple_profile(), 1000.0, 1e6, 8192, bad)


def test_prefill_capacity_unchanged_without_hits_and_higher_with_them(kit: Kit) -> None:
    model = pool_model(kit.spec, "prefill")
    slo = kit.spec.slo
    assert slo is not None
    plain = prefill_capacity(model, slo, 1000, KNOBS, transfer_gbps=400)
    same = prefill_capacity(model, slo, 1000, KNOBS, transfer_gbps=400, uncached_fraction=1.0)
    half = prefill_capacity(model, slo, 1000, KNOBS, transfer_gbps=400, uncached_fraction=0.5)
    assert same == plain
    assert half.raw_tokens_per_second > 1.8 * plain.raw_tokens_per_second
    assert half.utilisation >= plain.utilisation  # a shorter service leaves more room in the TTFT
    assert half.service_seconds == pytest.approx(1000 / half.raw_tokens_per_second)


def _with_prefix(snapshot: Snapshot, hit_share: float) -> Snapshot:
    pools = dict(snapshot.pools)
    prefill = pools["prefill"]
    queries = prefill.prompt_tokens_rate
    pools["prefill"] = dataclasses.replace(
        prefill, prefix_cache_queries_rate=queries, prefix_cache_hits_rate=queries * hit_share
    )
    return dataclasses.replace(snapshot, pools=pools)


SIZING_CASES = [
    # id, share of prompt tokens found cached
    ("no-hits", 0.0),
    ("a-third", 1 / 3),
    ("half", 0.5),
    ("nine-tenths", 0.9),
]


@pytest.mark.parametrize("hit_share", [c[1] for c in SIZING_CASES], ids=[c[0] for c in SIZING_CASES])
def test_a_cache_friendly_load_needs_fewer_prefill_replicas(kit: Kit, hit_share: float) -> None:
    """7.5 replicas' worth of prompt tokens (at the TTFT target, nothing cached): the same tokens with a
    share found cached need as many replicas as their compute takes at the capacity for that share."""
    snapshot = kit.snapshot(T0, sizes={"prefill": (8, 8), "decode": (2, 2)}, prefill=7.5)
    decision = decide(kit.spec, _with_prefix(snapshot, hit_share), _at(8), T0)
    pool = decision.pools["prefill"]
    slo = kit.spec.slo
    assert slo is not None
    uncached = max(MIN_UNCACHED_FRACTION, 1.0 - hit_share)
    capacity = prefill_capacity(
        pool_model(kit.spec, "prefill"), slo, 1000, KNOBS, transfer_gbps=400, uncached_fraction=uncached
    ).at_target
    assert pool.figures["capacityTokensPerSecond"] == pytest.approx(capacity)
    assert pool.recommendation == math.ceil(7.5 * kit.prompt_capacity / capacity - 1e-9)
    if hit_share:
        assert pool.figures["uncachedPromptFraction"] == pytest.approx(uncached)
        assert pool.recommendation < 8
    else:
        assert "uncachedPromptFraction" not in pool.figures
        assert pool.recommendation == 8


def _at(prefill: int) -> AutoscalingStatus:
    pools = {
        role: PoolAutoscalingStatus(desired_replicas=n) for role, n in (("prefill", prefill), ("decode", 2))
    }
    return AutoscalingStatus(mode="Active", last_evaluated=T0 - 30, pools=AutoscalingPoolsStatus(**pools))


def test_the_live_reader_reads_the_engines_counters() -> None:
    queries = snapshot_queries("ns", "llm", 60, 0.95)
    assert queries["prefix_cache_queries_rate"].startswith(
        "sum by (tandem_dev_role) (rate(vllm:prefix_cache_queries_total {namespace="
    )
    assert queries["prefix_cache_hits_rate"].endswith("[60s]))")
    role = "tandem_dev_role"

    def sample(value: float, **labels: str) -> dict[str, Any]:
        return {"metric": labels, "value": [T0, str(value)]}

    answers = {
        "engine_age": [sample(1.0, pod="p-0", **{role: "prefill"})],
        "engine_samples": [sample(60, pod="p-0", **{role: "prefill"})],
        "prefix_cache_queries_rate": [sample(8000, **{role: "prefill"})],
        "prefix_cache_hits_rate": [sample(6000, **{role: "prefill"})],
    }
    snapshot = build_snapshot(answers, {}, now=T0, window_seconds=60, slo_set=False)
    prefill = snapshot.pools["prefill"]
    assert (prefill.prefix_cache_queries_rate, prefill.prefix_cache_hits_rate) == (8000.0, 6000.0)
    assert prefill.uncached_fraction == pytest.approx(0.25)
    assert snapshot.pools["decode"].uncached_fraction == 1.0  # no series: everything computed
