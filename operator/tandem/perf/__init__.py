"""The latency and KV-size model shared by the sim engine and the cluster simulator.

Pure: no clock and no I/O beyond reading the packaged data files (`models.yaml`, `profiles/*.yaml`).

- `kv_bytes_per_token(model_id)` / `kv_transfer_seconds(tokens, bytes_per_token, bandwidth_gbps)`:
  KV-cache math (reference section 6).
- `load_profile(model_id, gpu, tp) -> Profile`: calibrated step times (reference section 7);
  `Profile.prefill_seconds(tokens)`, `Profile.decode_step_seconds(batch, context_tokens)` and
  `Profile.step_seconds(...)` for mixed (chunked-prefill) steps; `Profile.with_kv_cache_dtype("fp8")`.
- `kv_cache_tokens(...)` / `kv_cache_capacity(...)`: the KV tokens one replica holds;
  `decode_batch_at_tpot(...)` and `prefill_tokens_per_second(...)`: what one replica sustains.
"""

from tandem.perf.capacity import (
    ACTIVATION_RESERVE_BYTES,
    KVCapacity,
    decode_batch_at_tpot,
    kv_cache_capacity,
    kv_cache_tokens,
    prefill_tokens_per_second,
)
from tandem.perf.gpus import GpuSpec, UnknownGpuError, gpu_spec, gpu_specs, profile_gpu
from tandem.perf.kv import (
    KV_CACHE_DTYPE_BYTES,
    ModelArch,
    UnknownModelError,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_transfer_seconds,
    model_arch,
    weight_bytes_per_gpu,
)
from tandem.perf.profile import (
    DecodeCoefficients,
    PrefillChunk,
    PrefillCoefficients,
    Profile,
    ProfileNotFoundError,
    available_profiles,
    estimate_profile,
    load_profile,
)

__all__ = [
    "ACTIVATION_RESERVE_BYTES",
    "KV_CACHE_DTYPE_BYTES",
    "DecodeCoefficients",
    "GpuSpec",
    "KVCapacity",
    "ModelArch",
    "PrefillChunk",
    "PrefillCoefficients",
    "Profile",
    "ProfileNotFoundError",
    "UnknownGpuError",
    "UnknownModelError",
    "available_profiles",
    "decode_batch_at_tpot",
    "estimate_profile",
    "gpu_spec",
    "gpu_specs",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "kv_cache_capacity",
    "kv_cache_tokens",
    "kv_transfer_seconds",
    "load_profile",
    "model_arch",
    "prefill_tokens_per_second",
    "profile_gpu",
    "weight_bytes_per_gpu",
]
