"""The router's HTTP/1.1 server: connections, request parsing, response framing, flow control.

Why not aiohttp's server: a streamed answer crosses the router once per token, and with aiohttp
each token costs a task switch, a drain and its chunk writer (measured in
`bench/router_overhead.py`). Here the parsing is llhttp's (via httptools, as in uvicorn) and a
response is written straight to the transport, so the relay in `relay.py` can forward a token from
the engine's socket callback to the client's without waking a task.

What it does: keep-alive and pipelined requests (answered in order, one at a time); bodies framed by
Content-Length or chunked; `Expect: 100-continue`; a body size limit answered 413 before the body
is read; 400 on unparsable requests; 431 when a request's head (line and headers) grows past
`MAX_HEAD_BYTES`; 408 and close when a request is not read whole within the read timeout (a
slowloris: headers or body trickled). The read deadline rides on the connection's one idle timer,
so it costs a clock read per request and no timer of its own. Each request runs as a task; the
client closing its connection cancels that task, which is what cancels both legs of an abandoned
request. When the client's socket buffer fills, `ClientStream` tells whoever feeds it to pause (see
`when_writable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final, cast

import httptools

from tandem.router.errors import ClientGone, error_body

log = logging.getLogger(__name__)

_HIGH_WATER: Final = 256 * 1024  # bytes buffered for a client before its feeders are paused
_MAX_QUEUED: Final = 8  # pipelined requests waiting behind the one being answered
KEEPALIVE_S: Final = 75.0  # an idle keep-alive connection is closed after this (nginx's default)
READ_TIMEOUT_S: Final = 30.0  # a request's head and body must arrive within this (from its first byte)
MAX_HEAD_BYTES: Final = 1024 * 1024  # request line + headers; a head still growing past this gets 431
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_CHUNK_END: Final = b"0\r\n\r\n"


@dataclass(slots=True)
class FrontRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value
    body: bytes
    keep_alive: bool

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _head(status: int, headers: dict[str, str], framing: bytes, keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {_reason(status)}\r\n".encode()]
    for name, value in headers.items():
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    lines.append(framing)
    if not keep_alive:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


class ClientStream:
    """One request's answer: a whole response, or a chunked stream written as bytes arrive.

    The flow's `Responder`. Writes never block: they go to the transport's buffer, and
    `writable`/`when_writable` let a feeder (the relay) pause its source while the client lags.
    """

    __slots__ = ("_conn", "_headers", "_pending_head", "finished", "keep_alive", "started", "status")

    def __init__(self, conn: FrontProtocol, keep_alive: bool, headers: dict[str, str]) -> None:
        self._conn = conn
        self._headers = headers  # sent with every answer (X-Request-Id)
        self._pending_head = b""  # a stream's head waits for its first bytes: one send, not two
        self.keep_alive = keep_alive
        self.started = False  # has the answer begun (is its status decided)?
        self.finished = False
        self.status = 0

    def set_header(self, name: str, value: str) -> None:
        self._headers[name] = value

    async def answer(self, status: int, body: bytes, content_type: str) -> None:
        self.answer_nowait(status, body, content_type)

    def answer_nowait(self, status: int, body: bytes, content_type: str) -> None:
        if self.started:
            raise RuntimeError("answer already started")
        self.started = self.finished = True
        self.status = status
        headers = {"Content-Type": content_type or "application/json", **self._headers}
        framing = f"Content-Length: {len(body)}\r\n".encode()
        self._conn.send(_head(status, headers, framing, self._keeps_alive()) + body)

    def start_stream_nowait(self, status: int, content_type: str) -> None:
        if self.started:
            raise RuntimeError("answer already started")
        self.started = True
        self.status = status
        headers = {"Content-Type": content_type or "text/event-stream", "Cache-Control": "no-cache"}
        headers.update(self._headers)
        self._pending_head = _head(status, headers, b"Transfer-Encoding: chunked\r\n", self._keeps_alive())

    def _keeps_alive(self) -> bool:
        """Whether the connection stays open after this answer (not while the router drains)."""
        return self.keep_alive and not self._conn.draining

    def write_nowait(self, data: bytes) -> None:
        """Sends one chunk; raises ClientGone when the client has left."""
        if not data:
            return
        frame = b"%x\r\n%b\r\n" % (len(data), data)
        if self._pending_head:
            frame, self._pending_head = self._pending_head + frame, b""
        self._conn.send_or_raise(frame)

    def finish_nowait(self, data: bytes = b"") -> None:
        """The last bytes and the end of the stream, in one send."""
        if self.finished:
            return
        self.finished = True
        frame = (b"%x\r\n%b\r\n" % (len(data), data) if data else b"") + _CHUNK_END
        if self._pending_head:
            frame, self._pending_head = self._pending_head + frame, b""
        self._conn.send_or_raise(frame)

    async def write(self, data: bytes) -> None:
        self.write_nowait(data)
        await self._conn.drain()

    async def finish(self, data: bytes) -> None:
        self.finish_nowait(data)

    @property
    def writable(self) -> bool:
        """False while the client's buffer is over the high-water mark."""
        return not self._conn.paused

    def when_writable(self, callback: Callable[[], None]) -> None:
        """Calls `callback` once when the client has drained (or gone: then feeders stop anyway)."""
        self._conn.on_drained(callback)


Handler = Callable[[FrontRequest, ClientStream], Awaitable[None]]
# Told of each request the front answers itself: "body_too_large" or "malformed_request".
RefusalHook = Callable[[str], None]


def _ignore(reason: str) -> None:
    pass


@dataclass(slots=True)
class _Settings:
    """What every connection of one `Front` shares."""

    handler: Handler
    max_body_bytes: Callable[[], int]  # read as each request's headers end: the limit may change
    keepalive_s: float
    on_refused: RefusalHook
    read_timeout_s: float = READ_TIMEOUT_S
    connections: set[FrontProtocol] = field(default_factory=set)


class FrontProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, settings: _Settings) -> None:
        self._settings = settings
        self._handler = settings.handler
        self._on_refused = settings.on_refused
        self._max_body = 0  # read from the settings as each request's headers end
        self._connections = settings.connections
        self._transport: asyncio.Transport | None = None
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        self._refused = False  # the current request was answered already (413): ignore its body
        self._queue: deque[FrontRequest] = deque()
        self._reading_paused = False  # by us, for a client that pipelines without reading
        self._task: asyncio.Task[None] | None = None
        self._drained: list[Callable[[], None]] = []
        self._drain_waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.closed = False
        self.draining = False  # shutting down: finish the answer in progress, take no other
        # One keep-alive timer per connection, moved forward only when it fires (not per request).
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # when the connection last became idle; None: busy
        # When the request being read began (its first byte parsed); None between requests.
        self._reading_since: float | None = None
        self._in_head = True  # reading a request line and headers (not a body)
        self._lingering = False  # answered 413: dropping the rest of the body, then closing
        self._head_bytes = 0  # bytes received while still in a head (bounded by MAX_HEAD_BYTES)
        self._loop = asyncio.get_running_loop()

    # -- transport callbacks ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same methods.
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=_HIGH_WATER)
        self._connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._parser = None  # it refers back to this protocol: no cycle left for the GC
        self._disarm_idle()
        self._connections.discard(self)
        self._queue.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._wake_drained()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_drained()

    def data_received(self, data: bytes) -> None:
        if self._parser is None:
            return
        try:
            self._parser.feed_data(data)
            if self._in_head:  # the head is not complete yet: count what it has taken so far
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    self._on_refused("header_too_large")
                    self._fail(431, f"request line and headers over {MAX_HEAD_BYTES} bytes")
        except httptools.HttpParserUpgrade:
            self._on_refused("malformed_request")
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as error:
            self._on_refused("malformed_request")
            self._fail(400, f"malformed HTTP request: {error}")

    # -- parser callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._idle_since = None
        self._reading_since = self._loop.time()
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_size = 0
        self._refused = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._max_body = self._settings.max_body_bytes()
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._max_body:
            self._refuse_body(f"request body over {self._max_body} bytes")
            return
        if self._headers.get("expect", "").lower() == "100-continue":
            self.send(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._body_size += len(body)
        if self._body_size > self._max_body:  # chunked, or more than Content-Length promised
            self._refuse_body(f"request body over {self._max_body} bytes")
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._reading_since = None
        self._in_head = True
        if self._refused:
            if self._lingering:  # the refused body is over: the 413 is out, close
                self._close_after_flush()
            return
        url = httptools.parse_url(self._url) if self._url.startswith(b"/") else None
        if url is None:
            self._on_refused("malformed_request")
            self._fail(400, "request target must be a path")
            return
        parser = self._parser
        assert parser is not None  # it is calling us
        request = FrontRequest(
            method=parser.get_method().decode("latin-1"),
            path=url.path.decode("latin-1"),
            headers=self._headers,
            body=b"".join(self._body),
            keep_alive=parser.should_keep_alive(),
        )
        self._queue.append(request)
        if len(self._queue) > _MAX_QUEUED and self._transport is not None and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()  # a client pipelining without reading: let TCP push back
        if self._task is None:
            self._next()

    # -- answering -------------------------------------------------------------------------
    def _next(self) -> None:
        if not self._queue or self.closed:
            self._task = None
            self._arm_idle()
            return
        if self._reading_paused and self._transport is not None and len(self._queue) <= _MAX_QUEUED:
            self._reading_paused = False
            self._transport.resume_reading()
        request = self._queue.popleft()
        stream = ClientStream(self, request.keep_alive, {})
        self._task = asyncio.get_running_loop().create_task(self._run(request, stream))

    async def _run(self, request: FrontRequest, stream: ClientStream) -> None:
        try:
            await self._handler(request, stream)
        except (asyncio.CancelledError, ClientGone):
            self.close()
            return
        except Exception:
            log.exception("handler failed on %s %s", request.method, request.path)
            if not stream.started:
                stream.answer_nowait(500, error_body(500, "internal router error"), "application/json")
            else:
                self.close()  # a half-sent answer cannot be completed or followed
                return
        if not stream.finished:
            if stream.started:  # a stream its handler left open: cut it, never fake its end
                self.close()
                return
            stream.answer_nowait(502, error_body(502, "no answer"), "application/json")
        if not request.keep_alive or self.draining:
            self._task = None
            self._close_after_flush()
            return
        self._next()

    def _period(self) -> float:
        return min(self._settings.keepalive_s, self._settings.read_timeout_s)

    def _arm_idle(self) -> None:
        loop = self._loop
        self._idle_since = loop.time()
        if self._idle_timer is None and not self.closed:
            self._idle_timer = loop.call_later(self._period(), self._idle_expired)

    def _disarm_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if self.closed:
            return
        loop = self._loop
        now = loop.time()
        left = self._period()  # busy: look again a full period later
        reading = self._reading_since
        if reading is not None and self._task is None:  # the request it waits on is still arriving
            read_left = reading + self._settings.read_timeout_s - now
            if read_left <= 0 and self._lingering:  # the 413 is out; stop waiting for its body
                self._close_after_flush()
                return
            if read_left <= 0:
                self._on_refused("read_timeout")
                self._fail(408, f"request not received within {self._settings.read_timeout_s:g} s")
                return
            left = min(left, read_left)
        since = self._idle_since
        if since is not None and self._task is None and not self._queue:
            idle_left = since + self._settings.keepalive_s - now
            if idle_left <= 0:
                self.close()
                return
            left = min(left, idle_left) if reading is not None else idle_left
        self._idle_timer = loop.call_later(left, self._idle_expired)

    def _refuse_body(self, message: str) -> None:
        """Answers 413 now, before the body is read, and closes once the body is over: the body
        is read and dropped meanwhile (closing with it unread would make the client's kernel reset
        the connection, and a client that sends its whole body before reading would see the reset,
        not the 413). The read timeout bounds the wait."""
        self._refused = True
        self._on_refused("body_too_large")
        expects = self._headers.get("expect", "").lower() == "100-continue"  # the body is not coming
        if expects or self._task is not None or self.closed:  # (behind an answer: no answer fits)
            self._fail(413, message)
            return
        ClientStream(self, False, {}).answer_nowait(413, error_body(413, message), "application/json")
        self._queue.clear()
        self._lingering = True

    def _fail(self, status: int, message: str) -> None:
        """Answers an unreadable request and closes (the stream is out of step)."""
        if self._task is None and not self.closed:
            stream = ClientStream(self, False, {})
            stream.answer_nowait(status, error_body(status, message), "application/json")
        self._queue.clear()
        self._close_after_flush()

    def _close_after_flush(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()  # closes once the buffer is written
        self.closed = True

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self.closed = True

    # -- writing ---------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        if not self.closed and self._transport is not None:
            self._transport.write(data)

    def send_or_raise(self, data: bytes) -> None:
        if self.closed or self._transport is None or self._transport.is_closing():
            raise ClientGone()
        self._transport.write(data)

    def on_drained(self, callback: Callable[[], None]) -> None:
        if not self.paused or self.closed:
            callback()
        else:
            self._drained.append(callback)

    async def drain(self) -> None:
        if not self.paused or self.closed:
            return
        waiter = self._drain_waiter
        if waiter is None:
            waiter = self._drain_waiter = asyncio.get_running_loop().create_future()
        await waiter
        if self.closed:
            raise ClientGone()

    def _wake_drained(self) -> None:
        callbacks, self._drained = self._drained, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("drain callback failed")
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The request being answered, if any."""
        return self._task


def _fixed(value: int) -> Callable[[], int]:
    def get() -> int:
        return value

    return get


class Front:
    """The listening socket and its connections; `max_body_bytes` is a number or a function read as
    each request's headers end (spec.router.admission.maxBodyBytes changes while connections live)."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int | Callable[[], int],
        keepalive_s: float = KEEPALIVE_S,
        on_refused: RefusalHook = _ignore,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        limit = _fixed(max_body_bytes) if isinstance(max_body_bytes, int) else max_body_bytes
        self._settings = _Settings(handler, limit, keepalive_s, on_refused, read_timeout_s)
        self._connections = self._settings.connections
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int, *, backlog: int = 2048) -> int:
        """Listens; returns the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: FrontProtocol(self._settings),
            host,
            port,
            backlog=backlog,
        )
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def stop(self, grace_s: float) -> None:
        """Stops accepting, lets answers in progress finish for up to `grace_s`, then closes all."""
        if self._server is not None:
            self._server.close()
        tasks = []
        for conn in list(self._connections):
            conn.draining = True
            if conn.task is None:
                conn.close()
            else:
                tasks.append(conn.task)
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for conn in list(self._connections):
            conn.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
