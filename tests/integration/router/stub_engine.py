"""A minimal in-process engine for router tests: the two-phase protocol and scripted faults.

Not the sim engine (that one models time and batching); this one answers at once and does exactly
what a test scripts: a status on the next requests, a stream cut after N tokens, an error event
inside a 200 stream, a failed KV pull. Output text is a function of the prompt only, so P/D and
colocated answers are comparable.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web


class Engine(Protocol):
    async def start(self) -> str: ...
    async def stop(self) -> None: ...


@asynccontextmanager
async def serving(pools: Mapping[str, Sequence[Engine]]) -> AsyncIterator[None]:
    """Starts every engine of `pools` (role -> engines), and stops them all on the way out: the body
    of the router tests' `engines` fixtures."""
    for pool in pools.values():
        for engine in pool:
            await engine.start()
    yield
    for pool in pools.values():
        for engine in pool:
            await engine.stop()


@dataclass
class Script:
    fail_status: int | None = None  # answer this status ...
    fail_count: int = 0  # ... to this many completion requests
    cut_after_tokens: int | None = None  # drop the connection after this many streamed tokens
    error_after_tokens: int | None = None  # send an error event after this many tokens
    kv_pull_fails: bool = False  # a decode request with remote params answers 500
    token_delay_s: float = 0.0
    hold_s: float = 0.0  # wait before answering (to test client disconnect)
    kv_usage: float = 0.0  # what /metrics reports as vllm:kv_cache_usage_perc (decode backpressure)


@dataclass
class StubEngine:
    name: str
    model: str = "stub-model"
    max_model_len: int = 2048
    script: Script = field(default_factory=Script)
    seen: list[dict[str, Any]] = field(default_factory=list)  # request bodies with their headers
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set once a completion arrives
    cancelled: int = 0
    host: str = "127.0.0.1"  # any 127.0.0.0/8 address: pods of a test get one each
    port: int = 0  # 0: any free port
    _runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _metrics(self, request: web.Request) -> web.Response:
        text = f'vllm:kv_cache_usage_perc{{engine="0",model_name="{self.model}"}} {self.script.kv_usage}\n'
        return web.Response(text=text, content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(
            {
                "body": body,
                "request_id": request.headers.get("X-Request-Id"),
                "authorization": request.headers.get("Authorization"),
            }
        )
        self.arrived.set()
        script = self.script
        try:
            if script.hold_s:
                await asyncio.sleep(script.hold_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if script.fail_count > 0 and script.fail_status is not None:
            script.fail_count -= 1
            return web.json_response(
                {"error": {"message": f"{self.name} scripted failure", "code": script.fail_status}},
                status=script.fail_status,
            )
        params = body.get("kv_transfer_params") or {}
        if params.get("do_remote_prefill") and script.kv_pull_fails:
            return web.json_response({"error": {"message": "KV pull failed", "code": 500}}, status=500)
        chat = "messages" in body
        prompt = json.dumps(body["messages"]) if chat else str(body.get("prompt"))
        tokens = [_token(prompt, i) for i in range(int(body.get("max_tokens") or 16))]
        created = int(time.time())
        if params.get("do_remote_decode"):
            answer = _whole(chat, tokens[:1], created)
            answer["kv_transfer_params"] = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": self.name,
                "remote_block_ids": [1, 2, 3],
                "remote_host": "127.0.0.1",
                "remote_port": 5600,
            }
            return web.json_response(answer)
        if not body.get("stream"):
            return web.json_response(_whole(chat, tokens, created))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for index, token in enumerate(tokens):
                if script.cut_after_tokens is not None and index == script.cut_after_tokens:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if script.error_after_tokens is not None and index == script.error_after_tokens:
                    await response.write(b'data: {"error": {"message": "engine error", "code": 500}}\n\n')
                    await response.write(b"data: [DONE]\n\n")
                    return response
                if script.token_delay_s:
                    await asyncio.sleep(script.token_delay_s)
                await response.write(b"data: " + json.dumps(_chunk(chat, token, created)).encode() + b"\n\n")
            if (body.get("stream_options") or {}).get("include_usage"):  # as vLLM: only when asked
                count = len(tokens)
                usage = {"prompt_tokens": 3, "completion_tokens": count, "total_tokens": 3 + count}
                chunk = json.dumps({"choices": [], "usage": usage}).encode()
                await response.write(b"data: " + chunk + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return response


def _token(prompt: str, index: int) -> str:
    return " t" + hashlib.blake2b(f"{prompt}/{index}".encode(), digest_size=3).hexdigest()


def _whole(chat: bool, tokens: list[str], created: int) -> dict[str, Any]:
    text = "".join(tokens)
    usage = {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": text}
    choice["finish_reason"] = "length"
    return {"id": "x", "object": "completion", "created": created, "choices": [choice], "usage": usage}


def _chunk(chat: bool, token: str, created: int) -> dict[str, Any]:
    choice: dict[str, Any] = (
        {"index": 0, "delta": {"content": token}} if chat else {"index": 0, "text": token}
    )
    return {"id": "x", "object": "chunk", "created": created, "choices": [choice]}
