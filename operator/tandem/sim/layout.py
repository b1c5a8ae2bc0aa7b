"""What is simulated: pools of replicas (their profile, TP, KV capacity, batching limits), the SLO, the
router's path split, and the simulator's own settings. Frozen pydantic models, checked once up front.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.api.shape import Shape
from tandem.perf import Profile, kv_cache_tokens, model_arch
from tandem.perf.capacity import DEFAULT_MAX_BATCH, DEFAULT_MAX_NUM_BATCHED_TOKENS
from tandem.routing.disaggregation import DisaggregationKnobs
from tandem.routing.prefix import PrefixKnobs

Role = Literal["prefill", "decode", "colocated"]
# How the router picks the pod a request's prompt is computed on (prefill, or colocated): the live
# router's power-of-two choices; the least-loaded pod; round-robin; prefix-aware (`routing.prefix`'s
# choose_prefill, the router's code, with an index learnt from its own choices); the affinity oracle
# (the pod whose simulated cache holds the longest prefix of the prompt, ties to the least loaded:
# load otherwise ignored); the bounded oracle (choose_prefill with the simulated caches in place of the
# learnt index: the prefix-aware balancer with perfect knowledge). Decode pods are always picked by
# power-of-two choices.
Routing = Literal["power-of-two", "least-loaded", "round-robin", "prefix", "oracle", "oracle-bounded"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "colocated")

DEFAULT_MAX_NUM_SEQS = DEFAULT_MAX_BATCH  # vLLM's defaults on H100/H200, as the capacity model's


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
    # vLLM's --enable-prefix-caching (on by default in V1): only requests with `Request.prefix` can hit.
    enable_prefix_caching: bool = True
    # vLLM's --max-model-len: a longer request (prompt + output) is refused (vLLM's 400). None: no limit
    # beyond the KV cache (a real engine defaults to the model's context length).
    max_model_len: int | None = Field(default=None, gt=0)

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
        enable_prefix_caching: bool = True,
        max_model_len: int | None = None,
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
            enable_prefix_caching=enable_prefix_caching,
            max_model_len=max_model_len,
        )

    @model_validator(mode="after")
    def _batch_fits_budget(self) -> ReplicaSpec:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs (vLLM refuses otherwise)")
        return self


class PoolSpec(BaseModel):
    """A pool of identical replicas. A replica is a group of `shape.data` data-parallel ranks, each an
    engine as `replica` describes (its profile at the pool's TP); None: one engine, one rank (TP GPUs).
    The group's GPUs are `shape.gpus_per_instance` (TP x PP x DP), its router endpoints follow
    `shape.load_balancing` (`tandem.sim.group`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replica: ReplicaSpec
    replicas: int = Field(ge=0)  # at the start of the trace, ready (already loaded)
    shape: Shape | None = None

    @property
    def instance(self) -> Shape:
        """The replica's shape (`tandem.api.shape.Shape`): the one given, or one rank at the engine's TP."""
        return self.shape if self.shape is not None else Shape(tensor=self.replica.tp)

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica (group) holds: TP x PP x DP."""
        return self.instance.gpus_per_instance

    @model_validator(mode="after")
    def _shape_matches_engine(self) -> PoolSpec:
        if self.shape is not None and self.shape.tensor != self.replica.tp:
            raise ValueError(
                f"the shape's tensor parallelism ({self.shape.tensor}) is not the engine profile's "
                f"({self.replica.tp})"
            )
        return self


class SLO(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_ms: float = Field(gt=0)
    tpot_ms: float = Field(gt=0)
    quantile: float = Field(default=0.9, gt=0, le=1)  # what the windows report TTFT/TPOT at


class Layout(BaseModel):
    """Pools by role and how the router splits traffic between the two paths."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: dict[Role, PoolSpec]
    # Percent of requests meant for P/D (`routing.paths.disaggregated_share`): 100 = all P/D, 0 = colocated.
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
    routing: Routing = "power-of-two"
    prefix_knobs: PrefixKnobs = PrefixKnobs()  # the balancer's knobs when routing is "prefix"
    # spec.router.disaggregation: Always (every P/D request prefilled on a prefill replica), or
    # per request remote or on its decode replica (Threshold, Auto), as `routing.disaggregation.decide`
    disaggregation: DisaggregationKnobs = DisaggregationKnobs()
    # vLLM's bidirectional NIXL mode (`kv_connector_extra_config.bidirectional_kv_xfer` on both pools,
    # and a router that hands each turn the decode side's blocks, as vLLM's multi-turn proxy does): a
    # remote prefill first pulls from the decode replica the request goes to the prompt blocks that
    # replica holds beyond the prefill replica's cache, when they are at least `kv_recompute_threshold`
    # tokens (fewer: recomputed), then computes only the rest (`Cluster._pull_back`).
    bidirectional_kv: bool = False
    kv_recompute_threshold: int = Field(default=64, ge=0)
    # Tokens per router key in the simulator (the router hashes `block_chars` characters, about
    # block_chars / 4 tokens: 16 for the default 64). A multiple of 16.
    route_block_tokens: int = Field(default=16, ge=16, multiple_of=16)
