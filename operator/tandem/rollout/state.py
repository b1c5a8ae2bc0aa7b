"""A rollout's state: one frozen record that maps 1:1 onto the future `status.rollout`.

Everything `step()` needs from the past is here, so the operator can stop at any moment and a new
one continues from status alone: `to_dict()` writes the camelCase mapping status will hold, and
`from_dict()` reads it back (raising `ValueError` naming the key on anything malformed). Times are
unix seconds, as in `status.autoscaling`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeVar

from tandem.rollout.config import RolloutConfig
from tandem.rollout.judge import Result, Verdict

E = TypeVar("E", bound=StrEnum)

MAX_VERDICTS: Final = 5  # verdicts kept in status, newest last
MAX_FIGURES: Final = 32  # figures kept per verdict
MAX_REASON: Final = 1024  # characters kept of a reason


class Phase(StrEnum):
    Preparing = "Preparing"  # the target arm's pods are starting; weight 0
    Shifting = "Shifting"  # at steps[step].weight, baking and judged
    Paused = "Paused"  # at steps[step].weight, waiting for a command (see PauseCause)
    Promoted = "Promoted"  # weight 100: the target arm serves everything
    RollingBack = "RollingBack"  # weight 0; the target arm's scale-down after the weight (RollbackStage)
    RolledBack = "RolledBack"  # weight 0, the target arm scaled down; `retry` starts again


# The phases in which the target arm takes traffic: the step's weight of everyone, and every request of
# spec.rollout.tenants (at any weight, 0 included: the tenants stage). The routers read the phase from
# status (`tandem.kube.pods`); before (Preparing) and on the way back, everyone is on the source.
TARGET_SERVING: Final = (Phase.Shifting, Phase.Paused, Phase.Promoted)


class PauseCause(StrEnum):
    AwaitingPromote = "AwaitingPromote"  # a step without pauseSeconds passed: a manual gate
    Inconclusive = "Inconclusive"  # no conclusive verdict for inconclusivePauseSeconds after the bake
    MetricsUnavailable = "MetricsUnavailable"  # onMetricsUnavailable: Pause (or Rollback, autoRollback off)
    Failed = "Failed"  # a Fail with autoRollback off


class RollbackStage(StrEnum):
    RestoringWeight = "RestoringWeight"  # weight 0 published; the target arm keeps its pods
    ScalingDown = "ScalingDown"  # the weight has been back long enough: the target arm may go


@dataclass(frozen=True, slots=True)
class VerdictRecord:
    step: int  # the step it judged
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class RolloutState:
    phase: Phase
    step: int  # index into the configured steps (Preparing: the first; Promoted: the last)
    weight: int  # percent of requests on the target arm
    started_at: float  # this attempt began
    step_started_at: float  # the current step began (Shifting, Paused)
    phase_since: float  # the phase (and pause cause or rollback stage) was entered
    reason: str
    attempt: int = 1  # 1 + the retries after a rollback
    pause_cause: PauseCause | None = None  # set exactly when Paused
    rollback_stage: RollbackStage | None = None  # set exactly when RollingBack
    metrics_missing_since: float | None = None  # verdicts have said "metrics unavailable" since
    last_command: str | None = None  # the id (annotation value) of the last command handled
    last_command_outcome: str = ""  # what that command did, echoed in status
    verdicts: tuple[VerdictRecord, ...] = ()  # the last MAX_VERDICTS verdicts judged, newest last

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"status.rollout: {message}")

        check(0 <= self.weight <= 100, f"weight must be within 0..100, got {self.weight}")
        check(self.step >= 0, f"step must be >= 0, got {self.step}")
        check(self.attempt >= 1, f"attempt must be >= 1, got {self.attempt}")
        check(
            (self.phase is Phase.Paused) == (self.pause_cause is not None),
            f"pauseCause must be set exactly when Paused (phase {self.phase}, pauseCause {self.pause_cause})",
        )
        check(
            (self.phase is Phase.RollingBack) == (self.rollback_stage is not None),
            f"rollbackStage must be set exactly when RollingBack (phase {self.phase}, "
            f"rollbackStage {self.rollback_stage})",
        )
        check(
            len(self.verdicts) <= MAX_VERDICTS, f"at most {MAX_VERDICTS} verdicts, got {len(self.verdicts)}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The camelCase mapping for `status.rollout` (JSON-ready; None fields left out)."""
        out: dict[str, Any] = {
            "phase": self.phase.value,
            "step": self.step,
            "weight": self.weight,
            "attempt": self.attempt,
            "startedAt": self.started_at,
            "stepStartedAt": self.step_started_at,
            "phaseSince": self.phase_since,
            "reason": self.reason,
            "verdicts": [_verdict_to_dict(r) for r in self.verdicts],
        }
        optional: dict[str, Any] = {
            "pauseCause": self.pause_cause.value if self.pause_cause else None,
            "rollbackStage": self.rollback_stage.value if self.rollback_stage else None,
            "metricsMissingSince": self.metrics_missing_since,
            "lastCommand": self.last_command,
            "lastCommandOutcome": self.last_command_outcome or None,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutState:
        """Read `status.rollout` back; raises ValueError naming the key on anything malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"status.rollout: must be a mapping, got {type(data).__name__}")
        r = _Reader(data, "status.rollout")
        pause = r.optional_str("pauseCause")
        stage = r.optional_str("rollbackStage")
        raw_verdicts = data.get("verdicts", [])
        if not isinstance(raw_verdicts, list):
            raise ValueError("status.rollout.verdicts: must be a list")
        return cls(
            phase=r.enum("phase", Phase),
            step=r.integer("step"),
            weight=r.integer("weight"),
            attempt=r.integer("attempt", 1),
            started_at=r.number("startedAt"),
            step_started_at=r.number("stepStartedAt"),
            phase_since=r.number("phaseSince"),
            reason=r.string("reason", ""),
            pause_cause=None if pause is None else r.enum("pauseCause", PauseCause),
            rollback_stage=None if stage is None else r.enum("rollbackStage", RollbackStage),
            metrics_missing_since=r.optional_number("metricsMissingSince"),
            last_command=r.optional_str("lastCommand"),
            last_command_outcome=r.string("lastCommandOutcome", ""),
            verdicts=tuple(
                _verdict_from_dict(v, f"status.rollout.verdicts[{i}]") for i, v in enumerate(raw_verdicts)
            ),
        )


def weight_of(phase: Phase, step: int, config: RolloutConfig) -> int:
    """The weight a phase publishes: 0 before and after, the step's while shifting or paused, 100 promoted."""
    if phase in (Phase.Shifting, Phase.Paused):
        return config.steps[min(step, config.last_step)].weight
    return 100 if phase is Phase.Promoted else 0


def start(
    config: RolloutConfig, now: float, last_command: str | None = None, attempt: int = 1
) -> RolloutState:
    """A new rollout (or attempt): Preparing at weight 0.

    Pass the previous state's `last_command`, so a command annotation left on the object is not
    acted on again by the new rollout.
    """
    return RolloutState(
        phase=Phase.Preparing,
        step=0,
        weight=weight_of(Phase.Preparing, 0, config),
        started_at=now,
        step_started_at=now,
        phase_since=now,
        reason="waiting for the target arm's pods to be ready",
        attempt=attempt,
        last_command=last_command,
    )


def clip(text: str, room: int = 0) -> str:
    """`text` cut to MAX_REASON characters, less `room` kept for a suffix."""
    limit = MAX_REASON - room
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _verdict_to_dict(record: VerdictRecord) -> dict[str, Any]:
    v = record.verdict
    out: dict[str, Any] = {
        "step": record.step,
        "result": v.result.value,
        "reason": v.reason,
        "figures": dict(v.figures),
        "windowStart": v.window_start,
        "windowEnd": v.window_end,
    }
    if v.missing:
        out["missing"] = list(v.missing)
    return out


def _verdict_from_dict(data: Any, where: str) -> VerdictRecord:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: must be a mapping")
    r = _Reader(data, where)
    figures = data.get("figures", {})
    if not isinstance(figures, Mapping) or not all(
        isinstance(k, str) and _is_number(v) for k, v in figures.items()
    ):
        raise ValueError(f"{where}.figures: must map names to finite numbers")
    missing = data.get("missing", [])
    if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
        raise ValueError(f"{where}.missing: must be a list of strings")
    verdict = Verdict(
        result=r.enum("result", Result),
        reason=r.string("reason", ""),
        figures={k: float(v) for k, v in figures.items()},
        window_start=r.number("windowStart"),
        window_end=r.number("windowEnd"),
        missing=tuple(missing),
    )
    return VerdictRecord(step=r.integer("step"), verdict=verdict)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class _Reader:
    """Typed access to one mapping, every error naming `where.key`."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def _fail(self, key: str, what: str) -> ValueError:
        return ValueError(f"{self.where}.{key}: must be {what}, got {self.data.get(key)!r}")

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "an integer")
        return value

    def number(self, key: str) -> float:
        value = self.data.get(key)
        if not _is_number(value):
            raise self._fail(key, "a finite number")
        return float(value)  # type: ignore[arg-type]  # _is_number checked it

    def optional_number(self, key: str) -> float | None:
        return None if self.data.get(key) is None else self.number(key)

    def string(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self._fail(key, "a string")
        return value

    def optional_str(self, key: str) -> str | None:
        return None if self.data.get(key) is None else self.string(key, "")

    def enum(self, key: str, kind: type[E]) -> E:
        value = self.data.get(key)
        for member in kind:
            if value == member.value:
                return member
        raise self._fail(key, "one of " + ", ".join(m.value for m in kind))
