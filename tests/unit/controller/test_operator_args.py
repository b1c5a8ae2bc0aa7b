"""The operator's command line: the child-event delay's and the unschedulable grace's defaults, bounds and
refusals."""

from __future__ import annotations

import pytest

from tandem.controller.main import CHILD_EVENT_DELAY_SECONDS, parse_args
from tandem.status.derive import UNSCHEDULABLE_GRACE_SECONDS


@pytest.mark.parametrize(
    ("argv", "delay"),
    [
        ([], CHILD_EVENT_DELAY_SECONDS),
        (["--child-event-delay-seconds", "0"], 0.0),
        (["--child-event-delay-seconds", "2.5"], 2.5),
        (["--child-event-delay-seconds", "60"], 60.0),
    ],
)
def test_child_event_delay_accepted(argv: list[str], delay: float) -> None:
    assert parse_args(argv).child_event_delay_seconds == delay


@pytest.mark.parametrize("value", ["-1", "60.5", "nan", "inf", "soon"])
def test_child_event_delay_refused_naming_the_flag(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--child-event-delay-seconds", value])
    assert "--child-event-delay-seconds" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "grace"),
    [
        ([], UNSCHEDULABLE_GRACE_SECONDS),
        (["--unschedulable-grace-seconds", "0"], 0.0),
        (["--unschedulable-grace-seconds", "900"], 900.0),
    ],
)
def test_unschedulable_grace_accepted(argv: list[str], grace: float) -> None:
    assert parse_args(argv).unschedulable_grace_seconds == grace


@pytest.mark.parametrize("value", ["-1", "86401", "nan", "inf", "soon"])
def test_unschedulable_grace_refused_naming_the_flag(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--unschedulable-grace-seconds", value])
    assert "--unschedulable-grace-seconds" in capsys.readouterr().err
