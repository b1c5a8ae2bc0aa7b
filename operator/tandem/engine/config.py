"""Resolves parsed `vllm serve` arguments and sim settings into one `EngineConfig`.

Here live vLLM's defaults and the start-up checks that need the model's architecture (TP must
divide the attention heads, max_model_len within the model's limit, a KV cache big enough for one
max-length sequence). The KV capacity itself is `tandem.perf.kv_cache_capacity`, the one the
autoscaler and the simulator use. Pure: raises `ConfigError` with a vLLM-like message.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from tandem.engine.args import KVTransferConfig, ServeArgs
from tandem.engine.settings import DEFAULT_LEASE_SECONDS, DEFAULT_PERF_MODEL, SimSettings
from tandem.perf import (
    ModelArch,
    Profile,
    ProfileNotFoundError,
    UnknownModelError,
    estimate_profile,
    kv_cache_capacity,
    model_arch,
)
from tandem.perf.capacity import DEFAULT_MAX_BATCH, DEFAULT_MAX_NUM_BATCHED_TOKENS

GIB = 1 << 30
DEFAULT_BATCHED_TOKENS = DEFAULT_MAX_NUM_BATCHED_TOKENS  # vLLM's H100/H200 defaults, as the capacity model's
DEFAULT_MAX_NUM_SEQS = DEFAULT_MAX_BATCH


class ConfigError(ValueError):
    """The engine cannot start with this configuration; the message says why, as vLLM would."""


class EngineConfig(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    args: ServeArgs
    sim: SimSettings
    model: str
    served_model_names: tuple[str, ...]
    arch: ModelArch
    profile: Profile
    tensor_parallel_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    prefix_caching: bool = True  # vLLM V1's automatic prefix caching (on unless --no-enable-...)
    block_size: int
    num_gpu_blocks: int
    kv_bytes_per_token: int  # whole model, as moved between P and D (kv-cache dtype applied)
    kv_transfer: KVTransferConfig | None
    kv_lease_seconds: float
    notes: tuple[str, ...] = ()  # warnings printed at start
    # The `engine` label of the metrics: an External or MultiPortExternal rank's global data-parallel
    # rank, as vLLM's API server of an externally balanced rank labels its one engine (`ranks.py`); 0
    # otherwise (an Internal leader labels its workers' series at the scrape: `group.py`).
    engine_index: int = 0

    @property
    def model_name(self) -> str:
        """The first served name: returned in responses and used as the `model_name` label."""
        return self.served_model_names[0]


def resolve(args: ServeArgs, sim: SimSettings) -> EngineConfig:
    notes: list[str] = []
    arch, perf_model = _arch_for(args.model, sim, notes)
    tp = args.tensor_parallel_size
    if tp < 1:
        raise ConfigError(f"--tensor-parallel-size must be >= 1, got {tp}")
    if arch.attention_heads % tp:
        raise ConfigError(
            f"Total number of attention heads ({arch.attention_heads}) must be divisible by "
            f"tensor parallel size ({tp})."
        )
    try:
        profile = estimate_profile(perf_model, sim.gpu, tp)
    except ProfileNotFoundError as exc:
        raise ConfigError(f"TANDEM_SIM_GPU={sim.gpu}: {exc}") from None
    if profile.derived_from:
        notes.append(
            f"no calibrated profile for {perf_model} on {sim.gpu} TP{tp}; scaled from {profile.derived_from}"
        )

    max_model_len = args.max_model_len if args.max_model_len is not None else arch.max_position
    if max_model_len < 1:
        raise ConfigError(f"--max-model-len must be positive, got {max_model_len}")
    if max_model_len > arch.max_position:
        raise ConfigError(
            f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={arch.max_position} in model's config.json)."
        )
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ConfigError(f"GPU memory utilization must be within (0, 1]. Got {args.gpu_memory_utilization}.")

    chunked = True if args.enable_chunked_prefill is None else args.enable_chunked_prefill
    max_num_seqs = args.max_num_seqs if args.max_num_seqs is not None else DEFAULT_MAX_NUM_SEQS
    if max_num_seqs < 1:
        raise ConfigError(f"--max-num-seqs must be >= 1, got {max_num_seqs}")
    if args.max_num_batched_tokens is not None:
        batched = args.max_num_batched_tokens
    else:
        batched = DEFAULT_BATCHED_TOKENS if chunked else max(max_model_len, DEFAULT_BATCHED_TOKENS)
    if batched < 1:
        raise ConfigError(f"--max-num-batched-tokens must be >= 1, got {batched}")
    if not chunked and batched < max_model_len:
        raise ConfigError(
            f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}). "
            "This effectively limits the maximum sequence length to max_num_batched_tokens and makes "
            "vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease max_model_len."
        )
    if batched < max_num_seqs:
        raise ConfigError(
            f"max_num_batched_tokens ({batched}) must be greater than or equal to "
            f"max_num_seqs ({max_num_seqs})."
        )

    try:
        kv_per_token = arch.kv_bytes_per_token_as(args.kv_cache_dtype)
    except ValueError as exc:
        raise ConfigError(f"--kv-cache-dtype: {exc}") from None
    # The decode KV-read term follows the cache dtype: fp8 halves it for a bf16 model.
    profile = profile.with_kv_cache_dtype(args.kv_cache_dtype)
    if args.num_gpu_blocks_override is not None:
        if args.num_gpu_blocks_override < 1:
            raise ConfigError("--num-gpu-blocks-override must be >= 1")
        num_blocks = args.num_gpu_blocks_override
    else:
        capacity = kv_cache_capacity(
            arch,
            tp=tp,
            gpu_memory_gib=profile.gpu_memory_gib,
            gpu_memory_utilization=args.gpu_memory_utilization,
            kv_cache_dtype=args.kv_cache_dtype,
        )
        available = capacity.available_bytes_per_gpu
        if available <= 0:
            raise ConfigError(
                "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                "when initializing the engine."
            )
        num_blocks = capacity.blocks(args.block_size)
        if num_blocks * args.block_size < max_model_len:
            raise ConfigError(
                f"To serve at least one request with the models's max seq len ({max_model_len}), "
                f"({max_model_len * capacity.bytes_per_token_per_gpu / GIB:.2f} GiB KV cache is needed, "
                f"which is larger than the available KV cache memory ({available / GIB:.2f} GiB). Based on "
                f"the available memory, the estimated maximum model length is "
                f"{num_blocks * args.block_size}. Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
            )

    kv = args.kv_transfer_config
    lease = DEFAULT_LEASE_SECONDS if sim.abort_request_timeout is None else sim.abort_request_timeout
    if kv is not None and "kv_lease_duration" in kv.kv_connector_extra_config:
        try:
            lease = float(kv.kv_connector_extra_config["kv_lease_duration"])
        except (TypeError, ValueError):
            raise ConfigError(
                "kv_connector_extra_config.kv_lease_duration must be a number of seconds"
            ) from None
        if lease <= 0:
            raise ConfigError("kv_connector_extra_config.kv_lease_duration must be positive")

    return EngineConfig(
        args=args,
        sim=sim,
        model=args.model,
        served_model_names=args.served_model_name or (args.model,),
        arch=arch,
        profile=profile,
        tensor_parallel_size=tp,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        chunked_prefill=chunked,
        prefix_caching=True if args.enable_prefix_caching is None else args.enable_prefix_caching,
        block_size=args.block_size,
        num_gpu_blocks=num_blocks,
        kv_bytes_per_token=kv_per_token,
        kv_transfer=kv,
        kv_lease_seconds=lease,
        notes=tuple(notes),
    )


def _arch_for(model: str, sim: SimSettings, notes: list[str]) -> tuple[ModelArch, str]:
    """The served model's architecture; TANDEM_SIM_PERF_MODEL overrides, unknown models fall back."""
    candidates = [sim.perf_model] if sim.perf_model else [model]
    for candidate in candidates:
        try:
            arch = model_arch(candidate)
            return arch, arch.model_id
        except UnknownModelError:
            if sim.perf_model:
                raise ConfigError(f"TANDEM_SIM_PERF_MODEL={sim.perf_model!r} is not a known model") from None
    notes.append(
        f"model {model!r} has no known architecture; simulating {DEFAULT_PERF_MODEL} "
        "(set TANDEM_SIM_PERF_MODEL to choose)"
    )
    arch = model_arch(DEFAULT_PERF_MODEL)
    return arch, arch.model_id


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)
