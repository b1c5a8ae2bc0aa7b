"""KV-cache capacity by hand, and the replica helpers the autoscaler sizes pools with (`perf/capacity.py`)."""

from __future__ import annotations

import math

import pytest

from tandem.perf import (
    ACTIVATION_RESERVE_BYTES,
    Profile,
    decode_batch_at_tpot,
    kv_cache_capacity,
    kv_cache_tokens,
    load_profile,
    model_arch,
    prefill_tokens_per_second,
)

GIB = 1 << 30
KIB = 1 << 10
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"


def test_llama_8b_bf16_is_128_kib_per_token_so_8k_tokens_is_one_gib() -> None:
    capacity = kv_cache_capacity(LLAMA_8B, tp=1, gpu_memory_gib=80)
    assert capacity.bytes_per_token_per_gpu == 2 * 32 * 8 * 128 * 2 == 128 * KIB
    assert 8192 * capacity.bytes_per_token_per_gpu == GIB


def test_h100_tp1_capacity_of_llama_8b_by_hand() -> None:
    # 80 GiB x 0.9 = 72 GiB; weights 8.03e9 x 2 B = 16.06e9 B = 14.957 GiB; reserve 2 GiB:
    # 72 - 14.957 - 2 = 55.043 GiB of KV at 128 KiB/token = 59,101,927,680 B / 131,072 = 450,911.9 tokens.
    available = 72 * GIB - 16.06e9 - 2 * GIB
    assert available / GIB == pytest.approx(55.043, abs=0.001)
    by_hand = math.floor(available / (128 * KIB))
    assert by_hand == 450_911
    assert kv_cache_tokens(LLAMA_8B, tp=1, gpu_memory_gib=80, gpu_memory_utilization=0.9) == by_hand
    assert kv_cache_tokens(load_profile(LLAMA_8B, "H100", 1)) == by_hand  # the profile supplies TP and memory
    assert kv_cache_capacity(LLAMA_8B, tp=1, gpu_memory_gib=80).blocks(16) == by_hand // 16


def test_70b_tp4_capacity_by_hand() -> None:
    # weights 70.6e9 x 2 / 4 = 35.3e9 B = 32.876 GiB per GPU; 72 - 32.876 - 2 = 37.124 GiB per GPU;
    # each rank holds 2 of 8 KV heads: 80 KiB/token, so 39,861,927,680 B / 81,920 = 486,595.8 tokens.
    available = 72 * GIB - 35.3e9 - ACTIVATION_RESERVE_BYTES
    assert kv_cache_tokens(LLAMA_70B, tp=4, gpu_memory_gib=80) == math.floor(available / (80 * KIB))
    assert kv_cache_tokens(LLAMA_70B, tp=4, gpu_memory_gib=80) == 486_595


@pytest.mark.parametrize(
    ("model", "tp"),
    [(LLAMA_8B, 1), (LLAMA_70B, 4), (LLAMA_70B, 8), ("Qwen/Qwen2.5-32B-Instruct", 2)],
)
def test_fp8_halves_bytes_per_token_and_doubles_capacity(model: str, tp: int) -> None:
    bf16 = kv_cache_capacity(model, tp=tp, gpu_memory_gib=80)
    fp8 = kv_cache_capacity(model, tp=tp, gpu_memory_gib=80, kv_cache_dtype="fp8")
    assert fp8.bytes_per_token_per_gpu * 2 == bf16.bytes_per_token_per_gpu
    assert fp8.available_bytes_per_gpu == bf16.available_bytes_per_gpu
    assert fp8.tokens in (2 * bf16.tokens, 2 * bf16.tokens + 1)  # floor of twice the quotient


def test_deepseek_fp8_ds_mla_uses_vllms_656_byte_layout() -> None:
    # reference section 6: 61 layers x 656 B = 40,016 B/token (vLLM PR #48439), vs 70,272 B in bf16.
    arch = model_arch(DEEPSEEK)
    assert arch.kv_bytes_per_token_as("fp8_ds_mla") == 40_016
    assert arch.kv_bytes_per_token_per_gpu(8, "fp8_ds_mla") == 40_016  # MLA is replicated on every rank
    assert arch.kv_bytes_per_token_as("auto") == 70_272


def test_a_replica_that_would_not_start_holds_nothing() -> None:
    assert kv_cache_tokens(LLAMA_70B, tp=1, gpu_memory_gib=80) == 0  # 141 GB of weights
    assert kv_cache_capacity(LLAMA_70B, tp=1, gpu_memory_gib=80).available_bytes_per_gpu < 0
    assert kv_cache_tokens(LLAMA_8B, tp=1, gpu_memory_gib=80, max_model_len=131_072) > 0
    assert kv_cache_tokens(LLAMA_8B, tp=1, gpu_memory_gib=24, max_model_len=131_072) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": LLAMA_8B}, "required"),
        ({"model": LLAMA_8B, "tp": 0, "gpu_memory_gib": 80}, "tp"),
        ({"model": LLAMA_8B, "tp": 1, "gpu_memory_gib": 80, "gpu_memory_utilization": 1.5}, "utilization"),
        ({"model": LLAMA_8B, "tp": 1, "gpu_memory_gib": 80, "kv_cache_dtype": "int3"}, "kv_cache_dtype"),
    ],
)
def test_capacity_refuses_nonsense(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kv_cache_capacity(**kwargs)  # type: ignore[arg-type]


def _flat(
    base_ms: float, per_context_token_ms: float = 0.0, knee: int = 0, per_seq_ms: float = 0.0
) -> Profile:
    return Profile.model_validate(
        {
            "model": LLAMA_8B,
            "gpu": "H100",
            "tensor_parallel_size": 1,
            "gpu_memory_gib": 80,
            "prefill": {"floor_ms": 10, "intercept_ms": 2, "per_token_ms": 0.01, "per_token_sq_ms": 1e-6},
            "decode": {
                "base_ms": base_ms,
                "knee_batch": knee,
                "per_seq_beyond_knee_ms": per_seq_ms,
                "per_context_token_ms": per_context_token_ms,
            },
        }
    )


@pytest.mark.parametrize(
    ("profile", "tpot_ms", "context", "expected"),
    [
        # step = 5 + 0.001 x B x 1000 = 5 + B ms: B <= tpot - 5
        (_flat(5, 0.001), 20, 1000, 15),
        (_flat(5, 0.001), 20.5, 1000, 15),
        (_flat(5, 0.001), 5.999, 1000, 0),  # even one sequence misses
        (_flat(5, 0.001), 6, 1000, 1),
        # knee: step = 5 + 0.5 x max(0, B - 10) ms, no context: B <= 10 + (tpot - 5) / 0.5
        (_flat(5, 0, knee=10, per_seq_ms=0.5), 10, 0, 20),
        (_flat(5, 0, knee=10, per_seq_ms=0.5), 4, 0, 0),
        # nothing grows with B: capped at max_batch
        (_flat(5), 10, 4096, 1024),
    ],
)
def test_decode_batch_at_tpot(profile: Profile, tpot_ms: float, context: float, expected: int) -> None:
    batch = decode_batch_at_tpot(profile, tpot_ms / 1000, context)
    assert batch == expected
    if batch:
        assert profile.decode_step_seconds(batch, math.ceil(batch * context)) <= tpot_ms / 1000


def test_decode_batch_at_tpot_on_the_8b_profile_by_hand() -> None:
    # base 6.7 ms + 5.2e-5 ms x B x 2048 (B <= 128): 20 ms allows B <= 13.3 / 0.1065 = 124.9
    profile = load_profile(LLAMA_8B, "H100", 1)
    assert decode_batch_at_tpot(profile, 0.020, 2048) == math.floor((20 - 6.7) / (5.2e-5 * 2048))
    assert decode_batch_at_tpot(profile, 0.020, 2048, max_batch=64) == 64
    assert decode_batch_at_tpot(profile, 0.005, 10) == 0


@pytest.mark.parametrize(
    ("prompt", "budget", "expected_tps"),
    [
        # linear part of a full 8192-token step: max(10, 2 + 0.01 x 8192) = 83.92 ms, i.e. 10.244 us/token;
        # attention adds 1e-6 x n^2 ms per prompt once, however it is chunked.
        (100, 8192, 100 / (100 * 83.92 / 8192 + 1e-6 * 100**2) * 1000),
        (8192, 8192, 8192 / (83.92 + 1e-6 * 8192**2) * 1000),
        (32768, 8192, 32768 / (32768 * 83.92 / 8192 + 1e-6 * 32768**2) * 1000),
        # a small budget never leaves the 10 ms floor: 64 tokens per 10 ms step
        (64, 64, 64 / (10 + 1e-6 * 64**2) * 1000),
    ],
)
def test_prefill_tokens_per_second(prompt: int, budget: int, expected_tps: float) -> None:
    assert prefill_tokens_per_second(_flat(5), prompt, budget) == pytest.approx(expected_tps, rel=1e-9)


def test_prefill_throughput_matches_back_to_back_whole_prompts_at_the_budget() -> None:
    profile = load_profile(LLAMA_8B, "H100", 1)
    assert prefill_tokens_per_second(profile, 8192) == pytest.approx(8192 / profile.prefill_seconds(8192))
    # longer prompts pay more attention per token; short ones pack into full steps
    rates = [prefill_tokens_per_second(profile, n) for n in (256, 2048, 8192, 32768)]
    assert rates == sorted(rates, reverse=True)
    with pytest.raises(ValueError, match=">= 1"):
        prefill_tokens_per_second(profile, 0)
