"""The operator's command line: the child-event delay's default, its bounds and refusals."""

from __future__ import annotations

import pytest

from tandem.controller.main import CHILD_EVENT_DELAY_SECONDS, parse_args


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
