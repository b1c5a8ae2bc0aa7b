"""Which rollout the command annotation (`tandem.dev/rollout-command`) applies to, pure.

Three rollouts can read the one annotation: the mode rollout (`status.rollout`, colocated <-> P/D),
the revision rollout of the P/D pair (`status.revisions.rollout`) and the disaggregation-mode
rollout (`status.disaggregation.rollout`). The rule (docs/rollout.md, "Commands"):

- `mode:ACTION[/TOKEN]` goes to the mode rollout, `revision:ACTION[/TOKEN]` to the revision
  rollout, `disaggregation:ACTION[/TOKEN]` to the disaggregation rollout, whatever else runs;
- a plain `ACTION[/TOKEN]` goes to the one rollout that can take a command (a record in a phase
  other than Promoted); with none, to the mode rollout (which reports it as not applicable, as
  before); with more than one, to none: it is reported as ambiguous (in `status.rollout.problems`
  and an Event) on every pass while the annotation holds it, and never recorded, so scoping it acts
  at once.

The rollout a command went to echoes its kind in `lastCommandOutcome` (`mode rollout: ...`,
`revision rollout: ...`, `disaggregation rollout: ...`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tandem.api.status import RolloutStatus
from tandem.rollout.machine import COMMAND_SCOPES

MODE, REVISION, DISAGGREGATION = COMMAND_SCOPES
# Phases in which a rollout still acts on commands (Promoted ignores every command).
_TAKES_COMMANDS: Final = ("Preparing", "Shifting", "Paused", "RollingBack", "RolledBack")


@dataclass(frozen=True, slots=True)
class Routed:
    mode: str | None = None  # the annotation value the mode rollout sees (None: no command)
    revision: str | None = None  # ... the revision rollout sees
    problem: str | None = None  # why none got it (reported, not recorded)
    disaggregation: str | None = None  # ... the disaggregation-mode rollout sees


def scope_of(value: str) -> tuple[str | None, str]:
    """(scope, the command without it): `revision:promote/2` -> ("revision", "promote/2")."""
    head, sep, rest = value.strip().partition(":")
    if sep and head.strip() in COMMAND_SCOPES:
        return head.strip(), rest.strip()
    return None, value.strip()


def _takes_commands(record: RolloutStatus | None) -> bool:
    return record is not None and record.phase in _TAKES_COMMANDS


def _to(scope: str, value: str) -> Routed:
    return Routed(**{scope: value})


def route(
    value: str | None,
    mode: RolloutStatus | None,
    revision: RolloutStatus | None,
    disaggregation: RolloutStatus | None = None,
) -> Routed:
    """Where the annotation's `value` goes this pass, given the rollouts' stored records."""
    if value is None or not value.strip():
        return Routed()
    scope, _ = scope_of(value)
    if scope is not None:
        return _to(scope, value)
    records = {MODE: mode, REVISION: revision, DISAGGREGATION: disaggregation}
    taking = [kind for kind in COMMAND_SCOPES if _takes_commands(records[kind])]
    if len(taking) > 1:
        command = value.strip()
        kinds = " and ".join(f"a {kind} rollout" for kind in taking)
        say = " or ".join(f"'{kind}:{command}'" for kind in taking)
        return Routed(
            problem=(
                f"rollout command {command!r} ignored: {kinds} are "
                f"{'both' if len(taking) == 2 else 'all'} in progress; say which: {say}"
            )
        )
    return _to(taking[0] if taking else MODE, value)
