"""`step(state, verdict, command, now, config, observed) -> Transition`: one pass of a rollout, pure.

A pass makes at most one transition, in this order:
1. the command, when its id differs from `state.last_command`: acted on (or consumed and reported
   as not applicable in this phase), and recorded, so the same annotation seen again does nothing.
   Unknown actions are reported every pass and never recorded. A command that changes the phase or
   step ends the pass: the verdict was measured under the previous step.
2. the phase's own rule:
   - Preparing -> Shifting(0) once the target arm is ready (`observed.target_ready`), or
     RollingBack (`PrepareTimeout`) when it is not ready `prepareTimeoutSeconds` after it began;
   - Shifting and Paused record the verdict (when it is new and measured in this step) and judge:
     metrics missing for `metricsUnavailableSeconds` -> `onMetricsUnavailable`; Fail -> rollback
     (or Paused/Failed without autoRollback); in Shifting a Pass after the bake -> the next step,
     Promoted after the last, or Paused/AwaitingPromote at a manual gate; no conclusive verdict
     `inconclusivePauseSeconds` after the bake -> Paused/Inconclusive. Anything else holds.
   - RollingBack: RestoringWeight -> ScalingDown once the weight has been 0 for
     `scaleDownDelaySeconds`; ScalingDown -> RolledBack once the target arm has no pod.
A verdict counts for a step only when its window ended after the step began (a Pass only when the
whole window lies in the step) and after the last recorded verdict's, and not after `now`.
docs/rollout.md has the full transition table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tandem.rollout.config import OnMetricsUnavailable, RolloutConfig
from tandem.rollout.judge import Result, Verdict
from tandem.rollout.state import (
    MAX_FIGURES,
    MAX_VERDICTS,
    TARGET_SERVING,
    PauseCause,
    Phase,
    RollbackStage,
    RolloutState,
    VerdictRecord,
    clip,
    start,
    weight_of,
)

ACTIONS: Final = ("promote", "abort", "retry")
PREPARE_TIMEOUT: Final = "PrepareTimeout"  # the reason's head when Preparing ran out of time


@dataclass(frozen=True, slots=True)
class Command:
    action: str  # promote, abort, retry; anything else is reported and ignored
    id: str  # identifies this command: the same id is acted on once


# A command may name the rollout it is for: `mode:promote`, `revision:abort/2`, `disaggregation:retry`
# (controller/commands.py).
COMMAND_SCOPES: Final = ("mode", "revision", "disaggregation")


def parse_command(value: str | None) -> Command | None:
    """A command annotation's value: `[SCOPE:]ACTION[/TOKEN]` (the token lets the same action be
    given again: `promote/2` after `promote`; the scope, `mode`, `revision` or `disaggregation`, says
    which rollout it is for). The whole value is the command's id."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    head, sep, rest = value.partition(":")
    body = rest if sep and head.strip() in COMMAND_SCOPES else value
    return Command(action=body.split("/", 1)[0].strip(), id=value)


@dataclass(frozen=True, slots=True)
class Observed:
    """The target arm as the controller saw it this pass (from the cluster, not from metrics)."""

    target_ready: bool = False  # the pods the first step needs are ready
    target_pods: int | None = None  # pods of the target arm that still exist; None: not read


@dataclass(frozen=True, slots=True)
class Transition:
    state: RolloutState  # to write to status.rollout
    scale_down_allowed: bool  # the target arm may be scaled to zero (its weight has been 0 long enough)
    changed: bool  # phase, step, pause cause or rollback stage changed: an Event with state.reason
    problems: tuple[str, ...]  # commands not acted on, verdicts not used: for status and Events

    @property
    def weight(self) -> int:
        """Percent of requests the routers send to the target arm."""
        return self.state.weight

    def event_reason(self, previous: RolloutState, prefix: str) -> str | None:
        """The Event reason for this pass, one per moment (None: no Event): `<prefix><phase>` when the
        phase, step or pause cause changed; `<prefix>ScalingDown` when only the rollback stage did
        (the weight has been back long enough: the target arm goes), so RollingBack is posted once."""
        if not self.changed:
            return None
        s = self.state
        if (s.phase, s.step, s.pause_cause) == (previous.phase, previous.step, previous.pause_cause):
            return f"{prefix}ScalingDown"
        return f"{prefix}{s.phase.value}"


def _fmt(seconds: float) -> str:
    return f"{seconds:.0f}"


def _move(
    s: RolloutState,
    now: float,
    config: RolloutConfig,
    phase: Phase,
    reason: str,
    *,
    step: int | None = None,
    pause_cause: PauseCause | None = None,
    rollback_stage: RollbackStage | None = None,
) -> RolloutState:
    """`s` in a new phase (or step), entered at `now`."""
    new_step = s.step if step is None else step
    return dataclasses.replace(
        s,
        phase=phase,
        step=new_step,
        weight=weight_of(phase, new_step, config),
        step_started_at=now if new_step != s.step or phase is Phase.Shifting else s.step_started_at,
        phase_since=now,
        reason=clip(reason),
        pause_cause=pause_cause,
        rollback_stage=rollback_stage,
        metrics_missing_since=None,
    )


def _advance(s: RolloutState, now: float, config: RolloutConfig, why: str) -> RolloutState:
    if s.step >= config.last_step:
        return _move(s, now, config, Phase.Promoted, f"{why}; promoted: the target arm serves all requests")
    nxt = s.step + 1
    return _move(s, now, config, Phase.Shifting, f"{why}; step {nxt}: {config.describe(nxt)}", step=nxt)


# A rollback's reason keeps its cause (with the figures) to the end: each stage swaps the suffix.
WEIGHT_FIRST: Final = "; rolling back: weight back to the source arm first"
SCALING_DOWN: Final = "; rolling back: scaling the target arm down"
ROLLED_BACK: Final = "; rolled back: the source arm serves all requests"


def _cause(reason: str) -> str:
    for suffix in (WEIGHT_FIRST, SCALING_DOWN, ROLLED_BACK):
        if reason.endswith(suffix):
            return reason.removesuffix(suffix)
    return reason


def _rollback(s: RolloutState, now: float, config: RolloutConfig, why: str) -> RolloutState:
    # A target that took no traffic yet (Preparing) may go at once. One that did (at its weight, or
    # spec.rollout.tenants' requests in the tenants stage at weight 0) waits until the routers have
    # read that it is back on the source.
    served = s.phase in TARGET_SERVING
    stage = RollbackStage.RestoringWeight if served else RollbackStage.ScalingDown
    suffix = WEIGHT_FIRST if served else SCALING_DOWN
    return _move(s, now, config, Phase.RollingBack, clip(why, len(suffix)) + suffix, rollback_stage=stage)


def _pause(s: RolloutState, now: float, config: RolloutConfig, cause: PauseCause, why: str) -> RolloutState:
    at = "in the tenants stage (weight 0)" if s.weight == 0 else f"at {s.weight}%"
    return _move(s, now, config, Phase.Paused, f"{why}; paused {at}", pause_cause=cause)


# --- commands ------------------------------------------------------------------------------------

CommandRule = Callable[[RolloutState, float, RolloutConfig], "RolloutState | str"]


def _promote(s: RolloutState, now: float, config: RolloutConfig) -> RolloutState | str:
    if s.phase in (Phase.Shifting, Phase.Paused):
        return _advance(s, now, config, f"promote command at step {s.step}")
    if s.phase is Phase.Preparing:
        return "promote ignored: the target arm is not ready, no traffic goes to it before"
    return f"promote ignored: the rollout is {s.phase}"


def _abort(s: RolloutState, now: float, config: RolloutConfig) -> RolloutState | str:
    if s.phase in (Phase.Preparing, Phase.Shifting, Phase.Paused):
        return _rollback(s, now, config, f"abort command at step {s.step} ({s.weight}%)")
    return f"abort ignored: the rollout is {s.phase}"


def _retry(s: RolloutState, now: float, config: RolloutConfig) -> RolloutState | str:
    if s.phase is Phase.Paused:
        return _move(s, now, config, Phase.Shifting, f"retry command: step {s.step} judged again from now")
    if s.phase is Phase.RolledBack:
        fresh = start(config, now, s.last_command, s.attempt + 1)
        return dataclasses.replace(
            fresh, reason=f"retry command: attempt {fresh.attempt}, {fresh.reason}", verdicts=s.verdicts
        )
    return f"retry ignored: the rollout is {s.phase} (retry resumes a Paused or RolledBack rollout)"


COMMANDS: Final[dict[str, CommandRule]] = {"promote": _promote, "abort": _abort, "retry": _retry}


def _command(
    s: RolloutState, command: Command | None, now: float, config: RolloutConfig, problems: list[str]
) -> RolloutState:
    if command is None or command.id == s.last_command:
        return s
    rule = COMMANDS.get(command.action)
    if rule is None:
        problems.append(f"unknown rollout command {command.id!r} ignored (known: {', '.join(ACTIONS)})")
        return s
    outcome = rule(s, now, config)
    if isinstance(outcome, str):
        problems.append(outcome)
        return dataclasses.replace(s, last_command=command.id, last_command_outcome=clip(outcome))
    return dataclasses.replace(outcome, last_command=command.id, last_command_outcome=outcome.reason)


# --- verdicts ------------------------------------------------------------------------------------


def _usable(s: RolloutState, verdict: Verdict | None, now: float, problems: list[str]) -> Verdict | None:
    """The verdict if it is new and measured (at least partly) in the current step."""
    if verdict is None:
        return None
    if verdict.window_end > now:
        problems.append(f"verdict for a window ending after now ({verdict.window_end} > {now}) ignored")
        return None
    if s.verdicts and verdict.window_end <= s.verdicts[-1].verdict.window_end:
        return None  # judged already (the same window seen again, e.g. after a restart)
    if verdict.window_end <= s.step_started_at:
        return None  # measured before this step
    return verdict


def _record(s: RolloutState, verdict: Verdict) -> RolloutState:
    figures = dict(list(verdict.figures.items())[:MAX_FIGURES])
    kept = dataclasses.replace(verdict, reason=clip(verdict.reason), figures=figures)
    verdicts = (*s.verdicts, VerdictRecord(step=s.step, verdict=kept))[-MAX_VERDICTS:]
    return dataclasses.replace(s, verdicts=verdicts)


def _judged(s: RolloutState, v: Verdict, now: float, config: RolloutConfig) -> RolloutState | None:
    """What a verdict does in Shifting and Paused, the same in both: metrics unavailable for long
    enough, or a Fail. None: nothing (the phase's own rule goes on)."""
    analysis = config.analysis
    if v.missing:
        since = s.metrics_missing_since if s.metrics_missing_since is not None else now
        s = dataclasses.replace(s, metrics_missing_since=since)
        waited = now - since
        if waited < analysis.metrics_unavailable_seconds:
            return dataclasses.replace(
                s,
                reason=clip(
                    f"{v.reason}; for {_fmt(waited)} s, "
                    f"onMetricsUnavailable ({analysis.on_metrics_unavailable}) "
                    f"after {_fmt(analysis.metrics_unavailable_seconds)} s"
                ),
            )
        why = f"step {s.step}: {v.reason} for {_fmt(waited)} s"
        if analysis.on_metrics_unavailable is OnMetricsUnavailable.Rollback and config.auto_rollback:
            return _rollback(s, now, config, why)
        if analysis.on_metrics_unavailable is OnMetricsUnavailable.Rollback:
            why += " (onMetricsUnavailable Rollback, but autoRollback is off)"
        paused = _pause(s, now, config, PauseCause.MetricsUnavailable, why)
        return dataclasses.replace(paused, metrics_missing_since=since)
    s = dataclasses.replace(s, metrics_missing_since=None)
    if v.result is Result.Fail:
        why = f"step {s.step} failed: {v.reason}"
        if config.auto_rollback:
            return _rollback(s, now, config, why)
        return _pause(s, now, config, PauseCause.Failed, why + " (autoRollback is off)")
    return None


# --- phases --------------------------------------------------------------------------------------


def _preparing(s: RolloutState, now: float, config: RolloutConfig, observed: Observed) -> RolloutState:
    if not observed.target_ready:
        waited = now - s.phase_since
        deadline = config.prepare_timeout_seconds
        if deadline is not None and waited >= deadline:
            why = (
                f"{PREPARE_TIMEOUT}: the target arm was not ready within prepareTimeoutSeconds "
                f"({_fmt(deadline)} s)"
            )
            return _rollback(s, now, config, why)
        left = "" if deadline is None else f", rolled back after {_fmt(deadline)} s"
        return dataclasses.replace(
            s, reason=f"waiting for the target arm's pods to be ready ({_fmt(waited)} s{left})"
        )
    return _move(s, now, config, Phase.Shifting, f"target arm ready; step 0: {config.describe(0)}", step=0)


def _shifting(s: RolloutState, v: Verdict | None, now: float, config: RolloutConfig) -> RolloutState:
    if v is not None:
        judged = _judged(s, v, now, config)
        if judged is not None:
            return judged
        s = dataclasses.replace(s, metrics_missing_since=None)
    bake_end = s.step_started_at + config.bake_seconds(s.step)
    if v is not None and v.result is Result.Pass:
        if v.window_start < s.step_started_at:
            return dataclasses.replace(
                s, reason=clip(f"step {s.step}: a window that began before the step passed; judged again")
            )
        if now < bake_end:
            return dataclasses.replace(
                s, reason=clip(f"step {s.step} passed: {v.reason}; baking {_fmt(bake_end - now)} s more")
            )
        why = f"step {s.step} passed: {v.reason}"
        if config.steps[s.step].pause_seconds is None:
            return _pause(s, now, config, PauseCause.AwaitingPromote, why + "; waiting for a promote command")
        return _advance(s, now, config, why)
    give_up = bake_end + config.analysis.inconclusive_pause_seconds
    last = f"last verdict: {v.reason}" if v is not None else "no verdict this pass"
    if now >= give_up:
        why = f"step {s.step}: no conclusive verdict {_fmt(now - bake_end)} s after its bake ({last})"
        return _pause(s, now, config, PauseCause.Inconclusive, why)
    if now < bake_end:
        return dataclasses.replace(
            s, reason=clip(f"step {s.step}: baking {_fmt(bake_end - now)} s more; {last}")
        )
    return dataclasses.replace(
        s,
        reason=clip(
            f"step {s.step}: waiting for a passing window ({_fmt(give_up - now)} s before pausing); {last}"
        ),
    )


def _paused(s: RolloutState, v: Verdict | None, now: float, config: RolloutConfig) -> RolloutState:
    """Only a rollback leaves Paused by itself; otherwise it keeps the reason it paused for (the
    verdicts are in the list) and waits for a command."""
    if v is None:
        return s
    judged = _judged(s, v, now, config)
    if judged is not None and judged.phase is not Phase.Paused:
        return judged
    since = judged.metrics_missing_since if judged is not None else None
    return dataclasses.replace(s, metrics_missing_since=since)


def _rolling_back(s: RolloutState, now: float, config: RolloutConfig, observed: Observed) -> RolloutState:
    if s.rollback_stage is RollbackStage.RestoringWeight:
        waited = now - s.phase_since
        if waited < config.scale_down_delay_seconds:
            return s
        return dataclasses.replace(
            s,
            rollback_stage=RollbackStage.ScalingDown,
            phase_since=now,
            reason=_cause(s.reason) + SCALING_DOWN,
        )
    if observed.target_pods == 0:
        return _move(s, now, config, Phase.RolledBack, _cause(s.reason) + ROLLED_BACK)
    return s


def _fit(s: RolloutState, config: RolloutConfig, problems: list[str]) -> RolloutState:
    """`s` made consistent with a config that may have changed since it was written."""
    step = min(s.step, config.last_step)
    if step != s.step:
        problems.append(f"step {s.step} no longer exists ({len(config.steps)} steps): at step {step}")
    weight = weight_of(s.phase, step, config)
    if weight != s.weight:
        problems.append(f"weight {s.weight}% is not step {step}'s: now {weight}%")
    return dataclasses.replace(s, step=step, weight=weight)


def step(
    state: RolloutState,
    verdict: Verdict | None,
    command: Command | None,
    now: float,
    config: RolloutConfig,
    observed: Observed = Observed(),
) -> Transition:
    """One pass: the command, then the phase's rule (see the module docstring)."""
    problems: list[str] = []
    s = _fit(state, config, problems)
    after = _command(s, command, now, config, problems)
    moved = (after.phase, after.step) != (s.phase, s.step)
    s = after
    if not moved:
        v = _usable(s, verdict, now, problems) if s.phase in (Phase.Shifting, Phase.Paused) else None
        if v is not None:
            s = _record(s, v)
        if s.phase is Phase.Preparing:
            s = _preparing(s, now, config, observed)
        elif s.phase is Phase.Shifting:
            s = _shifting(s, v, now, config)
        elif s.phase is Phase.Paused:
            s = _paused(s, v, now, config)
        elif s.phase is Phase.RollingBack:
            s = _rolling_back(s, now, config, observed)
    key = (s.phase, s.step, s.pause_cause, s.rollback_stage)
    changed = key != (state.phase, state.step, state.pause_cause, state.rollback_stage)
    scale_down = s.phase is Phase.RolledBack or s.rollback_stage is RollbackStage.ScalingDown
    return Transition(state=s, scale_down_allowed=scale_down, changed=changed, problems=tuple(problems))


def fall_back(
    state: RolloutState, now: float, config: RolloutConfig, why: str, verdict: Verdict | None = None
) -> Transition:
    """A steady-state target arm (Promoted) going back to the source arm, as a rollback does:
    weight 0 first, the target arm's scale-down after `scaleDownDelaySeconds` (issue 12, item 4).

    The controller decides when (an SLO breach that persists at the arm's maximum size, or KV
    transfers failing); anything but Promoted is left as it is and reported in `problems`.
    `verdict`, the failed window that decided it, is recorded in `verdicts` with its figures.
    """
    if state.phase is not Phase.Promoted:
        return Transition(state, False, False, (f"fall-back ignored: the rollout is {state.phase}",))
    s = _fit(state, config, [])
    if verdict is not None:
        s = _record(s, verdict)
    s = _rollback(s, now, config, why)
    return Transition(state=s, scale_down_allowed=False, changed=True, problems=())


def promoted(config: RolloutConfig, now: float, reason: str, last_command: str | None = None) -> RolloutState:
    """The state of a target arm already serving everything with no rollout behind it (a P/D
    deployment created as such, or one whose mode changed without `spec.rollout`): Promoted, so that
    `fall_back` can take it back to the source arm."""
    return _move(start(config, now, last_command), now, config, Phase.Promoted, reason, step=config.last_step)
