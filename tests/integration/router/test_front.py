"""The router's HTTP/1.1 server over real sockets: framing, keep-alive, limits, disconnects, drain.

Raw bytes on purpose: these are the cases a client library hides (pipelining, 100-continue, a
body it never sends, a connection it drops).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tandem.router.front import MAX_HEAD_BYTES, ClientStream, Front, FrontRequest

pytestmark = pytest.mark.timeout(30)

Handler = Callable[[FrontRequest, ClientStream], Awaitable[None]]


async def echo(request: FrontRequest, client: ClientStream) -> None:
    """Answers what it got: method, path, body length, one header."""
    payload = {
        "method": request.method,
        "path": request.path,
        "body": request.body.decode(),
        "x": request.header("X-Test"),
    }
    await client.answer(200, json.dumps(payload).encode(), "application/json")


class Served:
    def __init__(self, front: Front, port: int) -> None:
        self.front = front
        self.port = port

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@asynccontextmanager
async def serve(handler: Handler, **options: Any) -> AsyncIterator[Served]:
    """A Front on a free port, stopped on the way out even when the test body fails."""
    front = Front(handler, max_body_bytes=int(options.pop("max_body_bytes", 1024)), **options)
    port = await front.start("127.0.0.1", 0)
    try:
        yield Served(front, port)
    finally:
        await front.stop(grace_s=0.5)


@pytest.fixture
async def echo_server() -> AsyncIterator[Served]:
    async with serve(echo) as served:
        yield served


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 5)).strip(), 16)
            data = await asyncio.wait_for(reader.readexactly(size + 2), 5)
            if size == 0:
                break
            parts.append(data[:-2])
        body = b"".join(parts)
    else:
        body = b""
    return status, headers, body


def post(path: str, body: bytes, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


async def test_keep_alive_answers_several_requests_on_one_connection(echo_server: Served) -> None:
    reader, writer = await echo_server.connect()
    for n in range(3):
        writer.write(post("/x", f"body{n}".encode(), "X-Test: yes\r\n"))
        status, headers, body = await read_answer(reader)
        assert status == 200
        assert "connection" not in headers
        assert json.loads(body) == {"method": "POST", "path": "/x", "body": f"body{n}", "x": "yes"}
    writer.close()


async def test_pipelined_requests_are_answered_in_order(echo_server: Served) -> None:
    """More than the front queues (8): it stops reading until it catches up, losing none."""
    reader, writer = await echo_server.connect()
    writer.write(b"".join(post(f"/p{n}", f"{n}".encode()) for n in range(30)))
    for n in range(30):
        _, _, body = await read_answer(reader)
        assert json.loads(body)["path"] == f"/p{n}"
    writer.close()


async def test_chunked_request_body_and_query_string(echo_server: Served) -> None:
    reader, writer = await echo_server.connect()
    writer.write(
        b"POST /c?debug=1 HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    status, _, body = await read_answer(reader)
    assert status == 200
    assert json.loads(body) == {"method": "POST", "path": "/c", "body": "hello world", "x": None}
    writer.close()


async def test_expect_100_continue_gets_a_continue_before_the_body(echo_server: Served) -> None:
    reader, writer = await echo_server.connect()
    writer.write(b"POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    writer.write(b"data")
    status, _, body = await read_answer(reader)
    assert (status, json.loads(body)["body"]) == (200, "data")
    writer.close()


async def test_body_over_the_limit_is_refused_before_it_is_sent(echo_server: Served) -> None:
    reader, writer = await echo_server.connect()
    writer.write(b"POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
    status, headers, body = await read_answer(reader)
    assert status == 413
    assert headers.get("connection") == "close"
    assert "over 1024 bytes" in json.loads(body)["error"]["message"]
    assert await asyncio.wait_for(reader.read(), 5) == b""  # and the connection is closed
    writer.close()


async def test_chunked_body_over_the_limit_is_refused(echo_server: Served) -> None:
    reader, writer = await echo_server.connect()
    chunk = b"x" * 600
    writer.write(b"POST /big HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) * 2)
    status, _, _ = await read_answer(reader)
    assert status == 413
    writer.close()


async def test_malformed_request_gets_400_and_the_connection_closes() -> None:
    refused: list[str] = []
    front = Front(echo, max_body_bytes=1024, on_refused=refused.append)
    port = await front.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"THIS IS NOT HTTP\r\n\r\n")
        status, headers, body = await read_answer(reader)
        assert status == 400
        assert headers.get("connection") == "close"
        assert json.loads(body)["error"]["code"] == 400
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert refused == ["malformed_request"]
        writer.close()
    finally:
        await front.stop(grace_s=0.5)


async def test_connection_close_and_http_1_0_are_honoured(echo_server: Served) -> None:
    for request in (
        post("/a", b"1", "Connection: close\r\n"),
        b"POST /b HTTP/1.0\r\nContent-Length: 1\r\n\r\n1",
    ):
        reader, writer = await echo_server.connect()
        writer.write(request)
        status, headers, _ = await read_answer(reader)
        assert status == 200
        assert headers.get("connection") == "close"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_idle_keep_alive_connections_are_closed() -> None:
    async with serve(echo, keepalive_s=0.3) as served:
        reader, writer = await served.connect()
        writer.write(post("/a", b"1"))
        assert (await read_answer(reader))[0] == 200
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server when idle
        writer.close()


async def test_client_disconnect_cancels_the_handler() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hang(request: FrontRequest, client: ClientStream) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with serve(hang) as served:
        _, writer = await served.connect()
        writer.write(post("/v1/completions", b"{}"))
        await asyncio.wait_for(started.wait(), 5)
        writer.close()
        await asyncio.wait_for(cancelled.wait(), 5)


async def test_a_stream_is_chunked_with_its_head_sent_with_the_first_bytes() -> None:
    async def streamer(request: FrontRequest, client: ClientStream) -> None:
        client.set_header("X-Request-Id", "r1")
        client.start_stream_nowait(200, "text/event-stream")
        for n in range(3):
            await client.write(f"data: {n}\n\n".encode())
        await client.finish(b"data: [DONE]\n\n")

    async with serve(streamer) as served:
        reader, writer = await served.connect()
        writer.write(post("/s", b""))
        status, headers, body = await read_answer(reader)
        assert status == 200
        assert headers["content-type"] == "text/event-stream"
        assert headers["x-request-id"] == "r1"
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        writer.write(post("/again", b""))  # the connection is still usable
        assert (await read_answer(reader))[0] == 200
        writer.close()


async def test_handler_errors_become_500_before_the_answer_started() -> None:
    async def broken(request: FrontRequest, client: ClientStream) -> None:
        raise RuntimeError("boom")

    async with serve(broken) as served:
        reader, writer = await served.connect()
        writer.write(post("/x", b""))
        status, _, body = await read_answer(reader)
        assert status == 500
        assert json.loads(body)["error"]["message"] == "internal router error"
        writer.close()


async def test_stop_lets_answers_in_progress_finish_and_refuses_new_connections() -> None:
    release = asyncio.Event()
    entered = asyncio.Event()

    async def slow(request: FrontRequest, client: ClientStream) -> None:
        entered.set()
        await release.wait()
        await client.answer(200, b"done", "text/plain")

    front = Front(slow, max_body_bytes=1024)
    port = await front.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/x", b""))
    await asyncio.wait_for(entered.wait(), 30)  # the answer is in progress
    stopping = asyncio.create_task(front.stop(grace_s=60))
    refused = False
    for _ in range(300):  # until the listener is closed (a condition, up to 30 s)
        try:
            _, probe = await asyncio.open_connection("127.0.0.1", port)
        except ConnectionRefusedError:
            refused = True
            break
        except ConnectionResetError:  # caught in the backlog while the listener closed: try again
            await asyncio.sleep(0.1)
            continue
        probe.close()
        await asyncio.sleep(0.1)
    assert refused, "new connections still accepted while stopping"
    assert not stopping.done()
    release.set()
    status, headers, body = await read_answer(reader)
    assert (status, body) == (200, b"done")
    assert headers.get("connection") == "close"  # the client learns not to send another
    await asyncio.wait_for(stopping, 30)
    writer.close()


async def test_a_trickled_head_is_cut_at_the_read_timeout_while_others_are_served() -> None:
    """Slowloris: a byte of headers every second keeps the connection busy but does not extend
    the read deadline (2 s here, from the request's first byte): 408 and close."""
    refused: list[str] = []
    async with serve(echo, read_timeout_s=2.0, on_refused=refused.append) as served:
        slow_reader, slow = await served.connect()
        slow.write(b"POST /slow HTTP/1.1\r\nHost: t\r\n")
        started = asyncio.get_running_loop().time()
        closed = asyncio.ensure_future(read_answer(slow_reader))
        for _ in range(6):
            if closed.done():
                break
            slow.write(b"X")  # one more byte of a header that never ends
            with contextlib.suppress(ConnectionError):
                await slow.drain()
            reader, writer = await served.connect()  # another client is served meanwhile
            writer.write(post("/fast", b"1", "Connection: close\r\n"))
            assert (await read_answer(reader))[0] == 200
            writer.close()
            await asyncio.sleep(1)
        status, headers, body = await asyncio.wait_for(closed, 5)
        waited = asyncio.get_running_loop().time() - started
        assert status == 408, body
        assert json.loads(body)["error"]["type"] == "RequestTimeoutError"
        assert headers.get("connection") == "close"
        assert 1.5 <= waited < 5.0
        assert await asyncio.wait_for(slow_reader.read(), 5) == b""
        assert refused == ["read_timeout"]
        slow.close()


async def test_a_body_that_stops_short_is_cut_at_the_read_timeout() -> None:
    async with serve(echo, read_timeout_s=1.0) as served:
        reader, writer = await served.connect()
        writer.write(post("/a", b"12345")[:-3])  # Content-Length 5, two bytes sent
        status, _, _ = await asyncio.wait_for(read_answer(reader), 5)
        assert status == 408
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_an_idle_keep_alive_connection_outlives_the_read_timeout() -> None:
    """The read timeout is for a request arriving; between requests only the keep-alive counts."""
    async with serve(echo, read_timeout_s=1.0, keepalive_s=10.0) as served:
        reader, writer = await served.connect()
        writer.write(post("/a", b"1"))
        assert (await read_answer(reader))[0] == 200
        await asyncio.sleep(2.5)
        writer.write(post("/b", b"2"))
        status, _, body = await read_answer(reader)
        assert (status, json.loads(body)["path"]) == (200, "/b")
        writer.close()


async def test_a_head_over_the_limit_gets_431_and_the_connection_closes() -> None:
    refused: list[str] = []
    async with serve(echo, on_refused=refused.append) as served:
        reader, writer = await served.connect()
        start = b"POST /a HTTP/1.1\r\nHost: t\r\nX-Big: "
        # One byte over the limit, and a header line that never ends. (Exactly one over: bytes
        # still unread when the router closes would make the client's kernel see a reset.)
        writer.write(start + b"a" * (MAX_HEAD_BYTES + 1 - len(start)))
        await writer.drain()
        status, headers, body = await read_answer(reader)
        assert status == 431
        assert json.loads(body)["error"]["code"] == 431
        assert headers.get("connection") == "close"
        assert refused == ["header_too_large"]
        writer.close()


async def test_a_body_over_the_limit_sent_whole_still_gets_its_413() -> None:
    """No 100-continue: the client sends it all before reading. The router answers 413 at once and
    drops the body as it comes, closing after it: the client reads a 413, not a reset."""
    async with serve(echo) as served:
        reader, writer = await served.connect()
        big = b"x" * 3_000_000
        writer.write(post("/big", big))
        await writer.drain()
        status, headers, body = await read_answer(reader)
        assert (status, headers.get("connection")) == (413, "close")
        assert json.loads(body)["error"]["type"] == "RequestTooLargeError"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
