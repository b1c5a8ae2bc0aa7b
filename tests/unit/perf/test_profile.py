"""Profiles reproduce the reference's calibration tables (shared/reference/vllm-pd.md section 7)."""

from __future__ import annotations

import pytest

from tandem.perf import PrefillChunk, ProfileNotFoundError, available_profiles, estimate_profile, load_profile

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


# The 128-token row (~8 ms) sits under the reference's own fitted floor (6.5 ms); the fit is what we use.
@pytest.mark.parametrize(
    ("tokens", "expected_ms"),
    [(512, 14), (1024, 24), (2048, 47), (4096, 102), (8192, 225), (16384, 540)],
)
def test_8b_prefill_matches_section_7_4(tokens: int, expected_ms: float) -> None:
    profile = load_profile(LLAMA_8B, "H100", 1)
    assert profile.prefill_seconds(tokens) * 1000 == pytest.approx(expected_ms, rel=0.12)


@pytest.mark.parametrize(
    ("batch", "context", "expected_ms"),
    [(1, 1024, 6.8), (1, 4096, 7.0), (32, 1024, 8.7), (64, 4096, 20.7), (128, 4096, 35.0), (256, 4096, 65.3)],
)
def test_8b_decode_matches_section_7_4(batch: int, context: int, expected_ms: float) -> None:
    profile = load_profile(LLAMA_8B, "H100", 1)
    assert profile.decode_step_seconds(batch, batch * context) * 1000 == pytest.approx(expected_ms, rel=0.06)


@pytest.mark.parametrize(
    ("tp", "prefill_ms", "decode_ms"),
    [
        (4, {1024: 79, 4096: 290, 8192: 600}, {(1, 0): 21, (64, 4096): 31, (128, 4096): 39}),
        (8, {1024: 52, 4096: 180, 8192: 375}, {(1, 0): 13.5, (64, 4096): 19, (128, 4096): 25}),
    ],
)
def test_70b_matches_section_7_5(
    tp: int, prefill_ms: dict[int, float], decode_ms: dict[tuple[int, int], float]
) -> None:
    profile = load_profile(LLAMA_70B, "H100", tp)
    for tokens, ms in prefill_ms.items():
        assert profile.prefill_seconds(tokens) * 1000 == pytest.approx(ms, rel=0.02)
    for (batch, context), ms in decode_ms.items():
        assert profile.decode_step_seconds(batch, batch * context) * 1000 == pytest.approx(ms, rel=0.06)


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
