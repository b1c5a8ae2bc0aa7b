"""Which rollout the command annotation (`tandem.dev/rollout-command`) applies to, pure.

Two rollouts can read the one annotation: the mode rollout (`status.rollout`, colocated <-> P/D) and
the revision rollout of the P/D pair (`status.revisions.rollout`). The rule (docs/rollout.md,
"Commands"):

- `mode:ACTION[/TOKEN]` goes to the mode rollout, `revision:ACTION[/TOKEN]` to the revision
  rollout, whatever else runs;
- a plain `ACTION[/TOKEN]` goes to the one rollout that can take a command (a record in a phase
  other than Promoted); with none, to the mode rollout (which reports it as not applicable, as
  before); with both, to neither: it is reported as ambiguous (in `status.rollout.problems` and an
  Event) on every pass while the annotation holds it, and never recorded, so scoping it acts at once.

The rollout a command went to echoes its kind in `lastCommandOutcome` (`mode rollout: ...`,
`revision rollout: ...`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tandem.api.status import RolloutStatus
from tandem.rollout.machine import COMMAND_SCOPES

MODE, REVISION = COMMAND_SCOPES
# Phases in which a rollout still acts on commands (Promoted ignores every command).
_TAKES_COMMANDS: Final = ("Preparing", "Shifting", "Paused", "RollingBack", "RolledBack")


@dataclass(frozen=True, slots=True)
class Routed:
    mode: str | None = None  # the annotation value the mode rollout sees (None: no command)
    revision: str | None = None  # ... the revision rollout sees
    problem: str | None = None  # why neither got it (reported, not recorded)


def scope_of(value: str) -> tuple[str | None, str]:
    """(scope, the command without it): `revision:promote/2` -> ("revision", "promote/2")."""
    head, sep, rest = value.strip().partition(":")
    if sep and head.strip() in COMMAND_SCOPES:
        return head.strip(), rest.strip()
    return None, value.strip()


def _takes_commands(record: RolloutStatus | None) -> bool:
    return record is not None and record.phase in _TAKES_COMMANDS


def route(value: str | None, mode: RolloutStatus | None, revision: RolloutStatus | None) -> Routed:
    """Where the annotation's `value` goes this pass, given both rollouts' stored records."""
    if value is None or not value.strip():
        return Routed()
    scope, _ = scope_of(value)
    if scope == MODE:
        return Routed(mode=value)
    if scope == REVISION:
        return Routed(revision=value)
    mode_open, revision_open = _takes_commands(mode), _takes_commands(revision)
    if mode_open and revision_open:
        return Routed(
            problem=(
                f"rollout command {value.strip()!r} ignored: a mode rollout and a revision rollout are "
                f"both in progress; say which: 'mode:{value.strip()}' or 'revision:{value.strip()}'"
            )
        )
    if revision_open:
        return Routed(revision=value)
    return Routed(mode=value)
