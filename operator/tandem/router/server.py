"""The router's endpoints: OpenAI completions and chat, /v1/models, /health, /ready, /metrics.

A thin shell over `front` (the HTTP/1.1 server): it reads and checks the client's request (size,
JSON, model, context length) and hands it to `Flow`, with the connection's `ClientStream` as the
flow's `Responder`. The front cancels a request's task when its client disconnects, which is
what cancels both legs of an abandoned request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tandem.router.errors import error_body
from tandem.router.flow import ClientRequest, Flow
from tandem.router.front import ClientStream, FrontRequest
from tandem.router.gateway import rate_limited_body, unauthorized_body
from tandem.router.protocol import BadRequest, Endpoint, check_fits, parse_body, request_facts
from tandem.router.state import RouterState
from tandem.routing.admission import Refusal
from tandem.routing.tenants import Unauthorized

log = logging.getLogger(__name__)

JSON: Final = "application/json"
_FORWARDED_HEADERS: Final = {"authorization": "Authorization"}  # client header -> sent to engines
_GENERATE: Final[dict[str, Endpoint]] = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


class RequestIds:
    """Ids for requests that come without `X-Request-Id`: a random per-process prefix and a counter
    (unique across router replicas without a uuid4 per request)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"


class RouterApp:
    def __init__(
        self, state: RouterState, flow: Flow, *, max_body_bytes: int, max_model_len: int | None
    ) -> None:
        self.state = state
        self.flow = flow
        self.max_body_bytes = max_body_bytes
        self.max_model_len = max_model_len
        self._ids = RequestIds()
        self._gets: dict[str, Callable[[ClientStream], Awaitable[None]]] = {
            "/v1/models": self.models,
            "/health": self.health,
            "/ready": self.ready,
            "/metrics": self.metrics,
        }

    def body_limit(self) -> int:
        """The largest body accepted now: spec.router.admission.maxBodyBytes, else the flag's."""
        return self.state.gateway.max_body_bytes or self.max_body_bytes

    async def handle(self, request: FrontRequest, client: ClientStream) -> None:
        """The front's handler: routes by path and method."""
        endpoint = _GENERATE.get(request.path)
        if endpoint is not None:
            if request.method != "POST":
                await self._refuse(client, 405, f"{request.method} is not allowed on {request.path}")
                return
            await self._generate(request, client, endpoint)
            return
        get = self._gets.get(request.path)
        if get == self.models and request.method == "GET" and self._tenant(request, client) is None:
            return
        if get is None:
            await self._refuse(client, 404, f"no route {request.path}")
        elif request.method != "GET":
            await self._refuse(client, 405, f"{request.method} is not allowed on {request.path}")
        else:
            await get(client)

    def _tenant(self, request: FrontRequest, client: ClientStream) -> str | None:
        """The request's tenant label; None when it was answered 401 (bad key) or 503 (keys not loaded)."""
        gateway = self.state.gateway
        if not gateway.ready:  # keys configured but not (yet) readable: serve nobody
            self._reject(client, "api_keys_unavailable", 503, "API keys are not loaded; try again later")
            return None
        tenant = gateway.identify(request.headers)
        if isinstance(tenant, Unauthorized):
            self.state.metrics.child(self.state.metrics.rejected, "invalid_api_key").inc()
            client.set_header("WWW-Authenticate", "Bearer")
            client.answer_nowait(401, unauthorized_body(tenant.message), JSON)
            return None
        return tenant

    def count_refusal(self, reason: str) -> None:
        """The front's hook for requests it answers itself (413 before the body, 400 unparsable)."""
        self.state.metrics.child(self.state.metrics.rejected, reason).inc()

    @staticmethod
    async def _refuse(client: ClientStream, status: int, message: str) -> None:
        await client.answer(status, error_body(status, message), JSON)

    def _reject(
        self, client: ClientStream, reason: str, status: int, message: str, param: str | None = None
    ) -> None:
        self.state.metrics.child(self.state.metrics.rejected, reason).inc()
        client.answer_nowait(status, error_body(status, message, param=param), JSON)

    async def _generate(self, request: FrontRequest, client: ClientStream, endpoint: Endpoint) -> None:
        arrived = time.monotonic()
        raw = request.body
        # The front refuses bodies over the limit before reading them; this catches a body read
        # whole before the limit was lowered, and a front given a larger limit (tests).
        limit = self.body_limit()
        if len(raw) > limit:
            self._reject(client, "body_too_large", 413, f"request body over {limit} bytes")
            return
        tenant = self._tenant(request, client)
        if tenant is None:
            return
        try:
            body = parse_body(raw)
        except ValueError as error:
            self._reject(client, "invalid_json", 400, f"request body is not valid JSON: {error}")
            return
        except RecursionError:  # "[[[[...": nesting deeper than the parser's recursion limit
            self._reject(client, "invalid_json", 400, "request body is nested too deeply")
            return
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
            self._reject(client, reason, error.status, error.message, error.param)
            return
        ticket = self.state.gateway.admit(tenant, facts.prompt_tokens, arrived)
        if isinstance(ticket, Refusal):
            client.set_header("Retry-After", str(ticket.retry_after_s))
            client.answer_nowait(429, rate_limited_body(ticket), JSON)
            return
        try:
            request_id = request.header("x-request-id") or self._ids.next()
            client.set_header("X-Request-Id", request_id)
            headers = request.headers
            # With API keys the key is the router's to check: it is not passed on to the engines.
            forwarded = {} if self.state.gateway.tenancy.keys_required else _FORWARDED_HEADERS
            forward = {sent: headers[name] for name, sent in forwarded.items() if name in headers}
            client_request = ClientRequest(endpoint, body, raw, facts, request_id, arrived, forward, tenant)
            await self.flow.serve(client_request, client)
        finally:
            ticket.release()

    async def _json(self, client: ClientStream, payload: Any, status: int = 200) -> None:
        await client.answer(status, json.dumps(payload).encode(), JSON)

    async def models(self, client: ClientStream) -> None:
        await self._json(client, {"object": "list", "data": self.state.catalog.cards()})

    async def health(self, client: ClientStream) -> None:
        counts = {role: len(urls) for role, urls in self.state.endpoints.items()}
        await self._json(client, {"status": "ok", "endpoints": counts})

    async def ready(self, client: ClientStream) -> None:
        """200 once the router knows its pods (a readiness probe); /health stays a liveness check."""
        counts = {role: len(urls) for role, urls in self.state.endpoints.items()}
        # Not ready while API keys are configured but unreadable: a router that would refuse everyone.
        keys = self.state.gateway.ready
        status = 200 if self.state.synced and keys else 503
        await self._json(client, {"synced": self.state.synced, "keys": keys, "endpoints": counts}, status)

    async def metrics(self, client: ClientStream) -> None:
        self.state.metrics.retry_budget.set(self.flow.budget.available)
        await client.answer(200, generate_latest(self.state.metrics.registry), CONTENT_TYPE_LATEST)


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
