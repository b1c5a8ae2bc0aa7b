"""What is simulated: pools of replicas (their profile, TP, KV capacity, batching limits), the SLO, the
router's path split, and the simulator's own settings. Frozen pydantic models, checked once up front.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.perf import Profile, kv_cache_tokens, model_arch

Role = Literal["prefill", "decode", "colocated"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "colocated")

DEFAULT_MAX_NUM_SEQS = 1024  # vLLM's default on H100/H200
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


class ReplicaSpec(BaseModel):
    """One replica of a pool: a vLLM engine on `profile.tensor_parallel_size` GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: Profile
    kv_capacity_tokens: int = Field(gt=0)
    max_num_seqs: int = Field(default=DEFAULT_MAX_NUM_SEQS, ge=1)
    max_num_batched_tokens: int = Field(default=DEFAULT_MAX_NUM_BATCHED_TOKENS, ge=1)
    # KV transfer: each TP rank moves its own slice over its own NIC at this line rate (as the sim engine).
    kv_bandwidth_gbps: float = Field(default=400.0, gt=0)
    kv_bytes_per_token_per_gpu: int = Field(gt=0)

    @property
    def tp(self) -> int:
        return self.profile.tensor_parallel_size

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        *,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        kv_bandwidth_gbps: float = 400.0,
        gpu_memory_utilization: float = 0.9,
    ) -> ReplicaSpec:
        """A replica with vLLM's KV capacity for this profile (`tandem.perf.kv_cache_tokens`)."""
        arch = model_arch(profile.model)
        tokens = kv_cache_tokens(profile, gpu_memory_utilization=gpu_memory_utilization)
        if tokens <= 0:
            raise ValueError(
                f"{profile.model} does not fit on {profile.gpu} at TP{profile.tensor_parallel_size}"
            )
        return cls(
            profile=profile,
            kv_capacity_tokens=tokens,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_bandwidth_gbps=kv_bandwidth_gbps,
            kv_bytes_per_token_per_gpu=arch.kv_bytes_per_token_per_gpu(profile.tensor_parallel_size),
        )

    @model_validator(mode="after")
    def _batch_fits_budget(self) -> ReplicaSpec:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs (vLLM refuses otherwise)")
        return self


class PoolSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    replica: ReplicaSpec
    replicas: int = Field(ge=0)  # at the start of the trace, ready (already loaded)


class SLO(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_ms: float = Field(gt=0)
    tpot_ms: float = Field(gt=0)
    quantile: float = Field(default=0.9, gt=0, le=1)  # what the windows report TTFT/TPOT at


class Layout(BaseModel):
    """Pools by role and how the router splits traffic between the two paths."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: dict[Role, PoolSpec]
    # Percent of requests meant for P/D (`router.paths.disaggregated_share`): 100 = all P/D, 0 = colocated.
    disaggregated_percent: int = Field(default=100, ge=0, le=100)
    colocated_fallback: bool = True  # P/D wanted but no ready prefill or decode pod: serve colocated
    model_load_seconds: float = Field(default=120.0, ge=0)  # a requested replica becomes ready after this

    @model_validator(mode="after")
    def _pd_pools_come_in_pairs(self) -> Layout:
        if ("prefill" in self.pools) != ("decode" in self.pools):
            raise ValueError("a layout has both a prefill and a decode pool, or neither")
        if not self.pools:
            raise ValueError("a layout needs at least one pool")
        return self


class SimConfig(BaseModel):
    """The simulator's own settings (none of them changes what a replica does)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    slo: SLO
    scrape_interval_seconds: float = Field(default=15.0, gt=0)  # gauges sampled, counters snapshotted
    window_seconds: float = Field(default=60.0, gt=0)  # what rates and quantiles are computed over
    seed: int = 0  # the router's random choices (path draw, power-of-two pod choice)
    # Decode steps in closed form between composition changes; False steps one at a time (the reference
    # the closed form is tested against; same results, much slower).
    closed_form: bool = True
