"""The side channel paces a KV read over the modelled transfer time: the last byte never comes early."""

from __future__ import annotations

import asyncio
import time

import pytest

from tandem.engine.sidechannel import _paced_write


@pytest.mark.parametrize("size", [1000, 64 * 1024 * 3, 64 * 1024 * 40])
async def test_the_last_byte_arrives_no_sooner_than_the_modelled_time(size: int) -> None:
    seconds = 0.3
    finished = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _paced_write(writer, size, seconds)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        received = 0
        while chunk := await reader.read(65536):
            received += len(chunk)
        finished.set_result(time.monotonic() - started)
        writer.close()
    assert received == size
    # A lower bound only: a busy machine may deliver later, never sooner.
    assert await finished >= seconds
