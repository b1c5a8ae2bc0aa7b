"""How profiles compute step times: mixed steps, fp8 KV caches, lookups and estimates.

The calibration points themselves are in test_calibration.py.
"""

from __future__ import annotations

import pytest

from tandem.perf import PrefillChunk, ProfileNotFoundError, available_profiles, estimate_profile, load_profile

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def test_mixed_step_of_one_whole_prompt_equals_prefill() -> None:
    profile = load_profile(LLAMA_8B, "H100", 1)
    assert profile.step_seconds([PrefillChunk(0, 4096)], 0, 0) == pytest.approx(profile.prefill_seconds(4096))


def test_chunking_keeps_total_attention_and_decodes_wait_for_chunks() -> None:
    profile = load_profile(LLAMA_8B, "H100", 1)
    whole = profile.step_seconds([PrefillChunk(0, 16384)], 0, 0)
    chunked = sum(profile.step_seconds([PrefillChunk(o, 2048)], 0, 0) for o in range(0, 16384, 2048))
    assert chunked >= whole  # per-step overhead only adds
    decode_alone = profile.decode_step_seconds(32, 32 * 1024)
    decode_with_chunk = profile.step_seconds([PrefillChunk(0, 2048)], 32, 32 * 1024)
    assert decode_with_chunk > 3 * decode_alone


def test_empty_work_takes_no_time() -> None:
    profile = load_profile(LLAMA_8B, "H100", 1)
    assert profile.prefill_seconds(0) == 0
    assert profile.decode_step_seconds(0, 0) == 0
    assert profile.step_seconds([], 0, 0) == 0


def test_lookup_is_by_alias_and_case_insensitive_gpu() -> None:
    assert load_profile("meta-llama/Llama-3.1-8B", "h100", 1).model == LLAMA_8B
    with pytest.raises(ProfileNotFoundError):
        load_profile(LLAMA_8B, "H100", 2)


def test_estimates_fill_gaps_and_say_so() -> None:
    tp2 = estimate_profile(LLAMA_8B, "H100", 2)
    tp1 = load_profile(LLAMA_8B, "H100", 1)
    assert tp2.derived_from is not None
    assert tp2.prefill_seconds(8192) < tp1.prefill_seconds(8192)
    assert estimate_profile(LLAMA_8B, "H100", 1).derived_from is None
    qwen = estimate_profile("Qwen/Qwen2.5-32B-Instruct", "H100", 2)
    assert qwen.model == "Qwen/Qwen2.5-32B-Instruct"
    with pytest.raises(ProfileNotFoundError, match="GPU"):
        estimate_profile(LLAMA_8B, "TPU", 1)


def test_required_profiles_are_packaged() -> None:
    keys = {(p.model, p.gpu, p.tensor_parallel_size) for p in available_profiles()}
    assert {(LLAMA_8B, "H100", 1), (LLAMA_70B, "H100", 4), (LLAMA_70B, "H100", 8)} <= keys


@pytest.mark.parametrize(("model", "tp"), [(LLAMA_8B, 1), (LLAMA_70B, 4), (LLAMA_70B, 8)])
def test_fp8_kv_cache_halves_the_kv_read_term_only(model: str, tp: int) -> None:
    bf16 = load_profile(model, "H100", tp)
    fp8 = bf16.with_kv_cache_dtype("fp8")
    assert fp8.kv_cache_dtype == "fp8"
    assert fp8.decode.per_context_token_ms == pytest.approx(bf16.decode.per_context_token_ms / 2)
    batch, context = 64, 64 * 4096
    kv_read = bf16.decode.per_context_token_ms * context / 1000
    assert fp8.decode_step_seconds(batch, context) == pytest.approx(
        bf16.decode_step_seconds(batch, context) - kv_read / 2
    )
    # mixed steps read the decodes' KV the same way; prefill compute is unchanged
    chunk = [PrefillChunk(0, 2048)]
    assert fp8.step_seconds(chunk, batch, context) == pytest.approx(
        bf16.step_seconds(chunk, batch, context) - kv_read / 2
    )
    assert fp8.prefill_seconds(8192) == bf16.prefill_seconds(8192)
    # back to the model's own dtype, and "auto" on a bf16 model is a no-op
    assert fp8.with_kv_cache_dtype("auto").decode == bf16.decode
    assert bf16.with_kv_cache_dtype("auto") is bf16
    assert bf16.with_kv_cache_dtype("bfloat16").decode == bf16.decode


def test_unknown_kv_cache_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        load_profile(LLAMA_8B, "H100", 1).with_kv_cache_dtype("int2")


def test_estimates_scale_the_per_sequence_slope_with_tp() -> None:
    tp4 = load_profile(LLAMA_70B, "H100", 4)
    tp2 = estimate_profile(LLAMA_70B, "H100", 2)
    assert tp2.derived_from == "meta-llama/Llama-3.1-70B-Instruct H100 TP4"
    assert tp2.decode.per_seq_beyond_knee_ms == pytest.approx(2 * tp4.decode.per_seq_beyond_knee_ms)
    assert tp2.decode.per_context_token_ms == pytest.approx(2 * tp4.decode.per_context_token_ms)
    assert tp2.decode.base_ms == tp4.decode.base_ms
