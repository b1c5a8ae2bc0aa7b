"""Replays trace requests through the router's OpenAI API, streaming, and measures each one.

TTFT is the time from sending the request to the first generated text; TPOT is the time from
then to the last token over the remaining tokens (the count reported in the stream's usage).

`replay` sends a trace's requests at their times; `BackgroundLoad` sends an open-loop load whose
rate and lengths change by phase, from a thread of its own (the autoscaling e2e tests and
`bench/autoscale_reaction.py` drive it while they poll the cluster).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
import threading
import time
from collections.abc import Mapping, Sequence

import aiohttp

from tandem.demo.stats import Sample, Tally
from tandem.demo.trace import TraceRequest, prompt_ids

REQUEST_TIMEOUT_S = 120.0
# A loopback connect that is not answered at once is a SYN dropped by a full accept queue or a client
# loop starved on a busy 2-core machine, not a router that is gone (that is refused at once): wait for
# the kernel's retransmits at 1, 3, 7 and 15 s. At 5 s, CI runs at load average 11 failed such requests.
CONNECT_TIMEOUT_S = 20.0
MAX_IN_FLIGHT = 64


async def one_request(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    index: int,
    req: TraceRequest,
    label: str = "",
    request_id: str = "",
    vocab_size: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Sample:
    """One streamed completion, measured; never raises for a failed request (the sample says why).
    With `request_id`, it is sent as `X-Request-Id` (the router's path draw) and kept in the sample;
    `headers` are sent too (a tenant header)."""
    sent_at = time.time()
    sample = await _stream(session, base_url, model, index, req, request_id, vocab_size, headers)
    return dataclasses.replace(sample, sent_at=sent_at, label=label, request_id=request_id)


async def _stream(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    index: int,
    req: TraceRequest,
    request_id: str = "",
    vocab_size: int | None = None,
    extra_headers: Mapping[str, str] | None = None,
) -> Sample:
    body = {
        "model": model,
        "prompt": prompt_ids(index, req.input_tokens, vocab_size),
        "max_tokens": req.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    first = last = math.nan
    chunks = 0
    usage_tokens = 0
    try:
        headers = {**(extra_headers or {}), **({"X-Request-Id": request_id} if request_id else {})}
        async with session.post(f"{base_url}/v1/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:160]
                return Sample(ok=False, input_tokens=req.input_tokens, error=f"HTTP {resp.status}: {text}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return Sample(ok=False, input_tokens=req.input_tokens, error=str(chunk["error"])[:160])
                choices = chunk.get("choices") or []
                if choices and choices[0].get("text"):
                    now = time.monotonic()
                    if chunks == 0:
                        first = now
                    last = now
                    chunks += 1
                usage = chunk.get("usage")
                if usage:
                    usage_tokens = int(usage.get("completion_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return Sample(ok=False, input_tokens=req.input_tokens, error=f"{type(exc).__name__}: {exc}"[:160])
    tokens = usage_tokens or chunks
    if chunks == 0:
        return Sample(ok=False, input_tokens=req.input_tokens, error="stream ended without a token")
    tpot = (last - first) / (tokens - 1) if tokens > 1 else math.nan
    return Sample(
        ok=True, ttft_s=first - started, tpot_s=tpot, output_tokens=tokens, input_tokens=req.input_tokens
    )


async def replay(base_url: str, model: str, requests: Sequence[TraceRequest], tally: Tally) -> None:
    """Sends every request at its time (relative to now) and records its sample in `tally`."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S)
    limit = asyncio.Semaphore(MAX_IN_FLIGHT)
    connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def run(index: int, req: TraceRequest) -> None:
            async with limit:
                tally.in_flight += 1
                try:
                    tally.add(await one_request(session, base_url, model, index, req, req.phase))
                finally:
                    tally.in_flight -= 1

        start = time.monotonic()
        tasks = []
        for index, req in enumerate(requests):
            delay = start + req.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tally.sent += 1
            tasks.append(asyncio.create_task(run(index, req)))
        await asyncio.gather(*tasks)


@dataclasses.dataclass(frozen=True)
class Phase:
    """What `BackgroundLoad` sends now: `rate` requests/s, evenly spaced (0: nothing new)."""

    rate: float
    prompt_tokens: int
    output_tokens: int
    label: str = ""


class BackgroundLoad:
    """An open-loop streaming load on `base_url`, in a thread with its own event loop.

    `set()` switches the phase at once; `stop()` stops sending and waits for the requests in flight.
    Bounded by construction: it sends at most `max_requests` requests and nothing after
    `max_seconds`, so a test that forgets to stop it still ends. Every finished request is a
    `Sample` in `tally` (with `sent_at` and the phase's label).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        max_requests: int = 3000,
        max_seconds: float = 600.0,
        max_in_flight: int = MAX_IN_FLIGHT,
        request_timeout: float = REQUEST_TIMEOUT_S,
        first_index: int = 0,
        vocab_size: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url
        self.headers = dict(headers or {})  # sent with every request (a tenant header)
        self.vocab_size = vocab_size
        self.model = model
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.max_in_flight = max_in_flight
        self.request_timeout = request_timeout
        self.tally = Tally()
        self._phase = Phase(0.0, 1, 1)
        self._changed = threading.Event()
        self._stopping = threading.Event()
        self._indexes = itertools.count(first_index)
        self._thread = threading.Thread(target=self._run, name="background-load", daemon=True)
        self.error: BaseException | None = None

    def start(self, phase: Phase | None = None) -> BackgroundLoad:
        if phase is not None:
            self._phase = phase
        self._thread.start()
        return self

    def set(self, phase: Phase) -> None:
        self._phase = phase
        self._changed.set()

    @property
    def phase(self) -> Phase:
        return self._phase

    def stop(self, timeout: float | None = None) -> None:
        """Stops sending and waits (at most `timeout` seconds past the request timeout) for the
        requests in flight to finish."""
        self._stopping.set()
        self._changed.set()
        self._thread.join(timeout=(self.request_timeout + 30) if timeout is None else timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def samples(
        self, *, since: float = 0.0, until: float = math.inf, label: str | None = None
    ) -> list[Sample]:
        """Finished requests sent within [since, until) (wall clock), of one phase if `label`."""
        return [
            s
            for s in list(self.tally.samples)
            if since <= s.sent_at < until and (label is None or s.label == label)
        ]

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced by the caller through `error`
            self.error = exc

    async def _main(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout, sock_connect=CONNECT_TIMEOUT_S)
        connector = aiohttp.TCPConnector(limit=self.max_in_flight)
        limit = asyncio.Semaphore(self.max_in_flight)
        tasks: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

            async def run(index: int, phase: Phase) -> None:
                req = TraceRequest(0.0, phase.prompt_tokens, phase.output_tokens)
                async with limit:
                    self.tally.in_flight += 1
                    try:
                        sample = await one_request(
                            session,
                            self.base_url,
                            self.model,
                            index,
                            req,
                            phase.label,
                            vocab_size=self.vocab_size,
                            headers=self.headers,
                        )
                        self.tally.add(sample)
                    finally:
                        self.tally.in_flight -= 1

            started = time.monotonic()
            phase = self._phase
            next_at = time.monotonic()
            while not self._stopping.is_set():
                now = time.monotonic()
                if now - started >= self.max_seconds or self.tally.sent >= self.max_requests:
                    break
                if self._phase is not phase:
                    phase, next_at = self._phase, now
                if phase.rate <= 0:
                    await asyncio.to_thread(self._changed.wait, 0.5)
                    self._changed.clear()
                    next_at = time.monotonic()
                    continue
                if next_at > now:
                    await asyncio.sleep(min(next_at - now, 0.5))
                    continue
                self.tally.sent += 1
                task = asyncio.create_task(run(next(self._indexes), phase))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_at += 1.0 / phase.rate
            if tasks:
                await asyncio.wait(set(tasks), timeout=self.request_timeout + 10)
