"""controller.commands.route: which rollout the one command annotation applies to (table-driven)."""

from __future__ import annotations

import pytest

from tandem.api.status import RolloutStatus
from tandem.controller.commands import Routed, route, scope_of
from tandem.rollout.machine import Command, parse_command


def record(phase: str) -> RolloutStatus:
    extra = {"pause_cause": "AwaitingPromote"} if phase == "Paused" else {}
    if phase == "RollingBack":
        extra = {"rollback_stage": "RestoringWeight"}
    return RolloutStatus(
        phase=phase, weight=0, started_at=0, step_started_at=0, phase_since=0, reason="", **extra
    )


AMBIGUOUS = (
    "rollout command 'promote' ignored: a mode rollout and a revision rollout are both in progress; "
    "say which: 'mode:promote' or 'revision:promote'"
)

# (annotation, mode rollout's phase, revision rollout's phase) -> where it goes
ROUTES = [
    (None, "Shifting", "Shifting", Routed()),
    ("  ", "Shifting", None, Routed()),
    ("promote", None, None, Routed(mode="promote")),  # nothing running: the mode rollout reports it
    ("promote", "Shifting", None, Routed(mode="promote")),
    ("promote", "Promoted", None, Routed(mode="promote")),
    ("promote", None, "Shifting", Routed(revision="promote")),
    ("promote", "Promoted", "Paused", Routed(revision="promote")),  # a promoted rollout takes none
    ("retry", None, "RolledBack", Routed(revision="retry")),
    ("promote", "Shifting", "Promoted", Routed(mode="promote")),
    ("promote", "Shifting", "Shifting", Routed(problem=AMBIGUOUS)),
    ("promote", "RolledBack", "RollingBack", Routed(problem=AMBIGUOUS)),
    ("mode:promote", "Shifting", "Shifting", Routed(mode="mode:promote")),
    ("revision:abort/2", "Shifting", "Shifting", Routed(revision="revision:abort/2")),
    ("revision:abort", "Shifting", None, Routed(revision="revision:abort")),  # no revision rollout: unused
    ("mode:retry", None, "RolledBack", Routed(mode="mode:retry")),
    ("pods:promote", None, "Shifting", Routed(revision="pods:promote")),  # unknown scope: an unknown action
]


@pytest.mark.parametrize(("value", "mode", "revision", "expected"), ROUTES)
def test_route(value: str | None, mode: str | None, revision: str | None, expected: Routed) -> None:
    got = route(value, record(mode) if mode else None, record(revision) if revision else None)
    assert got == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("revision:promote/2", Command("promote", "revision:promote/2")),
        ("mode:abort", Command("abort", "mode:abort")),
        (" mode : retry ", Command("retry", "mode : retry")),
        ("pods:promote", Command("pods:promote", "pods:promote")),
    ],
)
def test_parse_command_strips_the_scope_only(value: str, expected: Command) -> None:
    assert parse_command(value) == expected


def test_scope_of() -> None:
    assert scope_of("revision:promote/2") == ("revision", "promote/2")
    assert scope_of("promote/a:b") == (None, "promote/a:b")
