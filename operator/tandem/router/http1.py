"""A lean asyncio HTTP/1.1 client with per-host keep-alive pools, for the router's legs to engines.

Why not aiohttp's client: the router makes two upstream calls per user request and relays a
stream, and on one core aiohttp's client costs several hundred microseconds a call (measured with
`bench/router_overhead.py`: 1,095 vs 1,696 two-phase req/s at 256 streams). This client does only
what the legs need: POST/GET with a Content-Length body; answers framed by Content-Length, chunked
encoding or connection close; body bytes delivered as they arrive, to a task or to a `BodySink`
inside the socket callback; keep-alive reuse; one transparent retry when a reused idle
connection turns out to be closed before any answer byte.

Errors: `ConnectionError` subclasses for transport trouble, `TimeoutError` for timeouts. Closing a
response before its end closes the connection, which is how an engine learns to abort.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from typing import Final, Protocol, cast
from urllib.parse import urlsplit

_MAX_HEAD: Final = 64 * 1024
_CRLF: Final = b"\r\n"
_IN_TRAILER: Final = -2  # after the last (zero-size) chunk, before the final empty line


class BodySink(Protocol):
    """Takes a body's bytes inside the socket callback, instead of a task reading them."""

    def on_data(self, data: bytes) -> None: ...

    def on_end(self, error: BaseException | None) -> None: ...  # None: the body ended whole


class ProtocolViolation(ConnectionError):
    """The server sent something that is not HTTP/1.1 as this client reads it."""


class EarlyClose(ConnectionError):
    """The connection closed before the answer was complete."""


class Response:
    """One answer: status and headers once the head is in, then body chunks as they arrive."""

    __slots__ = (
        "_chunk_left",
        "_chunked",
        "_chunks",
        "_conn",
        "_error",
        "_head",
        "_head_done",
        "_length_left",
        "_pending",
        "_sink",
        "_waiter",
        "done",
        "got_bytes",
        "headers",
        "keep_alive",
        "status",
    )

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._head = bytearray()
        self._head_done = False
        self._chunked = False
        self._chunk_left = -1  # -1: expecting a size line
        self._length_left: int | None = None
        self._pending = b""  # unparsed chunked framing
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._sink: BodySink | None = None
        self._error: BaseException | None = None
        self.done = False
        self.got_bytes = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = True

    # -- fed by the connection -------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self.got_bytes = True
        if not self._head_done:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > _MAX_HEAD:
                    self.fail(ProtocolViolation("response head too large"))
                return
            head, rest = bytes(self._head[:end]), bytes(self._head[end + 4 :])
            self._head = bytearray()
            try:
                self._parse_head(head)
            except (ValueError, IndexError) as error:
                self.fail(ProtocolViolation(f"bad response head: {error}"))
                return
            self._head_done = True
            self._wake()
            if self._length_left == 0:
                self._finish()
                return
            data = rest
            if not data:
                return
        if self.done:
            return
        if self._chunked:
            self._feed_chunked(data)
        elif self._length_left is not None:
            take = data[: self._length_left]
            self._length_left -= len(take)
            self._push(take)
            if self._length_left == 0:
                self._finish()
        else:
            self._push(data)

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(_CRLF)
        parts = lines[0].split(b" ", 2)
        if not parts[0].startswith(b"HTTP/1."):
            raise ValueError(lines[0][:40].decode(errors="replace"))
        self.status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            self.headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._chunked = True
        elif "content-length" in self.headers:
            self._length_left = int(self.headers["content-length"])
        else:
            self.keep_alive = False  # body runs to connection close
        if self.headers.get("connection", "").lower() == "close" or parts[0] == b"HTTP/1.0":
            self.keep_alive = False

    def _feed_chunked(self, data: bytes) -> None:
        buffer = self._pending + data if self._pending else data
        position, size = 0, len(buffer)
        out: list[bytes] = []
        while position < size:
            if self._chunk_left > 0:
                take = buffer[position : position + self._chunk_left]
                out.append(take)
                position += len(take)
                self._chunk_left -= len(take)
                continue
            if self._chunk_left == 0:  # the CRLF after a chunk's data
                if size - position < 2:
                    break
                position += 2
                self._chunk_left = -1
                continue
            end = buffer.find(_CRLF, position)
            if end < 0:
                break
            if self._chunk_left == _IN_TRAILER:
                if end == position:  # the empty line that ends the message
                    if out:
                        self._push(b"".join(out))
                    self._pending = b""
                    self._finish()
                    return
                position = end + 2  # a trailer field: ignored
                continue
            try:
                chunk_size = int(buffer[position:end].split(b";", 1)[0], 16)
            except ValueError:
                self.fail(ProtocolViolation("bad chunk size"))
                return
            position = end + 2
            self._chunk_left = chunk_size if chunk_size else _IN_TRAILER
        self._pending = buffer[position:]
        if out:
            self._push(out[0] if len(out) == 1 else b"".join(out))

    def _push(self, data: bytes) -> None:
        if data:
            if self._sink is not None:
                self._sink.on_data(data)
                return
            self._chunks.append(data)
            self._wake()

    def _finish(self) -> None:
        self.done = True
        self._wake()
        self._conn.response_done(self)
        if self._sink is not None:
            self._sink.on_end(None)

    def fail(self, error: BaseException) -> None:
        if self.done:
            return
        if not self._head_done or self._chunked or self._length_left is not None:
            self._error = error
        self.done = True  # a close-delimited body simply ends here
        self._wake()
        self._conn.response_done(self)
        if self._sink is not None:
            self._sink.on_end(self._error)

    def set_sink(self, sink: BodySink) -> None:
        """From now on the body goes to `sink` as it arrives (what has arrived already, first)."""
        self._sink = sink
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks.clear()
            sink.on_data(data)
        if self.done and self._sink is sink:
            sink.on_end(self._error)

    def pause_reading(self) -> None:
        if self._conn.response is self:  # not once the connection serves another request
            self._conn.pause_reading()

    def resume_reading(self) -> None:
        if self._conn.response is self:
            self._conn.resume_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- read by the caller ----------------------------------------------------------------
    # Timeouts: `timeout_s` bounds each wait for bytes (silence); `deadline` (loop time) bounds
    # the whole read. One timer per wait, none when nothing has to be waited for.
    async def _wait(self, timeout_s: float | None, deadline: float | None = None) -> None:
        loop = asyncio.get_running_loop()
        if deadline is not None:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError()
            timeout_s = left if timeout_s is None else min(timeout_s, left)
        waiter = self._waiter = loop.create_future()
        timer = None if timeout_s is None else loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def read_head(self, timeout_s: float | None, deadline: float | None = None) -> None:
        while not self._head_done:
            if self._error is not None:
                raise self._error
            if self.done:
                raise EarlyClose("connection closed before the answer")
            await self._wait(timeout_s, deadline)

    async def read_chunk(self, timeout_s: float | None, deadline: float | None = None) -> bytes:
        """The next body bytes (all that arrived), or b"" at the end of the body."""
        while True:
            if self._chunks:
                if len(self._chunks) == 1:
                    return self._chunks.popleft()
                data = b"".join(self._chunks)
                self._chunks.clear()
                return data
            if self._error is not None:
                raise self._error
            if self.done:
                return b""
            await self._wait(timeout_s, deadline)

    async def read_all(self, timeout_s: float | None, deadline: float | None = None) -> bytes:
        parts = []
        while chunk := await self.read_chunk(timeout_s, deadline):
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Releases the connection: back to the pool when the answer was read whole, else closed."""
        self._sink = None  # the sink usually refers back to this response: no cycle for the GC
        self._conn.release(self)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Connection(asyncio.Protocol):
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.closed = False
        self.reusable = True
        self.reading_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.response is None:
            self.reusable = False  # bytes nobody asked for: this connection is out of step
            self.close()
            return
        self.response.feed(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.response is not None:
            self.response.fail(EarlyClose(str(exc) if exc else "connection closed"))

    def send(self, data: bytes) -> Response:
        assert self.transport is not None
        response = self.response = Response(self)
        self.transport.write(data)
        return response

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed and self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def response_done(self, response: Response) -> None:
        if not response.keep_alive:
            self.reusable = False

    def release(self, response: Response) -> None:
        if self.response is not response:
            return
        self.response = None
        if response.done and response._error is None and self.reusable and not self.closed:
            self.resume_reading()  # a relay may have paused it for a slow client
            self.pool.put_back(self)
        else:
            self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Idle keep-alive connections to one host:port."""

    def __init__(self, host: str, port: int, connect_timeout_s: float, max_idle: int = 1024) -> None:
        self.host, self.port = host, port
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self.idle: list[Connection] = []

    async def connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, protocol = await loop.create_connection(lambda: Connection(self), self.host, self.port)
        return protocol

    def take_idle(self) -> Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return None

    def put_back(self, conn: Connection) -> None:
        if len(self.idle) < self.max_idle:
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


class Client:
    def __init__(self, *, connect_timeout_s: float = 3.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._pools: dict[str, Pool] = {}
        self._targets: dict[str, tuple[Pool, bytes, bytes]] = {}

    def _target(self, url: str) -> tuple[Pool, bytes, bytes]:
        """(pool, request-target, Host value) of a URL, cached: the router calls few distinct URLs."""
        cached = self._targets.get(url)
        if cached is not None:
            return cached
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"only http:// URLs are supported: {url}")
        port = parts.port or 80
        netloc = f"{parts.hostname}:{port}"
        pool = self._pools.get(netloc)
        if pool is None:
            pool = self._pools[netloc] = Pool(parts.hostname, port, self.connect_timeout_s)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.encode()
        cached = self._targets[url] = (pool, target.encode(), host)
        if len(self._targets) > 4096:
            self._targets.clear()
        return cached

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        head_timeout_s: float | None,
        deadline: float | None = None,
    ) -> Response:
        """Sends a request and waits for the answer's head; the caller reads the body and closes.

        `deadline` (loop time) bounds the wait for the head as well (connecting has its own timeout).
        """
        pool, target, host = self._target(url)
        lines = [method.encode(), b" ", target, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
        for name, value in headers.items():
            lines += [name.encode(), b": ", value.encode("latin-1"), b"\r\n"]
        if body is not None:
            lines += [b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n", body]
        else:
            lines.append(b"\r\n")
        data = b"".join(lines)
        conn = pool.take_idle()
        reused = conn is not None
        while True:
            if conn is None:
                conn = await pool.connect()
            response = conn.send(data)
            try:
                await response.read_head(head_timeout_s, deadline)
                return response
            except EarlyClose:
                response.close()
                if reused and not response.got_bytes:
                    conn, reused = None, False  # a stale idle connection: once more, fresh
                    continue
                raise
            except BaseException:
                response.close()
                raise

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._targets.clear()
