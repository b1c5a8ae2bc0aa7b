"""The router never writes a prompt (or a generated text) to its log, at any log level: requests
carrying a marker string go through every path that logs (P/D and colocated, streaming and not,
chat and completions, a failing prefill leg retried, an engine whose error message echoes the
prompt, malformed and over-long requests), and no log record, message or arguments or exception
text, contains the marker. There is no option to log prompts (docs/security.md)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tandem.router.main import parse_args

from .harness import running_router, stream
from .stub_engine import Script, StubEngine, serving

pytestmark = pytest.mark.timeout(60)

MARKER = "SECRET-PROMPT-7f3a9c"


class EchoingEngine:
    """An engine that refuses every completion with an error message quoting the prompt back."""

    def __init__(self) -> None:
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()

        async def refuse(request: web.Request) -> web.Response:
            body = await request.json()
            message = f"cannot serve prompt {body.get('prompt') or body.get('messages')!r}"
            return web.json_response({"error": {"message": message, "code": 500}}, status=500)

        async def models(request: web.Request) -> web.Response:
            card = {"id": "stub-model", "object": "model", "max_model_len": 2048}
            return web.json_response({"object": "list", "data": [card]})

        app.router.add_post("/v1/completions", refuse)
        app.router.add_post("/v1/chat/completions", refuse)
        app.router.add_get("/v1/models", models)

        async def health(request: web.Request) -> web.Response:
            return web.json_response({})

        app.router.add_get("/health", health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, Any]]:
    pools: dict[str, Any] = {
        "prefill": [StubEngine("p0", script=Script(fail_status=503, fail_count=1)), StubEngine("p1")],
        "decode": [StubEngine("d0")],
        "colocated": [StubEngine("c0")],
        "echo": [EchoingEngine()],
    }
    async with serving(pools):
        yield pools


def _leaks(records: list[logging.LogRecord]) -> list[str]:
    found = []
    for record in records:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += repr(record.exc_info[1])
        if record.exc_text:
            text += record.exc_text
        if MARKER in text or MARKER in repr(record.args):
            found.append(f"{record.name} {record.levelname}: {text[:300]}")
    return found


async def test_no_prompt_reaches_the_log(engines: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # the most the router ever logs (-v)
    completion = {"model": "stub-model", "prompt": f"tell me {MARKER}", "max_tokens": 4}
    chat = {"model": "stub-model", "messages": [{"role": "user", "content": f"hi {MARKER}"}], "max_tokens": 4}
    pd_urls = {role: [e.url for e in engines[role]] for role in ("prefill", "decode")}
    statuses: list[int] = []
    async with (
        # Round-robin: p0 (which fails once) gets one of the first two P/D requests for sure. These
        # prompts are shorter than a prefix chunk, so the default choice is by load: two idle pods,
        # a coin toss each, and all four requests went to p1 one run in sixteen.
        running_router(**pd_urls, learn_models=True, prefill_policy="RoundRobin") as pd,
        running_router(colocated=[engines["colocated"][0].url], learn_models=True) as colo,
        running_router(colocated=[engines["echo"][0].url], learn_models=True) as echo,
        aiohttp.ClientSession() as session,
    ):
        for router in (pd, colo, echo):
            for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
                for streaming in (True, False):
                    result = await stream(session, router.url + path, {**body, "stream": streaming})
                    statuses.append(result.status)
            malformed: list[dict[str, Any]] = [
                {**completion, "max_tokens": f"{MARKER}"},
                {**completion, "prompt": MARKER * 2000, "max_tokens": 4},  # over max_model_len
                {"model": MARKER, "prompt": MARKER},
                {**chat, "messages": [{"role": MARKER, "content": MARKER}]},
            ]
            for bad in malformed:
                async with session.post(router.url + "/v1/completions", json=bad) as response:
                    statuses.append(response.status)
            async with session.post(
                router.url + "/v1/completions",
                data=f'{{"prompt": "{MARKER}", ',
                headers={"Content-Type": "application/json"},
            ) as response:
                statuses.append(response.status)
    # The paths were really taken: successes, the retried prefill failure, 4xx and the echoing 5xx.
    assert statuses.count(200) >= 8, statuses
    assert any(400 <= s < 500 for s in statuses), statuses
    assert any(s >= 500 for s in statuses), statuses
    assert engines["prefill"][0].script.fail_count == 0  # the scripted failure was served and retried
    assert any(r.levelno >= logging.WARNING for r in caplog.records)  # failures were logged ...
    assert not _leaks(caplog.records), "\n".join(_leaks(caplog.records))  # ... without the prompt


def test_the_leak_detector_sees_a_prompt_in_message_args_and_exceptions() -> None:
    def record(msg: str, args: tuple[Any, ...] = (), exc: BaseException | None = None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("tandem.router", logging.INFO, __file__, 1, msg, args, info)

    assert _leaks([record(f"body {MARKER}")])
    assert _leaks([record("body %s", ({"prompt": MARKER},))])
    assert _leaks([record("failed", exc=ValueError(MARKER))])
    assert not _leaks([record("prefill leg failed: %s", ("answered 503",))])


def test_there_is_no_flag_to_log_prompts() -> None:
    """Documented in docs/security.md: the router has no prompt-logging option."""
    with pytest.raises(SystemExit):
        parse_args(["--namespace", "n", "--pddeployment", "p", "--log-prompts"])
