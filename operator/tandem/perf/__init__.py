"""The latency and KV-size model shared by the sim engine and the cluster simulator.

Pure: no clock and no I/O beyond reading the packaged data files (`models.yaml`, `profiles/*.yaml`).

- `kv_bytes_per_token(model_id)` / `kv_transfer_seconds(tokens, bytes_per_token, bandwidth_gbps)`:
  KV-cache math (reference section 6).
- `load_profile(model_id, gpu, tp) -> Profile`: calibrated step times (reference section 7);
  `Profile.prefill_seconds(tokens)`, `Profile.decode_step_seconds(batch, context_tokens)` and
  `Profile.step_seconds(...)` for mixed (chunked-prefill) steps.
"""

from tandem.perf.kv import (
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
    "DecodeCoefficients",
    "ModelArch",
    "PrefillChunk",
    "PrefillCoefficients",
    "Profile",
    "ProfileNotFoundError",
    "UnknownModelError",
    "available_profiles",
    "estimate_profile",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "kv_transfer_seconds",
    "load_profile",
    "model_arch",
    "weight_bytes_per_gpu",
]
