"""A kit for autoscaler tests: specs, snapshots built from "replicas' worth" of load, and a fake clock.

Loads are expressed in replicas of capacity computed by `tandem.autoscale.capacity` from the same
profile `decide()` uses, so a test says "4.5 replicas of prompt tokens" and expects 5, without
hard-coding the profile's figures.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from tandem.api.models import PDDeploymentSpec
from tandem.api.status import AutoscalingStatus
from tandem.autoscale.capacity import decode_capacity, pool_model, prefill_capacity
from tandem.autoscale.decide import Decision, decide
from tandem.autoscale.knobs import KNOBS
from tandem.autoscale.snapshot import PathSignals, PoolSignals, PoolSize, Snapshot

PROMPT = 1000.0
OUTPUT = 200.0
T0 = 1_800_000_000.0  # the fake clock's start (unix seconds)

BASE_SPEC: dict[str, Any] = {
    "model": {"name": "llama", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
    "engine": {"image": "vllm/vllm-openai:v0.21.0"},
    "prefill": {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 16}},
    "decode": {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 16}},
    "slo": {"ttftMs": 500, "tpotMs": 50, "attainmentPercent": 95},
    "autoscaling": {
        "enabled": True,
        "intervalSeconds": 30,
        "scaleUp": {"stabilizationSeconds": 0, "maxStep": 4},
        "scaleDown": {"stabilizationSeconds": 300, "maxStep": 1},
    },
}


def merge(base: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Kit:
    spec: PDDeploymentSpec

    def with_spec(self, **patch: Any) -> Kit:
        return Kit(PDDeploymentSpec.model_validate(merge(BASE_SPEC, patch)))

    # Capacities of one replica, as decide() computes them (correction 1).
    @property
    def prompt_capacity(self) -> float:
        slo = self.spec.slo
        assert slo is not None
        model = pool_model(self.spec, "prefill")
        gbps = self.spec.kv_transfer.bandwidth_gbps
        return prefill_capacity(model, slo, PROMPT, KNOBS, transfer_gbps=gbps).at_target

    @property
    def prompt_raw(self) -> float:
        slo = self.spec.slo
        assert slo is not None
        model = pool_model(self.spec, "prefill")
        gbps = self.spec.kv_transfer.bandwidth_gbps
        return prefill_capacity(model, slo, PROMPT, KNOBS, transfer_gbps=gbps).raw_tokens_per_second

    @property
    def sequence_capacity(self) -> float:
        slo = self.spec.slo
        assert slo is not None
        return decode_capacity(pool_model(self.spec, "decode"), slo, PROMPT + OUTPUT / 2, KNOBS).sequences

    @property
    def kv_tokens(self) -> int:
        slo = self.spec.slo
        assert slo is not None
        return decode_capacity(pool_model(self.spec, "decode"), slo, PROMPT + OUTPUT / 2, KNOBS).kv_tokens

    def snapshot(
        self,
        now: float,
        *,
        sizes: Mapping[str, tuple[int, int]],
        prefill: float = 0.0,  # replicas' worth of prompt tokens/s (at the TTFT target)
        busy: float = 0.0,  # replicas computing prompt tokens flat out (the profile's raw rate), added
        queue: float = 0.0,  # replicas' worth of queued prompt tokens over one drain interval
        decode: float = 0.0,  # replicas' worth of running sequences
        waiting: float = 0.0,  # replicas' worth of waiting sequences on decode
        kv: float | None = None,  # mean KV usage; default: what the running sequences hold
        ttft: float | None = None,
        tpot: float | None = None,
        attainment: float = 1.0,
        request_rate: float | None = None,
        missing: tuple[str, ...] = (),
        age: float = 0.0,
        colocated: tuple[float, float] | None = None,  # (prefill, decode) replicas' worth
    ) -> Snapshot:
        drain = float(self.spec.autoscaling.interval_seconds)
        running = decode * self.sequence_capacity
        pools: dict[str, PoolSignals] = {}
        if "prefill" in sizes:
            ready = sizes["prefill"][1]
            queued = queue * self.prompt_capacity * drain
            pools["prefill"] = PoolSignals(
                scraped_pods=ready,
                prompt_tokens_rate=prefill * self.prompt_capacity + busy * self.prompt_raw,
                queued_prompt_tokens=queued,
                waiting_requests=queued / PROMPT,
                mean_prompt_tokens=PROMPT if prefill or busy else 0.0,
                mean_output_tokens=1.0 if prefill or busy else 0.0,
            )
        if "decode" in sizes:
            ready = sizes["decode"][1]
            usage = kv
            if usage is None:
                usage = running * (PROMPT + OUTPUT / 2) / (max(ready, 1) * self.kv_tokens)
            pools["decode"] = PoolSignals(
                scraped_pods=ready,
                running_requests=running,
                waiting_requests=waiting * self.sequence_capacity,
                kv_usage_mean=usage,
                kv_usage_max=usage,
                mean_prompt_tokens=PROMPT if running > 0 else 0.0,
                mean_output_tokens=OUTPUT if running > 0 else 0.0,
            )
        if "colocated" in sizes and colocated is not None:
            pools["colocated"] = PoolSignals(scraped_pods=sizes["colocated"][1])
        rate = request_rate if request_rate is not None else (10.0 if prefill or busy or decode else 0.0)
        path = PathSignals(
            request_rate=rate,
            within_slo_rate=rate * attainment,
            ttft_seconds=ttft,
            tpot_seconds=tpot,
        )
        return Snapshot(
            observed_at=now - age,
            window_seconds=60.0,
            sizes={role: PoolSize(replicas=r, ready=ready) for role, (r, ready) in sizes.items()},
            pools=pools,
            paths={"disaggregated": path},
            missing=missing,
        )


@pytest.fixture(scope="session")
def kit() -> Kit:
    return Kit(PDDeploymentSpec.model_validate(BASE_SPEC))


@dataclass
class Loop:
    """Runs decide() every interval on the fake clock, the cluster following the decisions at once."""

    kit: Kit
    now: float = T0
    state: AutoscalingStatus = field(default_factory=AutoscalingStatus)
    decisions: list[Decision] = field(default_factory=list)

    def size(self, role: str) -> int:
        desired = getattr(self.state.pools, role).desired_replicas
        return int(desired) if desired is not None else self.kit.spec.pool(role).replicas

    def step(self, *, paused: bool = False, **load: Any) -> Decision:
        sizes = {role: (self.size(role), self.size(role)) for role in ("prefill", "decode")}
        snapshot = self.kit.snapshot(self.now, sizes=load.pop("sizes", sizes), **load)
        decision = decide(self.kit.spec, snapshot, self.state, self.now, paused=paused)
        self.state = decision.state
        self.decisions.append(decision)
        self.now += self.kit.spec.autoscaling.interval_seconds
        return decision

    def run(self, seconds: float, **load: Any) -> Iterator[Decision]:
        end = self.now + seconds
        while self.now < end:
            yield self.step(**dict(load))


@pytest.fixture
def loop(kit: Kit) -> Loop:
    return Loop(kit)


@pytest.fixture(scope="session")
def make_loop() -> type[Loop]:
    return Loop
