"""A streamed engine answer passed to the client from inside the engine socket's callback.

Per token, a task-based relay pays for a task switch, a future, an idle timer and a drain; at 256
streams of 50 tokens/s that was most of a core (`bench/router_overhead.py --itl-ms`). Here the
upstream response hands each read to `StreamRelay.on_data`, which cuts it into SSE events (`sse`),
counts tokens and inter-token latency, and writes the events to the client at once. The flow's
task sleeps until the stream ends: `outcome` resolves once, with None when `[DONE]` reached the
client or with why the leg failed. The rules stay the flow's: this class only reports.

Flow control: when the client's buffer is full, the engine connection stops being read until the
client drains, so a slow reader slows its own stream instead of filling the router's memory.
The idle timeout and the leg's deadline share one timer per stream, moved forward only when it
fires.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tandem.router.errors import ClientGone
from tandem.router.failure import LegFailure
from tandem.router.sse import SseSplitter, scan


class StreamClient(Protocol):
    """What the relay needs of the client's side (front.ClientStream)."""

    @property
    def started(self) -> bool: ...

    @property
    def writable(self) -> bool: ...

    def start_stream_nowait(self, status: int, content_type: str) -> None: ...

    def write_nowait(self, data: bytes) -> None: ...  # raises ClientGone

    def finish_nowait(self, data: bytes) -> None: ...  # raises ClientGone

    def when_writable(self, callback: Callable[[], None]) -> None: ...


class StreamSource(Protocol):
    """What the relay needs of the engine's side (the upstream answer)."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class TokenObserver(Protocol):
    """Receives client-visible token timings (the flow's metrics and tally)."""

    def on_tokens(self, count: int, now: float) -> None: ...

    def on_usage(self, prompt_tokens: int | None, completion_tokens: int | None) -> None: ...


@dataclass(frozen=True, slots=True)
class RelayFailure:
    failure: LegFailure | None  # None: the client left
    detail: str


class StreamRelay:
    __slots__ = (
        "_client",
        "_clock",
        "_content_type",
        "_deadline",
        "_idle_s",
        "_last_read",
        "_loop",
        "_observer",
        "_paused",
        "_source",
        "_splitter",
        "_strip_usage",
        "_timer",
        "ended",
        "outcome",
    )

    def __init__(
        self,
        client: StreamClient,
        source: StreamSource,
        content_type: str,
        observer: TokenObserver,
        *,
        idle_timeout_s: float,
        deadline: float,
        clock: Callable[[], float],
        strip_usage: bool = False,
    ) -> None:
        self._client = client
        self._strip_usage = strip_usage  # the router asked for the usage chunk, the client did not
        self._source = source
        self._content_type = content_type
        self._observer = observer
        self._clock = clock
        self._idle_s = idle_timeout_s
        self._splitter = SseSplitter()
        self._loop = asyncio.get_running_loop()
        self._deadline = deadline  # on the loop's clock
        self.outcome: asyncio.Future[RelayFailure | None] = self._loop.create_future()
        self.ended: asyncio.Future[None] = self._loop.create_future()  # the engine's body is over
        self._last_read = clock()
        self._paused = False  # reading stopped for a slow client: silence is not the engine's
        first_check = min(idle_timeout_s, deadline - self._loop.time())
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(first_check, self._check_idle)

    # -- fed by the engine's response (http1.BodySink) -------------------------------------
    def on_data(self, data: bytes) -> None:
        if self.outcome.done():
            return  # what follows [DONE] (the body's end) or a failure is dropped
        now = self._last_read = self._clock()
        try:
            batch = scan(self._splitter.feed(data), self._strip_usage)
        except ValueError as error:
            self._end(RelayFailure(LegFailure.BAD_ANSWER, str(error)))
            return
        if batch.completion_tokens is not None or batch.prompt_tokens is not None:
            self._observer.on_usage(batch.prompt_tokens, batch.completion_tokens)
        if batch.tokens:
            self._observer.on_tokens(batch.tokens, now)
        client = self._client
        try:
            if batch.forward:
                if not client.started:
                    client.start_stream_nowait(200, self._content_type)
                out = batch.forward[0] if len(batch.forward) == 1 else b"".join(batch.forward)
                if batch.done:
                    client.finish_nowait(out)
                    self._end(None)
                    return
                client.write_nowait(out)
                if not client.writable and not self._paused:
                    self._paused = True
                    self._source.pause_reading()
                    client.when_writable(self._resume)
        except ClientGone:
            self._end(RelayFailure(None, "client closed the connection"))
            return
        if batch.error_message is not None:
            self._end(RelayFailure(LegFailure.STREAM_ERROR, batch.error_message))

    def on_end(self, error: BaseException | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)
        if error is None:
            self._end(RelayFailure(LegFailure.TRUNCATED, "stream ended without [DONE]"))
        else:
            self._end(RelayFailure(LegFailure.TRUNCATED, str(error) or type(error).__name__))

    # -- internals -------------------------------------------------------------------------
    def _resume(self) -> None:
        if self.outcome.done():
            return  # the leg is over; its connection was resumed (or closed) when released
        self._paused = False
        self._last_read = self._clock()
        self._source.resume_reading()

    def _check_idle(self) -> None:
        self._timer = None
        if self.outcome.done():
            return
        left = self._deadline - self._loop.time()
        if left <= 0:
            self._end(RelayFailure(LegFailure.TIMEOUT, "the leg ran out of time"))
            return
        idle = 0.0 if self._paused else self._clock() - self._last_read
        if idle >= self._idle_s:
            self._end(RelayFailure(LegFailure.TIMEOUT, "engine went silent mid-stream"))
        else:
            self._timer = self._loop.call_later(min(self._idle_s - idle, left), self._check_idle)

    def _end(self, result: RelayFailure | None) -> None:
        if not self.outcome.done():
            self.outcome.set_result(result)
        self.close()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
