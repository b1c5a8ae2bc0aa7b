"""Length-bucketed, per-tenant/model series through the router over real HTTP, against stub engines.

The stub engines count 3 prompt tokens and answer 8 tokens (`max_tokens`); the routers here cut the
buckets at 2 and 10 prompt tokens and at 4 output tokens, so every request lands in `2-10` / `4+`,
which only the engines' counts can tell (the prompt has 4 words). The engines pace tokens 20 ms
apart, so a stream has a TPOT.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from .harness import RunningRouter, running_router, stream
from .stub_engine import StubEngine

pytestmark = pytest.mark.timeout(60)

PROMPT = {"model": "stub-model", "prompt": "the quick brown fox", "max_tokens": 8}
BUCKETS: dict[str, Any] = {"input_length_buckets": (2, 10), "output_length_buckets": (4,)}


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, StubEngine]]:
    pools = {role: StubEngine(role[0]) for role in ("prefill", "decode", "colocated")}
    for engine in pools.values():
        engine.script.token_delay_s = 0.02  # paced, so the tokens reach the router in several reads
    for engine in pools.values():
        await engine.start()
    yield pools
    for engine in pools.values():
        await engine.stop()


def bucketed(router: RunningRouter, path: str) -> tuple[float, float]:
    labels = {"path": path, "tenant": "default", "model": "stub-model"}
    ttft = router.sample("tandem_router_ttft_by_input_length_seconds_count", **labels, input_length="2-10")
    tpot = router.sample("tandem_router_tpot_by_output_length_seconds_count", **labels, output_length="4+")
    return ttft, tpot


def usage_events(events: list[object]) -> list[object]:
    return [e for e in events if isinstance(e, dict) and "usage" in e and not e.get("choices")]


async def test_colocated_stream_asks_usage_and_strips_it_unless_the_client_asked(
    engines: dict[str, StubEngine],
) -> None:
    async with (
        running_router(colocated=[engines["colocated"].url], **BUCKETS) as router,
        aiohttp.ClientSession() as session,
    ):
        plain = await stream(session, router.url + "/v1/completions", PROMPT)
        asked = {**PROMPT, "stream_options": {"include_usage": True}}
        with_usage = await stream(session, router.url + "/v1/completions", asked)
        assert plain.status == with_usage.status == 200
        assert plain.text == with_usage.text != ""
        # The engine was asked for usage both times; the client got it only when it asked.
        sent = [seen["body"]["stream_options"] for seen in engines["colocated"].seen]
        assert sent == [{"include_usage": True}, {"include_usage": True}]
        assert usage_events(plain.events) == []
        assert plain.events[-1] == "[DONE]"
        [usage] = usage_events(with_usage.events)
        assert isinstance(usage, dict)
        assert usage["usage"]["completion_tokens"] == 8
        assert bucketed(router, "colocated") == (2.0, 2.0)
        assert router.sample("tandem_router_prompt_tokens_total", path="colocated") == 6  # engine's 3, twice
        labels = {"tenant": "default", "model": "stub-model"}
        assert router.sample("tandem_router_tenant_tokens_total", **labels, kind="prompt") == 6
        assert router.sample("tandem_router_tenant_tokens_total", **labels, kind="generation") == 16
        assert (
            router.sample("tandem_router_tenant_requests_total", **labels, path="colocated", code="2xx") == 2
        )
        assert router.sample("tandem_router_decode_leg_first_token_seconds_count", path="colocated") == 2


async def test_disaggregated_buckets_come_from_the_prefill_usage(engines: dict[str, StubEngine]) -> None:
    async with (
        running_router(prefill=[engines["prefill"].url], decode=[engines["decode"].url], **BUCKETS) as router,
        aiohttp.ClientSession() as session,
    ):
        result = await stream(session, router.url + "/v1/completions", PROMPT)
        assert result.status == 200
        assert usage_events(result.events) == []
        assert engines["decode"].seen[0]["body"]["stream_options"] == {"include_usage": True}
        assert "stream_options" not in engines["prefill"].seen[0]["body"]
        async with session.post(router.url + "/v1/completions", json=PROMPT) as response:  # not streamed
            assert response.status == 200
            assert (await response.json())["usage"]["prompt_tokens"] == 3
        assert "stream_options" not in engines["decode"].seen[1]["body"]
        assert bucketed(router, "disaggregated") == (2.0, 1.0)  # a whole answer has no TPOT
        assert router.sample("tandem_router_decode_leg_first_token_seconds_count", path="disaggregated") == 1


async def test_bad_bucket_flags_are_refused() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        async with running_router(colocated=["http://127.0.0.1:9"], input_length_buckets=(10, 5)):
            pass
