"""Model architectures (from `models.yaml`) and the KV-cache size and transfer-time math.

Per token, GQA/MHA: 2 (K and V) x layers x kv_heads x head_dim x dtype_bytes.
MLA (DeepSeek): layers x latent_dim x dtype_bytes (no separate K and V).
With tensor parallelism GQA KV is split by KV head (replicated when TP > kv_heads); MLA is replicated.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

_GIGA = 1e9


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
        if self.mla:
            return self.layers * self.head_dim * self.dtype_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token_per_gpu(self, tp: int) -> int:
        """KV bytes one TP rank stores per token."""
        if self.mla:
            return self.kv_bytes_per_token
        heads_per_rank = max(1, self.kv_heads // tp)
        return 2 * self.layers * heads_per_rank * self.head_dim * self.dtype_bytes


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
