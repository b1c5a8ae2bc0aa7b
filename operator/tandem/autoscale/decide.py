"""`decide(spec, snapshot, state, now) -> Decision`: one pass of the SLO autoscaler, pure.

Per autoscaled pool (`spec.<pool>.autoscaling` set, not `external`), in this order:
1. the raw recommendation from the load at the SLO (`recommend.py`);
2. a partial view (fewer pods report than are ready, or no pod is ready yet) forbids scaling
   down this pass;
3. the dead band (`stabilize.within_dead_band`; a scale-up only while the pool is comfortably within
   its SLO), then `[minReplicas, maxReplicas]`;
4. the stabilization windows over the recorded recommendations (a descent, `stabilize.fell_for_good`,
   has the shorter `scaleDown.descentStabilizationSeconds`), then the step limits, then the bounds
   again (bounds win over steps);
5. `spec.maxGPUs` arbitration between the pools by SLO deficit (`budget.py`).
`PoolDecision.limited_by` names the last stage that changed the size.

No data (the snapshot lists something `missing`, is older than `stale_intervals` decision
intervals, has non-finite figures, or a pool with ready pods has no scraped pod) holds every size
and says why; a pause holds every size too. Both record the current size as the pass's
recommendation, so a scale-down after them waits for a full window. No traffic (fresh, zero rates)
is data: recommendations fall to `minReplicas` and the scale-down window and step apply.
Advisory mode computes everything from the spec's sizes (what the operator runs in that mode),
reports the target, and writes the spec's size as `desired_replicas`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Literal

from tandem.api.models import AutoscalingMode, PDDeploymentSpec, PoolAutoscaling
from tandem.api.status import (
    AutoscalingPoolsStatus,
    AutoscalingStatus,
    ForecastStatus,
    PoolAutoscalingStatus,
    Recommendation,
    ScaleDecision,
)
from tandem.api.times import rfc3339 as _rfc3339
from tandem.autoscale import forecast as forecasting
from tandem.autoscale import stabilize
from tandem.autoscale.attribution import Attribution
from tandem.autoscale.bounds import autoscaled_roles
from tandem.autoscale.bounds import clamp as _clamp
from tandem.autoscale.budget import Claim, arbitrate
from tandem.autoscale.knobs import KNOBS, Knobs
from tandem.autoscale.recommend import ROLES, Forecast, Sizing, fmt, recommend, ttft_attribution
from tandem.signals import PATH_DISAGGREGATED, Snapshot

LimitedBy = Literal["maxGPUs", "maxReplicas", "minReplicas", "maxStep", "stabilization", "deadBand"]
ConditionTuple = tuple[Literal["True", "False"], str, str]
MAX_REASON = 1024


@dataclass(frozen=True, slots=True)
class PoolDecision:
    role: str
    current: int
    target: int  # what the autoscaler would set now
    recommendation: int  # raw, before dead band, bounds, stabilization, steps and budget
    reason: str  # one sentence with the figures
    figures: Mapping[str, float]  # the numbers used (<= 32 keys, camelCase)
    limited_by: LimitedBy | None
    # what the pool's own SLO miss was charged to ("tpot", a TTFT part: `autoscale.attribution`), "load"
    # when the capacity model alone decided; None when held
    cause: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    pools: Mapping[str, PoolDecision]  # every autoscaled pool
    state: AutoscalingStatus  # to write to status.autoscaling
    condition: ConditionTuple  # AutoscalingActive: (status, reason, message)
    held: bool  # no size may change this pass (no data, paused, or not configured)


def _bounds(spec: PDDeploymentSpec, role: str) -> PoolAutoscaling:
    bounds = spec.pool(role).autoscaling
    assert bounds is not None
    return bounds


def current_size(spec: PDDeploymentSpec, state: AutoscalingStatus, role: str) -> int:
    """The size `role` runs at: the autoscaler's last desired size, else the spec's clamped to the bounds.
    In Advisory mode the operator sizes pools from the spec, so the spec's size is the current one."""
    desired = _pool_state(state, role).desired_replicas
    if desired is not None and spec.autoscaling.mode is not AutoscalingMode.Advisory:
        return desired
    return _clamp(spec.pool(role).replicas, _bounds(spec, role))


def _pool_state(state: AutoscalingStatus, role: str) -> PoolAutoscalingStatus:
    pool: PoolAutoscalingStatus = getattr(state.pools, role)
    return pool


def _no_data(
    spec: PDDeploymentSpec, snapshot: Snapshot, roles: list[str], now: float, knobs: Knobs
) -> list[str]:
    """Why this snapshot cannot be trusted (empty: it can)."""
    problems = list(snapshot.missing)
    age = now - snapshot.observed_at
    stale_after = knobs.stale_intervals * spec.autoscaling.interval_seconds
    if not math.isfinite(age) or age > stale_after:
        problems.append(f"metrics are {fmt(age)} s old (stale after {fmt(stale_after)} s)")
    for name, group in (("pool", snapshot.pools), ("path", snapshot.paths)):
        for key, signals in group.items():
            for field in fields(signals):
                value = getattr(signals, field.name)
                if isinstance(value, float) and not math.isfinite(value):
                    problems.append(f"{name} {key}: {field.name} is {value}")
    for role in roles:
        size = snapshot.sizes.get(role)
        if size is None:
            problems.append(f"no size for {role}")
            continue
        if size.ready > 0 and (role not in snapshot.pools or snapshot.pools[role].scraped_targets == 0):
            problems.append(f"none of the {size.ready} ready {role} pods has fresh metrics")
    return problems


def _limit_text(
    limited_by: LimitedBy | None, target: int, spec: PDDeploymentSpec, bounds: PoolAutoscaling, knobs: Knobs
) -> str:
    rules = spec.autoscaling
    if limited_by is None:
        return ""
    return {
        "deadBand": f"; within the {knobs.dead_band:.0%} dead band: hold {target}",
        "minReplicas": f"; at minReplicas {bounds.min_replicas}",
        "maxReplicas": f"; capped at maxReplicas {bounds.max_replicas}",
        "stabilization": (
            f"; {target} by the stabilization windows (down {rules.scale_down.stabilization_seconds} s, "
            f"up {rules.scale_up.stabilization_seconds} s)"
        ),
        "maxStep": f"; {target} by the step limits (+{rules.scale_up.max_step}/-{rules.scale_down.max_step})",
        "maxGPUs": f"; {target} within maxGPUs {spec.max_gpus}",
    }[limited_by]


@dataclass(frozen=True, slots=True)
class _Stage:
    value: int
    limited_by: LimitedBy | None


def _shape(
    sizing: Sizing, current: int, bounds: PoolAutoscaling, partial: bool, knobs: Knobs
) -> tuple[int, LimitedBy | None]:
    """Dead band and bounds: the value recorded in the windows."""
    value = sizing.replicas
    limited_by: LimitedBy | None = None
    if partial and value < current:
        value = current
    if (
        value != current
        and (sizing.slo_floor is None or sizing.slo_floor <= current)
        and stabilize.within_dead_band(sizing.exact, current, knobs.dead_band)
        and not (
            knobs.dead_band_up_needs_comfort
            and value > current
            and sizing.figures.get("sloRatio", 0.0) >= knobs.comfortable_ratio
        )
    ):
        value, limited_by = current, "deadBand"
    bounded = _clamp(value, bounds)
    if bounded != value:
        limited_by = "maxReplicas" if bounded < value else "minReplicas"
    return bounded, limited_by


def decide(
    spec: PDDeploymentSpec,
    snapshot: Snapshot,
    state: AutoscalingStatus,
    now: float,
    *,
    paused: bool = False,
    knobs: Knobs = KNOBS,
) -> Decision:
    """One decision pass (see the module docstring). Pure: `now` is the only clock."""
    roles = autoscaled_roles(spec)
    mode = "Paused" if paused else spec.autoscaling.mode.value
    if not spec.autoscaling.enabled:
        return _inactive(state, now, "Disabled", ("False", "Disabled", "spec.autoscaling.enabled is false"))
    if spec.slo is None:
        return _inactive(
            state, now, mode, ("False", "NoSLO", "autoscaling needs spec.slo (TTFT and TPOT targets)")
        )
    if not roles:
        message = "no pool has autoscaling bounds (or every one is external)"
        return _inactive(state, now, mode, ("False", "NoAutoscaledPools", message))
    currents = {role: current_size(spec, state, role) for role in roles}
    problems = _no_data(spec, snapshot, roles, now, knobs)
    if problems or paused:
        return _hold(spec, state, now, mode, currents, problems, paused)
    return _active(spec, snapshot, state, now, currents, knobs)


def _inactive(state: AutoscalingStatus, now: float, mode: str, condition: ConditionTuple) -> Decision:
    new_state = state.model_copy(update={"mode": mode, "last_evaluated": now})
    return Decision(pools={}, state=new_state, condition=condition, held=True)


def _keep_seconds(spec: PDDeploymentSpec) -> float:
    rules = spec.autoscaling
    return float(max(rules.scale_up.stabilization_seconds, rules.scale_down.stabilization_seconds))


def _descent_seconds(spec: PDDeploymentSpec, knobs: Knobs) -> float:
    """The scale-down window of a descent (`stabilize.fell_for_good`): the spec's, else a share of the
    scale-down window."""
    rules = spec.autoscaling.scale_down
    if rules.descent_stabilization_seconds is not None:
        return float(rules.descent_stabilization_seconds)
    return knobs.descent_window_share * rules.stabilization_seconds


def _pool_status(
    old: PoolAutoscalingStatus,
    *,
    desired: int,
    decision: ScaleDecision | None,
    scaled: bool,
    now: float,
    history: list[Recommendation],
    correction: float,
    forecast: ForecastStatus | None = None,
) -> PoolAutoscalingStatus:
    return PoolAutoscalingStatus(
        desired_replicas=desired,
        last_decision=decision or old.last_decision,
        last_scale_time=now if scaled else old.last_scale_time,
        recommendations=history,
        capacity_correction=correction,
        draining=old.draining,
        forecast=forecast,
    )


def _scale_decision(
    now: float,
    current: int,
    target: int,
    reason: str,
    figures: Mapping[str, float],
    cause: str | None = None,
) -> ScaleDecision:
    return ScaleDecision(
        time=_rfc3339(now),
        from_replicas=current,
        to=target,
        reason=reason[:MAX_REASON],
        figures=dict(list(figures.items())[:32]),
        cause=cause,
    )


def _new_state(
    state: AutoscalingStatus, now: float, mode: str, updates: Mapping[str, PoolAutoscalingStatus]
) -> AutoscalingStatus:
    pools = {role: updates.get(role, _pool_state(state, role)) for role in ROLES}
    return AutoscalingStatus(mode=mode, last_evaluated=now, pools=AutoscalingPoolsStatus(**pools))


def _hold(
    spec: PDDeploymentSpec,
    state: AutoscalingStatus,
    now: float,
    mode: str,
    currents: Mapping[str, int],
    problems: list[str],
    paused: bool,
) -> Decision:
    why = "paused" if paused else "no data: " + "; ".join(problems)
    pools: dict[str, PoolDecision] = {}
    updates: dict[str, PoolAutoscalingStatus] = {}
    for role, current in currents.items():
        old = _pool_state(state, role)
        reason = f"{why}; holding {current} replicas"
        figures = {"current": float(current)}
        pools[role] = PoolDecision(
            role=role,
            current=current,
            target=current,
            recommendation=current,
            reason=reason,
            figures=figures,
            limited_by=None,
        )
        first = old.last_decision is None
        updates[role] = _pool_status(
            old,
            desired=current,
            decision=_scale_decision(now, current, current, reason, figures) if first else None,
            scaled=False,
            now=now,
            history=stabilize.record(old.recommendations, now, current, _keep_seconds(spec)),
            correction=old.capacity_correction,
            forecast=old.forecast if spec.autoscaling.forecast.enabled else None,
        )
    sizes = ", ".join(f"{role} {current}" for role, current in currents.items())
    if paused:
        condition: ConditionTuple = ("False", "Paused", f"autoscaling is paused; holding {sizes}")
    else:
        condition = ("False", "MetricsMissing", f"{why}; holding {sizes} (never scaling down without data)")
    return Decision(pools=pools, state=_new_state(state, now, mode, updates), condition=condition, held=True)


def _active(
    spec: PDDeploymentSpec,
    snapshot: Snapshot,
    state: AutoscalingStatus,
    now: float,
    currents: Mapping[str, int],
    knobs: Knobs,
) -> Decision:
    rules = spec.autoscaling
    advisory = rules.mode is AutoscalingMode.Advisory
    keep = _keep_seconds(spec)
    full_down = float(rules.scale_down.stabilization_seconds)
    descent = _descent_seconds(spec, knobs)
    sizings: dict[str, Sizing] = {}
    stepped: dict[str, _Stage] = {}
    histories: dict[str, list[Recommendation]] = {}
    partials: dict[str, bool] = {}
    # One TTFT attribution per pass: prefill, decode and the condition read the same one.
    pd_roles = {"prefill", "decode"} & set(currents)
    attribution = ttft_attribution(spec, snapshot, knobs) if pd_roles else None
    forecasts: dict[str, ForecastStatus | None] = {}
    short_down: dict[str, str] = {}
    for role, current in currents.items():
        old = _pool_state(state, role)
        bounds = _bounds(spec, role)
        last_up = old.last_scale_time
        watched = _watch_starting(spec, old.forecast, snapshot, role, now)
        ahead = _forecast_ahead(spec, watched, now, knobs)
        sizing = recommend(
            spec,
            role,
            snapshot,
            current,
            old.capacity_correction,
            knobs,
            attribution=attribution,
            scaled_up_within_window=(
                last_up is not None
                and now - last_up < 2 * snapshot.window_seconds
                and old.last_decision is not None
                and old.last_decision.to > old.last_decision.from_replicas
            ),
            forecast=ahead,
        )
        sizings[role] = sizing
        down_seconds = full_down
        forecasts[role] = None
        if watched is not None:
            updated = forecasting.update(
                watched, sizing.demand, now, rules.forecast.season_period_seconds, knobs
            )
            forecasts[role] = updated
            skipped = down_seconds * (1.0 - knobs.forecast_down_share)
            shorter = _forecast_down_seconds(watched, updated, sizing.demand, now, ahead, skipped, knobs)
            if shorter is not None:
                short_down[role] = shorter
                down_seconds *= knobs.forecast_down_share
        signals = snapshot.pools.get(role)
        size = snapshot.sizes[role]
        # Fewer scrape targets report than the ready replicas have (a silent pod, or a silent rank's
        # port), or every pod is still loading: the load is not all seen.
        reporting = spec.pool(role).shape.metrics_targets  # scrape targets of a replica
        partials[role] = (signals is not None and 0 < signals.scraped_targets < size.ready * reporting) or (
            size.ready == 0 and size.replicas > 0
        )
        recorded, limited_by = _shape(sizing, current, bounds, partials[role], knobs)
        history = stabilize.record(old.recommendations, now, recorded, keep)
        histories[role] = history
        if descent < down_seconds:
            level = stabilize.stabilized(history, now, current, rules.scale_up.stabilization_seconds, descent)
            if level < current and stabilize.fell_for_good(history, now, full_down, level):
                down_seconds = descent
                short_down[role] = (
                    f"; no recommendation came back above {level} within {fmt(full_down)} s: "
                    f"the descent's scale-down window, {fmt(descent)} s"
                )
        value = stabilize.stabilized(
            history, now, current, rules.scale_up.stabilization_seconds, down_seconds
        )
        if role in short_down and value >= stabilize.stabilized(
            history, now, current, rules.scale_up.stabilization_seconds, full_down
        ):
            del short_down[role]  # the shorter window changed nothing: no need to say so
        if value != recorded:
            limited_by = "stabilization"
        limited = stabilize.limit_step(value, current, rules.scale_up.max_step, rules.scale_down.max_step)
        if limited != value:
            limited_by = "maxStep"
        bounded = _clamp(limited, bounds)
        if bounded != limited:
            limited_by = "maxReplicas" if bounded < limited else "minReplicas"
        stepped[role] = _Stage(bounded, limited_by)

    targets = {role: stage.value for role, stage in stepped.items()}
    budget_note = ""
    if spec.max_gpus is not None:
        fixed = _fixed_gpus(spec, snapshot, list(currents))
        claims = [
            Claim(
                role=role,
                wanted=targets[role],
                current=max(currents[role], _running(spec, state, role)),
                min_replicas=_bounds(spec, role).min_replicas,
                gpus_per_replica=spec.pool(role).gpus_per_instance,
                deficit=sizings[role].deficit,
            )
            for role in currents
        ]
        # Pods still draining hold their GPUs: reserve them for every pool whose drain goes on (its
        # size stays at or below the drain's target); the reserve only grows, so this settles.
        draining, granted = 0, dict(targets)
        for _ in range(len(currents) + 1):
            draining = _draining_gpus(spec, state, granted)
            available = spec.max_gpus - fixed - draining
            granted = arbitrate(claims, available)
            if _draining_gpus(spec, state, granted) <= draining:
                break
        minimums = sum(c.min_replicas * c.gpus_per_replica for c in claims)
        if minimums > available:
            budget_note = (
                f"the minimums need {minimums} GPUs but maxGPUs {spec.max_gpus} leaves {available} "
                f"after {fixed} GPUs of other pools and {draining} of draining pods"
            )
        for role, value in granted.items():
            if value != targets[role]:
                targets[role] = value
                stepped[role] = _Stage(value, "maxGPUs")

    pools: dict[str, PoolDecision] = {}
    updates: dict[str, PoolAutoscalingStatus] = {}
    for role, current in currents.items():
        sizing, stage, target = sizings[role], stepped[role], targets[role]
        bounds = _bounds(spec, role)
        reason = sizing.reason
        if partials[role] and sizing.replicas < current:
            reason += "; not every pod reports (or none is ready yet): no scale-down"
        reason += _limit_text(stage.limited_by, target, spec, bounds, knobs)
        if role in short_down:
            reason += short_down[role]
        if target != current:
            reason += f"; {current} -> {target}"
        reason = reason[:MAX_REASON]
        figures = dict(sizing.figures)
        cause = sizing.slo_cause or "load"
        pools[role] = PoolDecision(
            role=role,
            current=current,
            target=target,
            recommendation=sizing.replicas,
            reason=reason,
            figures=figures,
            limited_by=stage.limited_by,
            cause=cause,
        )
        old = _pool_state(state, role)
        record_decision = target != current or old.last_decision is None
        updates[role] = _pool_status(
            old,
            desired=current if advisory else target,
            decision=(
                _scale_decision(now, current, target, reason, figures, cause) if record_decision else None
            ),
            scaled=not advisory and target != current,
            now=now,
            history=histories[role],
            correction=sizing.correction,
            forecast=forecasts[role],
        )
    kv_note = _kv_note(spec, snapshot, currents, attribution) if attribution is not None else ""
    condition = _condition(spec, pools, advisory, budget_note, kv_note)
    new_state = _new_state(state, now, rules.mode.value, updates)
    return Decision(pools=pools, state=new_state, condition=condition, held=False)


def _watch_starting(
    spec: PDDeploymentSpec, state: ForecastStatus | None, snapshot: Snapshot, role: str, now: float
) -> ForecastStatus | None:
    """The forecast's state with this pass's starting pods seen (None: the forecast is off)."""
    if not spec.autoscaling.forecast.enabled:
        return None
    size = snapshot.sizes.get(role)
    starting = max(0, size.replicas - size.ready) if size is not None else 0
    return forecasting.observe_starting(state, starting, now)


def _forecast_ahead(
    spec: PDDeploymentSpec, state: ForecastStatus | None, now: float, knobs: Knobs
) -> Forecast | None:
    """The pool's demand one model load ahead (its measured start-to-ready time, else the spec's
    horizon), from the forecast's state before this pass's demand (None: off, or nothing seen yet)."""
    if state is None:
        return None
    horizon = forecasting.horizon(state, float(spec.autoscaling.forecast.horizon_seconds))
    predicted = forecasting.predict(state, now, horizon, knobs)
    return None if predicted is None else Forecast(demand=predicted, horizon_seconds=horizon)


def _forecast_down_seconds(
    before: ForecastStatus | None,
    after: ForecastStatus,
    measured: float,
    now: float,
    ahead: Forecast | None,
    skipped: float,
    knobs: Knobs,
) -> str | None:
    """Why the scale-down window may be shortened this pass (None: it may not): the forecast made
    for now agreed with the measured demand within `forecast_agree_tolerance`, and the forecast over
    the part of the window skipped (at least one model load ahead) is no higher than that tolerance
    above it: a load the profile expects back within the window keeps its pods."""
    expected = forecasting.predict(before, now, 0.0, knobs)
    tolerance = knobs.forecast_agree_tolerance
    if expected is None or ahead is None or measured <= 0:
        return None
    if abs(expected - measured) > tolerance * measured:
        return None
    horizon = max(ahead.horizon_seconds, skipped)
    # the highest of the forecasts one load ahead, half-way through and at the end of the skipped part
    points = [
        forecasting.predict(after, now, h, knobs) for h in (ahead.horizon_seconds, horizon / 2, horizon)
    ]
    next_load = max((p for p in points if p is not None), default=None)
    if next_load is None or next_load > (1 + tolerance) * measured:
        return None
    return (
        f"; forecast {fmt(expected)}/s agreed with the {fmt(measured)}/s measured and stays at "
        f"{fmt(next_load)}/s for the next {fmt(horizon)} s: scale-down window "
        f"x{knobs.forecast_down_share:g}"
    )


def _drained(spec: PDDeploymentSpec, role: str, pods: int) -> int:
    """Replicas a drain of `pods` pods empties: the pods, or for a multi-node pool its groups (a drain
    names every pod of each group it empties, `nodesPerInstance` of them)."""
    return -(-pods // max(spec.pool(role).nodes_per_instance, 1))


def _running(spec: PDDeploymentSpec, state: AutoscalingStatus, role: str) -> int:
    """Replicas a pool's workload still has: its drain's target plus the replicas being drained."""
    drain = _pool_state(state, role).draining
    if drain is None:
        return 0
    return drain.target_replicas + _drained(spec, role, len(drain.pods or [drain.pod]))


def _draining_gpus(spec: PDDeploymentSpec, state: AutoscalingStatus, targets: Mapping[str, int]) -> int:
    """GPUs of replicas still draining (whole groups): their workload keeps them until they are idle,
    so the budget cannot lend them to another pool yet. A pool whose target is above its drain's
    target cancels the drain (the operator keeps those pods in service), so its own claim covers them."""
    total = 0
    for role, target in targets.items():
        drain = _pool_state(state, role).draining
        if drain is not None and target <= drain.target_replicas:
            drained = _drained(spec, role, len(drain.pods or [drain.pod]))
            total += drained * spec.pool(role).gpus_per_instance
    return total


def _fixed_gpus(spec: PDDeploymentSpec, snapshot: Snapshot, autoscaled: list[str]) -> int:
    """GPUs of the pools the autoscaler does not size: their cluster size, else their spec replicas."""
    total = 0
    for role in ROLES:
        if role in autoscaled:
            continue
        size = snapshot.sizes.get(role)
        replicas = size.replicas if size is not None else spec.pool(role).replicas
        total += replicas * spec.pool(role).gpus_per_instance
    return total


def _kv_note(
    spec: PDDeploymentSpec, snapshot: Snapshot, roles: Mapping[str, int], attribution: Attribution
) -> str:
    """Why no pool grows for a P/D TTFT miss charged to the KV transfer ("" when there is none)."""
    if "prefill" not in roles and "decode" not in roles:
        return ""
    path = snapshot.paths.get(PATH_DISAGGREGATED)
    slo = spec.slo
    if path is None or slo is None or path.ttft_seconds is None or path.ttft_breakdown is None:
        return ""
    attainment = path.attainment
    if path.ttft_seconds * 1000.0 <= slo.ttft_ms or attainment is None:
        return ""
    if attainment >= slo.attainment_percent / 100.0:
        return ""
    if attribution.charged is not None:
        return ""
    return (
        f"P/D TTFT {path.ttft_seconds * 1000:.0f} ms > {slo.ttft_ms} ms is the KV transfer's, not a pool's:"
        f" {attribution.text()}; no pool grows for it (check the link: kvTransfer.bandwidthGbps"
        f" {spec.kv_transfer.bandwidth_gbps:g})"
    )


def _condition(
    spec: PDDeploymentSpec,
    pools: Mapping[str, PoolDecision],
    advisory: bool,
    budget_note: str,
    kv_note: str = "",
) -> ConditionTuple:
    sizes = ", ".join(
        f"{d.role} {d.current}" + (f" -> {d.target}" if d.target != d.current else "") for d in pools.values()
    )
    if advisory:
        return ("False", "Advisory", f"advisory mode, nothing is changed; would set {sizes}")
    by_gpus = [d.role for d in pools.values() if d.limited_by == "maxGPUs"]
    if by_gpus or budget_note:
        detail = budget_note or f"{', '.join(by_gpus)} held below the wanted size"
        return ("False", "LimitedByMaxGPUs", f"maxGPUs {spec.max_gpus}: {detail}; {sizes}")
    over = [d.role for d in pools.values() if d.recommendation > _bounds(spec, d.role).max_replicas]
    if over:
        detail = ", ".join(f"{role} needs {pools[role].recommendation}" for role in over)
        return ("False", "LimitedByMaxReplicas", f"{detail} (over maxReplicas); {sizes}")
    if kv_note:
        return ("True", "KVTransferBound", f"{kv_note}; {sizes}")
    return ("True", "Active", sizes)
