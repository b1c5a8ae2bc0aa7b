"""Automatic prefix caching in the engine processes: vLLM's counters, and P/D pulls past the decode
engine's own cache (the NIXL connector reads only the remote blocks its local prefix cache lacks).

Compressed settings: time scale 0 (steps take no wall time); counts, not times, are checked here
(the TTFT drop is the router e2e's, tests/integration/operator/test_prefix_routing_e2e.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .harness import NAME, Engine, kv_config, start_engine
from .test_pd import prefill_leg

BLOCK = 16  # --block-size default
KV_BYTES_PER_TOKEN = 131072  # Llama-3.1-8B, bf16


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Engine, Engine, Engine, Engine]]:
    started = [
        start_engine(),
        start_engine("--no-enable-prefix-caching"),
        start_engine("--kv-transfer-config", kv_config("kv_producer"), side_channel=True),
        start_engine("--kv-transfer-config", kv_config("kv_consumer"), side_channel=True),
    ]
    yield started[0], started[1], started[2], started[3]
    for engine in started:
        engine.stop()


def sample(engine: Engine, name: str, **labels: str) -> float:
    raw = engine.request("GET", "/metrics")[2].decode()
    for family in text_string_to_metric_families(raw):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"{name}{labels} not exported")


def cache_counters(engine: Engine) -> tuple[float, float]:
    return sample(engine, "vllm:prefix_cache_queries_total"), sample(engine, "vllm:prefix_cache_hits_total")


def words(prefix: str, count: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(count))


def test_counters_count_tokens_looked_up_and_found(engines: tuple[Engine, ...]) -> None:
    colocated = engines[0]
    assert sample(colocated, "vllm:cache_config_info", enable_prefix_caching="True") == 1
    prompt = words("c", 300)  # 300 tokens: 18 full blocks and 12 tokens
    before = cache_counters(colocated)
    assert colocated.post("/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 2})[0] == 200
    once = cache_counters(colocated)
    assert (once[0] - before[0], once[1] - before[1]) == (300, 0)
    assert colocated.post("/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 2})[0] == 200
    twice = cache_counters(colocated)
    assert (twice[0] - once[0], twice[1] - once[1]) == (300, 18 * BLOCK)
    # A longer prompt sharing the first 200 tokens: 12 full blocks of it are cached.
    longer = words("c", 200) + " " + words("x", 100)
    assert colocated.post("/v1/completions", {"model": NAME, "prompt": longer, "max_tokens": 2})[0] == 200
    third = cache_counters(colocated)
    assert (third[0] - twice[0], third[1] - twice[1]) == (300, 12 * BLOCK)
    assert sample(colocated, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 30 * BLOCK


def test_caching_off_counts_nothing(engines: tuple[Engine, ...]) -> None:
    plain = engines[1]
    assert sample(plain, "vllm:cache_config_info", enable_prefix_caching="False") == 1
    prompt = words("p", 100)
    for _ in range(2):
        assert plain.post("/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 2})[0] == 200
    assert cache_counters(plain) == (0, 0)
    assert sample(plain, "vllm:prompt_tokens_by_source_total", source="local_compute") == 200


def test_decode_pulls_only_the_blocks_it_does_not_hold(engines: tuple[Engine, ...]) -> None:
    _, _, prefill, decode = engines

    def pd(prompt: str, request_id: str) -> tuple[float, float]:
        """(KV bytes pulled, tokens found in D's cache) by one P/D request."""
        body = {"model": NAME, "prompt": prompt, "max_tokens": 2}
        size = sample(decode, "vllm:nixl_bytes_transferred_sum")
        hits = sample(decode, "vllm:prefix_cache_hits_total")
        params = prefill_leg(prefill, body, request_id)
        status, reply = decode.post("/v1/completions", {**body, "kv_transfer_params": params})
        assert status == 200, reply
        return (
            sample(decode, "vllm:nixl_bytes_transferred_sum") - size,
            sample(decode, "vllm:prefix_cache_hits_total") - hits,
        )

    turn1 = words("t", 400)  # 25 full blocks
    moved, hits = pd(turn1, "turn-1")
    assert (moved, hits) == (400 * KV_BYTES_PER_TOKEN, 0)
    # The next turn resends turn 1 and adds 100 tokens: D holds turn 1's 25 full blocks (the ones it
    # pulled, and the last one once it had recomputed the last prompt token), so only the rest moves.
    turn2 = turn1 + " " + words("u", 100)
    p_hits = sample(prefill, "vllm:prefix_cache_hits_total")
    moved, hits = pd(turn2, "turn-2")
    assert hits == 25 * BLOCK
    assert moved == (500 - 25 * BLOCK) * KV_BYTES_PER_TOKEN
    assert sample(prefill, "vllm:prefix_cache_hits_total") - p_hits == 25 * BLOCK  # P skipped them too
    # The same prompt again, whose last token ends a block: D already holds all but that block.
    moved, hits = pd(turn2, "turn-2-again")
    assert hits == (500 - 1) // BLOCK * BLOCK
    assert moved == (500 - hits) * KV_BYTES_PER_TOKEN
    assert prefill.get("/debug/kv")[1]["held"] == []  # every held KV was read or released


def test_the_transfer_time_shrinks_with_the_bytes() -> None:
    """Time scale 1 on a 4 Gb/s link: a 600-token pull takes ~157 ms of modelled (and paced) time;
    the next turn, 40 tokens longer, pulls 48 tokens' KV (D holds 37 blocks of it): 8 % of the bytes;
    the read, paced to the link, takes under a fifth of the time (a loopback read's fixed cost stays)."""
    env = {"TANDEM_SIM_TIME_SCALE": "1", "TANDEM_SIM_KV_BANDWIDTH_GBPS": "4"}
    prefill = start_engine("--kv-transfer-config", kv_config("kv_producer"), env=env, side_channel=True)
    decode = start_engine("--kv-transfer-config", kv_config("kv_consumer"), env=env, side_channel=True)
    try:

        def pull_seconds(prompt: str, request_id: str) -> float:
            body = {"model": NAME, "prompt": prompt, "max_tokens": 2}
            before = sample(decode, "vllm:nixl_xfer_time_seconds_sum")
            params = prefill_leg(prefill, body, request_id)
            assert decode.post("/v1/completions", {**body, "kv_transfer_params": params})[0] == 200
            return sample(decode, "vllm:nixl_xfer_time_seconds_sum") - before

        turn1 = words("s", 600)
        first = pull_seconds(turn1, "slow-1")
        second = pull_seconds(turn1 + " " + words("v", 40), "slow-2")
        print(f"pull of turn 1: {first * 1000:.0f} ms, of turn 2: {second * 1000:.0f} ms")
        assert first >= 0.15
        assert second < first / 5
    finally:
        prefill.stop()
        decode.stop()
