"""What one replica can hold and sustain: KV-cache capacity, decode batch at a TPOT, prefill throughput.

One source for the sim engine (its `num_gpu_blocks`), the autoscaler and the cluster simulator.

KV capacity follows vLLM's start-up arithmetic, per GPU (every TP rank holds the same share):
`gpu_memory_gib x gpu_memory_utilization - weights/TP - activation reserve`, divided by the KV bytes one
rank stores per token (`--kv-cache-dtype` applied). A replica's capacity in tokens is that quotient:
with TP each rank holds its share of every token, so the ranks' capacities are one and the same.
The activation reserve is a rough stand-in for vLLM's profiling run (peak activations at
`max_num_batched_tokens`, CUDA graphs, non-torch memory) [derived].
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from tandem.perf.kv import ModelArch, model_arch
from tandem.perf.profile import Profile

GIB = 1 << 30
ACTIVATION_RESERVE_BYTES = 2 * GIB
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's H100/H200 API-server default (reference section 4.6)
DEFAULT_MAX_BATCH = 1024  # vLLM's default --max-num-seqs on H100/H200


class KVCapacity(BaseModel):
    """The KV cache of one replica: bytes each rank stores per token, bytes free for it, tokens it holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bytes_per_token_per_gpu: int
    available_bytes_per_gpu: float  # zero or less: vLLM refuses to start ("No available memory")
    tokens: int

    def blocks(self, block_size: int) -> int:
        """vLLM's `num_gpu_blocks` at this `--block-size`."""
        return self.tokens // block_size


def kv_cache_capacity(
    model: Profile | ModelArch | str,
    tp: int | None = None,
    gpu_memory_gib: float | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    kv_cache_dtype: str = "auto",
) -> KVCapacity:
    """KV-cache capacity of one replica of `model` (a profile, an architecture or an HF id).

    A profile supplies `tp` and `gpu_memory_gib` unless they are given; an architecture or id needs both.
    """
    if isinstance(model, Profile):
        arch = model_arch(model.model)
        tp = model.tensor_parallel_size if tp is None else tp
        gpu_memory_gib = model.gpu_memory_gib if gpu_memory_gib is None else gpu_memory_gib
    else:
        arch = model if isinstance(model, ModelArch) else model_arch(model)
    if tp is None or gpu_memory_gib is None:
        raise ValueError("tp and gpu_memory_gib are required unless a profile is given")
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if gpu_memory_gib <= 0 or not 0 < gpu_memory_utilization <= 1:
        raise ValueError("gpu_memory_gib must be positive and gpu_memory_utilization within (0, 1]")
    per_token = arch.kv_bytes_per_token_per_gpu(tp, kv_cache_dtype)
    weights = arch.params_b * 1e9 * arch.dtype_bytes / tp
    available = gpu_memory_gib * GIB * gpu_memory_utilization - weights - ACTIVATION_RESERVE_BYTES
    tokens = int(available // per_token) if available > 0 else 0
    return KVCapacity(bytes_per_token_per_gpu=per_token, available_bytes_per_gpu=available, tokens=tokens)


def kv_cache_tokens(
    model: Profile | ModelArch | str,
    tp: int | None = None,
    gpu_memory_gib: float | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    kv_cache_dtype: str = "auto",
    max_model_len: int | None = None,
) -> int:
    """Tokens of KV one replica holds; 0 if it would not start (no memory, or, when `max_model_len` is
    given, not enough for one sequence of that length, which vLLM refuses at start-up)."""
    tokens = kv_cache_capacity(model, tp, gpu_memory_gib, gpu_memory_utilization, kv_cache_dtype).tokens
    if max_model_len is not None and tokens < max_model_len:
        return 0
    return tokens


def decode_batch_at_tpot(
    profile: Profile, tpot_seconds: float, mean_context_tokens: float, max_batch: int = DEFAULT_MAX_BATCH
) -> int:
    """The largest batch B (at most `max_batch`) whose decode step, B sequences of `mean_context_tokens`
    each, takes at most `tpot_seconds`; 0 if even one sequence misses. KV capacity is not checked here:
    cap B by `kv_cache_tokens(...) // mean_context_tokens` too."""
    if mean_context_tokens < 0:
        raise ValueError("mean_context_tokens must be non-negative")

    def fits(batch: int) -> bool:
        return profile.decode_step_seconds(batch, math.ceil(batch * mean_context_tokens)) <= tpot_seconds

    if max_batch < 1 or not fits(1):
        return 0
    low, high = 1, max_batch  # fits(low) holds; the step time grows with B, so bisect
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def prefill_tokens_per_second(
    profile: Profile, prompt_tokens: int, max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
) -> float:
    """Prompt tokens per second one busy replica sustains when every prompt has `prompt_tokens` tokens.

    A busy vLLM V1 replica with chunked prefill fills every step with `max_num_batched_tokens` tokens,
    packing short prompts together and splitting long ones; a step's linear-op time is that of a full
    budget, and each prompt adds its whole attention cost once however it is chunked (`Profile.step_seconds`).
    """
    if prompt_tokens < 1 or max_num_batched_tokens < 1:
        raise ValueError("prompt_tokens and max_num_batched_tokens must be >= 1")
    linear_per_token = profile.prefill_linear_seconds(max_num_batched_tokens) / max_num_batched_tokens
    attention = profile.prefill_attention_seconds(0, prompt_tokens)
    seconds_per_prompt = prompt_tokens * linear_per_token + attention
    return prompt_tokens / seconds_per_prompt
