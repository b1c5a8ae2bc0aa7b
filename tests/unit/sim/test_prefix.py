"""Prefix caching in the simulator: the traces' prefix blocks (Mooncake, multi-turn sessions), the
replica's cache (hits skip compute, decode pulls only what it lacks, LRU eviction tail first,
vLLM's counters) and the routing policies. Hand-computed cases use the 8B H100 TP1 profile (ms):
prefill step `max(6.5, 1.0 + 0.0218 n) + 6.6e-7 ((o+n)^2 - o^2)`, KV 131,072 bytes/token at 400 Gb/s."""

from __future__ import annotations

import itertools
import random
from typing import TYPE_CHECKING

import pytest

from tandem.routing.prefix import PrefixKnobs
from tandem.sim import Request, SimConfig, StaticPolicy, simulate
from tandem.sim.layout import SLO, Layout, PoolSpec
from tandem.sim.traces.prefix import (
    ENGINE_BLOCK_TOKENS,
    RUN_BLOCKS,
    SessionParams,
    engine_block_keys,
    mooncake_prefix,
    mooncake_tokens,
    route_keys,
    session_turns,
    sessions,
    shared_blocks,
    token_block_keys,
    with_mooncake_prefix,
)

if TYPE_CHECKING:
    from conftest import SimKit

MS = 1e-3


def _leading_equal(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# --- traces -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "len_a", "b", "len_b", "shared"),
    [
        ([0, 1, 2], 1536, [0, 1, 2], 1536, 96),  # the same three full Mooncake blocks
        ([0, 1, 2], 1536, [0, 1, 3], 1536, 64),  # the third block differs: two blocks of 32
        ([0, 1, 2], 1300, [0, 1, 2], 1536, 81),  # a partial last block: 1300 // 16 = 81 full blocks
        ([0, 1], 1000, [0, 1, 2], 1536, 62),  # a prompt inside another: its own 62 full blocks
        ([5, 1], 1024, [0, 1], 1024, 0),  # different first block: nothing, though the second id is equal
        ([0], 15, [0], 15, 0),  # no full block at all
    ],
)
def test_mooncake_runs_share_what_the_expanded_tokens_share(
    a: list[int], len_a: int, b: list[int], len_b: int, shared: int
) -> None:
    """Each hash expands into deterministic tokens; vLLM's chained keys over their 16-token blocks share
    exactly as many leading blocks as the runs say (32 engine blocks per Mooncake block)."""
    tokens_a, tokens_b = mooncake_tokens(a, len_a), mooncake_tokens(b, len_b)
    assert len(tokens_a) == len_a
    by_tokens = _leading_equal(token_block_keys(tokens_a), token_block_keys(tokens_b))
    runs_a, runs_b = mooncake_prefix(a, len_a), mooncake_prefix(b, len_b)
    assert by_tokens == shared
    assert shared_blocks(runs_a, runs_b) == shared
    assert _leading_equal(engine_block_keys(runs_a), engine_block_keys(runs_b)) == shared
    assert sum(n for _, n in runs_a) == len_a // ENGINE_BLOCK_TOKENS


def test_mooncake_runs_on_random_prefixes() -> None:
    rng = random.Random(7)
    for _ in range(40):
        common = [rng.randrange(4) for _ in range(rng.randrange(0, 3))]
        a = common + [rng.randrange(4) for _ in range(rng.randrange(1, 3))]
        b = common + [rng.randrange(4) for _ in range(rng.randrange(1, 3))]
        len_a = rng.randint(512 * (len(a) - 1) + 1, 512 * len(a))
        len_b = rng.randint(512 * (len(b) - 1) + 1, 512 * len(b))
        by_tokens = _leading_equal(
            token_block_keys(mooncake_tokens(a, len_a)), token_block_keys(mooncake_tokens(b, len_b))
        )
        assert shared_blocks(mooncake_prefix(a, len_a), mooncake_prefix(b, len_b)) == by_tokens


def test_the_trace_reader_keeps_hashes_and_prefix_is_filled_deterministically() -> None:
    requests = [Request(0.0, 1300, 5, None, (0, 1, 2)), Request(1.0, 100, 5)]
    first, second = with_mooncake_prefix(requests), with_mooncake_prefix(requests)
    assert first == second
    assert first[0].prefix is not None
    assert [n for _, n in first[0].prefix] == [32, 32, 17]
    assert first[1].prefix is None


def test_route_keys_one_per_block_tokens_and_equal_exactly_over_the_shared_prefix() -> None:
    a, b = mooncake_prefix([0, 1, 2], 1536), mooncake_prefix([0, 1, 3], 1400)
    assert len(route_keys(a, 16, 1000)) == 96
    assert len(route_keys(a, 16, 10)) == 10
    assert len(route_keys(a, 512, 1000)) == 3
    assert len(route_keys(b, 512, 1000)) == 2  # 1400 tokens: two full 512-token keys
    assert len(route_keys(b, 64, 1000)) == 1400 // 64
    assert _leading_equal(route_keys(a, 16, 1000), route_keys(b, 16, 1000)) == 64
    assert _leading_equal(route_keys(a, 256, 1000), route_keys(b, 256, 1000)) == 4
    assert all(0 <= k < 2**64 for k in route_keys(a, 16, 1000))
    assert route_keys(None, 16, 10) == []


BASE = [Request(10.0 * i, 100 + i, 20 + i) for i in range(12)]


def test_sessions_resend_the_conversation_so_far() -> None:
    params = SessionParams(turns=3, think_seconds=0.0, system_prompt_tokens=1000, system_prompts=2, seed=1)
    out = sessions(BASE, params)
    assert len(out) == 12
    first = [r for r in out if r.arrival == 0.0]
    assert [r.prompt_tokens for r in first] == [1100, 1100 + 20 + 101, 1100 + 20 + 101 + 21 + 102]
    assert [r.output_tokens for r in first] == [20, 21, 22]
    # each turn's blocks are the previous turn's and more
    for earlier, later in itertools.pairwise(first):
        assert shared_blocks(earlier.prefix, later.prefix) == earlier.prompt_tokens // 16
    # sessions on the same system prompt share its 62 full blocks, and only those
    by_system: dict[str | None, list[Request]] = {}
    for r in out:
        by_system.setdefault(r.tenant, []).append(r)
    for group in by_system.values():
        starts = {r.arrival: r for r in group if r.arrival % 30 == 0}
        firsts = list(starts.values())
        for x, y in itertools.pairwise(firsts):
            assert shared_blocks(x.prefix, y.prefix) == 1000 // 16
    tenants = list(by_system)
    a, b = by_system[tenants[0]][0], by_system[tenants[-1]][0]
    if len(tenants) > 1:
        assert shared_blocks(a.prefix, b.prefix) == 0


@pytest.mark.parametrize("think", [0.0, 5.0])
def test_session_turns_number_each_sessions_turns(think: float) -> None:
    params = SessionParams(turns=3, think_seconds=think, system_prompt_tokens=1000, system_prompts=2, seed=1)
    numbered = session_turns(BASE, params)
    assert [r for r, _, _ in numbered] == sessions(BASE, params)
    by_session: dict[int, list[tuple[int, Request]]] = {}
    for request, session, turn in numbered:
        by_session.setdefault(session, []).append((turn, request))
    assert len(by_session) == 4
    for turns in by_session.values():
        assert [turn for turn, _ in turns] == [0, 1, 2]  # in arrival order
        for (_, earlier), (_, later) in itertools.pairwise(turns):
            assert later.arrival >= earlier.arrival
            assert shared_blocks(earlier.prefix, later.prefix) == earlier.prompt_tokens // 16


def test_sessions_think_time_hot_share_limit_and_seed() -> None:
    base = [Request(float(i), 500, 50) for i in range(4000)]
    params = SessionParams(turns=4, think_seconds=30.0, system_prompts=10, hot_share=0.5, seed=3)
    out = sessions(base, params)
    assert out == sessions(base, params)
    assert out != sessions(base, SessionParams(turns=4, think_seconds=30.0, system_prompts=10, seed=4))
    hot = sum(1 for r in out if r.tenant == "system-0") / len(out)
    assert hot == pytest.approx(0.5, abs=0.05)
    starts = sorted({r.arrival for r in out if r.prompt_tokens == 2500})
    assert len(starts) == 1000
    gaps = [r.arrival for r in out if r.prompt_tokens == 2000 + 500 + 550]  # second turns
    mean_gap = sum(gaps) / len(gaps) - sum(starts) / len(starts)
    assert mean_gap == pytest.approx(30.0, rel=0.1)
    limited = sessions(base, SessionParams(turns=4, max_prompt_tokens=3700))
    assert max(r.prompt_tokens + r.output_tokens for r in limited) <= 3700
    assert len(limited) == 3000  # the third turn (2000 + 1100 + 500 = 3600 + 50) does not fit


def test_runs_never_exceed_32_blocks() -> None:
    out = sessions(BASE, SessionParams(turns=4, system_prompt_tokens=1000))
    assert all(0 < n <= RUN_BLOCKS for r in out for _, n in (r.prefix or ()))


# --- the replica's cache --------------------------------------------------------------------------------
PROMPT = mooncake_prefix([1, 2], 1000)  # 62 full blocks
OTHER = mooncake_prefix([3, 4], 1000)
LONG = mooncake_prefix([5, 6, 7], 1500)


def _req(t: float, runs: tuple[tuple[int, int], ...], prompt: int = 1000, out: int = 1) -> Request:
    return Request(t, prompt, out, None, None, runs)


def test_a_cached_prefix_skips_its_prefill(kit: SimKit) -> None:
    result = simulate([_req(0.0, PROMPT), _req(1.0, PROMPT)], kit.colocated(), kit.config())
    assert result.records[0].ttft == pytest.approx(23.46 * MS, abs=1e-12)
    # 992 tokens cached (all full blocks but the one holding the last token): 8 tokens at offset 992
    second = 6.5 + 6.6e-7 * (1000**2 - 992**2)
    assert result.records[1].ttft == pytest.approx(second * MS, abs=1e-12)
    s = result.summary
    assert s.prefix_queries == {"colocated": 2000}
    assert s.prefix_hits == {"colocated": 992}
    assert s.busy_gpu_hours["colocated"] == pytest.approx((23.46 + second) * MS / 3600, rel=1e-9)


def test_prefix_caching_off_or_no_prefix_computes_everything(kit: SimKit) -> None:
    off = kit.spec().model_copy(update={"enable_prefix_caching": False})
    for layout, requests in (
        (kit.colocated(off), [_req(0.0, PROMPT), _req(1.0, PROMPT)]),
        (kit.colocated(), [Request(0.0, 1000, 1), Request(1.0, 1000, 1)]),
    ):
        result = simulate(requests, layout, kit.config())
        assert result.records[1].ttft == pytest.approx(23.46 * MS, abs=1e-12)
        assert result.summary.prefix_hits.get("colocated", 0) == 0


def test_decode_pulls_only_what_it_has_not_cached(kit: SimKit) -> None:
    result = simulate([_req(0.0, PROMPT, out=3), _req(1.0, PROMPT, out=3)], kit.pd(), kit.config())
    prefill = 6.5 + 6.6e-7 * (1000**2 - 992**2)
    transfer = 8 * 131_072 * 8 / 400e9 / MS  # 8 tokens of 1000: the decode pod holds the other 992
    first_step = 6.5 + 6.6e-7 * (1000**2 - 999**2)
    assert result.records[1].ttft == pytest.approx((prefill + transfer + first_step) * MS, abs=1e-12)
    assert result.summary.prefix_hits == {"prefill": 992, "decode": 992}
    assert result.summary.prefix_queries == {"prefill": 2000, "decode": 2000}


def test_eviction_least_recently_released_first_tail_first(kit: SimKit) -> None:
    """2000 tokens of KV. A, then B (other blocks), then A again (hit, now the most recent); D needs 1500
    tokens: B's blocks go whole, then A's tail run (30 blocks) and one block of its head run (31 of 32
    left); A once more hits 31 blocks, B none."""
    spec = kit.spec(cap=2000, seqs=4, batched=8192)
    requests = [
        _req(0.0, PROMPT),
        _req(1.0, OTHER),
        _req(2.0, PROMPT),
        _req(3.0, LONG, prompt=1500),
        _req(4.0, PROMPT),
        _req(5.0, OTHER),
    ]
    result = simulate(requests, kit.colocated(spec), kit.config())
    assert result.summary.prefix_hits == {"colocated": 992 + 31 * 16}
    fifth = 1.0 + 0.0218 * 504 + 6.6e-7 * (1000**2 - 496**2)
    assert result.records[4].ttft == pytest.approx(fifth * MS, abs=1e-12)
    assert result.records[5].ttft == pytest.approx(23.46 * MS, abs=1e-12)
    assert result.summary.preemptions == 0


def test_cached_blocks_are_free_kv_for_admission(kit: SimKit) -> None:
    """A cache full of unreferenced blocks does not keep a new prompt out: they are evicted for it, tail
    first. 1200 tokens of KV: B takes 1000, so A keeps 200 tokens' worth, its first 12 blocks."""
    spec = kit.spec(cap=1200, seqs=4, batched=8192)
    result = simulate(
        [_req(0.0, PROMPT), _req(1.0, OTHER), _req(2.0, PROMPT)], kit.colocated(spec), kit.config()
    )
    assert result.records[1].ttft == pytest.approx(23.46 * MS, abs=1e-12)
    assert result.summary.prefix_hits == {"colocated": 12 * 16}


# --- routing ----------------------------------------------------------------------------------------------
def _two_pods(kit: SimKit, routing: str) -> tuple[Layout, SimConfig]:
    spec = kit.spec()
    layout = Layout(pools={"colocated": PoolSpec(replica=spec, replicas=2)})
    config = SimConfig(slo=SLO(ttft_ms=1000, tpot_ms=50), routing=routing)
    return layout, config


@pytest.mark.parametrize(
    ("routing", "hits"),
    [
        ("oracle", 992),  # the pod holding the prefix
        ("prefix", 992),  # the index learnt where the first went
        ("oracle-bounded", 992),  # the balancer, with the true caches for its index
        ("round-robin", 0),  # the other pod
    ],
)
def test_a_repeated_prompt_and_the_routing_policies(kit: SimKit, routing: str, hits: int) -> None:
    layout, config = _two_pods(kit, routing)
    result = simulate([_req(0.0, PROMPT), _req(1.0, PROMPT)], layout, config)
    assert result.summary.prefix_hits == {"colocated": hits}


def test_prefix_routing_spreads_a_hot_prefix_under_load(kit: SimKit) -> None:
    """One request warms pod X with a 512-token prefix; then eight arrive at once sharing it (each with
    its own 488 tokens to compute, two prompts per 1024-token step). The oracle sends all eight to X (four
    steps); bounded load sends some to the other pod (two steps each), so TTFT p90 is lower."""
    spec = kit.spec(batched=1024)
    layout = Layout(pools={"colocated": PoolSpec(replica=spec, replicas=2)})
    requests = [_req(0.0, mooncake_prefix([1, 99], 1000))]
    requests += [_req(1.0, mooncake_prefix([1, 100 + i], 1000), out=20) for i in range(8)]
    by = {}
    for routing in ("prefix", "oracle"):
        config = SimConfig(slo=SLO(ttft_ms=1000, tpot_ms=50), routing=routing)
        by[routing] = simulate(requests, layout, config).summary
    assert by["oracle"].prefix_hits == {"colocated": 8 * 512}
    assert by["prefix"].prefix_hits["colocated"] < 8 * 512  # the second pod had to compute it once
    assert by["prefix"].ttft_p90 < by["oracle"].ttft_p90


def test_least_loaded_and_round_robin_spread_evenly(kit: SimKit) -> None:
    for routing in ("least-loaded", "round-robin"):
        layout, config = _two_pods(kit, routing)
        requests = [Request(0.0, 1000, 20) for _ in range(4)]
        result = simulate(requests, layout, config)
        # two prompts per pod, the second after the first (it arrives while the first's step runs): two
        # first TTFTs and two second ones (a 3 + 1 split would give a third)
        ttfts = sorted(result.records[i].ttft or 0.0 for i in range(4))
        assert ttfts[0] == pytest.approx(ttfts[1], abs=1e-12)
        assert ttfts[2] == pytest.approx(ttfts[3], abs=1e-12)
        assert ttfts[2] > ttfts[1]


def test_prefix_knobs_are_passed_through(kit: SimKit) -> None:
    config = SimConfig(
        slo=SLO(ttft_ms=1000, tpot_ms=50), routing="prefix", prefix_knobs=PrefixKnobs(max_blocks=8)
    )
    assert config.prefix_knobs.max_blocks == 8


def test_the_policy_sees_the_prefix_cache_counters(kit: SimKit) -> None:
    """The simulator's Snapshot carries the replicas' prefix-cache rates, as the live reader's."""
    policy = StaticPolicy(interval_seconds=15.0, keep_snapshots=True)
    requests = [_req(float(t), PROMPT) for t in range(60)]
    simulate(requests, kit.colocated(), kit.config(), policy)
    pool = policy.seen[-1].pools["colocated"]
    assert pool.prefix_cache_queries_rate == pytest.approx(1000.0, rel=0.05)  # one 1000-token prompt/s
    assert pool.prefix_cache_hits_rate == pytest.approx(992.0, rel=0.05)
    assert pool.uncached_fraction == 0.05  # 0.8% computed: the floor
