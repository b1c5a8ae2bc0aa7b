"""tandem's own autoscaler as a simulator policy: `autoscale.decide()` with its `AutoscalingStatus` carried
from one pass to the next, exactly as the operator carries it in `status.autoscaling`.

Every `spec.autoscaling.intervalSeconds` of virtual time the simulator hands over a `Snapshot` of its
windows; the policy calls `decide(spec, snapshot, state, now)`, keeps the returned state, and answers
each autoscaled pool's target (advisory mode and held passes answer nothing new: the sizes stay).
`decisions` keeps every pass that changed a size, with its reason, for reports and tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem.api.models import PDDeploymentSpec
from tandem.api.status import AutoscalingStatus, PoolAutoscalingStatus, Recommendation
from tandem.autoscale.bounds import autoscaled_roles, clamp
from tandem.autoscale.decide import Decision, decide
from tandem.autoscale.knobs import KNOBS, Knobs
from tandem.signals import Snapshot
from tandem.versions import VLLM_IMAGE

SEED_AGE_SECONDS = 0.001  # as controller.replicas: inside a scale-down window, outside a 0-s scale-up one


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    time: float
    role: str
    current: int
    target: int
    reason: str


@dataclass
class TandemPolicy:
    spec: PDDeploymentSpec
    knobs: Knobs = KNOBS
    state: AutoscalingStatus = field(default_factory=AutoscalingStatus)
    decisions: list[ScaleEvent] = field(default_factory=list)
    passes: int = 0
    held: int = 0
    last: Decision | None = None
    interval_seconds: float = 0.0  # set from spec.autoscaling.intervalSeconds

    def __post_init__(self) -> None:
        self.interval_seconds = float(self.spec.autoscaling.interval_seconds)

    def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
        if self.passes == 0:
            self.state = seeded_state(self.spec, self.state, now)
        decision = decide(self.spec, snapshot, self.state, now, knobs=self.knobs)
        self.state = decision.state
        self.last = decision
        self.passes += 1
        if decision.held:
            self.held += 1
            return {}
        if self.spec.autoscaling.mode.value == "Advisory":
            return {}
        wanted: dict[str, int] = {}
        for role, pool in decision.pools.items():
            if pool.target != pool.current:
                self.decisions.append(ScaleEvent(now, role, pool.current, pool.target, pool.reason))
            wanted[role] = pool.target
        return wanted


def seeded_state(spec: PDDeploymentSpec, state: AutoscalingStatus, now: float) -> AutoscalingStatus:
    """The state the operator starts from (`controller.replicas.prepare_state`): an autoscaled pool
    without a size starts at its spec size clamped to its bounds, which is also its first recommendation
    (just before `now`), as the HPA seeds its history, so the first scale-down waits a full window."""
    pools = {}
    for role in autoscaled_roles(spec):
        old: PoolAutoscalingStatus = getattr(state.pools, role)
        if old.desired_replicas is not None:
            continue
        bounds = spec.pool(role).autoscaling
        assert bounds is not None
        first = clamp(spec.pool(role).replicas, bounds)
        seed = [*old.recommendations, Recommendation(time=now - SEED_AGE_SECONDS, replicas=first)]
        pools[role] = old.model_copy(update={"desired_replicas": first, "recommendations": seed})
    if not pools:
        return state
    return state.model_copy(update={"pools": state.pools.model_copy(update=pools)})


def autoscaled_spec(
    model: str,
    *,
    ttft_ms: int,
    tpot_ms: int,
    max_gpus: int,
    initial: dict[str, int],
    gpu: str = "H100",
    tp: int = 1,
    attainment_percent: float = 95.0,
    interval_seconds: int = 30,
    bandwidth_gbps: int = 400,
    data: Mapping[str, int] | None = None,
) -> PDDeploymentSpec:
    """A PDDeployment spec with every pool in `initial` autoscaled within [1, maxGPUs / (TP x DP)] (the
    bench's and `tandem advise`'s starting point; the other knobs at their API defaults). `data`: a pool's
    data-parallel ranks per replica (`parallelism.data`, Internal balancing, one pod), 1 where not given."""
    colocated = "colocated" in initial
    pools: dict[str, dict[str, Any]] = {}
    for role in initial:
        ranks = (data or {}).get(role, 1)
        pools[role] = {
            "replicas": initial[role],
            "tensorParallelSize": tp,
            "autoscaling": {"minReplicas": 1, "maxReplicas": max(1, max_gpus // (tp * ranks))},
        }
        if ranks > 1:
            pools[role]["parallelism"] = {"data": ranks}
    return PDDeploymentSpec.model_validate(
        {
            "model": {"name": model.rsplit("/", 1)[-1].lower(), "uri": f"hf://{model}"},
            "engine": {"image": VLLM_IMAGE},
            "kvTransfer": {"bandwidthGbps": bandwidth_gbps},
            "serving": {"mode": "Colocated" if colocated else "Disaggregated"},
            "slo": {"ttftMs": ttft_ms, "tpotMs": tpot_ms, "attainmentPercent": attainment_percent},
            "maxGPUs": max_gpus,
            "autoscaling": {"enabled": True, "gpu": gpu, "intervalSeconds": interval_seconds},
            **pools,
        }
    )
