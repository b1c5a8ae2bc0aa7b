"""When the router asks a prefill pod to free KV no decode leg will read (docs/router.md, "Freeing KV
nobody will read"): a scripted upstream, no sockets."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tandem.router.failure import RetryBudget
from tandem.router.flow import ClientRequest, Flow, Timeouts
from tandem.router.metrics import RouterMetrics
from tandem.router.protocol import RequestFacts
from tandem.router.state import RouterState
from tandem.router.upstream import Answer, Upstream
from tandem.routing.balancer import Balancer

P, D = "http://127.0.0.1:7001", "http://127.0.0.1:7101"


@dataclass
class FakeStream:
    status: int
    body: bytes
    hang: bool = False  # the decode pod never answers (its request never reaches its scheduler)
    content_type: str = "application/json"
    deadline: float = 1e12

    async def read_all(self) -> bytes:
        if self.hang:
            await asyncio.Event().wait()
        return self.body


@dataclass
class FakeUpstream:
    """Prefill answers with a new remote_request_id each time; decode answers from `decodes`."""

    decodes: list[FakeStream]
    releases: list[tuple[str, list[str]]] = field(default_factory=list)
    prefills: int = 0
    decoding: asyncio.Event = field(default_factory=asyncio.Event)  # a decode leg was sent

    async def post(self, url: str, body: bytes, headers: Any, *, timeout_s: float) -> Answer:
        if url.endswith("/abort_requests"):
            self.releases.append((url.removesuffix("/abort_requests"), json.loads(body)["request_ids"]))
            return Answer(200, b"{}", "application/json")
        self.prefills += 1
        params = {"remote_request_id": f"held-{self.prefills}", "remote_block_ids": [1]}
        return Answer(200, json.dumps({"kv_transfer_params": params}).encode(), "application/json")

    @asynccontextmanager
    async def stream(self, url: str, body: bytes, headers: Any, **timeouts: float) -> AsyncIterator[Any]:
        self.decoding.set()
        yield self.decodes.pop(0)


@dataclass
class FakeClient:
    started: bool = False
    answers: list[int] = field(default_factory=list)

    async def answer(self, status: int, body: bytes, content_type: str) -> None:
        self.started = True
        self.answers.append(status)

    async def finish(self, data: bytes) -> None:
        pass

    def set_header(self, name: str, value: str) -> None:
        pass


def make(upstream: FakeUpstream) -> Flow:
    state = RouterState(balancer=Balancer(rng=random.Random(1)), metrics=RouterMetrics())
    state.set_static({"prefill": [P], "decode": [D]})
    return Flow(state, cast(Upstream, upstream), timeouts=Timeouts(), max_retries=2, budget=RetryBudget())


def request() -> ClientRequest:
    facts = RequestFacts(endpoint="completions", model="m", stream=False, prompt_tokens=3, max_tokens=4)
    body = {"model": "m", "prompt": "a b c", "max_tokens": 4}
    return ClientRequest("completions", body, json.dumps(body).encode(), facts, "r", 0.0)


async def serve(flow: Flow, client: FakeClient) -> None:
    await flow.serve(request(), cast(Any, client))


async def settle(flow: Flow) -> None:
    """Lets the background releases run."""
    for _ in range(5):
        await asyncio.sleep(0)


OK = FakeStream(200, b'{"choices": [{"text": "x"}]}')
FAILED = FakeStream(500, b'{"error": "KV transfer failed"}')


@pytest.mark.parametrize(
    ("decodes", "answers", "released"),
    [
        ([OK], [200], []),  # D read the KV: nothing to free
        ([FAILED, OK], [200], ["held-1"]),  # the failed attempt's KV, freed before the re-prefill
        ([FAILED, FAILED, FAILED], [502], ["held-1", "held-2", "held-3"]),  # gave up: all freed
    ],
)
async def test_kv_of_failed_decode_attempts_is_freed(
    decodes: list[FakeStream], answers: list[int], released: list[str]
) -> None:
    upstream = FakeUpstream(list(decodes))
    flow = make(upstream)
    client = FakeClient()
    await serve(flow, client)
    await settle(flow)
    assert client.answers == answers
    assert upstream.releases == [(P, [rid]) for rid in released]


async def test_a_client_gone_before_the_decode_answer_frees_the_kv() -> None:
    upstream = FakeUpstream([FakeStream(200, b"", hang=True)])
    flow = make(upstream)
    client = FakeClient()
    task = asyncio.create_task(serve(flow, client))
    await upstream.decoding.wait()  # prefill answered; the decode answer never comes
    task.cancel()  # what the front does when the client's connection closes
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle(flow)
    assert upstream.releases == [(P, ["held-1"])]
    assert client.answers == []


async def test_a_client_gone_after_its_answer_started_frees_nothing() -> None:
    """Bytes reached the client: D had read the KV already (its first token needs it)."""
    upstream = FakeUpstream([FakeStream(200, b"", hang=True)])
    flow = make(upstream)
    client = FakeClient(started=True)  # as if the stream's first bytes were out
    task = asyncio.create_task(serve(flow, client))
    await upstream.decoding.wait()  # prefill answered; the decode answer never comes
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle(flow)
    assert upstream.releases == []
