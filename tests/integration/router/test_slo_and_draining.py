"""Within-SLO counting and draining pods, through a real router over HTTP, against stub engines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tandem.devcluster.procs import free_port
from tandem.kube.pods import PodInfo

from .harness import running_router, stream
from .stub_engine import Script, StubEngine

pytestmark = pytest.mark.timeout(60)

WITHIN = "tandem_router_requests_within_slo_total"
PROMPT = {"model": "stub-model", "prompt": "the quick brown fox", "max_tokens": 4}


@pytest.fixture
async def pair() -> AsyncIterator[tuple[StubEngine, StubEngine]]:
    prefill, decode = StubEngine("p0"), StubEngine("d0")
    await prefill.start()
    await decode.start()
    yield prefill, decode
    await prefill.stop()
    await decode.stop()


async def test_requests_within_both_targets_are_counted(pair: tuple[StubEngine, StubEngine]) -> None:
    prefill, decode = pair
    static = {"prefill": [prefill.url], "decode": [decode.url]}
    async with (
        running_router(**static, slo_ttft_ms=2000, slo_tpot_ms=50) as router,
        aiohttp.ClientSession() as session,
    ):
        url = router.url + "/v1/completions"
        for _ in range(3):
            assert (await stream(session, url, PROMPT)).status == 200
        async with session.post(url, json=PROMPT) as response:  # not streamed: judged on its end
            assert response.status == 200
        assert router.sample(WITHIN, path="disaggregated") == 4
        decode.script = Script(token_delay_s=0.15)  # TPOT ~150 ms > 50 ms
        assert (await stream(session, url, PROMPT)).status == 200
        assert router.sample(WITHIN, path="disaggregated") == 4
        decode.script = Script(token_delay_s=0.15)
        one = await stream(session, url, {**PROMPT, "max_tokens": 1})  # no TPOT: TTFT alone
        assert one.status == 200
        assert router.sample(WITHIN, path="disaggregated") == 5
        decode.script = Script(error_after_tokens=2)
        failed = await stream(session, url, PROMPT)
        assert failed.errors
        assert router.sample(WITHIN, path="disaggregated") == 5
        total = sum(
            router.sample("tandem_router_requests_total", path="disaggregated", code=code)
            for code in ("2xx", "4xx", "5xx")
        )
        assert total == 7
        assert router.sample(WITHIN, path="colocated") == 0


async def test_a_refusal_for_want_of_pods_counts_as_a_request_of_its_path(
    pair: tuple[StubEngine, StubEngine],
) -> None:
    prefill, _ = pair
    async with (
        running_router(
            prefill=[prefill.url], colocated_fallback=False, slo_ttft_ms=2000, slo_tpot_ms=50
        ) as router,
        aiohttp.ClientSession() as session,
        session.post(router.url + "/v1/completions", json=PROMPT) as response,
    ):
        assert response.status == 503
        assert router.sample("tandem_router_requests_total", path="disaggregated", code="5xx") == 1
        assert router.sample(WITHIN, path="disaggregated") == 0


async def test_without_an_slo_there_is_no_within_slo_series(pair: tuple[StubEngine, StubEngine]) -> None:
    prefill, decode = pair
    async with (
        running_router(prefill=[prefill.url], decode=[decode.url]) as router,
        aiohttp.ClientSession() as session,
    ):
        assert (await stream(session, router.url + "/v1/completions", PROMPT)).status == 200
        assert WITHIN + "{" not in router.metrics_text()


def _pod(engine: StubEngine, role: str, *, draining: bool = False) -> PodInfo:
    return PodInfo(
        name=engine.name,
        pddeployment="llm",
        role=role,
        ip=engine.host,
        phase="Running",
        ready=True,
        terminating=False,
        draining=draining,
    )


async def test_a_draining_pod_finishes_its_streams_and_gets_no_new_ones() -> None:
    # Pods as the watcher reports them: one loopback IP each, one engine port for all.
    port = free_port()
    slow = Script(token_delay_s=0.1)
    engines = {
        "prefill": [
            StubEngine("p0", host="127.0.0.2", port=port),
            StubEngine("p1", host="127.0.0.3", port=port),
        ],
        "decode": [
            StubEngine("d0", host="127.0.0.4", port=port, script=slow),
            StubEngine("d1", host="127.0.0.5", port=port, script=slow),
        ],
    }
    everyone = [engine for pool in engines.values() for engine in pool]
    for engine in everyone:
        await engine.start()
    try:
        async with (
            running_router(pddeployment="llm", engine_port=port) as router,
            aiohttp.ClientSession() as session,
        ):
            pods = [_pod(e, role) for role, pool in engines.items() for e in pool]
            router.state.on_pods("SYNC", pods)
            url = router.url + "/v1/completions"
            in_flight = asyncio.create_task(stream(session, url, {**PROMPT, "max_tokens": 20}))
            arrivals = [asyncio.create_task(e.arrived.wait()) for e in engines["decode"]]
            done, pending = await asyncio.wait(arrivals, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            for waiting in pending:
                waiting.cancel()
            assert done, "no decode engine got the request within 60 s"
            busy_p = next(e for e in engines["prefill"] if e.seen)
            busy_d = next(e for e in engines["decode"] if e.seen)
            # The autoscaler marks both pods of the request draining while its answer streams.
            router.state.on_pods("MODIFIED", [_pod(busy_p, "prefill", draining=True)])
            router.state.on_pods("MODIFIED", [_pod(busy_d, "decode", draining=True)])
            assert router.sample("tandem_router_draining_endpoints", role="decode") == 1
            assert router.sample("tandem_router_ready_endpoints", role="decode") == 1
            for engine in everyone:
                engine.script = Script()
            for _ in range(6):
                assert (await stream(session, url, PROMPT)).status == 200
            finished = await in_flight
            assert finished.status == 200
            assert not finished.errors
            assert len([e for e in finished.events if isinstance(e, dict) and e.get("choices")]) == 20
            assert len(busy_p.seen) == len(busy_d.seen) == 1  # nothing new reached the draining pods
            others = [e for pool in engines.values() for e in pool if e not in (busy_p, busy_d)]
            assert [len(e.seen) for e in others] == [6, 6]
    finally:
        for engine in everyone:
            await engine.stop()
