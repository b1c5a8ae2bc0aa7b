"""The gateway's policy over real HTTP, against stub engines: API keys, per-tenant limits, the
long-prompt cap, decode backpressure and the rollout's tenants first.

Settings are compressed so each test takes seconds: buckets of one or two requests, a long prompt of
40 words, a KV scrape every second.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tandem.kube.pods import PddInfo, pdd_info_from
from tandem.router.kvwatch import watch_kv_usage

from .harness import RunningRouter, running_router, until
from .stub_engine import Script, StubEngine, serving

pytestmark = pytest.mark.timeout(120)

KEYS = {"team-a": "sk-team-a-000001", "team-b": "sk-team-b-000001\nsk-team-b-000002"}
SHORT = {"model": "stub-model", "prompt": "the quick brown fox", "max_tokens": 4}
LONG = {"model": "stub-model", "prompt": " ".join(["word"] * 60), "max_tokens": 8}


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, list[StubEngine]]]:
    pools = {
        "prefill": [StubEngine("p0")],
        "decode": [StubEngine("d0"), StubEngine("d1")],
        "colocated": [StubEngine("c0")],
    }
    async with serving(pools):
        yield pools


def urls(pools: dict[str, list[StubEngine]], *roles: str) -> dict[str, list[str]]:
    return {role: [e.url for e in pools[role]] for role in roles}


async def post(
    session: aiohttp.ClientSession, router: RunningRouter, body: dict[str, Any], **headers: str
) -> tuple[int, dict[str, str], Any]:
    async with session.post(router.url + "/v1/completions", json=body, headers=headers) as response:
        raw = await response.read()
        return response.status, dict(response.headers), json.loads(raw) if raw else None


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_keys_are_enforced(engines: dict[str, list[StubEngine]]) -> None:
    gateway = {"tenants": [{"name": "team-a"}]}
    async with (
        running_router(**urls(engines, "colocated"), gateway=gateway, api_keys=KEYS) as router,
        aiohttp.ClientSession() as session,
    ):
        status, headers, body = await post(session, router, SHORT)
        assert status == 401
        assert headers["WWW-Authenticate"] == "Bearer"
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "invalid_api_key"
        status, _, body = await post(session, router, SHORT, **bearer("sk-not-a-key-0000"))
        assert status == 401
        assert body["error"]["message"].startswith("Incorrect API key")
        status, _, _ = await post(session, router, SHORT, Authorization="Basic c2stdGVhbS1hLTAwMDAwMQ==")
        assert status == 401
        assert not engines["colocated"][0].seen  # nothing unauthenticated reached an engine
        async with session.get(router.url + "/v1/models") as response:
            assert response.status == 401

        for key in ("sk-team-a-000001", "sk-team-b-000002"):
            status, _, body = await post(session, router, SHORT, **bearer(key))
            assert status == 200, body
        async with session.get(router.url + "/v1/models", headers=bearer("sk-team-b-000001")) as response:
            assert response.status == 200
        # The key is the router's: the engines never see it.
        assert [seen["authorization"] for seen in engines["colocated"][0].seen] == [None, None]
        assert router.sample("tandem_router_rejected_requests_total", reason="invalid_api_key") == 4
        # team-a is configured (its own label); team-b is not (`other`).
        assert (
            router.sample(
                "tandem_router_tenant_requests_total",
                tenant="team-a",
                model="stub-model",
                path="colocated",
                code="2xx",
            )
            == 1
        )
        assert (
            router.sample(
                "tandem_router_tenant_requests_total",
                tenant="other",
                model="stub-model",
                path="colocated",
                code="2xx",
            )
            == 1
        )


async def test_keys_configured_but_unreadable_serve_nobody(engines: dict[str, list[StubEngine]]) -> None:
    async with running_router(**urls(engines, "colocated")) as router, aiohttp.ClientSession() as session:
        router.state.gateway.configure({"auth": {"apiKeysSecret": "llm-keys"}})  # no read yet
        async with session.get(router.url + "/ready") as response:
            assert response.status == 503
            assert (await response.json())["keys"] is False
        status, _, body = await post(session, router, SHORT, **bearer("sk-team-a-000001"))
        assert status == 503
        assert "API keys are not loaded" in body["error"]["message"]
        assert router.sample("tandem_router_api_keys_loaded") == 0
        router.state.gateway.on_keys({"team-a": "short"})  # malformed: still nobody
        assert (await post(session, router, SHORT, **bearer("sk-team-a-000001")))[0] == 503
        router.state.gateway.on_keys(KEYS)
        assert (await post(session, router, SHORT, **bearer("sk-team-a-000001")))[0] == 200
        async with session.get(router.url + "/ready") as response:
            assert response.status == 200
        assert router.sample("tandem_router_api_keys_loaded") == 1


async def test_a_tenant_over_its_limit_is_refused_while_another_is_served(
    engines: dict[str, list[StubEngine]],
) -> None:
    gateway = {
        "auth": {"tenantHeader": "X-Team"},
        "tenants": [
            {"name": "team-a", "limits": {"requestsPerSecond": 0.2, "requestBurst": 2}},
            {"name": "team-b", "limits": {"promptTokensPerSecond": 1, "promptTokenBurst": 6}},
        ],
    }
    async with (
        running_router(**urls(engines, "prefill", "decode"), gateway=gateway) as router,
        aiohttp.ClientSession() as session,
    ):
        codes = [(await post(session, router, SHORT, **{"X-Team": "team-a"}))[0] for _ in range(2)]
        assert codes == [200, 200]
        status, headers, body = await post(session, router, SHORT, **{"X-Team": "team-a"})
        assert status == 429
        assert 1 <= int(headers["Retry-After"]) <= 5  # 1 request at 0.2/s: at most 5 s away
        assert body["error"]["type"] == "rate_limit_exceeded"
        assert body["error"]["code"] == "tenant_requests"
        # Meanwhile another tenant (and a tenant without limits) is served.
        for team in ("team-c", "team-c", "team-c"):
            assert (await post(session, router, SHORT, **{"X-Team": team}))[0] == 200
        # team-b: a prompt-token bucket of 6 at 1/s; four words fit, the next four are 2 s away.
        assert (await post(session, router, SHORT, **{"X-Team": "team-b"}))[0] == 200
        status, headers, body = await post(session, router, SHORT, **{"X-Team": "team-b"})
        assert status == 429
        assert body["error"]["code"] == "tenant_prompt_tokens"
        assert headers["Retry-After"] == "2"
        assert router.sample("tandem_router_refusals_total", reason="tenant_requests", tenant="team-a") == 1
        assert (
            router.sample("tandem_router_refusals_total", reason="tenant_prompt_tokens", tenant="team-b") == 1
        )
        assert router.sample("tandem_router_refusals_total", reason="tenant_requests", tenant="other") == 0


async def test_long_prompt_cap_holds_under_a_burst(engines: dict[str, list[StubEngine]]) -> None:
    colocated = engines["colocated"][0]
    colocated.script = Script(token_delay_s=0.5)  # each answer takes 4 s: the burst overlaps
    gateway = {"admission": {"longPrompts": {"minTokens": 40, "maxConcurrent": 2}}}
    async with (
        running_router(**urls(engines, "colocated"), gateway=gateway) as router,
        aiohttp.ClientSession() as session,
    ):
        bodies = [{**LONG, "stream": True}] * 6 + [{**SHORT, "stream": True}] * 3
        results = await asyncio.gather(*(post_stream(session, router, body) for body in bodies))
        long_codes, short_codes = [r[0] for r in results[:6]], [r[0] for r in results[6:]]
        assert sorted(long_codes) == [200, 200, 429, 429, 429, 429]
        assert short_codes == [200, 200, 200]  # short prompts are never held back by the cap
        refused = [r for r in results[:6] if r[0] == 429]
        assert all(r[1]["error"]["code"] == "long_prompts" for r in refused)
        assert router.sample("tandem_router_refusals_total", reason="long_prompts", tenant="default") == 4
        assert router.sample("tandem_router_long_prompts_in_flight") == 0  # slots freed at the end
        status, _ = await post_stream(session, router, {**LONG, "stream": True})
        assert status == 200


async def post_stream(
    session: aiohttp.ClientSession, router: RunningRouter, body: dict[str, Any]
) -> tuple[int, Any]:
    async with session.post(router.url + "/v1/completions", json=body) as response:
        raw = await response.read()
    return response.status, json.loads(raw) if response.status != 200 else None


async def test_decode_backpressure_moves_transfers(engines: dict[str, list[StubEngine]]) -> None:
    d0, d1 = engines["decode"]
    prefill = engines["prefill"][0]
    d0.script = Script(kv_usage=0.95)
    d1.script = Script(kv_usage=0.10)
    gateway = {
        "admission": {
            "decodeBackpressure": {"kvUsagePercent": 90, "scrapeIntervalSeconds": 1, "queueSeconds": 1}
        }
    }
    async with (
        running_router(**urls(engines, "prefill", "decode"), gateway=gateway) as router,
        aiohttp.ClientSession() as session,
    ):
        state = router.state
        watcher = asyncio.create_task(
            watch_kv_usage(state.gateway, router.flow.upstream, lambda: state.endpoints["decode"])
        )
        try:
            await until(lambda: state.gateway.kv_usage.get(d0.url) == pytest.approx(0.95), every_s=1.0)
            for _ in range(12):
                assert (await post(session, router, SHORT))[0] == 200
            assert not d0.seen  # near full: no transfer
            assert len(d1.seen) == 12
            assert router.sample("tandem_router_decode_kv_full_endpoints") == 1

            d1.script = Script(kv_usage=0.97)  # both full: wait queueSeconds, then 429 before prefill
            await until(lambda: state.gateway.kv_usage.get(d1.url) == pytest.approx(0.97), every_s=1.0)
            prefills = len(prefill.seen)
            status, headers, body = await post(session, router, SHORT)
            assert status == 429
            assert body["error"]["code"] == "decode_kv_full"
            assert headers["Retry-After"] == "1"
            assert len(prefill.seen) == prefills  # no prefill work spent on it
            assert (
                router.sample("tandem_router_refusals_total", reason="decode_kv_full", tenant="default") == 1
            )

            d0.script = Script(kv_usage=0.20)  # d0 has room again: it takes the transfers
            await until(lambda: state.gateway.kv_usage.get(d0.url) == pytest.approx(0.20), every_s=1.0)
            for _ in range(4):
                assert (await post(session, router, SHORT))[0] == 200
            assert len(d0.seen) == 4
            assert len(d1.seen) == 12
        finally:
            watcher.cancel()


async def test_rollout_tenants_go_to_the_target_first(engines: dict[str, list[StubEngine]]) -> None:
    gateway = {"tenants": [{"name": "team-a"}, {"name": "team-b"}]}
    async with (
        running_router(**urls(engines, "prefill", "decode", "colocated"), gateway=gateway) as router,
        aiohttp.ClientSession() as session,
    ):
        state = router.state

        def served(tenant: str, path: str) -> float:
            return router.sample(
                "tandem_router_tenant_requests_total",
                tenant=tenant,
                model="stub-model",
                path=path,
                code="2xx",
            )

        async def send(team: str, count: int) -> None:
            for _ in range(count):
                assert (await post(session, router, SHORT, **{"X-Tenant": team}))[0] == 200

        # The tenants stage: weight 0, P/D the target taking traffic: only the chosen tenants on it.
        state.rollout_weight = 0
        state.gateway.configure(gateway, ["team-b"], rollout_target="Disaggregated")
        await send("team-a", 20)
        await send("team-b", 20)
        assert served("team-b", "disaggregated") == 20
        assert served("team-a", "colocated") == 20
        assert served("team-a", "disaggregated") == 0
        state.rollout_weight = 1  # P/D is the target at 1 %
        await send("team-a", 30)
        await send("team-b", 30)
        assert served("team-b", "disaggregated") == 50  # every request, at a weight of 1 %
        assert served("team-a", "colocated") >= 48  # everyone else by the weight (1 %)
        # Rolled back: weight 0 and no target taking traffic: the chosen tenants are on the source too.
        state.rollout_weight = 0
        state.gateway.configure(gateway, ["team-b"], rollout_target=None)
        await send("team-b", 5)
        assert served("team-b", "colocated") == 5


async def test_the_body_limit_follows_the_pddeployment_on_a_kept_alive_connection(
    engines: dict[str, list[StubEngine]],
) -> None:
    """spec.router.admission.maxBodyBytes, as the router's PDDeployment watch delivers it, changes the
    limit for the next request on a connection already open; unset, the flag's limit is back."""
    big = {**SHORT, "prompt": " ".join(["w" * 99] * 1000)}  # 100 KB in 1,000 words
    assert len(json.dumps(big)) > 64 * 1024

    def spec(admission: dict[str, Any]) -> PddInfo:
        return pdd_info_from({"metadata": {"name": "llm"}, "spec": {"router": {"admission": admission}}})

    async with (
        running_router(**urls(engines, "prefill", "decode"), max_body_bytes=64 * 1024) as router,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session,
    ):
        status, _, body = await post(session, router, big)
        assert (status, body["error"]["message"]) == (413, f"request body over {64 * 1024} bytes")
        # A 413 closes its connection; this one opens under the 64 KiB limit and stays open.
        assert (await post(session, router, SHORT))[0] == 200
        router.state.on_pdd(spec({"maxBodyBytes": 256 * 1024}))
        status, _, body = await post(session, router, big)
        assert status == 200, body
        # Chunked (no Content-Length): the front counts what arrives.
        async with session.post(router.url + "/v1/completions", data=_chunks(json.dumps(big))) as answer:
            assert answer.status == 200
        router.state.on_pdd(spec({"maxBodyBytes": 2048}))
        status, _, body = await post(session, router, big)
        assert (status, body["error"]["message"]) == (413, "request body over 2048 bytes")
        async with session.post(router.url + "/v1/completions", data=_chunks(json.dumps(big))) as answer:
            assert answer.status == 413
        assert (await post(session, router, SHORT))[0] == 200  # small bodies pass
        router.state.on_pdd(spec({}))
        assert (await post(session, router, big))[0] == 413  # the flag's 64 KiB again
        assert router.sample("tandem_router_rejected_requests_total", reason="body_too_large") == 4


async def _chunks(text: str) -> AsyncIterator[bytes]:
    data = text.encode()
    for start in range(0, len(data), 16 * 1024):
        yield data[start : start + 16 * 1024]
