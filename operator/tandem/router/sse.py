"""Server-sent-event parsing of an engine's streamed answer.

Pure. `SseSplitter` cuts a byte stream into whole events (so the router forwards events, never half
of one, and can look at each before the client sees it); `classify` says what one event is: a token
chunk, a usage-only chunk, an error that arrived inside a 200 stream, or the `[DONE]` terminator.
Only events that might carry an error or usage are JSON-decoded; token chunks are recognised by
cheap byte checks because this runs once per generated token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

DONE_EVENT: Final = b"data: [DONE]\n\n"
_MAX_PENDING: Final = 16 * 1024 * 1024


class EventKind(Enum):
    TOKEN = "token"  # a chunk that carries generated text (or any chunk we cannot prove empty)
    USAGE = "usage"  # the final `include_usage` chunk: no choices, only counts
    ERROR = "error"  # `data: {"error": ...}`: the engine failed after it had answered 200
    DONE = "done"  # `data: [DONE]`
    OTHER = "other"  # comments, keep-alives, events without data


@dataclass(frozen=True, slots=True)
class StreamEvent:
    raw: bytes  # the event as received, terminator included: forwarded unchanged
    kind: EventKind
    completion_tokens: int | None = None  # from a usage block, when the event has one
    error_message: str | None = None
    prompt_tokens: int | None = None  # from a usage block, when the event has one


class SseSplitter:
    """Feeds bytes in, takes whole events out. Accepts `\\n\\n` and `\\r\\n\\r\\n` separators."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._pending + data if self._pending else data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        events: list[bytes] = []
        start = 0
        while True:
            end = buffer.find(b"\n\n", start)
            if end < 0:
                break
            events.append(buffer[start : end + 2])
            start = end + 2
        self._pending = buffer[start:]
        if len(self._pending) > _MAX_PENDING:
            raise ValueError("stream event larger than the router accepts")
        return events

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished event (non-empty at end of stream means a truncated stream)."""
        return self._pending


def _data_of(raw: bytes) -> bytes | None:
    lines = [line for line in raw.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[5:].lstrip(b" ") for line in lines)


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        message = error.get("message")
        return str(message) if message is not None else json.dumps(error)
    return str(error)


def classify(raw: bytes) -> StreamEvent:
    """What one whole event is (see `EventKind`)."""
    if raw.startswith(b"data: ") and raw.find(b"\n") == len(raw) - 2:
        data: bytes | None = raw[6:-2]  # the usual event: one data line
    else:
        data = _data_of(raw)
    if data is None:
        return StreamEvent(raw, EventKind.OTHER)
    if data == b"[DONE]":
        return StreamEvent(raw, EventKind.DONE)
    if b'"error"' not in data and b'"usage"' not in data:
        return StreamEvent(raw, EventKind.TOKEN)
    try:
        payload = json.loads(data)
    except ValueError:
        return StreamEvent(raw, EventKind.TOKEN)
    if not isinstance(payload, dict):
        return StreamEvent(raw, EventKind.TOKEN)
    if "error" in payload and payload["error"] is not None:
        return StreamEvent(raw, EventKind.ERROR, error_message=_error_message(payload["error"]))
    completion_tokens = prompt_tokens = None
    usage = payload.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("completion_tokens"), int):
            completion_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            prompt_tokens = usage["prompt_tokens"]
    choices = payload.get("choices")
    kind = EventKind.USAGE if isinstance(choices, list) and not choices else EventKind.TOKEN
    return StreamEvent(raw, kind, completion_tokens=completion_tokens, prompt_tokens=prompt_tokens)


def error_event(message: str, *, code: int = 502, err_type: str = "BadGatewayError") -> bytes:
    """The event the router writes to end a stream it cannot finish, followed by `[DONE]`."""
    payload = {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n" + DONE_EVENT


@dataclass(frozen=True, slots=True)
class Batch:
    """What the events of one engine read amount to."""

    forward: list[bytes]  # the events to pass on: up to [DONE], never an error event or what follows
    tokens: int
    done: bool
    error_message: str | None = None  # set when an error event ended the batch
    completion_tokens: int | None = None
    prompt_tokens: int | None = None


def scan(events: list[bytes], strip_usage: bool = False) -> Batch:
    """Classifies one read's events; the usual batch (tokens, maybe [DONE]) without decoding JSON.

    `strip_usage`: the usage-only chunk is read but not forwarded (the router asked the engine for
    it, the client did not).
    """
    if events:
        block = events[0] if len(events) == 1 else b"".join(events)
        if b'"error"' not in block and b'"usage"' not in block:
            done = events[-1] == DONE_EVENT
            body = block[: -len(DONE_EVENT)] if done else block
            if b"[DONE]" not in body and b"\n:" not in block and not block.startswith(b":"):
                return Batch(events, len(events) - done, done)
    return _scan_each(events, strip_usage)


def _scan_each(events: list[bytes], strip_usage: bool) -> Batch:
    forward: list[bytes] = []
    tokens, completion_tokens, prompt_tokens = 0, None, None
    for raw in events:
        event = classify(raw)
        if event.kind is EventKind.ERROR:
            message = event.error_message or "error event in stream"
            return Batch(forward, tokens, False, message, completion_tokens, prompt_tokens)
        if event.kind is EventKind.TOKEN:
            tokens += 1
        if event.completion_tokens is not None:
            completion_tokens = event.completion_tokens
        if event.prompt_tokens is not None:
            prompt_tokens = event.prompt_tokens
        if not (strip_usage and event.kind is EventKind.USAGE):
            forward.append(raw)
        if event.kind is EventKind.DONE:
            return Batch(forward, tokens, True, None, completion_tokens, prompt_tokens)
    return Batch(forward, tokens, False, None, completion_tokens, prompt_tokens)
