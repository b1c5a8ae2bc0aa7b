"""The rollout step of a reconcile pass: the gray rollout between the colocated pool and P/D.

Runs inside the reconcile pass, before the autoscaler, so one pass computes everything the status
says and one status write records it. State lives only in `status.rollout` (the pure machine's
record, `tandem.rollout.state`), so a restart or a fail-over continues from the last status.

A rollout starts when `spec.serving.mode` differs from the mode in effect (`status.mode`) while
`spec.rollout` is set: the source arm is the mode in effect, the target `spec.serving.mode`. Each
pass reads the command annotation, reads the analysis window from Prometheus while the target arm
takes traffic (at most once per `analysis_period`), judges it, steps the machine and returns:
`status.rollout` (rewritten only when something other than the reason's countdown changed), the
mode in effect, each pool's size bounds (`tandem.rollout.arms`), the RolloutProgressing and
RolledBack conditions, and Events. The routers read `status.mode` and `status.rollout`
(`tandem.kube.pods.pdd_info_from`), never the spec, so traffic follows what the operator decided.

Without `spec.rollout` a mode change is a safe cut-over: the old arm keeps its pods and stays the
mode in effect until every pool of the new arm has its desired replicas ready.

With `autoRollback`, a steady P/D deployment (Promoted, or Disaggregated with no rollout behind it)
falls back to colocated like a rollback when a full analysis window fails at the arm's maximum
size (fixed pools, or the autoscaler limited by maxReplicas / maxGPUs), or when its error rate or
KV-transfer failure rate passes the threshold.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from tandem.api import meta
from tandem.api.models import PDDeployment, PDDeploymentSpec, RolloutSpec
from tandem.api.status import (
    Condition,
    ConditionStatus,
    ConditionType,
    PDDeploymentStatus,
    RolloutStatus,
)
from tandem.autoscale.bounds import autoscaled_roles
from tandem.controller import metrics
from tandem.kube.rest import Obj
from tandem.metrics.rollout import read_window
from tandem.rollout.arms import (
    ARMS,
    DISAGGREGATED,
    Bound,
    config_from,
    cutover_bounds,
    effective_mode,
    other,
    pool_bounds,
)
from tandem.rollout.config import RolloutConfig
from tandem.rollout.judge import ArmWindow, Result, Verdict, Window, judge
from tandem.rollout.machine import Command, Observed, Transition, fall_back, parse_command, promoted, step
from tandem.rollout.state import Phase, RolloutState, clip, start
from tandem.sizing import PREVIOUS as PREVIOUS  # who gives way under maxGPUs: the sizing chain's stage 5
from tandem.sizing import budget_order as budget_order

if TYPE_CHECKING:
    from tandem.controller.autoscaler import Autoscaler
    from tandem.metrics.reader import MetricsReader

log = logging.getLogger(__name__)

ConditionTuple = tuple[str, ConditionStatus, str, str]

# Autoscaler reasons that mean a pool is as large as it may get (the autoscaler had its chance).
AT_MAXIMUM: Final = ("LimitedByMaxReplicas", "LimitedByMaxGPUs")
ACTIVE_PHASES: Final = (Phase.Preparing, Phase.Shifting, Phase.RollingBack)
REQUEUE_ACTIVE_SECONDS: Final = 5.0
MAX_COMMAND_LENGTH: Final = 253  # longer annotation values are reported, never acted on
_EMPTY_ARM: Final = ArmWindow()


def read_through(
    autoscaler: Autoscaler,
    spec: PDDeploymentSpec,
    window_seconds: float,
    now: float,
    query: str,
    read: Callable[[MetricsReader], Window],
) -> Window:
    """An analysis window read through the autoscaler's Prometheus reader (mode, revision and
    disaggregation rollouts). No Prometheus, or a read that raised, gives a window whose metrics are
    missing: judge() says Inconclusive, never Pass. `query` labels the operator's error counter."""
    url = autoscaler.url(spec)
    if not url:
        missing = (
            "no Prometheus to read: set spec.autoscaling.prometheus.url or the operator's --prometheus-url",
        )
        return Window(now - window_seconds, now, target=_EMPTY_ARM, metrics_missing=missing)
    try:
        return read(autoscaler.reader(url, spec.autoscaling.prometheus.timeout_seconds))
    except Exception as exc:  # no data: judge() says Inconclusive, never Pass
        metrics.PROMETHEUS_ERRORS.labels(query=query).inc()
        missing = (f"Prometheus at {url}: {exc}",)
        return Window(now - window_seconds, now, target=_EMPTY_ARM, metrics_missing=missing)


def analysis_period(config: RolloutConfig) -> float:
    """Seconds between two analysis reads: a quarter of the window, within 5..15 s."""
    return max(5.0, min(15.0, config.analysis.window_seconds / 4.0))


def verdict_due(spec: PDDeploymentSpec, state: RolloutState, now: float) -> RolloutConfig | None:
    """spec.rollout's config when a verdict is due (none yet, or the last one ended at least an
    analysis period ago); None otherwise, or without spec.rollout."""
    if spec.rollout is None:
        return None
    config = rollout_config(spec, spec.rollout)
    if state.verdicts and now - state.verdicts[-1].verdict.window_end < analysis_period(config):
        return None
    return config


def rollout_config(spec: PDDeploymentSpec, rollout: RolloutSpec) -> RolloutConfig:
    """The machine's config from `spec.rollout`; the attainment floor defaults to the SLO's."""
    a = rollout.analysis
    floor = a.attainment_floor
    if floor is None:
        floor = spec.slo.attainment_percent / 100.0 if spec.slo is not None else 0.95
    return config_from(
        [(s.weight, s.pause_seconds) for s in rollout.steps],
        window_seconds=a.window_seconds,
        min_samples=a.min_samples,
        attainment_floor=floor,
        max_attainment_drop=a.max_attainment_drop,
        max_error_rate=a.max_error_rate,
        max_kv_failure_rate=a.max_kv_failure_rate,
        min_kv_bandwidth_ratio=a.min_kv_bandwidth_ratio,
        on_metrics_unavailable=a.on_metrics_unavailable.value,
        metrics_unavailable_seconds=a.metrics_unavailable_seconds,
        inconclusive_pause_seconds=a.inconclusive_pause_seconds,
        auto_rollback=rollout.auto_rollback,
        scale_down_delay_seconds=rollout.scale_down_delay_seconds,
        prepare_timeout_seconds=rollout.prepare_timeout_seconds,
    )


@dataclass
class RolloutOutcome:
    """What the rollout step hands the rest of the pass."""

    status: RolloutStatus | None  # status.rollout
    mode: str  # status.mode: the serving mode in effect
    bounds: dict[str, Bound] = field(default_factory=dict)  # per pool, applied to the decided sizes
    conditions: list[ConditionTuple] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    requeue_after: float | None = None


def to_status(state: RolloutState, target: str, problems: Sequence[str]) -> RolloutStatus:
    kept = [clip(p) for p in problems[:16]]
    data = state.to_dict()
    for verdict in data["verdicts"]:  # within the status schema's limits, whatever a reader said
        if "missing" in verdict:
            verdict["missing"] = [clip(m) for m in verdict["missing"][:32]]
    return RolloutStatus.model_validate({**data, "target": target, "problems": kept})


def from_status(status: RolloutStatus) -> RolloutState:
    """Raises ValueError naming the key when the stored record is malformed."""
    return RolloutState.from_dict(status.model_dump(by_alias=True, mode="json", exclude_none=True))


def _material(status: RolloutStatus | None) -> Any:
    """What a status write is for: everything but the reason (its countdowns change every pass)."""
    if status is None:
        return None
    return status.model_dump(by_alias=True, mode="json", exclude={"reason"})


def _ready(sts: Obj | None) -> int:
    return int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)


def _live(sts: Obj | None) -> int | None:
    if sts is None:
        return None
    value = (sts.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def _role(pod: Obj) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(meta.LABEL_ROLE, ""))


def _valid_mode(value: str | None) -> str | None:
    return value if value in ARMS else None


def _event_type(state: RolloutState) -> str:
    if state.phase in (Phase.RollingBack, Phase.RolledBack):
        return "Warning"
    if (
        state.phase is Phase.Paused
        and state.pause_cause is not None
        and state.pause_cause.value != "AwaitingPromote"
    ):
        return "Warning"
    return "Normal"


def conditions_for(
    state: RolloutState | None,
    target: str | None,
    had: Sequence[Condition],
    reason: str | None = None,
    source: str | None = None,
) -> list[ConditionTuple]:
    """RolloutProgressing and RolledBack for this pass (absent until a rollout has existed).

    `reason` is the one status keeps (it is not rewritten for a countdown alone); default the state's.
    `source`: what the target replaces (default: the other serving mode)."""
    if state is None or target is None:
        if any(c.type == ConditionType.RolloutProgressing for c in had):
            return [
                (ConditionType.RolloutProgressing, "False", "NoRollout", "no rollout is running"),
                (ConditionType.RolledBack, "False", "NoRollout", "no rollout is running"),
            ]
        return []
    source = other(target) if source is None else source
    head = f"{source} -> {target}, weight {state.weight}%: {state.reason if reason is None else reason}"
    progressing: ConditionTuple
    if state.phase in ACTIVE_PHASES:
        progressing = (ConditionType.RolloutProgressing, "True", state.phase.value, head)
    elif state.phase is Phase.Paused:
        cause = state.pause_cause.value if state.pause_cause is not None else "Paused"
        progressing = (ConditionType.RolloutProgressing, "False", cause, head)
    else:
        progressing = (ConditionType.RolloutProgressing, "False", state.phase.value, head)
    rolled: ConditionTuple
    if state.phase in (Phase.RollingBack, Phase.RolledBack):
        rolled = (ConditionType.RolledBack, "True", state.phase.value, head)
    else:
        rolled = (
            ConditionType.RolledBack,
            "False",
            state.phase.value,
            f"{source} -> {target}: not rolled back",
        )
    return [progressing, rolled]


Event = tuple[str, str, str]  # (type, reason, message)


def _resumed(stored: RolloutStatus | None, events: list[Event]) -> tuple[RolloutState | None, str | None]:
    """The rollout recorded in status, and its target arm; none (with a Warning) when unreadable."""
    if stored is None:
        return None, None
    try:
        return from_status(stored), stored.target
    except ValueError as exc:
        events.append(("Warning", "RolloutStatusInvalid", f"{exc}; the rollout starts over"))
        return None, None


def _spec_set_back(
    state: RolloutState,
    target: str,
    wanted: str,
    in_effect: str,
    config: RolloutConfig,
    now: float,
    events: list[Event],
) -> tuple[RolloutState | None, str | None, str]:
    """The spec points back at the source arm: a rollout still going is aborted (weight back first), a
    finished one ends here; a Promoted one starts a rollout the other way. Returns the state, its
    target and the mode in effect."""
    if state.phase is Phase.Promoted:
        return None, None, other(wanted)
    if state.phase is Phase.RolledBack:
        return None, None, wanted
    if state.phase is not Phase.RollingBack:
        t = step(state, None, Command("abort", f"spec.serving.mode {wanted}"), now, config)
        reverted = dataclasses.replace(
            t.state,
            last_command=state.last_command,
            reason=f"spec.serving.mode set back to {wanted}: {t.state.reason}",
        )
        events.append(("Warning", "RolloutReverted", reverted.reason))
        return reverted, target, in_effect
    return state, target, in_effect


def _started(
    body: Mapping[str, Any],
    stored: RolloutStatus | None,
    config: RolloutConfig,
    now: float,
    in_effect: str,
    wanted: str,
    events: list[Event],
) -> RolloutState:
    """A new rollout from the mode in effect to the spec's."""
    # A command annotation already on the object belongs to before this rollout: consumed.
    annotation = ((body.get("metadata") or {}).get("annotations") or {}).get(meta.ANNOTATION_ROLLOUT_COMMAND)
    last = stored.last_command if stored is not None else None
    if isinstance(annotation, str) and annotation.strip():
        last = annotation.strip()
    steps = config.describe_steps()
    events.append(("Normal", "RolloutStarted", f"{in_effect} -> {wanted} in steps of {steps}"))
    return start(config, now, last_command=last)


def _target_observed(
    target: str,
    bounds: Mapping[str, Bound],
    statefulsets: Mapping[str, Obj | None],
    ready: Mapping[str, int],
    pods: Sequence[Obj],
    source_ready: bool,
) -> Observed:
    """What the machine sees of the target arm: whether it is ready, and its pods."""
    target_roles = ARMS[target]
    # Ready at the size the first step needs, or at what was applied when spec.maxGPUs held it
    # lower (a change trades capacity within the budget: the sizing chain, tandem.sizing).
    need = {role: max(1, bounds[role].low) for role in target_roles}
    for role in target_roles:
        applied = _live(statefulsets.get(role))
        if applied is not None:
            need[role] = max(1, min(need[role], applied))
    return Observed(
        target_ready=all(ready[role] >= need[role] for role in target_roles),
        target_pods=sum(1 for pod in pods if _role(pod) in target_roles) if source_ready else None,
    )


def _problems(transition: Transition, routing_problem: str | None, too_long: bool) -> list[str]:
    """The command problems status reports: the machine's, the routing's, an overlong annotation."""
    problems = list(transition.problems)
    if routing_problem is not None:
        problems.append(routing_problem)
    if too_long:
        problems.append(
            f"{meta.ANNOTATION_ROLLOUT_COMMAND} ignored: longer than {MAX_COMMAND_LENGTH} characters"
        )
    return problems


def _transition_events(
    transition: Transition, before: RolloutState, stored: RolloutStatus | None, problems: Sequence[str]
) -> list[Event]:
    """The Events of a pass of the machine: its transition, a command taken, new command problems."""
    new = transition.state
    events: list[Event] = []
    event = transition.event_reason(before, "Rollout")
    if event is not None:
        events.append((_event_type(new), event, f"weight {new.weight}%: {new.reason}"))
    if new.last_command != before.last_command and new.last_command is not None:
        events.append(("Normal", "RolloutCommand", f"{new.last_command}: {new.last_command_outcome}"))
    if stored is None or list(stored.problems) != list(problems):
        events += [("Warning", "RolloutCommandIgnored", p) for p in problems]
    return events


def _requeue_after(new: RolloutState, target: str, config: RolloutConfig, now: float) -> float | None:
    """When the rollout needs another pass: each analysis period while it runs; once Promoted, when the
    scale-down delay ends, then each period while the steady fall-back reads P/D's verdicts."""
    active = new.phase in (Phase.Preparing, Phase.Shifting, Phase.Paused, Phase.RollingBack)
    requeue: float | None = min(REQUEUE_ACTIVE_SECONDS, analysis_period(config)) if active else None
    if new.phase is Phase.Promoted:
        left = new.phase_since + config.scale_down_delay_seconds - now
        watched = target == DISAGGREGATED and config.auto_rollback  # the steady fall-back's reads
        requeue = max(1.0, left) if left > 0 else (analysis_period(config) if watched else None)
    return requeue


class RolloutController:
    """The I/O around the rollout machine; one per operator, shared by the workers."""

    def __init__(self, autoscaler: Autoscaler) -> None:
        self.autoscaler = autoscaler  # its Prometheus URL and readers
        # When each steady P/D deployment was last judged (no rollout record to keep it in): only
        # paces the reads, so losing it on a restart costs one early read.
        self._steady_read: dict[tuple[str, str], float] = {}

    def forget(self, namespace: str, name: str) -> None:
        self._steady_read.pop((namespace, name), None)

    def _window(self, pdd: PDDeployment, target: str, config: RolloutConfig, now: float) -> Window:
        spec, window = pdd.spec, config.analysis.window_seconds

        def read(reader: MetricsReader) -> Window:
            return read_window(reader, spec, pdd.metadata.namespace, pdd.metadata.name, target, window, now)

        return read_through(self.autoscaler, spec, window, now, "rollout", read)

    def _verdict(
        self, pdd: PDDeployment, target: str, state: RolloutState, config: RolloutConfig, now: float
    ) -> Verdict | None:
        """A verdict when one is due (the last one ended at least a period ago), else None."""
        if state.verdicts and now - state.verdicts[-1].verdict.window_end < analysis_period(config):
            return None
        return judge(self._window(pdd, target, config, now), config.analysis)

    def step(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        previous: PDDeploymentStatus | None,
        statefulsets: Mapping[str, Obj | None],
        pods: Sequence[Obj],
        now: float,
        *,
        revision_change: bool = False,
        disaggregation_change: bool = False,
        command_value: str | None = None,
        command_problem: str | None = None,
    ) -> RolloutOutcome:
        """`revision_change`: a serving-revision change of the P/D pair is in progress (controller/
        revisions.py judges it); P/D's steady fall-back to colocated waits until it is over.
        `disaggregation_change`: a rollout of spec.router.disaggregation.mode is in progress
        (controller/disaggregation.py judges it, its arms both P/D): the fall-back waits too.
        `command_value`: the command annotation when it is for this rollout (controller/commands.py),
        else None; `command_problem`: why a command went to no rollout (reported)."""
        spec = pdd.spec
        wanted = spec.serving.mode.value
        in_effect = _valid_mode(previous.mode if previous is not None else None) or wanted
        had = previous.conditions if previous is not None else []
        stored = previous.rollout if previous is not None else None
        roles: tuple[str, ...] = meta.POOL_ROLES
        full: dict[str, int] = {role: spec.pool(role).replicas for role in roles}
        live: dict[str, int | None] = {role: _live(statefulsets.get(role)) for role in roles}
        ready: dict[str, int] = {role: _ready(statefulsets.get(role)) for role in roles}

        if spec.rollout is None:
            return self._cutover(in_effect, wanted, stored, had, statefulsets, live, full, ready)

        config = rollout_config(spec, spec.rollout)
        # One judge at a time: a revision or disaggregation rollout's verdicts decide. A P/D-only
        # deployment (no colocated replicas) has no arm to fall back to: its P/D is never given up.
        if revision_change or disaggregation_change or full["colocated"] < 1:
            config = dataclasses.replace(config, auto_rollback=False)
        events: list[Event] = []
        state, target = _resumed(stored, events)
        if state is not None and target is not None and target != wanted:
            state, target, in_effect = _spec_set_back(state, target, wanted, in_effect, config, now, events)
        if state is None and in_effect != wanted:
            state, target = _started(body, stored, config, now, in_effect, wanted, events), wanted

        if state is None or target is None:
            return self._steady(pdd, body, config, in_effect, wanted, had, now, ready, full, events)
        return self._advance(
            pdd,
            (command_value, command_problem),
            config,
            state,
            target,
            stored,
            had,
            statefulsets,
            pods,
            now,
            full,
            ready,
            events,
        )

    # -- a rollout (or a fall-back) in progress --------------------------------------------------

    def _advance(
        self,
        pdd: PDDeployment,
        command_in: tuple[str | None, str | None],
        config: RolloutConfig,
        state: RolloutState,
        target: str,
        stored: RolloutStatus | None,
        had: Sequence[Condition],
        statefulsets: Mapping[str, Obj | None],
        pods: Sequence[Obj],
        now: float,
        full: Mapping[str, int],
        ready: Mapping[str, int],
        events: list[Event],
    ) -> RolloutOutcome:
        autoscaled = set(autoscaled_roles(pdd.spec))
        source_ready = all(ready[role] >= 1 for role in ARMS[other(target)])
        before = pool_bounds(target, state, config, full, autoscaled, now, source_ready)
        observed = _target_observed(target, before, statefulsets, ready, pods, source_ready)
        value, routing_problem = command_in
        too_long = isinstance(value, str) and len(value) > MAX_COMMAND_LENGTH
        command = None if too_long else parse_command(value)
        verdict = None
        if state.phase in (Phase.Shifting, Phase.Paused):
            verdict = self._verdict(pdd, target, state, config, now)
        transition: Transition = step(state, verdict, command, now, config, observed)
        transition = echo_kind(transition, state, "mode rollout")
        new = transition.state
        if new.phase is Phase.Promoted and target == DISAGGREGATED and not transition.changed:
            transition = self._fall_back_if_breached(pdd, new, target, config, had, now) or transition
            new = transition.state

        problems = _problems(transition, routing_problem, too_long)
        status = to_status(new, target, problems)
        if stored is not None and stored.target == target and _material(status) == _material(stored):
            status = stored  # only the reason's countdown moved: no write
        events += _transition_events(transition, state, stored, problems)
        return RolloutOutcome(
            status=status,
            mode=effective_mode(target, new.phase),
            bounds=pool_bounds(target, new, config, full, autoscaled, now, source_ready),
            conditions=conditions_for(new, target, had, status.reason),
            events=events,
            requeue_after=_requeue_after(new, target, config, now),
        )

    def _fall_back_if_breached(
        self,
        pdd: PDDeployment,
        state: RolloutState,
        target: str,
        config: RolloutConfig,
        had: Sequence[Condition],
        now: float,
    ) -> Transition | None:
        """A steady P/D arm whose verdict fails where scaling cannot help: fall back to colocated."""
        if not config.auto_rollback:
            return None
        verdict = self._verdict(pdd, target, state, config, now)
        if verdict is None or verdict.result is not Result.Fail:
            return None
        why = breach(verdict, config, at_maximum(pdd.spec, had))
        if why is None:
            return None
        return fall_back(state, now, config, f"steady P/D breach: {why}", verdict)

    # -- no rollout running ----------------------------------------------------------------------

    def _steady(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        config: RolloutConfig,
        in_effect: str,
        wanted: str,
        had: Sequence[Condition],
        now: float,
        ready: Mapping[str, int],
        full: Mapping[str, int],
        events: list[Event],
    ) -> RolloutOutcome:
        """The mode in effect is the spec's and no rollout runs: P/D is watched for a fall-back."""
        period = analysis_period(config)
        if (
            wanted == DISAGGREGATED
            and config.auto_rollback
            and all(ready[r] >= 1 for r in ARMS[DISAGGREGATED])
        ):
            key = (pdd.metadata.namespace, pdd.metadata.name)
            transition = None
            if now - self._steady_read.get(key, float("-inf")) >= period or now < self._steady_read[key]:
                self._steady_read[key] = now
                steady = promoted(config, now - config.scale_down_delay_seconds, "P/D serves every request")
                transition = self._fall_back_if_breached(pdd, steady, DISAGGREGATED, config, had, now)
            if transition is not None and transition.changed:
                new = transition.state
                events.append(("Warning", "RolloutRollingBack", f"weight {new.weight}%: {new.reason}"))
                autoscaled = set(autoscaled_roles(pdd.spec))
                source_ready = all(ready[role] >= 1 for role in ARMS[other(DISAGGREGATED)])
                return RolloutOutcome(
                    status=to_status(new, DISAGGREGATED, ()),
                    mode=effective_mode(DISAGGREGATED, new.phase),
                    bounds=pool_bounds(DISAGGREGATED, new, config, full, autoscaled, now, source_ready),
                    conditions=conditions_for(new, DISAGGREGATED, had),
                    events=events,
                    requeue_after=REQUEUE_ACTIVE_SECONDS,
                )
        # Capacity is traded: the arm not in effect holds no pods (a rollout or a fall-back starts it).
        idle = {role: Bound(0, 0) for role in ARMS[other(in_effect)]}
        return RolloutOutcome(
            status=None,
            mode=in_effect,
            bounds=idle,
            conditions=conditions_for(None, None, had),
            events=events,
            requeue_after=period if wanted == DISAGGREGATED and config.auto_rollback else None,
        )

    def _cutover(
        self,
        in_effect: str,
        wanted: str,
        stored: RolloutStatus | None,
        had: Sequence[Condition],
        statefulsets: Mapping[str, Obj | None],
        live: Mapping[str, int | None],
        full: Mapping[str, int],
        ready: Mapping[str, int],
    ) -> RolloutOutcome:
        """No `spec.rollout`: a mode change switches once the new arm is ready, the old arm kept till then."""
        events: list[tuple[str, str, str]] = []
        if stored is not None:
            events.append(("Normal", "RolloutRemoved", "spec.rollout removed: the rollout record is dropped"))
        if in_effect == wanted:
            return RolloutOutcome(
                status=None, mode=wanted, conditions=conditions_for(None, None, had), events=events
            )
        new_ready = all(
            statefulsets.get(role) is not None and ready[role] >= max(1, full[role]) for role in ARMS[wanted]
        )
        if new_ready:
            events.append(
                ("Normal", "ModeSwitched", f"{in_effect} -> {wanted}: the {wanted} pools are ready")
            )
            # The old arm is still held in this pass: its pods go in the next one, once status.mode
            # (what the routers follow) says the new mode, so no reader sees the serving arm gone.
            return RolloutOutcome(
                status=None,
                mode=wanted,
                bounds=cutover_bounds(in_effect, False, live, full),
                conditions=conditions_for(None, None, had),
                events=events,
                requeue_after=REQUEUE_ACTIVE_SECONDS,
            )
        return RolloutOutcome(
            status=None,
            mode=in_effect,
            bounds=cutover_bounds(in_effect, False, live, full),
            conditions=conditions_for(None, None, had),
            events=events,
            requeue_after=REQUEUE_ACTIVE_SECONDS,
        )


def echo_kind(transition: Transition, before: RolloutState, kind: str) -> Transition:
    """The transition with `lastCommandOutcome` saying which rollout took the command (`kind: ...`)."""
    s = transition.state
    if s.last_command == before.last_command or s.last_command is None:
        return transition
    outcome = clip(f"{kind}: {s.last_command_outcome}")
    return dataclasses.replace(transition, state=dataclasses.replace(s, last_command_outcome=outcome))


def at_maximum(spec: PDDeploymentSpec, had: Sequence[Condition]) -> bool:
    """Whether the P/D pools are as large as they may get: fixed sizes, or the autoscaler limited."""
    autoscaled = set(autoscaled_roles(spec)) & set(ARMS[DISAGGREGATED])
    if not autoscaled:
        return True
    condition = next((c for c in had if c.type == ConditionType.AutoscalingActive), None)
    return condition is not None and condition.reason in AT_MAXIMUM


def breach(verdict: Verdict, config: RolloutConfig, at_max: bool) -> str | None:
    """Why a failed steady-state verdict warrants a fall-back, or None: request or KV-transfer failures
    always do; an SLO miss only at the arm's maximum size (otherwise the autoscaler acts first)."""
    figures = verdict.figures
    a = config.analysis
    hard = (
        figures.get("targetErrorRate", 0.0) > a.max_error_rate
        or figures.get("targetKvFailureRate", 0.0) > a.max_kv_failure_rate
    )
    if hard or at_max:
        return verdict.reason
    return None
