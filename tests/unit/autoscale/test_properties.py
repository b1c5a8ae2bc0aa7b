"""Properties of decide() over random specs, states and snapshots (hypothesis)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tandem.api.models import AutoscalingMode, PDDeploymentSpec
from tandem.api.status import AutoscalingPoolsStatus, AutoscalingStatus, PoolAutoscalingStatus, Recommendation
from tandem.autoscale.bounds import autoscaled_roles
from tandem.autoscale.decide import current_size, decide
from tandem.autoscale.knobs import KNOBS
from tandem.signals import PathSignals, PoolSignals, PoolSize, Snapshot

T0 = 1_800_000_000.0
ROLES = ("prefill", "decode", "colocated")

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Case:
    spec: PDDeploymentSpec
    state: AutoscalingStatus
    snapshot: Snapshot
    now: float
    paused: bool


rates = st.floats(min_value=0, max_value=2e6, allow_nan=False)
counts = st.floats(min_value=0, max_value=5000, allow_nan=False)
usage = st.floats(min_value=0, max_value=1, allow_nan=False)


@st.composite
def pool_signals(draw: st.DrawFn, ready: int) -> PoolSignals:
    return PoolSignals(
        scraped_targets=draw(st.integers(0, ready)) if draw(st.booleans()) else ready,
        waiting_requests=draw(counts),
        running_requests=draw(counts),
        kv_usage_mean=draw(usage),
        kv_usage_max=draw(usage),
        prompt_tokens_rate=draw(rates),
        generation_tokens_rate=draw(rates),
        request_rate=draw(st.floats(0, 500)),
        queued_prompt_tokens=draw(st.floats(0, 5e6)),
        queued_prompt_tokens_before=draw(st.none() | st.floats(0, 5e6)),
        mean_prompt_tokens=draw(st.floats(0, 32000)),
        mean_output_tokens=draw(st.floats(0, 4000)),
    )


@st.composite
def path_signals(draw: st.DrawFn) -> PathSignals:
    rate = draw(st.floats(0, 500))
    return PathSignals(
        request_rate=rate,
        within_slo_rate=rate * draw(st.floats(0, 1)),
        ttft_seconds=draw(st.none() | st.floats(0.001, 300)),
        tpot_seconds=draw(st.none() | st.floats(0.001, 5)),
    )


@st.composite
def cases(draw: st.DrawFn, *, missing: bool | None = None) -> Case:
    spec_dict: dict[str, Any] = {
        "model": {
            "name": "llama",
            "uri": draw(
                st.sampled_from(
                    [
                        "hf://meta-llama/Llama-3.1-8B-Instruct",
                        "hf://meta-llama/Llama-3.1-70B-Instruct",
                        "hf://org/unknown-model",
                    ]
                )
            ),
        },
        "engine": {"image": "vllm/vllm-openai:v0.21.0"},
        "slo": {
            "ttftMs": draw(st.integers(50, 5000)),
            "tpotMs": draw(st.integers(5, 200)),
            "attainmentPercent": draw(st.sampled_from([90.0, 95.0, 99.0])),
        },
        "autoscaling": {
            "enabled": True,
            "mode": draw(st.sampled_from(["Active", "Active", "Advisory"])),
            "intervalSeconds": draw(st.sampled_from([10, 30, 60])),
            "scaleUp": {
                "stabilizationSeconds": draw(st.sampled_from([0, 0, 60])),
                "maxStep": draw(st.integers(1, 6)),
            },
            "scaleDown": {
                "stabilizationSeconds": draw(st.sampled_from([0, 120, 300])),
                "maxStep": draw(st.integers(1, 4)),
            },
        },
    }
    minimum_gpus = 0
    for role in ROLES:
        tp = draw(st.sampled_from([1, 2, 4, 8]))
        scaled = draw(st.booleans()) if role == "colocated" else draw(st.integers(0, 4)) > 0
        pool: dict[str, Any] = {"tensorParallelSize": tp}
        if scaled:
            low = draw(st.integers(1, 4))
            high = draw(st.integers(low, 12))
            replicas = draw(st.integers(low, high))
            external = draw(st.integers(0, 5)) == 0
            pool |= {
                "replicas": replicas,
                "autoscaling": {"minReplicas": low, "maxReplicas": high, "external": external},
            }
            minimum_gpus += max(low, replicas) * tp
        else:
            replicas = draw(st.integers(0 if role == "colocated" else 1, 3))
            pool |= {"replicas": replicas}
            minimum_gpus += replicas * tp
        spec_dict[role] = pool
    if draw(st.booleans()):
        spec_dict["maxGPUs"] = minimum_gpus + draw(st.integers(0, 40))
    try:
        spec = PDDeploymentSpec.model_validate(spec_dict)
    except ValidationError:
        # e.g. TP not dividing the model's heads; draw a simpler spec instead of failing the strategy.
        spec_dict["prefill"]["tensorParallelSize"] = spec_dict["decode"]["tensorParallelSize"] = 1
        spec_dict["colocated"]["tensorParallelSize"] = 1
        spec = PDDeploymentSpec.model_validate(spec_dict)

    now = T0 + draw(st.floats(0, 10_000))
    pools: dict[str, PoolAutoscalingStatus] = {}
    for role in ROLES:
        if draw(st.booleans()):
            history = draw(
                st.lists(
                    st.builds(
                        Recommendation,
                        time=st.floats(now - 2000, now),
                        replicas=st.integers(0, 20),
                    ),
                    max_size=20,
                )
            )
            pools[role] = PoolAutoscalingStatus(
                desired_replicas=draw(st.none() | st.integers(0, 20)),
                recommendations=sorted(history, key=lambda r: r.time),
                capacity_correction=draw(st.floats(KNOBS.correction_min, KNOBS.correction_max)),
            )
    state = AutoscalingStatus(mode="Active", last_evaluated=now - 30, pools=AutoscalingPoolsStatus(**pools))

    sizes: dict[str, PoolSize] = {}
    signals: dict[str, PoolSignals] = {}
    for role in ROLES:
        replicas = draw(st.integers(0, 20))
        ready = draw(st.integers(0, replicas))
        sizes[role] = PoolSize(replicas=replicas, ready=ready)
        signals[role] = draw(pool_signals(ready))
    has_missing = draw(st.booleans()) if missing is None else missing
    snapshot = Snapshot(
        observed_at=now - draw(st.floats(0, 60)),
        window_seconds=60,
        sizes=sizes,
        pools=signals,
        paths={"disaggregated": draw(path_signals()), "colocated": draw(path_signals())},
        missing=("prometheus: query failed",) if has_missing else (),
    )
    return Case(spec=spec, state=state, snapshot=snapshot, now=now, paused=draw(st.integers(0, 9)) == 0)


def run(case: Case) -> Any:
    return decide(case.spec, case.snapshot, case.state, case.now, paused=case.paused)


@PROPERTY_SETTINGS
@given(cases())
def test_targets_stay_within_min_and_max(case: Case) -> None:
    decision = run(case)
    for role, pool in decision.pools.items():
        bounds = case.spec.pool(role).autoscaling
        assert bounds is not None
        if decision.held:
            assert pool.target == pool.current
        else:
            assert bounds.min_replicas <= pool.target <= bounds.max_replicas


@PROPERTY_SETTINGS
@given(cases(missing=False))
def test_gpus_stay_within_max_gpus_when_the_minimums_fit(case: Case) -> None:
    decision = run(case)
    spec = case.spec
    if spec.max_gpus is None or decision.held:
        return
    roles = autoscaled_roles(spec)
    fixed = sum(
        case.snapshot.sizes[r].replicas * spec.pool(r).tensor_parallel_size for r in ROLES if r not in roles
    )
    minimums = sum(spec.pool(r).autoscaling.min_replicas * spec.pool(r).tensor_parallel_size for r in roles)  # type: ignore[union-attr]
    used = sum(decision.pools[r].target * spec.pool(r).tensor_parallel_size for r in roles)
    if fixed + minimums <= spec.max_gpus:
        assert fixed + used <= spec.max_gpus
    else:
        assert all(decision.pools[r].target == spec.pool(r).autoscaling.min_replicas for r in roles)  # type: ignore[union-attr]


@PROPERTY_SETTINGS
@given(cases(missing=True))
def test_no_data_changes_nothing(case: Case) -> None:
    decision = run(case)
    assert decision.held
    for role, pool in decision.pools.items():
        assert pool.target == pool.current == current_size(case.spec, case.state, role)
        new = getattr(decision.state.pools, role)
        assert new.desired_replicas == pool.current
        assert new.capacity_correction == getattr(case.state.pools, role).capacity_correction
    if decision.pools:
        assert decision.condition[1] in ("MetricsMissing", "Paused")


@PROPERTY_SETTINGS
@given(cases(missing=False))
def test_steps_never_exceed_max_step(case: Case) -> None:
    decision = run(case)
    rules = case.spec.autoscaling
    for role, pool in decision.pools.items():
        bounds = case.spec.pool(role).autoscaling
        assert bounds is not None
        if not bounds.min_replicas <= pool.current <= bounds.max_replicas:
            continue  # bounds changed under the pool: they win over steps
        if pool.limited_by != "maxGPUs":
            assert pool.current - pool.target <= rules.scale_down.max_step
        assert pool.target - pool.current <= rules.scale_up.max_step


@PROPERTY_SETTINGS
@given(cases())
def test_decide_is_deterministic_and_its_state_is_valid(case: Case) -> None:
    first, second = run(case), run(case)
    assert first == second
    AutoscalingStatus.model_validate(first.state.model_dump(by_alias=True))
    keep = max(
        case.spec.autoscaling.scale_up.stabilization_seconds,
        case.spec.autoscaling.scale_down.stabilization_seconds,
    )
    for role in first.pools:
        pool = getattr(first.state.pools, role)
        assert all(r.time <= case.now for r in pool.recommendations)
        assert sum(r.time < case.now - keep for r in pool.recommendations) <= 1  # the window's marker
        assert KNOBS.correction_min <= pool.capacity_correction <= KNOBS.correction_max
        assert math.isfinite(pool.capacity_correction)
        assert len(first.pools[role].figures) <= 32
        assert len(first.pools[role].reason) <= 1024
    assert first.state.last_evaluated == case.now


@PROPERTY_SETTINGS
@given(cases())
def test_advisory_and_pause_never_change_the_desired_size(case: Case) -> None:
    decision = run(case)
    if case.paused or case.spec.autoscaling.mode.value == "Advisory":
        for role, pool in decision.pools.items():
            assert getattr(decision.state.pools, role).desired_replicas == pool.current


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(missing=False))
def test_no_traffic_reaches_min_replicas_after_the_window(case: Case) -> None:
    """Fresh, all-zero snapshots with every pod ready: each pool ends at its minReplicas, never faster
    than the scale-down window allows."""
    spec = case.spec.model_copy(
        update={"autoscaling": case.spec.autoscaling.model_copy(update={"mode": AutoscalingMode.Active})}
    )
    state, now = case.state, case.now
    rules = spec.autoscaling
    roles = autoscaled_roles(spec)
    start = {role: current_size(spec, state, role) for role in roles}
    longest = max(
        (
            math.ceil(max(0, n - spec.pool(r).autoscaling.min_replicas) / rules.scale_down.max_step)
            for r, n in start.items()
        ),  # type: ignore[union-attr]
        default=0,
    )
    passes = math.ceil(rules.scale_down.stabilization_seconds / rules.interval_seconds) + longest + 2
    sizes = dict(start)
    first_down: dict[str, float] = {}
    for _ in range(passes):
        snapshot = Snapshot(
            observed_at=now,
            window_seconds=60,
            sizes={r: PoolSize(replicas=sizes.get(r, 0), ready=sizes.get(r, 0)) for r in ROLES},
            pools={r: PoolSignals(scraped_targets=sizes.get(r, 0)) for r in ROLES},
            paths={},
        )
        decision = decide(spec, snapshot, state, now)
        for role, pool in decision.pools.items():
            if pool.target < pool.current:
                first_down.setdefault(role, now)
            sizes[role] = pool.target
        state = decision.state
        now += rules.interval_seconds
    for role in roles:
        assert sizes[role] == spec.pool(role).autoscaling.min_replicas  # type: ignore[union-attr]
        if role in first_down:
            # A pool with no recommendations yet waits a whole window; one with a history may go sooner
            # only if that history was already low for the window.
            # A size above maxReplicas (the bound was lowered) goes down to it at once: bounds win.
            history = getattr(case.state.pools, role).recommendations
            above_max = start[role] > spec.pool(role).autoscaling.max_replicas  # type: ignore[union-attr]
            # So does a size the GPU budget cannot hold (maxGPUs wins over the windows too).
            start_gpus = sum(n * spec.pool(r).tensor_parallel_size for r, n in start.items())
            over_budget = spec.max_gpus is not None and start_gpus > spec.max_gpus
            if not history and not above_max and not over_budget:
                assert first_down[role] - case.now >= rules.scale_down.stabilization_seconds


@PROPERTY_SETTINGS
@given(cases(missing=False))
def test_a_missed_slo_never_shrinks_its_pool(case: Case) -> None:
    decision = run(case)
    if decision.held:
        return
    for pool in decision.pools.values():
        ratio = pool.figures.get("sloRatio")
        attainment = pool.figures.get("attainment")
        target = pool.figures["attainmentTarget"]
        missed = ratio is not None and ratio > 1 and attainment is not None and attainment < target
        if missed and pool.limited_by not in ("maxGPUs", "maxReplicas"):
            assert pool.target >= pool.current
