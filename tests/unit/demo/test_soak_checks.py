"""The soak bench's pure parts (`bench/soak.py`): how a client's failure is classed, which failures a
fault explains (the router's failure rules, within the fault's window), and the RSS slope common to
processes that restart. The soak itself runs in tests/integration/chaos/test_soak_short.py."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import ModuleType

import pytest

from tandem.demo.stats import Sample
from tandem.devcluster.testing import load_file

ROOT = Path(__file__).resolve().parents[3]


def _bench() -> ModuleType:
    return load_file("bench_soak", ROOT / "bench" / "soak.py")


soak = _bench()


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("HTTP 503: no ready decode pod", "http_503"),
        ("HTTP 429: rate limited", "http_429"),
        ("ClientConnectorError: Cannot connect to host 127.0.0.5:8080", "connect"),
        ("ClientOSError: [Errno 104] Connection reset by peer", "connect"),
        ("ServerDisconnectedError: Server disconnected", "disconnected"),
        ("ClientPayloadError: Response payload is not completed", "disconnected"),
        ("TimeoutError: ", "timeout"),
        ("stream ended without a token", "no_token"),
        ("{'message': 'decode failed mid-stream', 'type': 'server_error'}", "stream_error"),
        ("ValueError: Expecting value", "other"),
    ],
)
def test_a_failure_is_classed_by_the_clients_error(error: str, reason: str) -> None:
    assert soak.failure_reason(Sample(ok=False, error=error)) == reason
    assert soak.failure_reason(Sample(ok=True)) == "ok"


def finished(reason: str, at: float) -> object:
    return soak.Finished(Sample(ok=reason == "ok", error="" if reason == "ok" else reason), at, reason)


# Faults at a fake clock: the decode fault at 100 s, whole again at 110 s; the router's at 200-205 s;
# the operator's at 300-303 s; grace 30 s.
FAULTS = [
    soak.Fault("decode", "soak-decode-0", 100.0, 110.0),
    soak.Fault("router", "soak-router-x", 200.0, 205.0),
    soak.Fault("operator", "pid 1", 300.0, 303.0),
]


@pytest.mark.parametrize(
    ("reason", "at", "explained"),
    [
        ("ok", 50.0, True),  # successes are never listed
        ("stream_error", 105.0, True),  # a stream cut by the decode pod's deletion
        ("stream_error", 140.0, True),  # within the grace after recovery (110 + 30)
        ("stream_error", 140.5, False),  # after it
        ("stream_error", 99.0, False),  # before the fault
        ("connect", 105.0, False),  # a decode pod's deletion does not refuse connections
        ("connect", 201.0, True),  # the deleted router's address
        ("http_503", 204.0, True),  # the deleted router draining
        ("stream_error", 202.0, False),  # a router deletion does not cut streams (it drains)
        ("timeout", 301.0, False),  # the operator's crash allows no failure at all
        ("stream_error", 301.0, False),
    ],
)
def test_a_failure_is_explained_only_by_a_fault_that_allows_it_within_its_window(
    reason: str, at: float, explained: bool
) -> None:
    listed = soak.unexplained([finished(reason, at)], FAULTS, grace=30.0)
    assert (listed == []) is explained


def test_the_slope_is_common_to_restarted_processes_and_ignores_their_level() -> None:
    # Two processes, each flat at its own level: no slope, though the second starts lower.
    flat = [(1, t, 80.0) for t in (0, 60, 120)] + [(2, t, 40.0) for t in (180, 240, 300)]
    assert soak.pooled_slope(flat) == 0.0
    # Each grows 1 MB a minute from its own level: 1/60 MB/s, whatever the levels.
    growing = [(1, t, 80.0 + t / 60) for t in (0, 60, 120)] + [
        (2, t, 10.0 + (t - 180) / 60) for t in (180, 240)
    ]
    assert soak.pooled_slope(growing) == pytest.approx(1 / 60)
    assert math.isnan(soak.pooled_slope([(1, 0.0, 5.0)]))


def test_rss_points_leave_out_each_processes_warmup_and_the_first_half() -> None:
    def reading(at: float, op_pid: int, routers: dict[str, tuple[int, float, float]]) -> object:
        return soak.Reading(at, 0, 0, {}, 0, op_pid, 70.0 + at / 1000, 60.0, routers, {})

    readings = [
        reading(0, 1, {"r-a": (10, 80.0, 4.0)}),
        reading(30, 1, {"r-a": (10, 81.0, 4.0)}),
        reading(90, 2, {"r-a": (10, 82.0, 4.0), "r-b": (11, 50.0, 4.0)}),
        reading(120, 2, {"r-a": (10, 83.0, 4.0), "r-b": (11, 79.0, 4.0)}),
        reading(160, 2, {"r-b": (11, 79.5, 4.0)}),
    ]
    # The operator: pid 1's readings all within its warmup; pid 2 first seen at 90, so from 150 on.
    assert [(p, t) for p, t, _ in soak.rss_points(readings, "operator", since=0, warmup=60)] == [(2, 160.0)]
    # The routers since 60: r-a (pid 10, first seen at 0) at 90 and 120; r-b (first seen 90) at 160.
    assert [(p, t) for p, t, _ in soak.rss_points(readings, "router", since=60, warmup=60)] == [
        (10, 90.0),
        (10, 120.0),
        (11, 160.0),
    ]


class NoError:
    error: BaseException | None = None


def result_of(**changes: object) -> object:
    """A clean 30-minute result (every check passes), with `changes` applied."""
    start = 1000.0
    flat = [
        soak.Reading(start + t, 0, 0, {}, 0, 7, 72.0, 60.0, {"soak-router-a": (8, 79.0, 4.0)}, {})
        for t in range(0, 1800, 30)
    ]
    base = {
        "settings": soak.Settings(minutes=30),
        "started_at": start,
        "readings": flat,
        "faults": [soak.Fault("decode", "soak-decode-0", start + 60, start + 66)],
        "finished": [finished("ok", start + 10), finished("stream_error", start + 62)],
        "sent": 2,
        "baseline_tasks": {"operator": 60.0, "router/soak-router-a": 4.0},
        "quiet_tasks": {"operator": 62.0, "router/soak-router-b": 4.0},
        "quiet_after_s": 1.0,
        "checks": [],
    }
    return soak.Result(**(base | changes))


def failing(result: object, quiet: bool = True) -> list[str]:
    return [c.name for c in soak.checks(result, NoError(), {"quiet": quiet, "detail": ""}) if not c.ok]


def test_a_clean_run_passes_every_check() -> None:
    assert failing(result_of()) == []


@pytest.mark.parametrize(
    ("changes", "quiet", "failed"),
    [
        ({"sent": 3}, True, "every request accounted for"),  # one still in flight
        (
            {
                "faults": [soak.Fault("decode", "soak-decode-0", 1060.0, math.nan)],
                "finished": [finished("ok", 1010.0)],
                "sent": 1,
            },
            True,
            "whole again",
        ),
        ({"finished": [finished("timeout", 1062.0)], "sent": 1}, True, "failures only"),
        ({}, False, "zero KV held"),
        ({"quiet_tasks": {"operator": 64.0, "router/soak-router-b": 4.0}}, True, "task counts"),
    ],
)
def test_each_check_fails_on_its_own_fault(changes: dict[str, object], quiet: bool, failed: str) -> None:
    names = failing(result_of(**changes), quiet)
    assert len(names) == 1, names
    assert failed in names[0]


def test_rss_growing_within_each_process_fails_the_slope_check() -> None:
    # The operator restarted every 4 minutes, each process growing 1 MB a minute (60 MB/hour).
    readings = [
        soak.Reading(1000.0 + t, 0, 0, {}, 0, 100 + t // 240, 72.0 + (t % 240) / 60, 60.0, {}, {})
        for t in range(0, 1800, 30)
    ]
    routers = result_of().readings  # type: ignore[attr-defined]
    mixed = [dataclasses.replace(r, routers=flat.routers) for r, flat in zip(readings, routers, strict=True)]
    names = failing(result_of(readings=mixed))
    assert names == ["RSS slope over the second half under 30 MB/hour"]
