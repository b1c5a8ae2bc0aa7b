"""The NIXL side channel over TCP: the decode engine reads a prefill engine's held KV.

Wire format (one connection per read): the reader sends one JSON line
`{"op": "read", "remote_request_id", "remote_block_ids", "prompt_tokens", "prompt_key", "engine_id",
"kv_bandwidth_factor"}`;
the holder answers one JSON line, `{"ok": true, "bytes": N}` followed by N payload bytes, or
`{"ok": false, "error": "..."}`. Other ops: `release` (decode gave up; free now) and `heartbeat`
(extend the leases of `remote_request_ids`), each answered with `{"ok": true}`.

The payload is the modelled KV size divided by TANDEM_SIM_KV_SCALE, and it is paced so the read
lasts the modelled transfer time (bandwidth x time scale): a real transfer over loopback, sized
and timed by the model without moving gigabytes. The `kv_bandwidth_factor` fault (either end's;
the lower wins, `link_factor`) scales the bandwidth: a slow link, as a silent TCP fallback.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

CONNECT_TIMEOUT_S = 5.0  # vLLM's ZMQ handshake receive timeout
_CHUNK = 64 * 1024
_MAX_PACING_SLICES = 16
_MIN_SLEEP_S = 0.001

# Given the parsed request, returns (response header, payload bytes, seconds to spread them over,
# completion callback taking ok).
ReadHandler = Callable[[dict[str, Any]], Awaitable[tuple[dict[str, Any], int, float, Callable[[bool], None]]]]
SimpleHandler = Callable[[dict[str, Any]], dict[str, Any]]


class SideChannelServer:
    def __init__(self, on_read: ReadHandler, on_simple: SimpleHandler) -> None:
        self._on_read = on_read
        self._on_simple = on_simple
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), CONNECT_TIMEOUT_S)
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("request must be a JSON object")
            if request.get("op") != "read":
                writer.write(json.dumps(self._on_simple(request)).encode() + b"\n")
                await writer.drain()
                return
            header, size, seconds, done = await self._on_read(request)
            writer.write(json.dumps(header).encode() + b"\n")
            if not header.get("ok"):
                await writer.drain()
                return
            ok = False
            try:
                await _paced_write(writer, size, seconds)
                ok = True
            finally:
                done(ok)
        except (TimeoutError, OSError, ValueError):
            pass
        finally:
            writer.close()


def link_factor(own: float, peer: Any) -> float:
    """The fraction of the configured link a read runs at: the lower of this engine's
    `kv_bandwidth_factor` fault and the reader's (sent with the read; anything but a number in
    (0, 1] counts as 1). A slow NIC at either end slows the transfer."""
    try:
        theirs = float(peer)
    except (TypeError, ValueError):
        theirs = 1.0
    if not 0.0 < theirs <= 1.0:  # also NaN
        theirs = 1.0
    return min(own, theirs)


async def _sleep_until(deadline: float) -> None:
    """Sleeps until `time.monotonic()` reaches `deadline`. uvloop keeps its clock and timers in
    whole milliseconds, so one of its sleeps can end up to about 1 ms early in real time; what is
    left is slept again, at least a millisecond, so the wait is never short."""
    while (left := deadline - time.monotonic()) > 0:  # noqa: ASYNC110 (a deadline, not a condition)
        await asyncio.sleep(max(left, _MIN_SLEEP_S))


async def _paced_write(writer: asyncio.StreamWriter, size: int, seconds: float) -> None:
    start = time.monotonic()
    slices = max(1, min(_MAX_PACING_SLICES, size // _CHUNK))
    per_slice = size // slices
    zeros = bytes(min(per_slice + slices, _CHUNK))
    sent = 0
    for k in range(1, slices + 1):
        # Slice k is sent once its share of the modelled time has passed, so the reader has the last
        # byte at `seconds`, not one slice early.
        await _sleep_until(start + seconds * k / slices)
        target_bytes = size if k == slices else per_slice * k
        while sent < target_bytes:
            n = min(len(zeros), target_bytes - sent)
            writer.write(zeros[:n])
            sent += n
        await writer.drain()


@dataclass
class ReadOutcome:
    ok: bool
    bytes_received: int
    post_seconds: float  # connect + request sent
    seconds: float  # whole read
    error: str | None = None


async def read_remote_kv(host: str, port: int, request: dict[str, Any], read_timeout: float) -> ReadOutcome:
    """Reads one held KV from a prefill engine; never raises for network trouble."""
    started = time.monotonic()
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
        assert writer is not None
        writer.write(json.dumps({"op": "read", **request}).encode() + b"\n")
        await writer.drain()
        posted = time.monotonic() - started
        header = json.loads(await asyncio.wait_for(reader.readline(), read_timeout))
        if not header.get("ok"):
            return ReadOutcome(
                False, 0, posted, time.monotonic() - started, str(header.get("error", "refused"))
            )
        expected = int(header["bytes"])
        received = 0
        while received < expected:
            chunk = await asyncio.wait_for(reader.read(min(1 << 20, expected - received)), read_timeout)
            if not chunk:
                raise ConnectionError(f"connection closed after {received} of {expected} bytes")
            received += len(chunk)
        return ReadOutcome(True, received, posted, time.monotonic() - started)
    except (TimeoutError, OSError, ValueError, KeyError) as exc:
        elapsed = time.monotonic() - started
        return ReadOutcome(False, 0, elapsed, elapsed, f"{type(exc).__name__}: {exc}".rstrip(": "))
    finally:
        if writer is not None:
            writer.close()


async def send_simple(host: str, port: int, request: dict[str, Any]) -> dict[str, Any] | None:
    """A one-line op (`release`, `heartbeat`); None when the peer cannot be reached."""
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
        assert writer is not None
        writer.write(json.dumps(request).encode() + b"\n")
        await writer.drain()
        answer = json.loads(await asyncio.wait_for(reader.readline(), CONNECT_TIMEOUT_S))
        return answer if isinstance(answer, dict) else None
    except (TimeoutError, OSError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()
