"""`tandem probe` picks the pods to check: Ready, with an IP, not being deleted."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.controller.probe import parse_args, ready_pod_ips


def pod(
    name: str, ready: str = "True", ip: str | None = "127.20.1.5", deleting: bool = False
) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name}
    if deleting:
        md["deletionTimestamp"] = "2026-11-29T10:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": ready}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": md, "status": status}


def test_ready_pod_ips() -> None:
    pods = [
        pod("a"),
        pod("b", ready="False"),
        pod("c", ip=None),
        pod("d", deleting=True),
        pod("e", ip="127.20.1.6"),
    ]
    assert ready_pod_ips(pods) == {"a": "127.20.1.5", "e": "127.20.1.6"}


@pytest.mark.parametrize(
    "argv", [["--port", "8081"], ["--selector", "a=b", "--port", "0"], ["--selector", "a=b"]]
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
