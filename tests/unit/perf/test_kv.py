"""KV math reproduces the reference's worked numbers (shared/reference/vllm-pd.md section 6)."""

from __future__ import annotations

import pytest

from tandem.perf import kv_bytes_per_token, kv_bytes_per_token_per_gpu, kv_transfer_seconds, model_arch

GIB = 1 << 30


@pytest.mark.parametrize(
    ("model_id", "expected"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 131_072),
        ("meta-llama/Llama-3.1-70B-Instruct", 327_680),
        ("Qwen/Qwen2.5-32B-Instruct", 262_144),
        ("Qwen/Qwen2.5-72B-Instruct", 327_680),
        ("deepseek-ai/DeepSeek-V3", 70_272),
    ],
)
def test_bytes_per_token_matches_reference_table(model_id: str, expected: int) -> None:
    assert kv_bytes_per_token(model_id) == expected


@pytest.mark.parametrize(
    ("model_id", "fp8_expected"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 64 * 1024),
        ("meta-llama/Llama-3.1-70B-Instruct", 160 * 1024),
        ("Qwen/Qwen2.5-32B-Instruct", 128 * 1024),
        ("Qwen/Qwen2.5-72B-Instruct", 160 * 1024),
    ],
)
def test_fp8_bytes_per_token_match_reference_table(model_id: str, fp8_expected: int) -> None:
    """Section 6's fp8 column: half the bf16 bytes, for every fp8 variant vLLM accepts."""
    arch = model_arch(model_id)
    for dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert arch.kv_bytes_per_token_as(dtype) == fp8_expected
        assert arch.kv_dtype_scale(dtype) == 0.5
    assert arch.kv_bytes_per_token_as("bfloat16") == arch.kv_bytes_per_token


def test_8k_tokens_of_llama_8b_is_one_gib() -> None:
    bytes_per_token = kv_bytes_per_token("meta-llama/Llama-3.1-8B-Instruct")
    assert bytes_per_token is not None
    assert 8192 * bytes_per_token == GIB


@pytest.mark.parametrize(
    ("gbps", "expected_ms"),
    [(400, 21.5), (200, 43), (100, 86), (25, 344)],
)
def test_transfer_time_of_one_gib_matches_reference(gbps: float, expected_ms: float) -> None:
    seconds = kv_transfer_seconds(8192, 131_072, gbps)
    assert seconds * 1000 == pytest.approx(expected_ms, rel=0.01)


def test_70b_8k_at_400_gbps_is_54_ms() -> None:
    assert kv_transfer_seconds(8192, 327_680, 400) * 1000 == pytest.approx(54, rel=0.01)


def test_aliases_and_hf_uri_resolve_to_the_same_model() -> None:
    assert kv_bytes_per_token("hf://meta-llama/Llama-3.1-8B-Instruct@main") == 131_072
    assert kv_bytes_per_token("META-LLAMA/meta-llama-3.1-8b") == 131_072
    assert model_arch("meta-llama/Llama-3.1-8B").model_id == "meta-llama/Llama-3.1-8B-Instruct"


def test_unknown_model_has_no_kv_size() -> None:
    assert kv_bytes_per_token("acme/unknown-7b") is None


def test_per_gpu_kv_splits_by_kv_head_and_replicates_mla() -> None:
    assert kv_bytes_per_token_per_gpu("meta-llama/Llama-3.1-70B-Instruct", 4) == 327_680 // 4
    assert kv_bytes_per_token_per_gpu("meta-llama/Llama-3.1-70B-Instruct", 16) == 327_680 // 8
    assert kv_bytes_per_token_per_gpu("deepseek-ai/DeepSeek-V3", 8) == 70_272


def test_transfer_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        kv_transfer_seconds(1, 1, 0)
    with pytest.raises(ValueError, match="non-negative"):
        kv_transfer_seconds(-1, 1, 1)
