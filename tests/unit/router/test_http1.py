"""The lean HTTP/1.1 client's answer parsing: framing by length, chunks and close, cut anywhere."""

from __future__ import annotations

import asyncio

import pytest

from tandem.router.http1 import EarlyClose, ProtocolViolation, Response


class FakeConnection:
    def __init__(self) -> None:
        self.done: list[Response] = []

    def response_done(self, response: Response) -> None:
        self.done.append(response)

    def release(self, response: Response) -> None:
        pass


EVENTS = [b'data: {"a":1}\n\n', b"data: [DONE]\n\n"]
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in EVENTS)
    + b"0\r\n\r\n"
)
LENGTH = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\nConnection: close\r\n\r\nboom!"


def collect(response: Response) -> bytes:
    return asyncio.run(response.read_all(1.0))


@pytest.mark.parametrize("payload", [CHUNKED, LENGTH])
def test_any_split_gives_the_same_body(payload: bytes) -> None:
    expected = None
    for cut in range(1, len(payload)):
        response = Response(FakeConnection())  # type: ignore[arg-type]
        response.feed(payload[:cut])
        response.feed(payload[cut:])
        assert response.done
        body = collect(response)
        expected = expected or body
        assert body == expected
    assert expected in (b"".join(EVENTS), b"boom!")


def test_head_fields() -> None:
    response = Response(FakeConnection())  # type: ignore[arg-type]
    response.feed(LENGTH)
    assert response.status == 500
    assert response.headers["content-length"] == "5"
    assert not response.keep_alive
    chunked = Response(FakeConnection())  # type: ignore[arg-type]
    chunked.feed(CHUNKED)
    assert chunked.keep_alive
    assert chunked.headers["content-type"] == "text/event-stream"


def test_trailer_lines_are_skipped() -> None:
    response = Response(FakeConnection())  # type: ignore[arg-type]
    response.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\n")
    assert not response.done
    response.feed(b"\r\n")
    assert response.done
    assert collect(response) == b"ok"


def test_close_delimited_body_ends_at_close() -> None:
    response = Response(FakeConnection())  # type: ignore[arg-type]
    response.feed(b"HTTP/1.1 200 OK\r\n\r\npartial")
    response.fail(EarlyClose("closed"))
    assert collect(response) == b"partial"


def test_cut_chunked_body_is_an_error() -> None:
    response = Response(FakeConnection())  # type: ignore[arg-type]
    response.feed(CHUNKED[:90])
    response.fail(EarlyClose("closed"))
    with pytest.raises(EarlyClose):
        collect(response)


def test_garbage_is_a_protocol_violation() -> None:
    response = Response(FakeConnection())  # type: ignore[arg-type]
    response.feed(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(ProtocolViolation):
        asyncio.run(response.read_head(1.0))
