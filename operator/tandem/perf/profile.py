"""Calibrated step-time profiles for (model, GPU, tensor-parallel size), loaded from `profiles/*.yaml`.

Functional forms (reference section 7; DistServe's simulator uses the same shapes):
- prefill of n prompt tokens: `max(floor, intercept + per_token * n) + per_token_sq * n^2` ms;
- decode step of B sequences holding sumC context tokens:
  `base + per_seq_beyond_knee * max(0, B - knee) + per_context_token * sumC` ms;
- a mixed step (chunked prefill next to decodes, vLLM V1's unified batch): the linear part runs over
  all scheduled tokens, a chunk of n tokens at offset o adds the attention cost of its rows,
  `per_token_sq * ((o + n)^2 - o^2)`, and the decodes add their KV-read term. A chunked prompt
  therefore costs the same total attention as an unchunked one, and decodes sharing a step with a
  prefill chunk wait for it: the interference P/D removes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from importlib import resources
from typing import NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field

from tandem.perf.kv import model_arch

_MS = 1e-3


class ProfileNotFoundError(LookupError):
    """No calibrated profile for this (model, GPU, TP)."""


class PrefillChunk(NamedTuple):
    """`tokens` prompt tokens of one request computed in a step, after `offset` already computed."""

    offset: int
    tokens: int


class PrefillCoefficients(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    floor_ms: float = Field(ge=0)
    intercept_ms: float = Field(ge=0)
    per_token_ms: float = Field(ge=0)
    per_token_sq_ms: float = Field(ge=0)


class DecodeCoefficients(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    base_ms: float = Field(ge=0)
    knee_batch: int = Field(ge=0)
    per_seq_beyond_knee_ms: float = Field(ge=0)
    per_context_token_ms: float = Field(ge=0)


class Profile(BaseModel):
    """Step times of one model on one GPU type at one TP degree."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    gpu: str
    tensor_parallel_size: int = Field(ge=1)
    gpu_memory_gib: float = Field(gt=0)
    prefill: PrefillCoefficients
    decode: DecodeCoefficients
    kv_cache_dtype: str = "auto"  # the KV-read term is for this cache dtype (`with_kv_cache_dtype`)
    derived_from: str | None = None  # set on estimated profiles: which calibrated one was scaled

    def prefill_seconds(self, tokens: int) -> float:
        """One request's whole prompt in one step, nothing else in the batch."""
        if tokens <= 0:
            return 0.0
        return self.prefill_linear_seconds(tokens) + self.prefill_attention_seconds(0, tokens)

    def prefill_linear_seconds(self, tokens: int) -> float:
        """The linear-op (weights, all-reduce, overhead) part of a step computing `tokens` tokens."""
        p = self.prefill
        return max(p.floor_ms, p.intercept_ms + p.per_token_ms * tokens) * _MS

    def prefill_attention_seconds(self, offset: int, tokens: int) -> float:
        """The attention part of computing `tokens` prompt tokens after `offset` already computed."""
        return self.prefill.per_token_sq_ms * ((offset + tokens) ** 2 - offset**2) * _MS

    def decode_step_seconds(self, batch: int, context_tokens: int) -> float:
        """One decode step of `batch` sequences holding `context_tokens` tokens in total."""
        if batch <= 0:
            return 0.0
        return self.decode.base_ms * _MS + self._decode_growth_seconds(batch, context_tokens)

    def step_seconds(
        self, chunks: Sequence[PrefillChunk], decode_batch: int, decode_context_tokens: int
    ) -> float:
        """One engine step: prefill `chunks` plus `decode_batch` decodes over their total context."""
        decode_only = self.decode_step_seconds(decode_batch, decode_context_tokens)
        if not chunks:
            return decode_only
        tokens = sum(c.tokens for c in chunks) + decode_batch
        attention = sum(self.prefill_attention_seconds(c.offset, c.tokens) for c in chunks)
        decode = self._decode_growth_seconds(decode_batch, decode_context_tokens)
        return max(self.prefill_linear_seconds(tokens) + attention + decode, decode_only)

    def with_kv_cache_dtype(self, kv_cache_dtype: str) -> Profile:
        """This profile with a `--kv-cache-dtype` cache: the decode KV-read term scales with KV bytes
        (fp8 halves it for a bf16 model); weights and prefill compute are unchanged."""
        arch = model_arch(self.model)
        scale = arch.kv_dtype_scale(kv_cache_dtype) / arch.kv_dtype_scale(self.kv_cache_dtype)
        if scale == 1 and kv_cache_dtype == self.kv_cache_dtype:
            return self
        d = self.decode
        return self.model_copy(
            update={
                "kv_cache_dtype": kv_cache_dtype,
                "decode": d.model_copy(update={"per_context_token_ms": d.per_context_token_ms * scale}),
            }
        )

    def time_scaled(self, factor: float) -> Profile:
        """This profile with every step time multiplied by `factor` (the sim engine's
        TANDEM_SIM_TIME_SCALE: a pod `factor` times slower than the GPU it models)."""
        if factor == 1:
            return self
        p, d = self.prefill, self.decode
        return self.model_copy(
            update={
                "prefill": p.model_copy(
                    update={
                        "floor_ms": p.floor_ms * factor,
                        "intercept_ms": p.intercept_ms * factor,
                        "per_token_ms": p.per_token_ms * factor,
                        "per_token_sq_ms": p.per_token_sq_ms * factor,
                    }
                ),
                "decode": d.model_copy(
                    update={
                        "base_ms": d.base_ms * factor,
                        "per_seq_beyond_knee_ms": d.per_seq_beyond_knee_ms * factor,
                        "per_context_token_ms": d.per_context_token_ms * factor,
                    }
                ),
            }
        )

    def _decode_growth_seconds(self, batch: int, context_tokens: int) -> float:
        """What decodes add above the weight-read floor: sequences beyond the knee and the KV read."""
        d = self.decode
        extra = max(0, batch - d.knee_batch) * d.per_seq_beyond_knee_ms
        return (extra + d.per_context_token_ms * context_tokens) * _MS


@functools.cache
def _profiles() -> dict[tuple[str, str, int], Profile]:
    found: dict[tuple[str, str, int], Profile] = {}
    for entry in resources.files("tandem.perf").joinpath("profiles").iterdir():
        if not entry.name.endswith((".yaml", ".yml")):
            continue
        profile = Profile.model_validate(yaml.safe_load(entry.read_text(encoding="utf-8")))
        canonical = model_arch(profile.model).model_id
        found[(canonical.lower(), profile.gpu.lower(), profile.tensor_parallel_size)] = profile
    return found


def available_profiles() -> list[Profile]:
    return sorted(_profiles().values(), key=lambda p: (p.model, p.gpu, p.tensor_parallel_size))


def load_profile(model_id: str, gpu: str, tp: int) -> Profile:
    """The calibrated profile for exactly this model (any alias), GPU and TP, or ProfileNotFoundError."""
    key = (model_arch(model_id).model_id.lower(), gpu.lower(), tp)
    try:
        return _profiles()[key]
    except KeyError:
        raise ProfileNotFoundError(f"no profile for {model_id} on {gpu} at TP{tp}") from None


def estimate_profile(model_id: str, gpu: str, tp: int) -> Profile:
    """The calibrated profile if there is one, else a [derived] estimate, marked in `derived_from`.

    Same model and GPU at another TP: the nearest calibrated TP with throughput terms (prefill per-token,
    decode per-sequence) scaled by the TP ratio and latency floors kept. Another model on the GPU: the
    first calibrated model's profile at its nearest TP, throughput terms also scaled by the parameter
    ratio and the context term by the KV ratio.
    """
    try:
        return load_profile(model_id, gpu, tp)
    except ProfileNotFoundError:
        pass
    arch = model_arch(model_id)
    on_gpu = [p for p in available_profiles() if p.gpu.lower() == gpu.lower()]
    if not on_gpu:
        raise ProfileNotFoundError(
            f"no profile on GPU {gpu!r}; known: {sorted({p.gpu for p in available_profiles()})}"
        )
    same_model = [p for p in on_gpu if model_arch(p.model).model_id == arch.model_id]
    candidates = same_model or on_gpu
    base = min(candidates, key=lambda p: (abs(p.tensor_parallel_size - tp), p.tensor_parallel_size))
    base_arch = model_arch(base.model)
    compute = (arch.params_b / base_arch.params_b) * (base.tensor_parallel_size / tp)
    kv = (arch.kv_bytes_per_token / base_arch.kv_bytes_per_token) * (base.tensor_parallel_size / tp)
    p, d = base.prefill, base.decode
    return base.model_copy(
        update={
            "model": arch.model_id,
            "tensor_parallel_size": tp,
            "derived_from": f"{base.model} {base.gpu} TP{base.tensor_parallel_size}"
            + (f" ({base.derived_from})" if base.derived_from else ""),
            "prefill": p.model_copy(
                update={
                    "per_token_ms": p.per_token_ms * compute,
                    "per_token_sq_ms": p.per_token_sq_ms * compute,
                }
            ),
            "decode": d.model_copy(
                update={
                    "per_seq_beyond_knee_ms": d.per_seq_beyond_knee_ms * compute,
                    "per_context_token_ms": d.per_context_token_ms * kv,
                }
            ),
        }
    )
