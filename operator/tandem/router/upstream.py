"""HTTP to the engines: whole answers and streamed answers, with failures as `LegError` reasons.

Over `http1.Client` (an asyncio HTTP/1.1 client with keep-alive pools; chosen over aiohttp's client
with numbers, see `http1`). Transport trouble becomes `LegError(LegFailure, detail)`, so the flow
decides with the pure rules in `failure`. A streamed answer is either read by a task
(`read_all`) or handed to a `BodySink` inside the socket callback (`attach`, used by `relay`).
Leaving a stream before its end closes its connection, which is how an engine learns to abort.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from tandem.router import http1
from tandem.router.failure import LegFailure


class LegError(Exception):
    def __init__(self, failure: LegFailure, detail: str) -> None:
        super().__init__(f"{failure.value}: {detail}")
        self.failure = failure
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    content_type: str


class StreamingAnswer(Protocol):
    status: int
    content_type: str
    deadline: float  # loop time by which the whole leg must be over

    async def read_all(self) -> bytes: ...

    def attach(self, sink: http1.BodySink) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Upstream(Protocol):
    async def get(self, url: str, *, timeout_s: float) -> Answer: ...

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, timeout_s: float
    ) -> Answer: ...

    def stream(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        idle_timeout_s: float,
        total_timeout_s: float,
    ) -> AbstractAsyncContextManager[StreamingAnswer]: ...

    async def close(self) -> None: ...


class _LeanStream:
    def __init__(self, response: http1.Response, idle_timeout_s: float, deadline: float) -> None:
        self._response = response
        self._idle = idle_timeout_s
        self.deadline = deadline  # loop time by which the whole leg must be over
        self.status = response.status
        self.content_type = response.headers.get("content-type", "application/octet-stream")

    async def read_all(self) -> bytes:
        try:
            return await self._response.read_all(self._idle, self.deadline)
        except TimeoutError as error:
            raise LegError(LegFailure.TIMEOUT, "engine went silent or the leg ran out of time") from error
        except ConnectionError as error:
            raise LegError(LegFailure.TRUNCATED, str(error) or type(error).__name__) from error

    def attach(self, sink: http1.BodySink) -> None:
        self._response.set_sink(sink)

    def pause_reading(self) -> None:
        self._response.pause_reading()

    def resume_reading(self) -> None:
        self._response.resume_reading()


class LeanUpstream:
    def __init__(self, *, connect_timeout_s: float = 3.0) -> None:
        self._client = http1.Client(connect_timeout_s=connect_timeout_s)

    async def close(self) -> None:
        self._client.close()

    async def get(self, url: str, *, timeout_s: float) -> Answer:
        return await self._whole("GET", url, None, {}, timeout_s)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *, timeout_s: float) -> Answer:
        return await self._whole("POST", url, body, headers, timeout_s)

    async def _whole(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str], timeout_s: float
    ) -> Answer:
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            response = await self._client.request(
                method, url, body, headers, head_timeout_s=None, deadline=deadline
            )
            try:
                data = await response.read_all(None, deadline)
            finally:
                response.close()
        except TimeoutError as error:
            raise LegError(LegFailure.TIMEOUT, f"{method} {url} timed out after {timeout_s}s") from error
        except OSError as error:
            raise LegError(LegFailure.CONNECT, f"{method} {url}: {error or type(error).__name__}") from error
        return Answer(response.status, data, response.headers.get("content-type", ""))

    @asynccontextmanager
    async def stream(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        idle_timeout_s: float,
        total_timeout_s: float,
    ) -> AsyncIterator[StreamingAnswer]:
        """A streamed answer, once its head is in. Reading it is bounded by `idle_timeout_s` of
        silence and by its `deadline` (`total_timeout_s` from now), which a relay enforces too."""
        deadline = asyncio.get_running_loop().time() + total_timeout_s
        try:
            response = await self._client.request(
                "POST", url, body, headers, head_timeout_s=idle_timeout_s, deadline=deadline
            )
        except TimeoutError as error:
            raise LegError(LegFailure.TIMEOUT, f"POST {url}: no answer in {idle_timeout_s}s") from error
        except OSError as error:
            raise LegError(LegFailure.CONNECT, f"POST {url}: {error or type(error).__name__}") from error
        try:
            yield _LeanStream(response, idle_timeout_s, deadline)
        finally:
            response.close()
