"""The lean HTTP/1.1 client against a real socket server: keep-alive reuse and stale connections.

Engines close idle keep-alive connections on their own schedule (uvicorn after 5 s): a request
that lands on such a connection must go out again on a fresh one, not fail.
"""

from __future__ import annotations

import asyncio

import pytest

from tandem.router.http1 import Client, EarlyClose

pytestmark = pytest.mark.timeout(30)

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class OneShotServer:
    """Answers each request and then, when told to, closes the connection like an idle timeout."""

    def __init__(self, *, close_after_answer: bool, answer: bytes = ANSWER) -> None:
        self.close_after_answer = close_after_answer
        self.answer = answer
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(self.answer)
                await writer.drain()
                if self.close_after_answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/completions"


async def call(client: Client, url: str) -> bytes:
    response = await client.request(
        "POST", url, b"{}", {"Content-Type": "application/json"}, head_timeout_s=5
    )
    try:
        assert response.status == 200
        return await response.read_all(5)
    finally:
        response.close()


async def test_keep_alive_reuses_one_connection() -> None:
    server = OneShotServer(close_after_answer=False)
    url = await server.start()
    client = Client()
    for _ in range(5):
        assert await call(client, url) == b"ok"
    assert server.connections == 1
    client.close()


@pytest.mark.parametrize("pause_s", [0.0, 0.2])
async def test_a_connection_the_server_closed_is_replaced(pause_s: float) -> None:
    server = OneShotServer(close_after_answer=True)
    url = await server.start()
    client = Client()
    for _ in range(4):
        assert await call(client, url) == b"ok"
        await asyncio.sleep(pause_s)  # 0: the close may still be in flight when the next request goes
    assert server.connections == 4
    client.close()


async def test_an_answer_cut_short_is_an_error() -> None:
    server = OneShotServer(close_after_answer=True, answer=b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok")
    url = await server.start()
    client = Client()
    with pytest.raises(EarlyClose):
        await call(client, url)
    client.close()
