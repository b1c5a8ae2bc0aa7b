"""Remote or local prefill per request (spec.router.disaggregation), through a real router process
path (the in-process router of `harness`) and real sim engines (`tandem engine serve`).

A decode-role engine sent a request without `kv_transfer_params` prefills it itself, as vLLM's does:
the engines' own `vllm:prompt_tokens_by_source` says where each prompt's tokens came from
(`local_compute` on the decode engine, or `external_kv_transfer`: pulled from a prefill engine).
Time scale 0: engine steps take no wall time, so what is checked is where work went, not how long.
"""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tandem.routing.disaggregation import DisaggregationKnobs

from .harness import RunningRouter, running_router, stream
from .sim import NAME, SimEngine, start_sim
from .test_stub_flow import until

pytestmark = pytest.mark.timeout(180)

LONG = 300  # words: past the routers' maxLocalTokens below
MAX_LOCAL = 100


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, list[SimEngine]]]:
    pools: dict[str, list[SimEngine]] = {"prefill": [], "decode": []}
    try:
        pools["prefill"].append(start_sim("prefill"))
        for _ in range(2):
            pools["decode"].append(start_sim("decode"))
        yield pools
    finally:
        for pool in pools.values():
            for engine in pool:
                engine.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
        yield client


def engine_sample(engine: SimEngine, name: str, **labels: str) -> float:
    with urllib.request.urlopen(engine.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def by_source(engines: list[SimEngine], source: str) -> float:
    return sum(engine_sample(e, "vllm:prompt_tokens_by_source_total", source=source) for e in engines)


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(count))


def choices(router: RunningRouter, prefill: str, reason: str) -> float:
    return router.sample("tandem_router_disaggregation_total", prefill=prefill, reason=reason)


def urls(sims: dict[str, list[SimEngine]], **extra: object) -> dict[str, object]:
    return {"prefill": [e.url for e in sims["prefill"]], "decode": [e.url for e in sims["decode"]], **extra}


async def complete(
    session: aiohttp.ClientSession, router: RunningRouter, prompt: str, tokens: int = 8
) -> str:
    body = {"model": NAME, "prompt": prompt, "max_tokens": tokens}
    result = await stream(session, router.url + "/v1/completions", body)
    assert result.status == 200, result.events
    assert not result.errors
    return result.text


async def warm_up(session: aiohttp.ClientSession, router: RunningRouter, tag: str) -> None:
    """Four long prompts (remote: past maxLocalTokens) so that Auto has measured the prefill legs and
    the pulls (`unmeasured` until then)."""
    for index in range(4):
        await complete(session, router, words(f"{tag}{index}w", LONG + 40 * index))
    assert choices(router, "remote", "too_long") == 4


async def test_auto_prefills_a_short_prompt_on_decode_and_a_long_one_remotely(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    decode, prefill = sims["decode"], sims["prefill"]
    auto = urls(sims, disaggregation="Auto", max_local_tokens=MAX_LOCAL)
    async with running_router(**auto) as router, running_router(**urls(sims)) as always:
        # Before anything is measured, Auto prefills remotely.
        await complete(session, router, words("cold", 20))
        assert choices(router, "remote", "unmeasured") == 1
        await warm_up(session, router, "auto")

        legs = router.sample("tandem_router_prefill_leg_seconds_count", outcome="ok")
        local, pulled = by_source(decode, "local_compute"), by_source(decode, "external_kv_transfer")
        short = words("short", 20)
        text = await complete(session, router, short)
        assert choices(router, "local", "local_faster") == 1
        assert router.sample("tandem_router_prefill_leg_seconds_count", outcome="ok") == legs
        # The decode engine computed the prompt itself and pulled nothing.
        assert by_source(decode, "local_compute") - local == 20
        assert by_source(decode, "external_kv_transfer") == pulled
        # The same answer as through a prefill pod.
        assert await complete(session, always, short) == text

        computed_on_prefill = by_source(prefill, "local_compute")
        await complete(session, router, words("long", LONG))
        assert choices(router, "remote", "too_long") == 5
        assert by_source(prefill, "local_compute") - computed_on_prefill == LONG
        # A request is recorded once its engine's body has ended, which may be after the client's.
        ttft = "tandem_router_disaggregation_ttft_seconds_count"
        await until(lambda: router.sample(ttft, mode="Auto", prefill="remote") == 6)
        assert router.sample(ttft, mode="Auto", prefill="local") == 1
        requests = "tandem_router_disaggregation_requests_total"
        assert router.sample(requests, mode="Auto", prefill="local", code="2xx") == 1
        await until(lambda: always.sample(requests, mode="Always", prefill="remote", code="2xx") == 1)


async def test_always_is_unchanged(sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession) -> None:
    decode = sims["decode"]
    async with running_router(**urls(sims)) as router:
        local = by_source(decode, "local_compute")
        for index, count in enumerate((5, 20, LONG)):
            await complete(session, router, words(f"always{index}w", count))
        assert choices(router, "remote", "always") == 3
        assert router.sample("tandem_router_prefill_leg_seconds_count", outcome="ok") == 3
        # Each decode engine computed at most the one last token of a prompt (vLLM recomputes it).
        assert by_source(decode, "local_compute") - local <= 3
        assert sum(choices(router, "local", reason) for reason in ("local_faster", "no_prefill_ready")) == 0


@pytest.mark.parametrize(
    "settings", [{"disaggregation": "Auto"}, {"disaggregation": "Threshold", "threshold_tokens": 8}]
)
async def test_no_prefill_pod_ready_is_served_on_decode(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession, settings: dict[str, object]
) -> None:
    decode = [e.url for e in sims["decode"]]
    async with running_router(decode=decode, **settings) as router:
        await complete(session, router, words("alone", LONG))
        assert choices(router, "local", "no_prefill_ready") == 1
        await until(
            lambda: router.sample("tandem_router_requests_total", path="disaggregated", code="2xx") == 1
        )
    # Always keeps today's answer: no prefill pod, no colocated pod: 503.
    async with running_router(decode=decode) as always:
        result = await stream(session, always.url + "/v1/completions", {"model": NAME, "prompt": "hi"})
        assert result.status == 503


async def test_next_turn_is_prefilled_on_the_decode_pod_holding_the_last_one(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    """Turn 1 (long) goes remote; turn 2 resends turn 1 and its reply plus a short message: the decode
    index (prompt and reply) sends it to the decode pod that served turn 1, which prefills only what
    is new and finds the rest, the reply included, in its prefix cache."""
    decode = sims["decode"]
    async with running_router(**urls(sims, disaggregation="Auto", max_local_tokens=MAX_LOCAL)) as router:
        await warm_up(session, router, "turns")
        messages = [{"role": "user", "content": words("first", LONG)}]
        body = {"model": NAME, "messages": messages, "max_tokens": 40}
        first = await stream(session, router.url + "/v1/chat/completions", body)
        assert first.status == 200
        assert choices(router, "remote", "too_long") == 5
        hits = [engine_sample(e, "vllm:prefix_cache_hits_total") for e in decode]
        local = by_source(decode, "local_compute")
        messages += [
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": words("next", 10)},
        ]
        second = await stream(session, router.url + "/v1/chat/completions", {**body, "messages": messages})
        assert second.status == 200
        assert choices(router, "local", "local_faster") == 1
        gained = [
            engine_sample(e, "vllm:prefix_cache_hits_total") - h for e, h in zip(decode, hits, strict=True)
        ]
        # One decode pod found turn 1's prompt and its 40-token reply (full 16-token blocks of them).
        assert max(gained) >= LONG + 16
        assert min(gained) == 0
        computed = by_source(decode, "local_compute") - local
        assert 0 < computed < 64  # the new message, the template and the unfinished blocks


async def test_auto_decides_from_its_first_request_after_always_traffic(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    """A router serving Always learns what Auto reads (the prefill and pull lines, the decode index):
    switched to Auto (as a rollout's promotion does), its first short prompt is an estimate, not
    `unmeasured`, and a conversation's next turn goes to the decode pod that served turn 1 under
    Always and is prefilled there."""
    decode = sims["decode"]
    async with running_router(**urls(sims)) as router:
        router.flow.always_learns_every = 1  # every Always request learns (the default samples 1 in 8)
        for index in range(4):
            await complete(session, router, words(f"pre{index}w", LONG + 40 * index))
        messages = [{"role": "user", "content": words("always", LONG)}]
        body = {"model": NAME, "messages": messages, "max_tokens": 40}
        first = await stream(session, router.url + "/v1/chat/completions", body)
        assert first.status == 200
        assert choices(router, "remote", "always") == 5
        disagg = router.state.disaggregation
        auto = DisaggregationKnobs(mode="Auto", max_local_tokens=MAX_LOCAL)
        disagg.configure(auto, disagg.index.capacity_blocks_per_pod)

        local = by_source(decode, "local_compute")
        await complete(session, router, words("firstauto", 20))
        assert choices(router, "remote", "unmeasured") == 0
        assert choices(router, "local", "local_faster") == 1
        assert by_source(decode, "local_compute") - local == 20

        hits = [engine_sample(e, "vllm:prefix_cache_hits_total") for e in decode]
        messages += [
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": words("next", 10)},
        ]
        second = await stream(session, router.url + "/v1/chat/completions", {**body, "messages": messages})
        assert second.status == 200
        assert choices(router, "local", "local_faster") == 2
        assert choices(router, "remote", "unmeasured") == 0
        gained = [
            engine_sample(e, "vllm:prefix_cache_hits_total") - h for e, h in zip(decode, hits, strict=True)
        ]
        assert max(gained) >= LONG + 16  # turn 1 and its reply, found where Always decoded them
