"""The router's two-phase flow and failure rules over real HTTP, against scripted stub engines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from .harness import running_router, stream, text_of, until
from .stub_engine import Script, StubEngine, serving

pytestmark = pytest.mark.timeout(60)


def text_of_events(events: list[object]) -> list[str]:
    """The generated pieces of a stream, one per token event."""
    return [piece for event in events if (piece := text_of(event))]


PROMPT = {"model": "stub-model", "prompt": "the quick brown fox", "max_tokens": 8}


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, list[StubEngine]]]:
    pools = {
        "prefill": [StubEngine("p0"), StubEngine("p1")],
        "decode": [StubEngine("d0"), StubEngine("d1")],
        "colocated": [StubEngine("c0")],
    }
    async with serving(pools):
        yield pools


async def until_drawn(session: aiohttp.ClientSession, router_url: str, faulty: StubEngine) -> int:
    """Sends requests, each of which must succeed, until the faulty engine got one (and 5 more)."""
    for count in range(1, 61):
        result = await stream(session, router_url + "/v1/completions", PROMPT)
        assert result.status == 200
        assert not result.errors
        if faulty.seen and count >= 6:
            return count
    raise AssertionError("the faulty engine was never chosen")


def urls(pools: dict[str, list[StubEngine]], *roles: str) -> dict[str, list[str]]:
    return {role: [e.url for e in pools[role]] for role in roles}


async def test_two_phase_request_and_equal_answers(engines: dict[str, list[StubEngine]]) -> None:
    async with (
        running_router(**urls(engines, "prefill", "decode")) as pd,
        running_router(**urls(engines, "colocated")) as colo,
        aiohttp.ClientSession() as session,
    ):
        disagg = await stream(session, pd.url + "/v1/completions", PROMPT)
        colocated = await stream(session, colo.url + "/v1/completions", PROMPT)
        assert disagg.status == colocated.status == 200
        assert disagg.text == colocated.text != ""
        assert disagg.events[-1] == "[DONE]"
        prefill_seen = [s for e in engines["prefill"] for s in e.seen]
        decode_seen = [s for e in engines["decode"] for s in e.seen]
        assert len(prefill_seen) == len(decode_seen) == 1
        assert prefill_seen[0]["body"]["max_tokens"] == 1
        assert prefill_seen[0]["body"]["stream"] is False
        assert prefill_seen[0]["body"]["kv_transfer_params"]["do_remote_decode"] is True
        assert decode_seen[0]["body"]["kv_transfer_params"]["do_remote_prefill"] is True
        assert decode_seen[0]["body"]["max_tokens"] == 8
        assert prefill_seen[0]["request_id"] == decode_seen[0]["request_id"]
        assert pd.sample("tandem_router_time_to_first_token_seconds_count", path="disaggregated") == 1
        assert pd.sample("tandem_router_generation_tokens_total", path="disaggregated") == 8


async def test_prefill_5xx_retries_on_another_prefill_pod(engines: dict[str, list[StubEngine]]) -> None:
    engines["prefill"][0].script = Script(fail_status=503, fail_count=100)
    async with running_router(**urls(engines, "prefill", "decode")) as router, aiohttp.ClientSession() as s:
        answers = await until_drawn(s, router.url, engines["prefill"][0])
        # p0 failed once, then sat out its quarantine: every answer came through p1.
        assert len(engines["prefill"][0].seen) == 1
        assert len(engines["prefill"][1].seen) == answers
        assert router.sample("tandem_router_retries_total", leg="prefill", reason="http_5xx") == 1


async def test_kv_pull_failure_reprefills_elsewhere(engines: dict[str, list[StubEngine]]) -> None:
    engines["decode"][0].script = Script(kv_pull_fails=True)
    async with running_router(**urls(engines, "prefill", "decode")) as router, aiohttp.ClientSession() as s:
        answers = await until_drawn(s, router.url, engines["decode"][0])
        assert len(engines["decode"][0].seen) == 1
        assert router.sample("tandem_router_retries_total", leg="decode", reason="http_5xx") == 1
        assert sum(len(e.seen) for e in engines["prefill"]) == answers + 1  # one re-prefill


async def test_decode_cut_before_first_byte_reprefills(engines: dict[str, list[StubEngine]]) -> None:
    engines["decode"][0].script = Script(cut_after_tokens=0)
    async with running_router(**urls(engines, "prefill", "decode")) as router, aiohttp.ClientSession() as s:
        await until_drawn(s, router.url, engines["decode"][0])
        assert len(engines["decode"][0].seen) == 1
        assert router.sample("tandem_router_retries_total", leg="decode", reason="truncated") == 1


async def test_decode_cut_mid_stream_ends_with_an_error(engines: dict[str, list[StubEngine]]) -> None:
    for engine in engines["decode"]:
        engine.script = Script(cut_after_tokens=3)
    async with running_router(**urls(engines, "prefill", "decode")) as router, aiohttp.ClientSession() as s:
        result = await stream(s, router.url + "/v1/completions", PROMPT)
        assert result.status == 200
        assert len(result.errors) == 1
        assert result.events[-1] == "[DONE]"
        tokens = [e for e in result.events if isinstance(e, dict) and "choices" in e]
        assert len(tokens) == 3  # never spliced with a second generation
        assert sum(len(e.seen) for e in engines["decode"]) == 1
        assert router.sample("tandem_router_failures_total", role="decode", reason="truncated") == 1


async def test_error_event_in_a_200_stream_counts_as_error(engines: dict[str, list[StubEngine]]) -> None:
    for engine in engines["decode"]:
        engine.script = Script(error_after_tokens=2)
    async with running_router(**urls(engines, "prefill", "decode")) as router, aiohttp.ClientSession() as s:
        result = await stream(s, router.url + "/v1/completions", PROMPT)
        assert result.status == 200
        assert len(result.errors) == 1
        assert router.sample("tandem_router_failures_total", role="decode", reason="stream_error") == 1
        assert router.sample("tandem_router_requests_total", path="disaggregated", code="5xx") == 1


async def test_no_prefill_pod_is_a_clear_503(engines: dict[str, list[StubEngine]]) -> None:
    async with (
        running_router(decode=[engines["decode"][0].url], colocated_fallback=False) as router,
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/completions", json=PROMPT) as response,
    ):
        assert response.status == 503
        body = await response.json()
        assert "no ready prefill pod" in body["error"]["message"]
        assert body["error"]["code"] == 503


async def test_no_prefill_pod_falls_back_to_colocated(engines: dict[str, list[StubEngine]]) -> None:
    async with (
        running_router(**urls(engines, "decode", "colocated")) as router,
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/completions", json=PROMPT) as response,
    ):
        assert response.status == 200
        assert len(engines["colocated"][0].seen) == 1


async def test_non_streaming_and_chat(engines: dict[str, list[StubEngine]]) -> None:
    chat = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    async with running_router(**urls(engines, "prefill", "decode")) as router, aiohttp.ClientSession() as s:
        async with s.post(router.url + "/v1/chat/completions", json=chat) as response:
            assert response.status == 200
            whole = text_of(await response.json())
        streamed = await stream(s, router.url + "/v1/chat/completions", chat)
        assert streamed.text == whole != ""


async def test_client_disconnect_cancels_the_leg(engines: dict[str, list[StubEngine]]) -> None:
    for engine in engines["prefill"]:
        engine.script = Script(hold_s=30)
    async with running_router(**urls(engines, "prefill", "decode")) as router, aiohttp.ClientSession() as s:
        task = asyncio.create_task(s.post(router.url + "/v1/completions", json=PROMPT))
        await until(lambda: any(e.seen for e in engines["prefill"]), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: sum(e.cancelled for e in engines["prefill"]) == 1, 60)
        assert sum(e.cancelled for e in engines["prefill"]) == 1
        assert not any(e.seen for e in engines["decode"])


async def test_prefill_timeout_retries_elsewhere(engines: dict[str, list[StubEngine]]) -> None:
    engines["prefill"][0].script = Script(hold_s=30)
    config = {**urls(engines, "prefill", "decode"), "prefill_timeout_s": 0.5}
    async with running_router(**config) as router, aiohttp.ClientSession() as s:
        for _ in range(8):
            result = await stream(s, router.url + "/v1/completions", PROMPT)
            assert result.status == 200
            assert not result.errors
        assert len(engines["prefill"][0].seen) == 1  # once, then quarantined
        assert router.sample("tandem_router_retries_total", leg="prefill", reason="timeout") == 1


async def test_silent_decode_times_out_and_the_client_gets_504(engines: dict[str, list[StubEngine]]) -> None:
    for engine in engines["decode"]:
        engine.script = Script(hold_s=30)
    config = {**urls(engines, "prefill", "decode"), "decode_idle_timeout_s": 0.3, "max_retries": 1}
    async with (
        running_router(**config) as router,
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/completions", json={**PROMPT, "stream": True}) as response,
    ):
        assert response.status == 504
        assert (await response.json())["error"]["code"] == 504
        assert sum(len(e.seen) for e in engines["decode"]) == 2  # the first try and one re-prefill
        assert router.sample("tandem_router_failures_total", role="decode", reason="timeout") == 2


async def test_a_decode_leg_over_its_total_time_ends_the_stream_with_an_error(
    engines: dict[str, list[StubEngine]],
) -> None:
    """Tokens keep coming (never idle long), but the whole leg outlives `decode_timeout_s`."""
    for engine in engines["decode"]:
        engine.script = Script(token_delay_s=0.1)
    config = {**urls(engines, "prefill", "decode"), "decode_idle_timeout_s": 5.0, "decode_timeout_s": 0.6}
    body = {**PROMPT, "max_tokens": 100, "stream": True}
    async with running_router(**config) as router, aiohttp.ClientSession() as s:
        result = await stream(s, router.url + "/v1/completions", body)
        assert result.status == 200  # the first tokens had been sent: the stream ends with an error
        assert 2 <= len(text_of_events(result.events)) < 100
        assert "ran out of time" in result.errors[0]["error"]["message"]
        assert result.events[-1] == "[DONE]"
        assert router.sample("tandem_router_failures_total", role="decode", reason="timeout") == 1


async def test_client_disconnect_mid_stream_cancels_the_decode_leg(
    engines: dict[str, list[StubEngine]],
) -> None:
    for engine in engines["decode"]:
        engine.script = Script(token_delay_s=0.2)
    body = {**PROMPT, "max_tokens": 100, "stream": True}
    async with running_router(**urls(engines, "prefill", "decode")) as router, aiohttp.ClientSession() as s:
        response = await s.post(router.url + "/v1/completions", json=body)
        assert response.status == 200
        await response.content.readline()  # the first token is here: the decode leg is streaming
        response.close()  # the client goes away
        await until(lambda: sum(e.cancelled for e in engines["decode"]) == 1, 60)
        assert sum(e.cancelled for e in engines["decode"]) == 1
        await until(lambda: router.sample("tandem_router_in_flight_requests", path="disaggregated") == 0, 60)
        assert router.sample("tandem_router_requests_total", path="disaggregated", code="4xx") == 1  # 499
