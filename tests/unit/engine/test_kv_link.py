"""The slow-link fault: `Faults.kv_bandwidth_factor` and how the two ends' factors combine."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from pydantic import ValidationError

from tandem.engine.settings import Faults, SimSettings
from tandem.engine.sidechannel import _paced_write, _sleep_until, link_factor


@pytest.mark.parametrize(
    ("own", "peer", "expected"),
    [
        (1.0, None, 1.0),  # an older reader sends no factor
        (1.0, 1.0, 1.0),
        (0.25, None, 0.25),  # the prefill end is slow
        (1.0, 0.1, 0.1),  # the decode end is slow
        (0.5, 0.2, 0.2),  # both: the slower end bounds the link
        (0.2, 0.5, 0.2),
        (0.5, "0.25", 0.25),
        (0.5, "fast", 0.5),  # garbage from the peer counts as a healthy end
        (0.5, 0.0, 0.5),
        (0.5, -1, 0.5),
        (0.5, 7, 0.5),
        (0.5, math.nan, 0.5),
        (0.5, [0.1], 0.5),
    ],
)
def test_link_factor(own: float, peer: Any, expected: float) -> None:
    assert link_factor(own, peer) == expected


def test_the_factor_is_off_by_default_and_bounded() -> None:
    assert Faults().kv_bandwidth_factor == 1.0
    assert Faults().merged({"kv_bandwidth_factor": 0.1}).kv_bandwidth_factor == 0.1
    for bad in (0, -0.5, 1.01):
        with pytest.raises(ValidationError):
            Faults().merged({"kv_bandwidth_factor": bad})


def test_the_factor_can_be_set_from_the_start() -> None:
    settings = SimSettings.from_env({"TANDEM_SIM_FAULTS": '{"kv_bandwidth_factor": 0.05}'})
    assert settings.faults.kv_bandwidth_factor == 0.05


def _event_loops() -> list[str]:
    loops = ["asyncio"]
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        return loops
    return [*loops, "uvloop"]


def _run(loop_name: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop_name == "uvloop":
        import uvloop  # type: ignore[import-not-found,unused-ignore]

        uvloop.run(main())
    else:
        asyncio.run(main())


@pytest.mark.parametrize("loop_name", _event_loops())
def test_a_paced_read_never_ends_before_its_modelled_time(loop_name: str) -> None:
    # uvloop's clock and timers are whole milliseconds: a sleep until a deadline taken from
    # loop.time() ended up to ~1 ms early in real time, and a read recorded less than the model.
    # Deadlines off the millisecond grid and a writer measured on the real clock show it.
    durations = [0.0105 + 0.0013 * i for i in range(24)]
    short: list[float] = []

    async def main() -> None:
        for seconds in durations:
            before = time.monotonic()
            await _sleep_until(before + seconds)
            short.append(time.monotonic() - before - seconds)

        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            started = time.monotonic()
            await _paced_write(writer, 4 * 64 * 1024, 0.0237)
            done.set_result(time.monotonic() - started)
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert len(await reader.read()) == 4 * 64 * 1024
        short.append(await done - 0.0237)
        writer.close()
        server.close()
        await server.wait_closed()

    _run(loop_name, main)
    assert len(short) == len(durations) + 1
    assert min(short) >= 0, short
