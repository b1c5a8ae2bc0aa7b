"""HTTP to the engines: whole answers and streamed answers, with failures as `LegError` reasons.

Two interchangeable clients behind one small interface, chosen by `--upstream-client`:
`lean` (default; `http1.Client`, an asyncio HTTP/1.1 client with keep-alive pools) and `aiohttp`
(aiohttp's client). Both turn transport trouble into `LegError(LegFailure, detail)`, so the flow
decides with the pure rules in `failure`. Leaving a stream before its end closes its connection,
which is how an engine learns to abort the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

import aiohttp

from tandem.router import http1
from tandem.router.failure import LegFailure

ClientKind = Literal["lean", "aiohttp"]


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

    async def read_all(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]: ...


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


def make_upstream(kind: ClientKind, *, connect_timeout_s: float) -> Upstream:
    if kind == "aiohttp":
        return AiohttpUpstream(connect_timeout_s=connect_timeout_s)
    return LeanUpstream(connect_timeout_s=connect_timeout_s)


# -- lean ------------------------------------------------------------------------------------


class _LeanStream:
    def __init__(self, response: http1.Response, idle_timeout_s: float) -> None:
        self._response = response
        self._idle = idle_timeout_s
        self.status = response.status
        self.content_type = response.headers.get("content-type", "application/octet-stream")

    async def read_all(self) -> bytes:
        try:
            return await self._response.read_all(self._idle)
        except TimeoutError as error:
            raise LegError(LegFailure.TIMEOUT, "engine went silent") from error
        except ConnectionError as error:
            raise LegError(LegFailure.TRUNCATED, str(error) or type(error).__name__) from error

    async def chunks(self) -> AsyncIterator[bytes]:
        response, idle = self._response, self._idle
        while True:
            try:
                data = await response.read_chunk(idle)
            except TimeoutError as error:
                raise LegError(LegFailure.TIMEOUT, "engine went silent mid-stream") from error
            except ConnectionError as error:
                raise LegError(LegFailure.TRUNCATED, str(error) or type(error).__name__) from error
            if not data:
                return
            yield data


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
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._client.request(method, url, body, headers, head_timeout_s=None)
                try:
                    data = await response.read_all(None)
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
        try:
            async with asyncio.timeout(total_timeout_s):
                try:
                    response = await self._client.request(
                        "POST", url, body, headers, head_timeout_s=idle_timeout_s
                    )
                except TimeoutError as error:
                    raise LegError(
                        LegFailure.TIMEOUT, f"POST {url}: no answer in {idle_timeout_s}s"
                    ) from error
                except OSError as error:
                    raise LegError(
                        LegFailure.CONNECT, f"POST {url}: {error or type(error).__name__}"
                    ) from error
                try:
                    yield _LeanStream(response, idle_timeout_s)
                finally:
                    response.close()
        except TimeoutError as error:
            raise LegError(LegFailure.TIMEOUT, f"POST {url}: over {total_timeout_s}s") from error


# -- aiohttp ---------------------------------------------------------------------------------


class _AiohttpStream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.content_type = response.headers.get("Content-Type", "application/octet-stream")

    async def read_all(self) -> bytes:
        try:
            return await self._response.read()
        except TimeoutError as error:
            raise LegError(LegFailure.TIMEOUT, "engine went silent") from error
        except aiohttp.ClientError as error:
            raise LegError(LegFailure.TRUNCATED, str(error) or type(error).__name__) from error

    async def chunks(self) -> AsyncIterator[bytes]:
        content = self._response.content
        while True:
            try:
                data = await content.readany()
            except TimeoutError as error:
                raise LegError(LegFailure.TIMEOUT, "engine went silent mid-stream") from error
            except aiohttp.ClientError as error:
                raise LegError(LegFailure.TRUNCATED, str(error) or type(error).__name__) from error
            if not data:
                return
            yield data


class AiohttpUpstream:
    def __init__(self, *, connect_timeout_s: float = 3.0) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, ttl_dns_cache=None)
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, url: str, *, timeout_s: float) -> Answer:
        return await self._call("GET", url, None, {}, timeout_s)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *, timeout_s: float) -> Answer:
        return await self._call("POST", url, body, headers, timeout_s)

    async def _call(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str], timeout_s: float
    ) -> Answer:
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self._connect_timeout_s)
        try:
            async with self._get_session().request(
                method, url, data=body, headers=headers, timeout=timeout
            ) as response:
                data = await response.read()
                return Answer(response.status, data, response.headers.get("Content-Type", ""))
        except TimeoutError as error:
            raise LegError(LegFailure.TIMEOUT, f"{method} {url} timed out after {timeout_s}s") from error
        except aiohttp.ClientError as error:
            raise LegError(LegFailure.CONNECT, f"{method} {url}: {error or type(error).__name__}") from error

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
        timeout = aiohttp.ClientTimeout(
            total=total_timeout_s, sock_connect=self._connect_timeout_s, sock_read=idle_timeout_s
        )
        try:
            response = await self._get_session().post(url, data=body, headers=headers, timeout=timeout)
        except TimeoutError as error:
            raise LegError(LegFailure.TIMEOUT, f"POST {url}: no answer in {idle_timeout_s}s") from error
        except aiohttp.ClientError as error:
            raise LegError(LegFailure.CONNECT, f"POST {url}: {error or type(error).__name__}") from error
        try:
            yield _AiohttpStream(response)
        finally:
            if not response.content.at_eof():
                response.close()
            response.release()
