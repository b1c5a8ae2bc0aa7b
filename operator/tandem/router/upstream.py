"""HTTP to the engines: one keep-alive connection pool, whole answers and streamed answers.

A thin shell over aiohttp's client. Every transport problem comes out as `LegError` carrying a
`LegFailure` reason, so the flow decides with the pure rules in `failure` and never sees aiohttp's
exception zoo. Cancelling a call (client went away) closes its connection, which is how an engine
learns to abort the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp

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


class StreamingAnswer:
    """An engine answer whose body is read as it arrives."""

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


class Upstream:
    """The router's client to engine pods."""

    def __init__(self, *, connect_timeout_s: float = 3.0, pool_per_host: int = 0) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._pool_per_host = pool_per_host
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0, limit_per_host=self._pool_per_host, keepalive_timeout=30, ttl_dns_cache=None
            )
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
        """A whole answer; raises `LegError` on transport failure or timeout (not on 4xx/5xx)."""
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
        """An answer read as it arrives; `idle_timeout_s` bounds every wait for bytes, the first too."""
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
            yield StreamingAnswer(response)
        finally:
            # Not read to the end (failure, cancel): drop the connection so the engine aborts.
            if not response.content.at_eof():
                response.close()
            response.release()
