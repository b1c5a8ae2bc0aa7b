"""A client that does not read makes the router stop reading its engine (no unbounded buffering).

The engine here writes a 40 MB stream as fast as its socket takes it; far more than the kernel's
loopback buffers and the router's 256 KB high-water mark hold together. While the client sleeps,
the engine must find its socket full (the router paused reading it) and be unable to finish; once
the client reads, every event must arrive, in order, ending with [DONE], although the client's
pause outlasted the leg's idle timeout.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from .harness import running_router
from .test_front import read_answer

pytestmark = pytest.mark.timeout(120)

EVENTS = 20_000
TEXT = "x" * 2000  # 20,000 events of ~2 KB: about 40 MB


class FloodEngine(asyncio.Protocol):
    """Prefill: kv params at once. Decode: the whole stream, written as fast as allowed."""

    instances: list[FloodEngine] = []  # every connection, to find the decode leg's

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.paused = asyncio.Event()
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.finished = False
        self.decoding = False  # this connection carries the decode leg's stream
        FloodEngine.instances.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def pause_writing(self) -> None:
        self.paused.set()
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].decode()
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = b""
        assert self.transport is not None
        if head.startswith("GET"):
            models = {"data": [{"id": "flood", "max_model_len": 4096}]}
            self._whole(json.dumps(models).encode())
        elif (json.loads(body).get("kv_transfer_params") or {}).get("do_remote_decode"):
            answer = {"choices": [{"text": "a"}], "kv_transfer_params": {"do_remote_prefill": True}}
            self._whole(json.dumps(answer).encode())
        else:
            self.decoding = True
            asyncio.get_running_loop().create_task(self._flood())

    def _whole(self, body: bytes) -> None:
        assert self.transport is not None
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self.transport.write(head.encode() + body)

    async def _flood(self) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        event = b"data: " + json.dumps({"choices": [{"index": 0, "text": TEXT}]}).encode() + b"\n\n"
        frame = b"%x\r\n%b\r\n" % (len(event), event)
        for _ in range(EVENTS // 20):
            await self.can_write.wait()
            if transport.is_closing():
                return
            transport.write(frame * 20)
        done = b"data: [DONE]\n\n"
        transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(done), done))
        self.finished = True


async def test_a_slow_client_pauses_the_engine_stream_and_still_gets_all_of_it() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(FloodEngine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        # An idle timeout shorter than the client's pause: waiting on a slow client is not an
        # engine gone silent, so the leg must not time out.
        config = {"prefill": [url], "decode": [url], "model": "flood", "decode_idle_timeout_s": 0.5}
        async with running_router(**config) as router:
            port = int(router.url.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**20)
            body = json.dumps({"model": "flood", "prompt": "hi", "max_tokens": EVENTS, "stream": True})
            head = f"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
            writer.write(head.encode() + body.encode())
            # The client reads nothing meanwhile. Wait for the decode engine's writes to stall (a
            # condition, not a time: a busy machine may take long to fill the buffers) ...
            deadline = time.monotonic() + 60
            while not [e for e in FloodEngine.instances if e.decoding and e.paused.is_set()]:
                assert time.monotonic() < deadline, (
                    "the router kept reading an engine for a client that did not"
                )
                assert not [e for e in FloodEngine.instances if e.finished], "the engine could write it all"
                await asyncio.sleep(0.1)
            decode = [e for e in FloodEngine.instances if e.decoding][-1]
            # ... then keep not reading for four idle timeouts: the leg must not time out meanwhile.
            await asyncio.sleep(2.0)
            assert not decode.finished
            status, _, data = await asyncio.wait_for(read_answer(reader), 60)
            assert status == 200
            events = data.split(b"\n\n")
            assert events[-2] == b"data: [DONE]"
            assert len(events) - 2 == EVENTS
            assert decode.finished
            writer.close()
    finally:
        server.close()
