"""spec.router.disaggregation's mode in a reconcile pass: which mode the routers choose by, and a
change of it moving through spec.rollout's steps like a serving-mode change (docs/router.md).

`advance` is the pure decision (table-tested with a fake clock); `verdict_reader` reads a window.
State lives only in `status.disaggregation`: `mode` is the mode in effect, `rollout` the gray
rollout's record (the pure machine of `tandem.rollout`; its `target` is the new mode). The routers
read both (`kube.pods.pdd_info_from`), never the spec's mode, and send `weight` percent of P/D
requests (by request id) to the target mode. Knob values within a mode are read from the spec live.

- An object whose status has never been written takes the spec's mode at once (nothing serves yet);
  no record is kept while the mode is Always and the spec does not name one (existing objects'
  status does not change).
- The spec's mode differs from the mode in effect: without spec.rollout the new mode takes effect
  at once (a router setting: no pod to wait for; Event `DisaggregationModeSwitched`); with it a
  rollout starts and shifts at once to the first step's weight (nothing to prepare), each step
  judged from the routers' per-mode series (`metrics.disaggregation`) against the SLO and against
  the mode in effect; Promoted makes the target the mode in effect. A failed verdict or `abort`
  takes the weight back to 0 (RollingBack, then RolledBack after `scaleDownDelaySeconds`: there are
  no pods to remove); while the spec still names the rejected mode it stays held until `retry`.
- The spec back at the mode in effect during a rollout ends it at once (weight 0, Event
  `DisaggregationRolloutReverted`); a third mode starts a new rollout toward it; spec.rollout removed
  cuts over to the spec's mode.

Commands: the annotation's `disaggregation:ACTION[/TOKEN]` (controller/commands.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from tandem.api.models import PDDeployment
from tandem.api.status import Condition, DisaggregationStatus, RolloutStatus
from tandem.controller.rollout import (
    ConditionTuple,
    conditions_for,
    echo_kind,
    from_status,
    read_through,
    rollout_config,
    to_status,
    verdict_due,
)
from tandem.metrics.disaggregation import read_mode_window
from tandem.metrics.queries import quantile_of
from tandem.rollout.config import RolloutConfig
from tandem.rollout.judge import Verdict, judge
from tandem.rollout.machine import Command, Observed, parse_command
from tandem.rollout.machine import step as machine_step
from tandem.rollout.state import Phase, RollbackStage, RolloutState, start

if TYPE_CHECKING:
    from tandem.controller.autoscaler import Autoscaler
    from tandem.metrics.reader import MetricsReader
    from tandem.rollout.judge import Window

ALWAYS: Final = "Always"
REQUEUE_SECONDS: Final = 5.0
_ACTIVE: Final = (Phase.Preparing, Phase.Shifting, Phase.Paused, Phase.RollingBack)
# The target's "pods" are the routers' setting: ready at once, none to remove on a rollback.
_NOTHING_TO_WAIT_FOR: Final = Observed(target_ready=True, target_pods=0)

Event = tuple[str, str, str]  # (type, reason, message)
VerdictFor = Callable[[RolloutState, str, str], "Verdict | None"]  # (state, target, mode in effect)


def _state_of(record: RolloutStatus | None) -> RolloutState | None:
    if record is None:
        return None
    try:
        return from_status(record)
    except ValueError:  # a record that cannot be read: as none
        return None


def active(status: DisaggregationStatus | None) -> bool:
    """Whether a rollout record is moving traffic or waiting on time (the pass comes back soon)."""
    state = _state_of(status.rollout if status is not None else None)
    return state is not None and state.phase in _ACTIVE


def _started(
    mode: str, target: str, config: RolloutConfig, command: Command | None, last: str | None, now: float
) -> tuple[DisaggregationStatus, list[Event]]:
    fresh = start(config, now, last_command=command.id if command is not None else last)
    shifted = machine_step(fresh, None, None, now, config, _NOTHING_TO_WAIT_FOR).state
    steps = ", ".join(f"{s.weight}%" for s in config.steps)
    message = f"disaggregation {mode} -> {target} in steps of {steps}: {shifted.weight}% of P/D requests"
    return (
        DisaggregationStatus(mode=mode, rollout=to_status(shifted, target, ())),
        [("Normal", "DisaggregationRolloutStarted", message)],
    )


def advance(
    stored: DisaggregationStatus | None,
    spec_mode: str | None,
    *,
    first_pass: bool,
    config: RolloutConfig | None,
    command: Command | None,
    verdict_for: VerdictFor,
    now: float,
) -> tuple[DisaggregationStatus | None, list[Event]]:
    """status.disaggregation after one pass (module docstring). `spec_mode`: the spec's mode, None
    when spec.router.disaggregation is absent (Always); `config`: spec.rollout's, None without it."""
    wanted = spec_mode or ALWAYS
    if first_pass or (stored is None and wanted == ALWAYS):
        return (None if spec_mode is None else DisaggregationStatus(mode=wanted)), []
    mode = stored.mode if stored is not None else ALWAYS
    state = _state_of(stored.rollout if stored is not None else None)
    target = stored.rollout.target if stored is not None and stored.rollout is not None else None
    settled = state is None or state.phase is Phase.Promoted
    if config is None or (settled and wanted != mode):
        if wanted == mode:  # no spec.rollout: a record has nothing left to do
            return DisaggregationStatus(mode=mode), []
        if config is None:
            message = f"disaggregation mode {mode} -> {wanted} (no spec.rollout: at once)"
            return DisaggregationStatus(mode=wanted), [("Normal", "DisaggregationModeSwitched", message)]
        return _started(mode, wanted, config, command, state.last_command if state else None, now)
    if state is None or target is None:  # at the spec's mode, or a record that cannot be read
        return DisaggregationStatus(mode=mode), []
    if state.phase is Phase.Promoted and wanted == target:
        return stored, []
    if wanted != target:
        if wanted == mode:
            message = f"spec back at disaggregation mode {mode}: the rollout to {target} ends, weight 0"
            return DisaggregationStatus(mode=mode), [("Warning", "DisaggregationRolloutReverted", message)]
        return _started(mode, wanted, config, command, state.last_command, now)
    verdict = None
    if state.phase in (Phase.Shifting, Phase.Paused):
        verdict = verdict_for(state, target, mode)
    transition = machine_step(state, verdict, command, now, config, _NOTHING_TO_WAIT_FOR)
    t = echo_kind(transition, state, "disaggregation rollout")
    s = t.state
    # Nothing to prepare (`retry` after a rollback) and no pod to remove (a rollback's last stage).
    if s.phase is Phase.Preparing or s.rollback_stage is RollbackStage.ScalingDown:
        s = machine_step(s, None, None, now, config, _NOTHING_TO_WAIT_FOR).state
    events: list[Event] = []
    if (s.phase, s.step, s.pause_cause) != (state.phase, state.step, state.pause_cause):
        kind = "Warning" if s.phase in (Phase.RollingBack, Phase.RolledBack) else "Normal"
        message = f"disaggregation {mode} -> {target}, weight {s.weight}%: {s.reason}"
        events.append((kind, f"DisaggregationRollout{s.phase.value}", message))
    new_mode = target if s.phase is Phase.Promoted else mode
    return DisaggregationStatus(mode=new_mode, rollout=to_status(s, target, t.problems)), events


def rollout_conditions(status: DisaggregationStatus, had: Sequence[Condition]) -> list[ConditionTuple]:
    """RolloutProgressing and RolledBack for a disaggregation-mode rollout, as a serving-mode rollout
    sets them (message `disaggregation Always -> Auto, weight 10%: ...`); none without a readable record."""
    record = status.rollout
    state = _state_of(record)
    if record is None or state is None or record.target is None:
        return []
    return conditions_for(state, record.target, had, record.reason, source=f"disaggregation {status.mode}")


@dataclass
class DisaggregationOutcome:
    status: DisaggregationStatus | None  # status.disaggregation
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None  # while a rollout moves: read windows and step again


def step(
    pdd: PDDeployment,
    stored: DisaggregationStatus | None,
    *,
    first_pass: bool,
    command_value: str | None,
    verdict_for: VerdictFor,
    now: float,
) -> DisaggregationOutcome:
    """`advance` with the spec's mode, spec.rollout's config and the routed command annotation."""
    spec = pdd.spec
    config = rollout_config(spec, spec.rollout) if spec.rollout is not None else None
    chosen = spec.router.disaggregation
    status, events = advance(
        stored,
        chosen.mode if chosen is not None else None,
        first_pass=first_pass,
        config=config,
        command=parse_command(command_value),
        verdict_for=verdict_for,
        now=now,
    )
    return DisaggregationOutcome(status, events, REQUEUE_SECONDS if active(status) else None)


def verdict_reader(autoscaler: Autoscaler, pdd: PDDeployment, now: float) -> VerdictFor:
    """`verdict_for` reading the routers' per-mode series through the autoscaler's Prometheus reader,
    at most once per analysis period; never raises."""

    def read(state: RolloutState, target: str, mode: str) -> Verdict | None:
        spec = pdd.spec
        config = verdict_due(spec, state, now)
        if config is None:
            return None
        window_s = config.analysis.window_seconds

        def window(reader: MetricsReader) -> Window:
            return read_mode_window(
                reader,
                pdd.metadata.namespace,
                pdd.metadata.name,
                target=target,
                baseline=mode,
                window_seconds=window_s,
                now=now,
                slo_set=spec.slo is not None,
                quantile=quantile_of(spec.slo.attainment_percent if spec.slo is not None else None),
            )

        return judge(read_through(autoscaler, spec, window_s, now, "disaggregation", window), config.analysis)

    return read
