"""Every mode learns what Auto decides from (docs/router.md, "Remote or local prefill"): Always traffic
fits the prefill leg's cost line and records which decode pod holds which prompt and reply, so a
switch to Auto decides from its first request. A scripted upstream, a fake clock, no sockets."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tandem.router.failure import RetryBudget
from tandem.router.flow import ALWAYS_LEARNS_EVERY, ClientRequest, Flow, Timeouts
from tandem.router.metrics import RouterMetrics
from tandem.router.protocol import RequestFacts
from tandem.router.state import RouterState
from tandem.router.upstream import Answer, Upstream
from tandem.routing.balancer import Balancer
from tandem.routing.disaggregation import (
    CostModel,
    DecodeView,
    DisaggregationKnobs,
    PrefillView,
    Request,
    decide,
)
from tandem.routing.prefix import text_keys

P, D = "http://127.0.0.1:7001", "http://127.0.0.1:7101"
INTERCEPT_S, PER_TOKEN_S = 0.02, 0.001  # the scripted prefill leg: 20 ms + 1 ms a prompt token


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Answered:
    status: int
    body: bytes
    content_type: str = "application/json"
    deadline: float = 1e12

    async def read_all(self) -> bytes:
        return self.body


@dataclass
class ScriptedUpstream:
    """A prefill leg takes INTERCEPT_S + PER_TOKEN_S per prompt token (words) on the fake clock; a decode
    leg answers `reply`."""

    clock: Clock
    reply: str = "the reply"
    decoded: list[str] = field(default_factory=list)

    async def post(self, url: str, body: bytes, headers: Any, *, timeout_s: float) -> Answer:
        prompt = json.loads(body)["prompt"]
        self.clock.now += INTERCEPT_S + PER_TOKEN_S * len(prompt.split())
        params = {"remote_request_id": "held", "remote_block_ids": [1]}
        return Answer(200, json.dumps({"kv_transfer_params": params}).encode(), "application/json")

    @asynccontextmanager
    async def stream(self, url: str, body: bytes, headers: Any, **timeouts: float) -> AsyncIterator[Any]:
        self.decoded.append(url)
        yield Answered(200, json.dumps({"choices": [{"text": self.reply}]}).encode())


@dataclass
class FakeClient:
    answers: list[int] = field(default_factory=list)
    started: bool = False

    async def answer(self, status: int, body: bytes, content_type: str) -> None:
        self.started = True
        self.answers.append(status)

    async def finish(self, data: bytes) -> None:
        pass

    def set_header(self, name: str, value: str) -> None:
        pass


def make(clock: Clock, every: int = 1) -> tuple[Flow, ScriptedUpstream]:
    """A router whose every Always request learns (`every` 1; the default samples, tested last)."""
    state = RouterState(balancer=Balancer(rng=random.Random(1)), metrics=RouterMetrics())
    state.set_static({"prefill": [P], "decode": [D]})
    upstream = ScriptedUpstream(clock)
    flow = Flow(
        state,
        cast(Upstream, upstream),
        timeouts=Timeouts(),
        max_retries=2,
        budget=RetryBudget(),
        clock=clock,
        always_learns_every=every,
    )
    return flow, upstream


def request(prompt: str, index: int) -> ClientRequest:
    tokens = len(prompt.split())
    facts = RequestFacts(endpoint="completions", model="m", stream=False, prompt_tokens=tokens, max_tokens=4)
    body = {"model": "m", "prompt": prompt, "max_tokens": 4}
    return ClientRequest("completions", body, json.dumps(body).encode(), facts, f"r{index}", 0.0)


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(count))


@pytest.mark.parametrize("sizes", [(10, 50, 200), (100, 100, 400, 800), (5, 1000, 20, 300, 64)])
async def test_always_fits_the_prefill_line_auto_reads(sizes: tuple[int, ...]) -> None:
    clock = Clock()
    flow, _ = make(clock)
    disagg = flow.state.disaggregation
    assert disagg.knobs.mode == "Always"
    for index, size in enumerate(sizes):
        client = FakeClient()
        await flow.serve(request(words(f"p{index}w", size), index), cast(Any, client))
        assert client.answers == [200]
    always = {"prefill": "remote", "reason": "always"}
    assert flow.state.metrics.registry.get_sample_value("tandem_router_disaggregation_total", always) == len(
        sizes
    )
    # Sequential requests: nothing queued, the prefill pod lacks every token (no prefix policy).
    line = disagg.costs.prefill.line()
    assert line is not None
    assert line[0] == pytest.approx(INTERCEPT_S, abs=1e-9)
    assert line[1] == pytest.approx(PER_TOKEN_S, abs=1e-12)
    assert disagg.costs.prefill.weight(clock.now) >= 2.5


async def test_always_records_the_decode_pods_prompt_and_reply_for_a_next_turn() -> None:
    clock = Clock()
    flow, upstream = make(clock)
    disagg, prefix = flow.state.disaggregation, flow.state.prefix.knobs
    first = words("turn", 600)
    await flow.serve(request(first, 0), cast(Any, FakeClient()))
    assert upstream.decoded == [D + "/v1/completions"]
    following = first + upstream.reply + " " + words("next", 10)
    data = following.encode()
    held = disagg.index.held_chunks(D, data, text_keys(following, prefix), prefix)
    # The decode pod holds the first turn and its reply: all but the new message's chunk or two.
    assert held * prefix.block_chars >= len(first) - prefix.block_chars
    assert D in disagg.pods  # its TPOT and output length are followed too


async def test_after_always_traffic_auto_decides_from_its_first_request() -> None:
    """Always measured the prefill leg; with the pull measured too (streamed legs do it), Auto's first
    decision is an estimate, not `unmeasured`."""
    clock = Clock()
    flow, _ = make(clock)
    disagg = flow.state.disaggregation
    for index, size in enumerate((100, 300, 500, 700)):
        await flow.serve(request(words(f"w{index}x", size), index), cast(Any, FakeClient()))
    for tokens in (100, 300, 500, 700):  # what streamed Always decode legs feed (see the integration test)
        disagg.costs.pull.observe(tokens, 0.005 + 0.0002 * tokens, clock.now)
    auto = DisaggregationKnobs(mode="Auto")
    choice = decide(auto, Request(40, 40), PrefillView(True), DecodeView(), disagg.costs, clock.now)
    assert choice.reason == "local_faster", choice
    assert choice.local_s is not None
    assert choice.remote_s is not None
    cold = decide(auto, Request(40, 40), PrefillView(True), DecodeView(), CostModel(), clock.now)
    assert cold.reason == "unmeasured"


async def test_by_default_always_learns_from_one_request_in_eight() -> None:
    """Learning costs the router about 150 us a request: Always learns from the first request and then
    every ALWAYS_LEARNS_EVERY-th (8), enough for the cost lines (a few points a minute)."""
    clock = Clock()
    flow, upstream = make(clock, every=ALWAYS_LEARNS_EVERY)
    disagg, prefix = flow.state.disaggregation, flow.state.prefix.knobs
    prompts = [words(f"s{index}w", 300) for index in range(2 * ALWAYS_LEARNS_EVERY + 1)]
    for index, prompt in enumerate(prompts):
        await flow.serve(request(prompt, index), cast(Any, FakeClient()))
    learnt = [
        index
        for index, prompt in enumerate(prompts)
        if disagg.index.held_chunks(D, (prompt + upstream.reply).encode(), text_keys(prompt, prefix), prefix)
    ]
    assert learnt == [0, ALWAYS_LEARNS_EVERY, 2 * ALWAYS_LEARNS_EVERY]
    assert 2.5 < disagg.costs.prefill.weight(clock.now) <= 3.0  # three legs (less their age), not 17
