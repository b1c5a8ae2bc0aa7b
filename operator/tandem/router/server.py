"""The router's HTTP front (aiohttp): OpenAI endpoints, /v1/models, /health, /metrics.

A thin shell: it reads and checks the client's request (size, JSON, model, context length), hands
it to `Flow`, and adapts aiohttp's response objects to the flow's `Responder`. Handlers run with
cancellation on client disconnect, which is what cancels both legs of an abandoned request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tandem.router.errors import error_body
from tandem.router.flow import ClientGone, ClientRequest, Flow
from tandem.router.protocol import BadRequest, Endpoint, check_fits, request_facts
from tandem.router.state import RouterState

log = logging.getLogger(__name__)

JSON: Final = "application/json"
_FORWARDED_HEADERS: Final = ("Authorization",)


class _StreamResponse(web.StreamResponse):
    # Headers leave with the first body bytes (one send instead of two): the router only prepares
    # a stream when it already has bytes to write. (aiohttp's own switch; without it, two sends.)
    _send_headers_immediately = False


class AiohttpResponder:
    """`Responder` over one aiohttp request; `response` is what the handler returns."""

    def __init__(self, request: web.Request, request_id: str) -> None:
        self._request = request
        self._request_id = request_id
        self.response: web.StreamResponse | None = None
        self._stream: web.StreamResponse | None = None

    @property
    def started(self) -> bool:
        return self.response is not None

    async def answer(self, status: int, body: bytes, content_type: str) -> None:
        headers = {"Content-Type": content_type or JSON, "X-Request-Id": self._request_id}
        self.response = web.Response(status=status, body=body, headers=headers)

    async def start_stream(self, status: int, content_type: str) -> None:
        stream = _StreamResponse(
            status=status,
            headers={
                "Content-Type": content_type or "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Request-Id": self._request_id,
            },
        )
        self.response = self._stream = stream
        try:
            await stream.prepare(self._request)
        except ConnectionError as error:
            raise ClientGone() from error

    async def write(self, data: bytes) -> None:
        assert self._stream is not None
        try:
            await self._stream.write(data)
        except ConnectionError as error:
            raise ClientGone() from error

    async def finish(self, data: bytes) -> None:
        assert self._stream is not None
        try:
            # With the end in the same call, aiohttp sends the last chunk and the terminator together.
            await self._stream.write_eof(data)
        except ConnectionError as error:
            raise ClientGone() from error


def _error(status: int, message: str, *, param: str | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(status, message, param=param), content_type=JSON)


class RouterApp:
    def __init__(
        self, state: RouterState, flow: Flow, *, max_body_bytes: int, max_model_len: int | None
    ) -> None:
        self.state = state
        self.flow = flow
        self.max_body_bytes = max_body_bytes
        self.max_model_len = max_model_len
        self.app = web.Application(client_max_size=max_body_bytes)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/health", self.health)
        self.app.router.add_get("/ready", self.ready)
        self.app.router.add_get("/metrics", self.metrics)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    def _reject(self, reason: str, status: int, message: str, param: str | None = None) -> web.Response:
        self.state.metrics.child(self.state.metrics.rejected, reason).inc()
        return _error(status, message, param=param)

    async def _generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        arrived = time.monotonic()
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return self._reject("body_too_large", 413, f"request body over {self.max_body_bytes} bytes")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._reject("body_too_large", 413, f"request body over {self.max_body_bytes} bytes")
        try:
            body = json.loads(raw)
        except ValueError as error:
            return self._reject("invalid_json", 400, f"request body is not valid JSON: {error}")
        try:
            facts = request_facts(endpoint, body)
            if facts.model is None:
                raise BadRequest("'model' is required", param="model")
            catalog = self.state.catalog
            known = catalog.names()
            if known and facts.model not in known:
                raise BadRequest(f"The model `{facts.model}` does not exist.", status=404, param="model")
            check_fits(facts, self.max_model_len or catalog.max_model_len(facts.model))
        except BadRequest as error:
            reason = {404: "unknown_model"}.get(error.status, "invalid_request")
            return self._reject(reason, error.status, error.message, error.param)
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        forward = {name: request.headers[name] for name in _FORWARDED_HEADERS if name in request.headers}
        client_request = ClientRequest(endpoint, body, raw, facts, request_id, arrived, forward)
        responder = AiohttpResponder(request, request_id)
        await self.flow.serve(client_request, responder)
        if responder.response is None:
            return _error(502, "no answer")
        return responder.response

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": self.state.catalog.cards()})

    async def health(self, request: web.Request) -> web.Response:
        counts = {role: len(urls) for role, urls in self.state.endpoints.items()}
        return web.json_response({"status": "ok", "endpoints": counts})

    async def ready(self, request: web.Request) -> web.Response:
        """200 once the router knows its pods (a readiness probe); /health stays a liveness check."""
        counts = {role: len(urls) for role, urls in self.state.endpoints.items()}
        status = 200 if self.state.synced else 503
        return web.json_response({"synced": self.state.synced, "endpoints": counts}, status=status)

    async def metrics(self, request: web.Request) -> web.Response:
        self.state.metrics.retry_budget.set(self.flow.budget.available)
        body = generate_latest(self.state.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def refresh_models(
    state: RouterState, flow: Flow, *, interval_s: float = 1.0, max_age_s: float = 60.0
) -> None:
    """Keeps the model catalog current from the engines' /v1/models (one ready pod suffices)."""
    seen_generation, learned_at = -1, 0.0
    while True:
        stale = time.monotonic() - learned_at > max_age_s
        if state.generation != seen_generation or stale:
            for role in ("decode", "colocated", "prefill"):
                for pod in state.endpoints.get(role, [])[:2]:
                    try:
                        answer = await flow.upstream.get(pod + "/v1/models", timeout_s=3.0)
                    except Exception as error:  # best effort: the next round tries again
                        log.debug("model list from %s failed: %s", pod, error)
                        continue
                    if answer.status == 200 and state.catalog.learn_from_engine(answer.body):
                        seen_generation, learned_at = state.generation, time.monotonic()
                        break
                else:
                    continue
                break
        await asyncio.sleep(interval_s)
