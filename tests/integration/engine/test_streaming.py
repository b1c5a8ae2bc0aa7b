"""Streams written from the step loop: a client that reads slowly, and an HTTP/1.0 client (no chunking)."""

from __future__ import annotations

import json
import socket
import time

from .harness import LOOPBACK, NAME, Engine

PROMPT = "stream to a reader that takes its time"


def _post_raw(
    engine: Engine, body: dict[str, object], version: str = "1.1", rcvbuf: int = 0
) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: a small window
    sock.settimeout(30)
    sock.connect((LOOPBACK, engine.port))
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/{version}\r\nHost: {LOOPBACK}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def _read_all(sock: socket.socket) -> tuple[bytes, bytes]:
    raw = b""
    while chunk := sock.recv(1 << 16):
        raw += chunk
    sock.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return head, body


def _dechunk(body: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert body == b"\r\n"
            return out
        assert body[size : size + 2] == b"\r\n"
        out, body = out + body[:size], body[size + 2 :]


def _texts(sse: bytes) -> tuple[list[str], list[object]]:
    events = [e[len("data: ") :] for e in sse.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    return [c["choices"][0]["text"] for c in chunks], [c["choices"][0]["finish_reason"] for c in chunks]


def test_a_slow_reader_gets_every_event_in_order(colocated: Engine) -> None:
    tokens = 16000  # about 2.8 MiB of events: more than the socket buffers hold
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": tokens, "stream": True}
    sock = _post_raw(colocated, body, rcvbuf=4096)
    time.sleep(1.5)  # time scale 0: the engine runs far ahead of this reader and has to hold back
    status, whole = colocated.post("/v1/completions", {**body, "stream": False})  # others still served
    assert status == 200
    head, raw = _read_all(sock)
    assert head.startswith(b"HTTP/1.1 200")
    assert b"Transfer-Encoding: chunked" in head
    texts, reasons = _texts(_dechunk(raw))
    assert len(texts) == tokens
    assert reasons == [None] * (tokens - 1) + ["length"]
    assert "".join(texts) == whole["choices"][0]["text"]


def test_an_http_1_0_client_gets_the_events_unchunked(colocated: Engine) -> None:
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 50, "stream": True}
    head, raw = _read_all(_post_raw(colocated, body, version="1.0"))
    assert head.startswith(b"HTTP/1.0 200")
    assert b"chunked" not in head
    texts, reasons = _texts(raw)
    assert len(texts) == 50
    assert reasons[-1] == "length"
    whole = colocated.post("/v1/completions", {**body, "stream": False})[1]
    assert "".join(texts) == whole["choices"][0]["text"]
