"""What one replica of a pool sustains within the SLO, seeded from the `perf` profile.

- Prefill: a busy replica spends, per prompt of n tokens, n x (a full token budget's linear step time
  / budget) plus the prompt's attention, quadratic in n; over the window's prompt lengths it computes
  `E[n] / (E[n] x linear + per_token_sq x E[n^2])` prompt tokens/s (`busy_prefill_tokens_per_second`;
  with `E[n^2] = E[n]^2` this is `perf.prefill_tokens_per_second` at the mean prompt: heavy-tailed
  prompts, Mooncake's `E[n^2] = 2.72 E[n]^2`, make it far lower than the mean predicts).
  Prefix caching: a prompt whose first h tokens are cached computes only the rest, `linear x (n - h)
  + per_token_sq x (n^2 - h^2)` (the new tokens still attend to the cached ones). With the pool's
  uncached fraction u (1 - prefix-cache hits / queries, `PoolSignals.uncached_fraction`) taken as
  h = (1 - u) n for every prompt, a busy replica computes `E[n] / (u E[n] x linear + u (2 - u)
  per_token_sq x E[n^2])` prompt tokens/s (cached ones included, the unit the engines' prompt-token
  counter and the queue are in), so a cache-friendly workload is not sized for tokens it never computes.
  At the TTFT target it may only be loaded to a utilisation `rho` that leaves room
  for queueing: with a prompt's service time `s` and the TTFT budget `T` (target less the KV
  transfer and the first decode step), `rho = clamp(1 - k * s / T, floor, cap)`, where `k` is the
  waiting time at the SLO's quantile in service times (knobs). Capacity at target = raw x rho.
- Decode: the largest batch whose step stays within `tpot_headroom x TPOT target` at the mean
  context (`perf.decode_batch_at_tpot`, capped by `--max-num-seqs`), and no more sequences than fill
  `kv_target_usage` of the replica's KV cache (`perf.kv_cache_tokens`); at that batch a replica
  generates `batch / step time` output tokens/s, of which it is loaded to `decode_utilisation_cap`
  (tokens/s flatten as the batch grows, so near that rate the batch, the TPOT and the KV cache
  in use swing widely; a full KV cache stops admissions and TTFT explodes).

The profile is the calibrated (or estimated) one for the model, the pool's GPU and the pool's TP: the
GPU its `gpuType` (GPU Feature Discovery's product label) maps to (`perf.profile_gpu`), else
`spec.autoscaling.gpu`, so a prefill pool on one GPU type and a decode pool on another are each sized
with their own profile; engine flags that change capacity (`--max-num-batched-tokens`, `--max-num-seqs`,
`--kv-cache-dtype`, `--gpu-memory-utilization`) are read from the pool's arguments. Capacities are
multiplied by the pool's learnt `capacity_correction` in `recommend.py`, not here.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.api.models import EngineType, PDDeploymentSpec, SLOSpec
from tandem.autoscale.knobs import Knobs
from tandem.perf import (
    Profile,
    ProfileNotFoundError,
    UnknownModelError,
    decode_batch_at_tpot,
    estimate_profile,
    kv_bytes_per_token,
    kv_cache_tokens,
    kv_transfer_seconds,
    model_arch,
    prefill_tokens_per_second,
    profile_gpu,
)
from tandem.perf.capacity import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
)
from tandem.perf.engine_args import COLOCATED_MAX_NUM_BATCHED_TOKENS, flag_values

FALLBACK_MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # what the sim engine simulates for unknown models
FALLBACK_GPU = "H100"


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The engine flags of one pool that change what a replica sustains."""

    max_num_batched_tokens: int
    max_num_seqs: int
    kv_cache_dtype: str
    gpu_memory_utilization: float


@dataclass(frozen=True, slots=True)
class PoolModel:
    """The profile a pool is sized with, and whether it had to fall back to a default model or GPU."""

    profile: Profile
    limits: EngineLimits
    kv_bytes_per_token: int
    fallback: bool


@dataclass(frozen=True, slots=True)
class PrefillCapacity:
    raw_tokens_per_second: float  # a busy replica, from the profile, over the prompt-length distribution
    utilisation: float  # share of it usable within the TTFT target
    service_seconds: float  # a prompt's mean busy time (E[n] / raw)

    @property
    def at_target(self) -> float:
        return self.raw_tokens_per_second * self.utilisation


@dataclass(frozen=True, slots=True)
class DecodeCapacity:
    batch_at_tpot: int  # sequences whose step stays within the TPOT target (and --max-num-seqs)
    kv_tokens: int  # KV-cache tokens of one replica
    context_tokens: float  # mean context per running sequence the figures assume
    kv_target_usage: float
    tokens_per_second: float  # output tokens/s of one replica running `sequences`

    @property
    def kv_sequences(self) -> float:
        return self.kv_tokens * self.kv_target_usage / max(self.context_tokens, 1.0)

    @property
    def sequences(self) -> float:
        """Running sequences one replica holds within both the TPOT target and the KV budget."""
        return max(0.0, min(float(self.batch_at_tpot), self.kv_sequences))


def _last_value(args: Sequence[str], flag: str) -> str | None:
    values = [v for v in flag_values(args, flag) if v is not None]
    return values[-1] if values else None


def _int_flag(args: Sequence[str], flag: str, default: int) -> int:
    value = _last_value(args, flag)
    try:
        return int(value) if value is not None and int(value) >= 1 else default
    except ValueError:
        return default


def engine_limits(spec: PDDeploymentSpec, role: str) -> EngineLimits:
    """The capacity-relevant flags of `role`'s engine: the user's (last one wins), else the defaults."""
    args = [*spec.engine.extra_args, *spec.pool(role).engine_args]
    default_budget = (
        COLOCATED_MAX_NUM_BATCHED_TOKENS if role == "colocated" else DEFAULT_MAX_NUM_BATCHED_TOKENS
    )
    utilisation = DEFAULT_GPU_MEMORY_UTILIZATION
    raw = _last_value(args, "--gpu-memory-utilization")
    if raw is not None:
        try:
            value = float(raw)
            utilisation = value if 0 < value <= 1 else utilisation
        except ValueError:
            pass
    max_seqs = _int_flag(args, "--max-num-seqs", DEFAULT_MAX_BATCH)
    return EngineLimits(
        max_num_batched_tokens=max(_int_flag(args, "--max-num-batched-tokens", default_budget), 1),
        max_num_seqs=max_seqs,
        kv_cache_dtype=_last_value(args, "--kv-cache-dtype") or "auto",
        gpu_memory_utilization=utilisation,
    )


def _sim_env(spec: PDDeploymentSpec, name: str) -> str | None:
    for var in spec.engine.env:
        if var.name == name and var.value:
            return var.value
    return None


@functools.lru_cache(maxsize=256)
def _load(
    candidates: tuple[str, ...], gpu: str, tp: int, kv_cache_dtype: str, time_scale: float
) -> tuple[Profile, int, bool]:
    model, fallback = FALLBACK_MODEL, True
    for candidate in candidates:
        try:
            model = model_arch(candidate).model_id
            fallback = False
            break
        except UnknownModelError:
            continue
    try:
        profile = estimate_profile(model, gpu, tp)
    except ProfileNotFoundError:
        profile, fallback = estimate_profile(model, FALLBACK_GPU, tp), True
    if kv_cache_dtype != "auto":
        with contextlib.suppress(KeyError, ValueError):
            profile = profile.with_kv_cache_dtype(kv_cache_dtype)
    if time_scale > 0:
        profile = profile.time_scaled(time_scale)
    per_token = kv_bytes_per_token(model) or 1
    return profile, per_token, fallback


def pool_gpu(spec: PDDeploymentSpec, role: str) -> tuple[str, bool]:
    """The profile GPU of `role`'s pool: the one its `gpuType` maps to, else `spec.autoscaling.gpu`; and
    whether a `gpuType` is set that maps to no profile GPU (then the pool is sized on the default)."""
    gpu_type = spec.pool(role).gpu_type
    if gpu_type is None:
        return spec.autoscaling.gpu, False
    mapped = profile_gpu(gpu_type)
    return (mapped, False) if mapped is not None else (spec.autoscaling.gpu, True)


def pool_model(spec: PDDeploymentSpec, role: str) -> PoolModel:
    """The profile for `role`: the model (sim engine: TANDEM_SIM_PERF_MODEL first) on the pool's GPU
    (`pool_gpu`) at the pool's TP; an unknown model or GPU, or a `gpuType` of no known GPU, falls back to
    a default (marked `fallback`).

    A sim engine runs the profile of TANDEM_SIM_GPU (if set; the operator renders the pool's GPU there) with
    every step time multiplied by TANDEM_SIM_TIME_SCALE, so its pods are sized by the profile they run."""
    candidates: list[str] = []
    gpu, unmapped = pool_gpu(spec, role)
    time_scale = 1.0
    if spec.engine.type is EngineType.sim:
        perf_model = _sim_env(spec, "TANDEM_SIM_PERF_MODEL")
        if perf_model:
            candidates.append(perf_model)
        gpu = _sim_env(spec, "TANDEM_SIM_GPU") or gpu
        with contextlib.suppress(TypeError, ValueError):
            time_scale = float(_sim_env(spec, "TANDEM_SIM_TIME_SCALE") or 1.0)
    candidates += [spec.model.uri, spec.model.name]
    limits = engine_limits(spec, role)
    profile, per_token, fallback = _load(
        tuple(candidates), gpu, spec.pool(role).tensor_parallel_size, limits.kv_cache_dtype, time_scale
    )
    return PoolModel(
        profile=profile, limits=limits, kv_bytes_per_token=per_token, fallback=fallback or unmapped
    )


def busy_prefill_tokens_per_second(
    profile: Profile,
    mean_prompt_tokens: float,
    second_moment: float,
    max_num_batched_tokens: int,
    uncached_fraction: float = 1.0,
) -> float:
    """Prompt tokens per second of busy time of one replica over prompts of mean `E[n]` and second moment
    `E[n^2]` (`second_moment`; below `E[n]^2`, e.g. 0 for unknown, it is taken as `E[n]^2`).

    A busy vLLM V1 replica fills every step with `max_num_batched_tokens` tokens, so each prompt token
    costs the linear time of a full step / budget, and a prompt of n tokens adds its attention
    `per_token_sq x n^2` however it is chunked (`perf.prefill_tokens_per_second`, at one length). Summed
    over the prompts: `E[n] / (E[n] x linear_per_token + per_token_sq x E[n^2])`. With a share
    `uncached_fraction` u of every prompt to compute (the rest cached), the linear part is u times and
    the attention part u (2 - u) times that (module docstring); tokens/s still count every prompt token.
    """
    if max_num_batched_tokens < 1:
        raise ValueError("max_num_batched_tokens must be >= 1")
    if not 0 < uncached_fraction <= 1:
        raise ValueError("uncached_fraction must be within (0, 1]")
    u = uncached_fraction
    mean = max(1.0, mean_prompt_tokens)
    moment = max(second_moment, mean * mean)
    linear_per_token = profile.prefill_linear_seconds(max_num_batched_tokens) / max_num_batched_tokens
    attention = profile.prefill_attention_seconds(0, 1) * moment  # per_token_sq x E[n^2], seconds
    busy = u * mean * linear_per_token + u * (2.0 - u) * attention
    return mean / busy if busy > 0 else math.inf


def prefill_capacity(
    model: PoolModel,
    slo: SLOSpec,
    mean_prompt_tokens: float,
    knobs: Knobs,
    *,
    transfer_gbps: float | None,
    prompt_second_moment: float = 0.0,
    uncached_fraction: float = 1.0,
    first_decode: Profile | None = None,
) -> PrefillCapacity:
    """Prompt tokens/s one replica computes busy, and the share of that usable within the TTFT target.

    `prompt_second_moment` is `E[n^2]` of the prompt lengths (0: unknown, every prompt taken at the
    mean). `transfer_gbps` is the KV link of a disaggregated prefill (None for colocated): the KV
    transfer of a prompt comes out of the TTFT budget, as does the first decode step.
    `uncached_fraction` (1: no prefix cache hits) is the share of prompt tokens computed; the rest is
    cached (`busy_prefill_tokens_per_second`). The transfer is still counted whole (conservative: a
    decode pod that caches the prefix pulls less). `first_decode` is the profile of the pool that runs
    the first decode step (a disaggregated prefill's decode pool, maybe on another GPU type; default
    this pool's own).
    """
    prompt = max(1, round(mean_prompt_tokens))
    budget_tokens = model.limits.max_num_batched_tokens
    if prompt_second_moment > prompt * prompt or uncached_fraction < 1.0:
        raw = busy_prefill_tokens_per_second(
            model.profile, prompt, prompt_second_moment, budget_tokens, uncached_fraction
        )
    else:
        raw = prefill_tokens_per_second(model.profile, prompt, budget_tokens)
    service = prompt / raw if raw > 0 else math.inf
    budget = slo.ttft_ms / 1000.0 - (first_decode or model.profile).decode_step_seconds(1, prompt)
    if transfer_gbps is not None:
        budget -= kv_transfer_seconds(prompt, model.kv_bytes_per_token, transfer_gbps)
    if budget <= 0 or not math.isfinite(service):
        rho = knobs.prefill_utilisation_floor
    else:
        rho = 1.0 - knobs.ttft_quantile_factor * service / budget
        rho = min(knobs.prefill_utilisation_cap, max(knobs.prefill_utilisation_floor, rho))
    return PrefillCapacity(raw_tokens_per_second=raw, utilisation=rho, service_seconds=service)


@functools.lru_cache(maxsize=4096)
def _batch_at_tpot(profile: Profile, tpot_seconds: float, context: int, max_batch: int) -> int:
    return decode_batch_at_tpot(profile, tpot_seconds, context, max_batch)


@functools.lru_cache(maxsize=256)
def _kv_tokens(profile: Profile, utilisation: float, kv_cache_dtype: str) -> int:
    return kv_cache_tokens(profile, gpu_memory_utilization=utilisation, kv_cache_dtype=kv_cache_dtype)


def decode_capacity(
    model: PoolModel,
    slo: SLOSpec,
    context_tokens: float,
    knobs: Knobs,
    *,
    headroom: float | None = None,
    tpot_scale: float = 1.0,
) -> DecodeCapacity:
    """Sequences one replica runs within `headroom x TPOT target / tpot_scale` and its KV budget.

    `headroom` defaults to `knobs.tpot_headroom` (the TPOT quantile runs above the mean step time);
    `tpot_scale` > 1 says steps run that much slower than the profile (used to learn the correction).
    The mean context is rounded to 64 tokens so that nearby windows share cached results.
    """
    context = max(64, 64 * round(context_tokens / 64))
    share = knobs.tpot_headroom if headroom is None else headroom
    tpot = slo.tpot_ms / 1000.0 * share / max(tpot_scale, 1e-6)
    batch = _batch_at_tpot(model.profile, round(tpot, 6), context, model.limits.max_num_seqs)
    kv = _kv_tokens(model.profile, model.limits.gpu_memory_utilization, model.limits.kv_cache_dtype)
    sequences = max(1, math.floor(min(float(batch), kv * knobs.kv_target_usage / context)))
    step = model.profile.decode_step_seconds(sequences, sequences * context) * max(tpot_scale, 1e-6)
    return DecodeCapacity(
        batch_at_tpot=batch,
        kv_tokens=kv,
        context_tokens=float(context),
        kv_target_usage=knobs.kv_target_usage,
        tokens_per_second=knobs.decode_utilisation_cap * sequences / step if step > 0 else 0.0,
    )
