"""Shared builders for the simulator's tests (`kit`): the 8B H100 TP1 profile, replicas and layouts."""

from __future__ import annotations

import pytest

from tandem.perf import Profile, load_profile
from tandem.sim import SLO, Layout, PoolSpec, ReplicaSpec, SimConfig

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
KV_PER_TOKEN_TP1 = 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B: K and V, 32 layers, 8 KV heads, 128 dims, bf16


class SimKit:
    def __init__(self) -> None:
        self.profile: Profile = load_profile(LLAMA_8B, "H100", 1)

    def spec(
        self, cap: int = 450_000, seqs: int = 1024, batched: int = 8192, bandwidth: float = 400.0
    ) -> ReplicaSpec:
        return ReplicaSpec(
            profile=self.profile,
            kv_capacity_tokens=cap,
            max_num_seqs=seqs,
            max_num_batched_tokens=batched,
            kv_bandwidth_gbps=bandwidth,
            kv_bytes_per_token_per_gpu=KV_PER_TOKEN_TP1,
        )

    def pd(
        self, replica: ReplicaSpec | None = None, prefill: int = 1, decode: int = 1, load: float = 120.0
    ) -> Layout:
        replica = replica or self.spec()
        return Layout(
            pools={
                "prefill": PoolSpec(replica=replica, replicas=prefill),
                "decode": PoolSpec(replica=replica, replicas=decode),
            },
            model_load_seconds=load,
        )

    def colocated(self, replica: ReplicaSpec | None = None, replicas: int = 1, load: float = 120.0) -> Layout:
        replica = replica or self.spec()
        return Layout(
            pools={"colocated": PoolSpec(replica=replica, replicas=replicas)}, model_load_seconds=load
        )

    def config(
        self, closed_form: bool = True, ttft_ms: float = 1000.0, tpot_ms: float = 50.0, seed: int = 0
    ) -> SimConfig:
        return SimConfig(slo=SLO(ttft_ms=ttft_ms, tpot_ms=tpot_ms), closed_form=closed_form, seed=seed)


@pytest.fixture
def kit() -> SimKit:
    return SimKit()
