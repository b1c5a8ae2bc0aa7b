"""Replays trace requests through the router's OpenAI API, streaming, and measures each one.

TTFT is the time from sending the request to the first generated text; TPOT is the time from
then to the last token over the remaining tokens (the count reported in the stream's usage).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence

import aiohttp

from tandem.demo.stats import Sample, Tally
from tandem.demo.trace import TraceRequest, prompt_ids

REQUEST_TIMEOUT_S = 120.0
MAX_IN_FLIGHT = 64


async def one_request(
    session: aiohttp.ClientSession, base_url: str, model: str, index: int, req: TraceRequest
) -> Sample:
    body = {
        "model": model,
        "prompt": prompt_ids(index, req.input_tokens),
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
        async with session.post(f"{base_url}/v1/completions", json=body) as resp:
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
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, sock_connect=5)
    limit = asyncio.Semaphore(MAX_IN_FLIGHT)
    connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def run(index: int, req: TraceRequest) -> None:
            async with limit:
                tally.in_flight += 1
                try:
                    tally.add(await one_request(session, base_url, model, index, req))
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
