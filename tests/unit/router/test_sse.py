"""SSE splitting and classification of engine stream events."""

from __future__ import annotations

import json

import pytest

from tandem.router.sse import DONE_EVENT, EventKind, SseSplitter, classify, error_event, scan


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


TOKEN = b'data: {"choices":[{"text":" a"}]}\n\n'
ERROR = b'data: {"error": {"message": "kv pull failed", "code": 500}}\n\n'
USAGE = b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n'


@pytest.mark.parametrize(
    ("events", "forwarded", "tokens", "done", "error", "usage"),
    [
        ([], 0, 0, False, None, None),
        ([TOKEN, TOKEN], 2, 2, False, None, None),
        ([TOKEN, DONE_EVENT], 2, 1, True, None, None),
        ([TOKEN, USAGE, DONE_EVENT], 3, 1, True, None, 2),
        ([TOKEN, ERROR, DONE_EVENT], 1, 1, False, "kv pull failed", None),
        ([ERROR], 0, 0, False, "kv pull failed", None),
        ([b": ping\n\n", TOKEN], 2, 1, False, None, None),
        ([DONE_EVENT, TOKEN], 1, 0, True, None, None),  # nothing after [DONE] is passed on
        ([b'data: {"choices":[{"text":"[DONE]"}]}\n\n'], 1, 1, False, None, None),
    ],
)
def test_scan_a_batch(
    events: list[bytes], forwarded: int, tokens: int, done: bool, error: str | None, usage: int | None
) -> None:
    batch = scan(events)
    assert batch.forward == events[:forwarded]
    assert (batch.tokens, batch.done, batch.error_message, batch.completion_tokens) == (
        tokens,
        done,
        error,
        usage,
    )
