"""Model architectures (from `models.yaml`) and the KV-cache size and transfer-time math.

Per token, GQA/MHA: 2 (K and V) x layers x kv_heads x head_dim x dtype_bytes.
MLA (DeepSeek): layers x latent_dim x dtype_bytes (no separate K and V).
With tensor parallelism GQA KV is split by KV head (replicated when TP > kv_heads); MLA is replicated.
`--kv-cache-dtype` (vLLM's values) changes the element size: `auto` keeps the model's dtype, `fp8*` is one
byte, and `fp8_ds_mla` is vLLM's packed DeepSeek layout of 656 bytes per layer (reference section 6).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

_GIGA = 1e9
# vLLM's `--kv-cache-dtype` choices and the bytes per element each stores (None: the model's dtype).
KV_CACHE_DTYPE_BYTES: dict[str, int | None] = {
    "auto": None,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
}
# fp8_ds_mla: 512 fp8 latent + 16 B of scales + 64 bf16 rope = 656 B per token per layer (reference
# section 6, from vLLM PR #48439: "allocation uses 656 bytes per token").
FP8_DS_MLA_BYTES_PER_LAYER = 656


class UnknownModelError(KeyError):
    """No architecture is known for this model id."""


class ModelArch(BaseModel):
    """What the KV math and weight sizing need to know about a model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str
    aliases: tuple[str, ...] = ()
    layers: int = Field(gt=0)
    attention_heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    dtype_bytes: int = Field(gt=0)
    mla: bool = False
    params_b: float = Field(gt=0)
    max_position: int = Field(gt=0)
    source: str

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes_per_token_as("auto")

    def kv_bytes_per_token_as(self, kv_cache_dtype: str) -> int:
        """Whole-model KV bytes per token with this `--kv-cache-dtype` (what P sends D)."""
        if self.mla:
            if kv_cache_dtype == "fp8_ds_mla":
                return self.layers * FP8_DS_MLA_BYTES_PER_LAYER
            return self.layers * self.head_dim * self._kv_element_bytes(kv_cache_dtype)
        return 2 * self.layers * self.kv_heads * self.head_dim * self._kv_element_bytes(kv_cache_dtype)

    def kv_bytes_per_token_per_gpu(self, tp: int, kv_cache_dtype: str = "auto") -> int:
        """KV bytes one TP rank stores per token."""
        if self.mla:
            return self.kv_bytes_per_token_as(kv_cache_dtype)
        heads_per_rank = max(1, self.kv_heads // tp)
        return 2 * self.layers * heads_per_rank * self.head_dim * self._kv_element_bytes(kv_cache_dtype)

    def kv_dtype_scale(self, kv_cache_dtype: str) -> float:
        """KV bytes per token with this cache dtype over those with the model's own dtype."""
        return self.kv_bytes_per_token_as(kv_cache_dtype) / self.kv_bytes_per_token_as("auto")

    def _kv_element_bytes(self, kv_cache_dtype: str) -> int:
        try:
            size = KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
        except KeyError:
            raise ValueError(
                f"unknown kv_cache_dtype {kv_cache_dtype!r}; one of {', '.join(KV_CACHE_DTYPE_BYTES)}"
            ) from None
        return self.dtype_bytes if size is None else size


@functools.cache
def _architectures() -> dict[str, ModelArch]:
    text = resources.files("tandem.perf").joinpath("models.yaml").read_text(encoding="utf-8")
    raw: dict[str, dict[str, Any]] = yaml.safe_load(text)["models"]
    by_name: dict[str, ModelArch] = {}
    for model_id, fields in raw.items():
        arch = ModelArch(model_id=model_id, **{**fields, "aliases": tuple(fields.get("aliases", ()))})
        for name in (model_id, *arch.aliases):
            by_name[name.lower()] = arch
    return by_name


def _normalise(model_id: str) -> str:
    name = model_id.strip()
    if name.startswith("hf://"):
        name = name[len("hf://") :].split("@", 1)[0]
    return name.lower()


def model_arch(model_id: str) -> ModelArch:
    """The architecture of a model by HF id (case-insensitive; `hf://repo@rev` accepted)."""
    try:
        return _architectures()[_normalise(model_id)]
    except KeyError:
        raise UnknownModelError(model_id) from None


def kv_bytes_per_token(model_id: str) -> int | None:
    """Whole-model KV bytes per token (all layers, all KV heads), or None for an unknown model."""
    try:
        return model_arch(model_id).kv_bytes_per_token
    except UnknownModelError:
        return None


def kv_bytes_per_token_per_gpu(model_id: str, tp: int) -> int | None:
    """KV bytes per token held by one of `tp` ranks, or None for an unknown model."""
    try:
        return model_arch(model_id).kv_bytes_per_token_per_gpu(tp)
    except UnknownModelError:
        return None


def weight_bytes_per_gpu(model_id: str, tp: int) -> int:
    arch = model_arch(model_id)
    return int(arch.params_b * _GIGA * arch.dtype_bytes / tp)


def kv_transfer_seconds(tokens: int, bytes_per_token: int, bandwidth_gbps: float) -> float:
    """Time to move `tokens` of KV at ideal line rate (`bandwidth_gbps` in Gb/s, 1e9 bits)."""
    if tokens < 0 or bytes_per_token < 0:
        raise ValueError("tokens and bytes_per_token must be non-negative")
    if bandwidth_gbps <= 0:
        raise ValueError("bandwidth_gbps must be positive")
    return tokens * bytes_per_token * 8 / (bandwidth_gbps * _GIGA)
