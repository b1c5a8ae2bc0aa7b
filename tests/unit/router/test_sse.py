"""SSE splitting and classification of engine stream events."""

from __future__ import annotations

import json

import pytest

from tandem.router.sse import DONE_EVENT, EventKind, SseSplitter, classify, error_event


def test_splitter_reassembles_events_cut_anywhere() -> None:
    stream = b'data: {"a": 1}\n\ndata: {"b": 2}\n\n' + DONE_EVENT
    for cut in range(1, len(stream)):
        splitter = SseSplitter()
        events = splitter.feed(stream[:cut]) + splitter.feed(stream[cut:])
        assert events == [b'data: {"a": 1}\n\n', b'data: {"b": 2}\n\n', DONE_EVENT]
        assert splitter.pending == b""


def test_splitter_accepts_crlf_and_keeps_partial_tail() -> None:
    splitter = SseSplitter()
    assert splitter.feed(b"data: x\r\n\r\ndata: y") == [b"data: x\n\n"]
    assert splitter.pending == b"data: y"


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b'data: {"choices":[{"text":" hi"}]}\n\n', EventKind.TOKEN),
        (b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n', EventKind.TOKEN),
        (DONE_EVENT, EventKind.DONE),
        (b": keep-alive\n\n", EventKind.OTHER),
        (b'data: {"error": {"message": "boom", "code": 500}}\n\n', EventKind.ERROR),
        (b'data: {"choices": [], "usage": {"completion_tokens": 7}}\n\n', EventKind.USAGE),
        (b'data: {"choices":[{"text":"\\"error\\""}]}\n\n', EventKind.TOKEN),  # the word in text
        (b'data: {"choices":[{"text":"x"}], "error": null}\n\n', EventKind.TOKEN),
    ],
)
def test_classify(raw: bytes, kind: EventKind) -> None:
    assert classify(raw).kind is kind


def test_error_message_and_usage_are_read() -> None:
    assert classify(b'data: {"error": {"message": "kv pull failed"}}\n\n').error_message == "kv pull failed"
    usage = b'data: {"choices":[{"text":"a"}],"usage":{"completion_tokens":3}}\n\n'
    assert classify(usage).completion_tokens == 3


def test_error_event_is_an_error_then_done() -> None:
    raw = error_event("decode died")
    splitter = SseSplitter()
    events = splitter.feed(raw)
    assert [classify(e).kind for e in events] == [EventKind.ERROR, EventKind.DONE]
    assert json.loads(events[0][6:])["error"]["message"] == "decode died"
