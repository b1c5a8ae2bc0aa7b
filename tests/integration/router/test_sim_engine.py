"""The router against real sim engines (`tandem engine serve`) over HTTP: answers, failures, load.

Engines run as processes on 127.0.0.1 with zero model latency, except where a test needs a stream
that lasts long enough to kill its decode engine halfway.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from .harness import RunningRouter, running_router, stream, text_of
from .sim import LOOPBACK, MAX_MODEL_LEN, NAME, SimEngine, free_port, start_sim

pytestmark = pytest.mark.timeout(180)

PROMPTS = [
    "The capital of France is",
    "Write a haiku about disaggregated inference, please.",
    "one two three four five six seven eight nine ten " * 20,
]


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, list[SimEngine]]]:
    pools: dict[str, list[SimEngine]] = {"prefill": [], "decode": [], "colocated": []}
    try:
        for role, count in (("prefill", 2), ("decode", 2), ("colocated", 1)):
            for _ in range(count):
                pools[role].append(start_sim(None if role == "colocated" else role))
        yield pools
    finally:
        for pool in pools.values():
            for engine in pool:
                engine.stop()


@pytest.fixture(autouse=True)
def no_faults(sims: dict[str, list[SimEngine]]) -> Iterator[None]:
    yield
    for pool in sims.values():
        for engine in pool:
            if engine.proc.poll() is None:
                engine.clear_faults()


def pd(sims: dict[str, list[SimEngine]], **extra: object) -> dict[str, object]:
    return {"prefill": [e.url for e in sims["prefill"]], "decode": [e.url for e in sims["decode"]], **extra}


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
        yield client


async def answer(session: aiohttp.ClientSession, router: RunningRouter, path: str, body: dict) -> str:
    async with session.post(router.url + path, json=body) as response:
        assert response.status == 200, await response.text()
        return text_of(await response.json())


async def test_disaggregated_answers_equal_colocated_answers(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    async with (
        running_router(**pd(sims), learn_models=True) as disagg,
        running_router(colocated=[sims["colocated"][0].url], learn_models=True) as colo,
    ):
        for prompt in PROMPTS:
            completion = {"model": NAME, "prompt": prompt, "max_tokens": 12}
            chat = {"model": NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": 12}
            for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
                pd_stream = await stream(session, disagg.url + path, body)
                co_stream = await stream(session, colo.url + path, body)
                assert pd_stream.status == co_stream.status == 200
                assert not pd_stream.errors
                assert pd_stream.text == co_stream.text != ""
                assert await answer(session, disagg, path, body) == pd_stream.text
                assert await answer(session, colo, path, body) == co_stream.text
        assert disagg.sample("tandem_router_prefill_leg_seconds_count", outcome="ok") == 12
        assert disagg.sample("tandem_router_requests_total", path="disaggregated", code="2xx") == 12
        assert colo.sample("tandem_router_requests_total", path="colocated", code="2xx") == 12
        assert disagg.sample("tandem_router_time_to_first_token_seconds_count", path="disaggregated") == 6


async def test_prefill_errors_retry_on_another_prefill_pod(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    sims["prefill"][0].set_faults(error_rate=1.0, error_status=500)
    async with running_router(**pd(sims)) as router:
        for index in range(60):
            body = {"model": NAME, "prompt": PROMPTS[index % 3], "max_tokens": 4}
            result = await stream(session, router.url + "/v1/completions", body)
            assert result.status == 200
            assert not result.errors
            if (
                router.sample("tandem_router_failures_total", role="prefill", reason="http_5xx")
                and index >= 5
            ):
                break
        # p0 answered 500 once, then sat out its quarantine.
        assert router.sample("tandem_router_failures_total", role="prefill", reason="http_5xx") == 1
        assert router.sample("tandem_router_retries_total", leg="prefill", reason="http_5xx") == 1


async def test_kv_pull_failure_reprefills_on_another_pair(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    sims["decode"][0].set_faults(kv_pull_failure_rate=1.0)
    async with running_router(**pd(sims)) as router:
        for index in range(60):
            body = {"model": NAME, "prompt": PROMPTS[index % 3], "max_tokens": 8}
            result = await stream(session, router.url + "/v1/completions", body)
            assert result.status == 200
            assert not result.errors
            assert len([e for e in result.events if isinstance(e, dict) and e.get("choices")]) == 8
            if router.sample("tandem_router_retries_total", leg="decode", reason="http_5xx") and index >= 5:
                break
        # d0's pull failed once (HTTP 500 before any byte), the request went to another pair.
        assert router.sample("tandem_router_retries_total", leg="decode", reason="http_5xx") == 1


async def test_error_inside_a_200_stream_is_an_error(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    for engine in sims["decode"]:
        engine.set_faults(stream_error_rate=1.0, stream_error_after_tokens=3)
    async with running_router(**pd(sims)) as router:
        body = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 10}
        result = await stream(session, router.url + "/v1/completions", body)
        assert result.status == 200
        assert len(result.errors) == 1
        assert result.events[-1] == "[DONE]"
        assert len([e for e in result.events if isinstance(e, dict) and e.get("choices")]) == 3
        assert router.sample("tandem_router_failures_total", role="decode", reason="stream_error") == 1
        assert router.sample("tandem_router_requests_total", path="disaggregated", code="5xx") == 1


async def test_decode_killed_mid_stream_ends_the_stream_with_an_error(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    decode = start_sim("decode", time_scale=1.0)  # real-time steps: the stream lasts seconds
    try:
        async with running_router(prefill=[sims["prefill"][0].url], decode=[decode.url]) as router:
            body = {"model": NAME, "prompt": PROMPTS[1], "max_tokens": 2000, "stream": True}
            texts: list[str] = []
            events: list[object] = []
            async with session.post(router.url + "/v1/completions", json=body) as response:
                assert response.status == 200
                async for line in response.content:
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:].strip()
                    event = "[DONE]" if data == b"[DONE]" else json.loads(data)
                    events.append(event)
                    if isinstance(event, dict) and event.get("choices"):
                        texts.append(text_of(event))
                        if len(texts) == 5:
                            decode.kill()
            assert 5 <= len(texts) < 2000
            errors = [e for e in events if isinstance(e, dict) and "error" in e]
            assert len(errors) == 1
            assert events[-1] == "[DONE]"
            assert router.sample("tandem_router_failures_total", role="decode", reason="truncated") == 1
            assert router.sample("tandem_router_retries_total", leg="decode", reason="truncated") == 0
    finally:
        decode.kill()


async def test_no_prefill_pod(sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession) -> None:
    body = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 4}
    async with (
        running_router(decode=[sims["decode"][0].url], colocated_fallback=False) as router,
        session.post(router.url + "/v1/completions", json=body) as response,
    ):
        assert response.status == 503
        assert "no ready prefill pod" in (await response.json())["error"]["message"]
    async with running_router(decode=[sims["decode"][0].url], colocated=[sims["colocated"][0].url]) as router:
        assert await answer(session, router, "/v1/completions", body) != ""
        assert router.sample("tandem_router_requests_total", path="colocated", code="2xx") == 1


async def test_dead_prefill_pod_is_skipped(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    dead = f"http://{LOOPBACK}:{free_port()}"  # nothing listens there
    async with running_router(
        prefill=[dead, sims["prefill"][0].url], decode=[sims["decode"][0].url]
    ) as router:
        for _ in range(6):
            body = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 4}
            assert await answer(session, router, "/v1/completions", body) != ""
        assert router.sample("tandem_router_failures_total", role="prefill", reason="connect") >= 1


async def test_bad_input_gets_openai_errors(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    async with running_router(**pd(sims), learn_models=True, max_body_bytes=64 * 1024) as router:
        url = router.url + "/v1/completions"
        cases = [
            (b"{not json", 400, None),
            (b'{"model": "m", "prompt": "hi", "temperature": NaN}', 400, None),  # not JSON
            (json.dumps({"prompt": "hi"}).encode(), 400, "model"),
            (json.dumps({"model": "nope", "prompt": "hi"}).encode(), 404, "model"),
            (json.dumps({"model": NAME, "prompt": "w " * MAX_MODEL_LEN}).encode(), 400, "prompt"),
            (json.dumps({"model": NAME, "prompt": "x" * 70_000}).encode(), 413, None),
        ]
        for raw, status, param in cases:
            headers = {"Content-Type": "application/json"}
            async with session.post(url, data=raw, headers=headers) as response:
                body = await response.json()
                assert response.status == status, body
                assert body["error"]["code"] == status
                assert body["error"]["param"] == param
                assert body["error"]["message"]
        assert router.sample("tandem_router_prefill_leg_seconds_count", outcome="ok") == 0  # none reached P
        rejected = "tandem_router_rejected_requests_total"
        assert router.sample(rejected, reason="invalid_json") == 2
        assert router.sample(rejected, reason="invalid_request") == 2
        assert router.sample(rejected, reason="unknown_model") == 1
        assert router.sample(rejected, reason="body_too_large") == 1
        async with session.get(router.url + "/v1/models") as response:
            cards = (await response.json())["data"]
        assert [(c["id"], c["max_model_len"]) for c in cards] == [(NAME, MAX_MODEL_LEN)]


async def test_many_concurrent_clients(
    sims: dict[str, list[SimEngine]], session: aiohttp.ClientSession
) -> None:
    async with (
        running_router(**pd(sims)) as router,
        running_router(colocated=[sims["colocated"][0].url]) as colo,
    ):
        bodies = [{"model": NAME, "prompt": f"{PROMPTS[i % 3]} #{i}", "max_tokens": 6} for i in range(48)]
        expected = await asyncio.gather(*(answer(session, colo, "/v1/completions", b) for b in bodies))
        results = await asyncio.gather(*(stream(session, router.url + "/v1/completions", b) for b in bodies))
        assert [r.status for r in results] == [200] * len(bodies)
        assert [r.text for r in results] == list(expected)
        assert router.sample("tandem_router_in_flight_requests", path="disaggregated") == 0


def test_cli_router_process(sims: dict[str, list[SimEngine]]) -> None:
    port = free_port()
    command = [sys.executable, "-m", "tandem.cli", "router", "--host", LOOPBACK, "--port", str(port)]
    for engine in sims["prefill"]:
        command += ["--prefill", engine.url]
    for engine in sims["decode"]:
        command += ["--decode", engine.url]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    health = json.loads(response.read())
                    break
            except OSError:
                assert time.monotonic() < deadline, "router did not start"
                time.sleep(0.2)
        assert health["endpoints"] == {"prefill": 2, "decode": 2, "colocated": 0}
        body = json.dumps({"model": NAME, "prompt": "hello", "max_tokens": 3}).encode()
        request = urllib.request.Request(url + "/v1/completions", data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            assert len(json.loads(response.read())["choices"][0]["text"].split()) == 3
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            metrics = response.read().decode()
        assert 'tandem_router_requests_total{code="2xx",path="disaggregated"} 1.0' in metrics
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0
