"""TPOT and ITL by output length and by concurrency, through a router over HTTP against real sim engines.

The sim engines (`tandem engine serve`, processes on 127.0.0.1) step in real time (`time_scale` 1), so
a stream's tokens reach the router over many reads. The router cuts output lengths at 16 tokens and
concurrency at 2 and 5 requests in flight. Six P/D requests of 32 output tokens sent at once arrive
while the others are still streaming (one step is milliseconds, the stream ~32 steps), so they see 1
to 6 requests in flight, themselves included: one in `0-2`, three in `2-5`, two in `5+`; two of 12
tokens sent one after the other each see only themselves, once the router has closed the one before (a
client can read a stream's end before the router's handler counts it out, so the test waits for that).
Every read gap the router times goes into exactly one output-length bucket and one concurrency bucket
of its path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from .harness import RunningRouter, running_router, stream
from .sim import NAME, SimEngine, start_sim

pytestmark = pytest.mark.timeout(180)

BUCKETS: dict[str, Any] = {"output_length_buckets": (16,), "concurrency_buckets": (2, 5)}
LONG, SHORT = 32, 12
METRICS = (
    "tandem_router_tpot_by_concurrency_seconds",
    "tandem_router_itl_by_output_length_seconds",
    "tandem_router_itl_by_concurrency_seconds",
)


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimEngine]]:
    engines: dict[str, SimEngine] = {}
    try:
        for role in ("prefill", "decode", "colocated"):
            engines[role] = start_sim(None if role == "colocated" else role, time_scale=1.0)
        yield engines
    finally:
        for engine in engines.values():
            engine.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def completion(session: aiohttp.ClientSession, router: RunningRouter, tokens: int) -> None:
    body = {"model": NAME, "prompt": "count with me " * 20, "max_tokens": tokens, "ignore_eos": True}
    result = await stream(session, router.url + "/v1/completions", body)
    assert result.status == 200, result.events[-3:]
    assert not result.errors, result.errors


async def until_idle(router: RunningRouter, path: str, deadline_s: float = 30.0) -> None:
    """Wait until the router counts no request in flight on `path` (its handlers ran their ends)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + deadline_s
    while router.sample("tandem_router_in_flight_requests", path=path) != 0:
        assert loop.time() < give_up, f"{path}: requests still in flight after {deadline_s} s"
        await asyncio.sleep(0.05)


def by_label(
    router: RunningRouter, metric: str, path: str, label: str, sample: str = "_count"
) -> dict[str, float]:
    """Label value -> the series' `sample` (_count, _sum) for one path; checks they carry no other label."""
    out: dict[str, float] = {}
    for family in router.state.metrics.registry.collect():
        for s in family.samples if family.name == metric else ():
            if s.name == metric + sample and s.labels["path"] == path:
                assert set(s.labels) == {"path", label}, s.labels
                out[s.labels[label]] = s.value
    return out


def check_gaps_add_up(router: RunningRouter, path: str) -> float:
    """Every gap of the path's ITL histogram is in one output-length and one concurrency bucket."""
    gaps = router.sample("tandem_router_inter_token_latency_seconds_count", path=path)
    seconds = router.sample("tandem_router_inter_token_latency_seconds_sum", path=path)
    for metric, label in ((METRICS[1], "output_length"), (METRICS[2], "concurrency")):
        assert sum(by_label(router, metric, path, label).values()) == gaps, metric
        assert sum(by_label(router, metric, path, label, "_sum").values()) == pytest.approx(seconds), metric
    return gaps


async def test_disaggregated_requests_by_concurrency_and_output_length(
    sims: dict[str, SimEngine], session: aiohttp.ClientSession
) -> None:
    async with running_router(
        prefill=[sims["prefill"].url], decode=[sims["decode"].url], **BUCKETS
    ) as router:
        path = "disaggregated"
        await asyncio.gather(*(completion(session, router, LONG) for _ in range(6)))
        for _ in range(2):
            await until_idle(router, path)
            await completion(session, router, SHORT)
        await until_idle(router, path)
        assert by_label(router, METRICS[0], path, "concurrency") == {"0-2": 3, "2-5": 3, "5+": 2}
        gaps = check_gaps_add_up(router, path)
        by_length = by_label(router, METRICS[1], path, "output_length")
        # Reads that carried tokens, less one per stream: at most one gap per token after the first.
        assert 0 < by_length["16+"] <= 6 * (LONG - 1)
        assert 0 < by_length["0-16"] <= 2 * (SHORT - 1)
        by_crowd = by_label(router, METRICS[2], path, "concurrency")
        assert set(by_crowd) == {"0-2", "2-5", "5+"}
        print(f"\n{gaps:.0f} gaps: by output length {by_length}, by concurrency {by_crowd}")


async def test_colocated_requests_by_concurrency_and_output_length(
    sims: dict[str, SimEngine], session: aiohttp.ClientSession
) -> None:
    async with running_router(colocated=[sims["colocated"].url], **BUCKETS) as router:
        path = "colocated"
        await asyncio.gather(*(completion(session, router, LONG) for _ in range(3)))
        await until_idle(router, path)
        assert by_label(router, METRICS[0], path, "concurrency") == {"0-2": 1, "2-5": 2}
        check_gaps_add_up(router, path)
        assert set(by_label(router, METRICS[1], path, "output_length")) == {"16+"}
        assert by_label(router, METRICS[0], "disaggregated", "concurrency") == {}
