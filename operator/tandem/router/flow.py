"""One client request through the router: path choice, the prefill and decode legs, retries, metrics.

The decisions are the pure rules of `failure` and `paths`; this module moves bytes and time. The
client side is behind `Responder`, so the flow knows whether a byte has reached the client (the
line between "re-prefill elsewhere" and "end the stream with an error") without knowing the HTTP
server. A streamed answer is passed on by `relay.StreamRelay` inside the socket callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from tandem.router.disaggregation import ReplyTap, with_reply
from tandem.router.discovery import pool_key
from tandem.router.errors import ClientGone, error_body
from tandem.router.failure import (
    Action,
    LegFailure,
    RetryBudget,
    blames_pod,
    client_status,
    on_decode_failure,
    on_prefill_failure,
)
from tandem.router.gateway import rate_limited_body
from tandem.router.metrics import GapCounts, PathMetrics
from tandem.router.protocol import (
    ENDPOINT_PATHS,
    Endpoint,
    RequestFacts,
    decode_body,
    dump_body,
    kv_transfer_params_of,
    prefill_body,
)
from tandem.router.relay import StreamClient, StreamRelay
from tandem.router.slo import within_slo
from tandem.router.sse import error_event
from tandem.router.state import RouterState
from tandem.router.upstream import Answer, LegError, StreamingAnswer, Upstream
from tandem.routing.admission import Refusal, retry_after
from tandem.routing.disaggregation import (
    Choice,
    DecodeView,
    DisaggregationKnobs,
    PrefillView,
    Side,
    decide,
    held_chunks,
    uncached_tokens,
)
from tandem.routing.disaggregation import Request as PrefillRequest
from tandem.routing.paths import Path, Unavailable, choose_path, draw_for, wanted_path
from tandem.routing.prefix import PodLoad, choose_prefill, prompt_text, text_keys

log = logging.getLogger(__name__)


__all__ = ["ClientGone", "ClientRequest", "Flow", "Responder", "Timeouts"]

_BODY_END_WAIT_S = 2.0  # after [DONE], how long to wait for the engine's end of body (keep-alive)


class Responder(StreamClient, Protocol):
    """The client's side of the exchange, as the flow sees it (`front.ClientStream`).

    `started`: has the answer begun? Once it has, a failure can only end the stream.
    """

    async def answer(self, status: int, body: bytes, content_type: str) -> None: ...

    async def finish(self, data: bytes) -> None: ...  # the last bytes and the end; raises ClientGone

    def set_header(self, name: str, value: str) -> None: ...  # sent with the answer (Retry-After)


@dataclass(frozen=True, slots=True)
class Timeouts:
    prefill_s: float = 60.0  # the whole prefill leg
    decode_idle_s: float = 60.0  # any wait for bytes on a decode or colocated leg, the first too
    decode_total_s: float = 1800.0  # a whole decode or colocated leg


@dataclass
class ClientRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    raw: bytes
    facts: RequestFacts
    request_id: str
    arrived: float
    forward_headers: Mapping[str, str] = field(default_factory=dict)
    # Who sent it, as a metrics label of bounded cardinality: a configured tenant's name,
    # `default` (no key and no tenant header), or `other` (a tenant the router was not told of).
    tenant: str = "default"


@dataclass
class _Failed:
    failure: LegFailure
    detail: str
    answer: Answer | None = None  # the engine's own answer, when it gave one


@dataclass
class _Tally:
    """What one request produced, for metrics."""

    arrived: float
    status: int = 200
    prompt_tokens: int | None = None
    output_tokens: int = 0
    usage_tokens: int | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    revision: str | None = None  # the serving revision of the P/D pair that served it
    leg_started: float | None = None  # when the streamed decode (or colocated) leg was sent
    concurrency: int = 1  # requests in flight on its path when it arrived, itself included
    gaps: GapCounts | None = None  # its inter-token gaps by bucket, from its second read with tokens
    side: Side | None = None  # P/D: where the prompt was prefilled (remote, local)
    decode_pod: str | None = None  # P/D: the decode pod of the last attempt
    on_first: Callable[[], None] | None = None  # called once, at the first token
    # Called once the client has a streamed leg's whole answer, before the router reads the engine's
    # end of body: what a next turn needs is recorded before the client can send it.
    on_answered: Callable[[], None] | None = None
    knobs: DisaggregationKnobs | None = None  # P/D: the disaggregation mode that chooses for it


_ALWAYS: Final = Choice("remote", "always")
_NOTHING_KNOWN: Final = PrefillRequest(0, 0)
# In Always, one request in this many teaches what Auto reads (the cost lines, the decode index, the
# decode pods' TPOT): enough for a switch to Auto to decide from its first request (a cost line wants
# a few points a minute), at an eighth of the learning's CPU (about 150 us a request, measured by
# bench/router_overhead.py: learning from every request cost 28% of the router's requests per
# CPU-second).
ALWAYS_LEARNS_EVERY: Final = 8


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the remote-or-local choice reads (and every mode learns from) of a request, computed once."""

    text: str  # prefix.prompt_text
    data: bytes  # the text in UTF-8, what the chunks cut
    keys: list[int]  # its sampled chunk keys


class _TokenTimes:
    """Counts a stream's tokens into its tally and the TTFT / inter-token histograms (per read)."""

    __slots__ = ("leg_first_token", "metrics", "tally")

    def __init__(self, tally: _Tally, metrics: PathMetrics, leg_first_token: Any) -> None:
        self.tally = tally
        self.metrics = metrics
        self.leg_first_token = leg_first_token  # tandem_router_decode_leg_first_token_seconds{path}

    def on_tokens(self, count: int, now: float) -> None:
        # Inter-token latency is the gap between reads that carried tokens: a paced engine sends
        # one token per step, and tokens that arrive together reach the client together.
        tally = self.tally
        if tally.first_token_at is None:
            tally.first_token_at = now
            self.metrics.ttft.observe(now - tally.arrived)
            if tally.on_first is not None:
                tally.on_first()
            if tally.leg_started is not None:
                self.leg_first_token.observe(now - tally.leg_started)
        elif tally.last_token_at is not None:
            gap = now - tally.last_token_at
            self.metrics.itl.observe(gap)
            if tally.gaps is None:
                tally.gaps = GapCounts()
            tally.gaps.add(gap)
        tally.last_token_at = now
        tally.output_tokens += count

    def on_usage(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        if prompt_tokens is not None:
            self.tally.prompt_tokens = prompt_tokens
        if completion_tokens is not None:
            self.tally.usage_tokens = completion_tokens


def _asks_usage(body: Mapping[str, Any]) -> bool:
    """Whether a streamed request asks for the final usage chunk (`stream_options.include_usage`)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _with_usage(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body asking the engine for the usage chunk: the engine's token counts label the metrics."""
    options = body.get("stream_options")
    asked = options if isinstance(options, dict) else {}
    return {**body, "stream_options": {**asked, "include_usage": True}}


def _usage_of(body: bytes) -> tuple[int | None, int | None]:
    try:
        usage = json.loads(body).get("usage") or {}
    except (ValueError, AttributeError):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )


class Flow:
    def __init__(
        self,
        state: RouterState,
        upstream: Upstream,
        *,
        timeouts: Timeouts,
        max_retries: int,
        budget: RetryBudget,
        clock: Callable[[], float] = time.monotonic,
        always_learns_every: int = ALWAYS_LEARNS_EVERY,
    ) -> None:
        self.state = state
        self.always_learns_every = max(1, always_learns_every)
        self.upstream = upstream
        self.timeouts = timeouts
        self.max_retries = max_retries
        self.budget = budget
        self.clock = clock
        self.metrics = state.metrics
        self._releases: set[asyncio.Task[None]] = set()  # KV releases in flight (kept from the GC)
        self._always_seen = 0  # Always requests since start: every ALWAYS_LEARNS_EVERY-th learns

    async def serve(self, request: ClientRequest, responder: Responder) -> None:
        state = self.state
        has_prefill, has_decode = bool(state.endpoints["prefill"]), bool(state.endpoints["decode"])
        knobs = state.disaggregation.knobs_for(request.request_id, self._first(request))
        local = knobs.mode != "Always"  # a decode pod may prefill: P/D needs decode pods only
        if state.revision_endpoints:  # a pair is a prefill and a decode pod of one revision
            paired = state.revision_for(request.request_id, self._first(request)) is not None
            has_prefill, has_decode = has_prefill and paired, has_decode and (paired or local)
        first_share = state.gateway.first_share(request.tenant)
        share = state.disaggregated_share() if first_share is None else first_share
        draw = draw_for(request.request_id)
        path = choose_path(
            share,
            draw,
            has_prefill=has_prefill or (local and has_decode),
            has_decode=has_decode,
            has_colocated=bool(state.endpoints["colocated"]),
            colocated_fallback=state.colocated_fallback,
        )
        if isinstance(path, Unavailable):
            # Refused for want of capacity: a request of the path it was meant for, never within SLO.
            self.metrics.child(self.metrics.rejected, "no_ready_pods").inc()
            self.metrics.child(self.metrics.requests, path.wanted, "5xx").inc()
            await responder.answer(503, error_body(503, path.message), "application/json")
            return
        wanted = wanted_path(share, draw)
        if path != wanted:
            self.metrics.child(self.metrics.stood_in, wanted).inc()
        self.budget.on_request(self.clock())
        path_metrics = self.metrics.by_path[path]
        path_metrics.active += 1
        tally = _Tally(arrived=request.arrived, concurrency=path_metrics.active, knobs=knobs)
        try:
            if path == "disaggregated":
                await self._disaggregated(request, responder, tally, path_metrics)
            else:
                await self._colocated(request, responder, tally, path_metrics)
        except ClientGone:
            tally.status = 499
        except asyncio.CancelledError:
            tally.status = 499  # the client went away while we waited on an engine
            raise
        except Exception:
            tally.status = 500
            raise
        finally:
            path_metrics.active -= 1
            self._record(request, path, tally, path_metrics)

    def _count_revision_stood_in(self, request: ClientRequest, revision: str | None) -> None:
        """A request whose revision's pair serves it in place of the one its draw meant (not ready)."""
        meant = self.state.revision_meant(request.request_id, self._first(request))
        if revision is not None and meant is not None and revision != meant:
            self.metrics.child(self.metrics.revision_stood_in, meant or "legacy").inc()

    def _record(self, request: ClientRequest, path: Path, tally: _Tally, metrics: PathMetrics) -> None:
        now = self.clock()
        code = f"{tally.status // 100}xx"
        self.metrics.child(self.metrics.requests, path, code).inc()
        revision = None if tally.revision is None else (tally.revision or "legacy")
        if revision is not None:
            self.metrics.child(self.metrics.revision_requests, revision, code).inc()
        mode = tally.knobs.mode if tally.side is not None and tally.knobs is not None else None
        if mode is not None and tally.side is not None:
            self.state.disaggregation.finished(mode, tally.side, code)
        if tally.status != 200:
            self.metrics.observe_request(path, tenant=request.tenant, model=request.facts.model, code=code)
            return
        metrics.e2e.observe(now - request.arrived)
        prompt = tally.prompt_tokens or request.facts.prompt_tokens
        metrics.prompt_tokens.inc(prompt)
        output = tally.usage_tokens if tally.usage_tokens is not None else tally.output_tokens
        metrics.generation_tokens.inc(output)
        first, last = tally.first_token_at, tally.last_token_at
        tpot = None
        if first is not None and last is not None and output > 1 and last > first:
            tpot = (last - first) / (output - 1)
            metrics.tpot.observe(tpot)
        ttft = (first if first is not None else now) - request.arrived
        if revision is not None:  # per revision of the pair, for a revision rollout's analysis
            self.metrics.child(self.metrics.revision_ttft, revision).observe(ttft)
            if tpot is not None:
                self.metrics.child(self.metrics.revision_tpot, revision).observe(tpot)
        self.metrics.observe_request(
            path,
            tenant=request.tenant,
            model=request.facts.model,
            code=code,
            # A non-streamed answer reaches the client whole: its TTFT is its end-to-end latency.
            ttft_s=ttft,
            tpot_s=tpot,
            prompt_tokens=prompt,
            output_tokens=output,
            concurrency=tally.concurrency,
            gaps=tally.gaps,
        )
        slo, within = self.state.slo, metrics.within_slo
        met = (
            slo is not None
            and within is not None
            and within_slo(
                slo,
                status=tally.status,
                arrived=request.arrived,
                first_token_at=first,
                last_token_at=last,
                output_tokens=output,
                ended=now,
            )
        )
        if met and within is not None:
            within.inc()
            if revision is not None:
                self.metrics.child(self.metrics.revision_within_slo, revision).inc()
        if mode is not None and tally.side is not None:
            self.state.disaggregation.succeeded(mode, tally.side, tally.decode_pod, ttft, tpot, output, met)

    def _may_retry(self, attempt: int) -> bool:
        return attempt < self.max_retries and self.budget.try_spend(self.clock())

    def _pick(
        self, role: str, exclude: set[str], revision: str | None = None, keys: list[int] | None = None
    ) -> str | None:
        """A pod of `role` (of `revision`'s pair when given); by prefix then load when `keys` are given
        (the prompt's sampled chunk keys, `_prefix_keys`), else by load."""
        now = self.clock()
        pool = role if revision is None else pool_key(role, revision)
        if keys:
            pod = self._pick_by_prefix(pool, now, exclude, keys)
            if pod is not None:
                return pod
        elif role != "decode" and self.state.prefix.prefill_policy == "RoundRobin":
            pod = self.state.balancer.pick_in_turn(pool, now, exclude)
            if pod is not None:
                return pod
        pod = self.state.balancer.pick(pool, now, exclude)
        # Every pod already tried: trying one again beats failing the request.
        return pod if pod is not None else self.state.balancer.pick(pool, now)

    def _prefix_keys(self, request: ClientRequest) -> list[int] | None:
        """The prompt's sampled chunk keys (`text_keys`) when the choice is prefix-aware, else None."""
        settings = self.state.prefix
        if settings.prefill_policy != "PrefixAware":
            return None
        return text_keys(prompt_text(request.body), settings.knobs)

    def _candidates(self, pool: str, now: float, exclude: set[str]) -> list[PodLoad]:
        """The pool's healthy pods not in `exclude`, with their load."""
        balancer = self.state.balancer
        out: list[PodLoad] = []
        for pod in balancer.pool(pool):
            load = balancer.load(pod)
            if pod not in exclude and load.quarantined_until <= now:
                out.append(PodLoad(pod, load.requests, load.tokens))
        return out

    def _pick_by_prefix(self, pool: str, now: float, exclude: set[str], keys: list[int]) -> str | None:
        """`prefix.choose_prefill` over the pool's healthy untried pods; the choice is recorded in
        the index (the pod will hold these chunks). None: no such pod (the caller falls back)."""
        state = self.state
        candidates = self._candidates(pool, now, exclude)
        chosen = choose_prefill(candidates, keys, state.prefix_index, state.prefix.knobs)
        if chosen is not None:
            state.prefix_index.record(chosen, keys)
        return chosen

    def _first(self, request: ClientRequest) -> bool:
        """A tenant of spec.rollout.tenants: first on a revision rollout's new revision and on a
        disaggregation rollout's target mode."""
        return self.state.gateway.goes_first(request.tenant)

    def _pick_decode(self, tried: set[str], revision: str | None) -> str | None:
        """A decode pod; with backpressure on, one with KV room while any has (an untried one first)."""
        pool = "decode" if revision is None else pool_key("decode", revision)
        balancer = self.state.balancer
        pods = balancer.pool(pool)
        room = self.state.gateway.decode_with_room(pods)
        if room is None or not room or len(room) == len(pods):
            return self._pick("decode", tried, revision)
        full = set(pods) - set(room)
        now = self.clock()
        pod = balancer.pick(pool, now, tried | full)
        return pod if pod is not None else balancer.pick(pool, now, full)

    async def _decode_room(
        self, request: ClientRequest, responder: Responder, tally: _Tally, revision: str | None
    ) -> bool:
        """Decode backpressure before prefill: waits up to the queue time for a decode pod with KV
        room; False when it refused the request (429) because every decode pod stayed full."""
        gateway = self.state.gateway
        if gateway.kv_full_at is None:
            return True
        pool = "decode" if revision is None else pool_key("decode", revision)
        deadline = self.clock() + gateway.kv_queue_s
        while True:
            pods = self.state.balancer.pool(pool)
            room = gateway.decode_with_room(pods)
            if not pods or room is None or room:
                return True  # no decode pod at all is the pick's 503, not backpressure
            left = deadline - self.clock()
            if left <= 0:
                break
            await asyncio.sleep(min(0.2, left))
        gateway.refuse("decode_kv_full", request.tenant)
        tally.status = 429
        wait = retry_after(gateway.kv_scrape_interval_s)
        refusal = Refusal("decode_kv_full", wait, "every decode pod is near its KV-cache capacity")
        responder.set_header("Retry-After", str(wait))
        await responder.answer(429, rate_limited_body(refusal), "application/json")
        return False

    def _leg_failed(self, role: str, pod: str, failed: _Failed) -> None:
        self.metrics.child(self.metrics.failures, role, failed.failure.value).inc()
        if blames_pod(failed.failure):
            self.state.balancer.mark_failed(pod, self.clock())
        log.warning("%s leg on %s failed: %s", role, pod, failed.detail)

    def _headers(self, request: ClientRequest, request_id: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        headers.update(request.forward_headers)
        return headers

    async def _give_up(self, responder: Responder, tally: _Tally, failed: _Failed, action: Action) -> None:
        if action is Action.PASS_THROUGH and failed.answer is not None:
            tally.status = failed.answer.status
            await responder.answer(failed.answer.status, failed.answer.body, failed.answer.content_type)
        elif responder.started:
            tally.status = 502
            await responder.finish(error_event(f"engine failed mid-answer: {failed.detail}"))
        else:
            status = client_status(failed.failure)
            tally.status = status
            await responder.answer(status, error_body(status, failed.detail), "application/json")

    async def _disaggregated(
        self, request: ClientRequest, responder: Responder, tally: _Tally, metrics: PathMetrics
    ) -> None:
        held: list[tuple[str, str]] = []  # (prefill pod, remote_request_id): KV no decode leg took
        try:
            await self._pd_legs(request, responder, tally, metrics, held)
        except BaseException:  # the client left (cancelled, ClientGone) or the router failed
            if held and not responder.started:  # no decode leg got as far as reading the KV
                self._release_kv(request, held)
            raise

    def _release_kv(self, request: ClientRequest, held: list[tuple[str, str]]) -> None:
        """Asks prefill pods to free KV that no decode leg will read (an abandoned or failed
        attempt) instead of holding it for the lease; best effort, in the background. Freeing KV
        a decode pod already read or released is a no-op."""
        for pod, remote_request_id in held:
            self._spawn_release(request, pod, remote_request_id)
        held.clear()

    def _spawn_release(self, request: ClientRequest, pod: str, request_id: str) -> None:
        """Sends one release in the background. `request_id` is P's `remote_request_id`, or the
        `X-Request-Id` an attempt's prefill leg was sent with when its answer (the handle) never
        reached the router: the sim engine frees that attempt's KV at once, or as its prefill
        finishes."""
        task = asyncio.get_running_loop().create_task(
            self._send_release(pod, request_id, self._headers(request, request_id))
        )
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _send_release(self, pod: str, remote_request_id: str, headers: dict[str, str]) -> None:
        body = json.dumps({"request_ids": [remote_request_id]}).encode()
        try:
            answer = await self.upstream.post(pod + "/abort_requests", body, headers, timeout_s=2.0)
        except Exception as error:  # the lease frees it anyway
            log.debug("KV release on %s failed: %s", pod, error)
            return
        if answer.status != 200:
            log.debug("KV release on %s answered %d", pod, answer.status)

    async def _pd_legs(
        self,
        request: ClientRequest,
        responder: Responder,
        tally: _Tally,
        metrics: PathMetrics,
        held: list[tuple[str, str]],
    ) -> None:
        tried_prefill: set[str] = set()
        tried_decode: set[str] = set()
        prefill_bytes = dump_body(prefill_body(request.body))
        keys = self._prefix_keys(request)
        knobs = tally.knobs or self.state.disaggregation.knobs
        # Every mode learns (the cost lines, the decode index, the decode pods' TPOT): a switch to
        # Auto then decides from its first request. Only Auto and Threshold choose from it; Always
        # learns from a sample of its requests (ALWAYS_LEARNS_EVERY).
        choosing = knobs.mode != "Always"
        plan = self._plan(request, keys) if choosing or self._always_learns() else None
        attempt = 0
        while True:
            request_id = request.request_id if attempt == 0 else f"{request.request_id}-{attempt}"
            # Both legs from one serving revision (chosen again per attempt: a pair may have gone).
            revision = self.state.revision_for(request.request_id, self._first(request))
            tally.revision = revision
            if attempt == 0:
                self._count_revision_stood_in(request, revision)
            if attempt == 0 and not await self._decode_room(request, responder, tally, revision):
                return
            decode_pod, choice = None, _ALWAYS
            uncached = _NOTHING_KNOWN
            if choosing and plan is not None:  # Auto, Threshold: the decode pod first, then where to prefill
                decode_pod, choice, uncached = self._decide(
                    request, knobs, plan, tried_decode, revision, keys
                )
            elif plan is not None:  # Always, learning: what the prefill pod lacks, as Auto would have it
                uncached = PrefillRequest(self._remote_view(request, plan, revision, keys)[0], 0)
            self.state.disaggregation.count(choice)
            tally.side = choice.side
            outcome: dict[str, Any] | None = None  # P's kv_transfer_params; None: D prefills itself
            if choice.side == "remote":
                prefill_pod = self._pick("prefill", tried_prefill, revision, keys)
                if prefill_pod is None:
                    self.metrics.child(self.metrics.rejected, "no_ready_pods").inc()
                    tally.status = 503
                    await responder.answer(503, error_body(503, "no ready prefill pod"), "application/json")
                    return
                tried_prefill.add(prefill_pod)
                queued, started = self.state.balancer.load(prefill_pod).tokens, self.clock()
                prefilled = await self._prefill(request, prefill_pod, prefill_bytes, request_id, tally)
                if isinstance(prefilled, _Failed):
                    self._leg_failed("prefill", prefill_pod, prefilled)
                    may_retry = self._may_retry(attempt)
                    action = on_prefill_failure(prefilled.failure, may_retry)
                    if action is Action.RETRY_PREFILL:
                        self.metrics.child(self.metrics.retries, "prefill", prefilled.failure.value).inc()
                        attempt += 1
                        continue
                    await self._give_up(responder, tally, prefilled, action)
                    return
                if plan is not None:
                    now = self.clock()
                    x = queued + uncached.uncached_remote
                    self.state.disaggregation.costs.prefill.observe(x, now - started, now)
                outcome = prefilled
                remote_request_id = outcome.get("remote_request_id") if outcome is not None else None
                if isinstance(remote_request_id, str):
                    held.append((prefill_pod, remote_request_id))
            if decode_pod is None:
                decode_pod = self._pick_decode(tried_decode, revision)
            if decode_pod is None:
                self._release_kv(request, held)
                self.metrics.child(self.metrics.rejected, "no_ready_pods").inc()
                tally.status = 503
                await responder.answer(503, error_body(503, "no ready decode pod"), "application/json")
                return
            tried_decode.add(decode_pod)
            tally.decode_pod = decode_pod
            leg_body = decode_body(request.body, outcome)
            body = dump_body(_with_usage(leg_body) if request.facts.stream else leg_body)
            if plan is None:  # Always, not learning from this one
                failed = await self._relay(
                    request, "decode", decode_pod, body, request_id, responder, tally, metrics
                )
            else:
                if not choosing:  # Always: the tokens the decode pod it went to lacks (what it pulls)
                    uncached = PrefillRequest(
                        uncached.uncached_remote, self._local_uncached(request, plan, decode_pod)
                    )
                failed = await self._decode_and_learn(
                    request,
                    plan,
                    choice.side,
                    uncached.uncached_local,
                    decode_pod,
                    body,
                    request_id,
                    responder,
                    tally,
                    metrics,
                )
            if failed is None:
                return
            self._leg_failed("decode", decode_pod, failed)
            # The pair's KV is dropped with the failed attempt: P is asked to free it now.
            if not responder.started:
                self._release_kv(request, held)
            action = on_decode_failure(failed.failure, responder.started, self._may_retry(attempt))
            if action is Action.REPREFILL:
                self.metrics.child(self.metrics.retries, "decode", failed.failure.value).inc()
                attempt += 1
                continue
            await self._give_up(responder, tally, failed, action)
            return

    # -- remote or local prefill (spec.router.disaggregation Auto and Threshold) ----------------------

    def _always_learns(self) -> bool:
        """Whether this Always request is one of the sample that learns (the first, then every
        `always_learns_every`-th: deterministic, so tests can count on it)."""
        seen, self._always_seen = self._always_seen, self._always_seen + 1
        return seen % self.always_learns_every == 0

    def _plan(self, request: ClientRequest, keys: list[int] | None) -> _Plan:
        """The prompt's text and sampled keys (`keys`: those `_prefix_keys` computed, the same)."""
        text = prompt_text(request.body)
        return _Plan(
            text, text.encode(), keys if keys is not None else text_keys(text, self.state.prefix.knobs)
        )

    def _uncached(self, request: ClientRequest, plan: _Plan, held_chunks: int) -> int:
        block_chars = self.state.prefix.knobs.block_chars
        return uncached_tokens(request.facts.prompt_tokens, held_chunks, len(plan.data), block_chars)

    def _decide(
        self,
        request: ClientRequest,
        knobs: DisaggregationKnobs,
        plan: _Plan,
        tried_decode: set[str],
        revision: str | None,
        keys: list[int] | None,
    ) -> tuple[str | None, Choice, PrefillRequest]:
        """The decode pod (by prefix in the decode index, within the load bound), where to prefill
        (`routing.disaggregation.decide`), and the uncached tokens on each side."""
        state, now = self.state, self.clock()
        disagg = state.disaggregation
        decode_pool = "decode" if revision is None else pool_key("decode", revision)
        room = state.gateway.decode_with_room(state.balancer.pool(decode_pool))
        full = set() if room is None else set(state.balancer.pool(decode_pool)) - set(room)
        candidates = self._candidates(decode_pool, now, tried_decode | full)
        prefix = state.prefix.knobs
        decode_pod = choose_prefill(candidates, plan.keys, disagg.index.index, prefix)
        if decode_pod is None:
            decode_pod = self._pick_decode(tried_decode, revision)
        prefill_pool = "prefill" if revision is None else pool_key("prefill", revision)
        uncached_remote, queued = self._remote_view(request, plan, revision, keys)
        uncached = PrefillRequest(uncached_remote, self._local_uncached(request, plan, decode_pod))
        stats = disagg.stats(decode_pod) if decode_pod is not None else None
        view = DecodeView()
        if stats is not None and decode_pod is not None:
            streams = state.balancer.load(decode_pod).requests
            view = DecodeView(
                streams, stats.local_prefills, stats.local_tokens, stats.tpot_s, stats.output_tokens
            )
        choice = decide(
            knobs,
            uncached,
            PrefillView(bool(state.balancer.pool(prefill_pool)), queued),
            view,
            disagg.costs,
            now,
            state.slo.tpot_s if state.slo is not None else None,
        )
        return decode_pod, choice, uncached

    def _remote_view(
        self, request: ClientRequest, plan: _Plan, revision: str | None, keys: list[int] | None
    ) -> tuple[int, int]:
        """(the prompt tokens the prefill pod would compute, the tokens queued on it): the pod a
        prefix-aware choice would take (what it holds, its queue); by load, the lightest queue."""
        state = self.state
        prefill_pool = "prefill" if revision is None else pool_key("prefill", revision)
        prefills = self._candidates(prefill_pool, self.clock(), set())
        best = choose_prefill(prefills, keys, state.prefix_index, state.prefix.knobs) if keys else None
        queues = [p.outstanding_tokens for p in prefills if best is None or p.name == best]
        held = held_chunks(state.prefix_index.matched_keys(best, plan.keys)) if best else 0
        return self._uncached(request, plan, held), min(queues, default=0)

    def _local_uncached(self, request: ClientRequest, plan: _Plan, decode_pod: str | None) -> int:
        """The prompt tokens the decode pod lacks, by the decode index (all of them: no pod)."""
        if decode_pod is None:
            return request.facts.prompt_tokens
        index, prefix = self.state.disaggregation.index, self.state.prefix.knobs
        return self._uncached(request, plan, index.held_chunks(decode_pod, plan.data, plan.keys, prefix))

    async def _decode_and_learn(
        self,
        request: ClientRequest,
        plan: _Plan,
        side: Side,
        tokens: int,
        decode_pod: str,
        body: bytes,
        request_id: str,
        responder: Responder,
        tally: _Tally,
        metrics: PathMetrics,
    ) -> _Failed | None:
        """The decode leg of a remote or local prefill, measured: its time to first token feeds the
        cost model (the pull, or the local prefill), and on success the decode pod is recorded as
        holding the prompt and its reply. A local prefill counts against the pod's cap until its
        first token (or the leg's end)."""
        disagg = self.state.disaggregation
        stats = disagg.stats(decode_pod)
        queued = stats.local_tokens if side == "local" else 0
        done = side != "local"

        def prefilled() -> None:
            nonlocal done
            if not done:
                done = True
                stats.local_prefills = max(0, stats.local_prefills - 1)
                stats.local_tokens = max(0, stats.local_tokens - tokens)

        if not done:
            stats.local_prefills += 1
            stats.local_tokens += tokens
            tally.on_first = prefilled
        tap = ReplyTap(responder)
        learned = False

        def learn() -> None:
            """The leg's time to first token into the cost model and the decode pod's new holding
            into the index, once, as soon as the client has the whole answer (a next turn may follow
            at once: it must find this one)."""
            nonlocal learned
            if learned:
                return
            learned = True
            first, started, now = tally.first_token_at, tally.leg_started, self.clock()
            if first is not None and started is not None:
                fit = disagg.costs.local if side == "local" else disagg.costs.pull
                fit.observe(queued + tokens if side == "local" else tokens, first - started, now)
            text = with_reply(plan.text, tap.reply(request.facts.stream), request.endpoint)
            knobs = self.state.prefix.knobs
            disagg.index.record(decode_pod, text.encode(), text_keys(text, knobs), knobs)

        tally.on_answered = learn
        try:
            failed = await self._relay(request, "decode", decode_pod, body, request_id, tap, tally, metrics)
        finally:
            tally.on_first = None
            tally.on_answered = None
            prefilled()
        if failed is not None:
            return failed
        learn()
        return None

    async def _colocated(
        self, request: ClientRequest, responder: Responder, tally: _Tally, metrics: PathMetrics
    ) -> None:
        tried: set[str] = set()
        attempt = 0
        # A stream asks the engine for its usage chunk (its token counts label the metrics); the
        # chunk is passed on only when the client asked for it too.
        raw = request.raw
        if request.facts.stream and not _asks_usage(request.body):
            raw = dump_body(_with_usage(request.body))
        keys = self._prefix_keys(request)
        while True:
            pod = self._pick("colocated", tried, None, keys)
            if pod is None:
                tally.status = 503
                self.metrics.child(self.metrics.rejected, "no_ready_pods").inc()
                await responder.answer(503, error_body(503, "no ready colocated pod"), "application/json")
                return
            tried.add(pod)
            request_id = request.request_id if attempt == 0 else f"{request.request_id}-{attempt}"
            failed = await self._relay(request, "colocated", pod, raw, request_id, responder, tally, metrics)
            if failed is None:
                return
            self._leg_failed("colocated", pod, failed)
            action = on_decode_failure(failed.failure, responder.started, self._may_retry(attempt))
            if action is Action.REPREFILL:
                self.metrics.child(self.metrics.retries, "colocated", failed.failure.value).inc()
                attempt += 1
                continue
            await self._give_up(responder, tally, failed, action)
            return

    async def _prefill(
        self, request: ClientRequest, pod: str, body: bytes, request_id: str, tally: _Tally
    ) -> dict[str, Any] | _Failed | None:
        """P's `kv_transfer_params` (None when P returned none), or why the leg failed."""
        balancer, started = self.state.balancer, self.clock()
        tokens = request.facts.prompt_tokens
        balancer.acquire(pod, tokens)
        self._count_leg("prefill", pod)
        in_flight = self.metrics.child(self.metrics.upstream_in_flight, "prefill")
        in_flight.inc()
        outcome: dict[str, Any] | _Failed | None
        try:
            url = pod + ENDPOINT_PATHS[request.endpoint]
            answer = await self.upstream.post(
                url, body, self._headers(request, request_id), timeout_s=self.timeouts.prefill_s
            )
            if answer.status >= 400:
                failure = LegFailure.CLIENT_ERROR if answer.status < 500 else LegFailure.SERVER_ERROR
                outcome = _Failed(failure, f"prefill answered {answer.status}", answer)
            else:
                try:
                    parsed = json.loads(answer.body)
                except ValueError:
                    outcome = _Failed(LegFailure.BAD_ANSWER, "prefill answer is not JSON")
                else:
                    outcome = kv_transfer_params_of(parsed)
                    prompt = (parsed.get("usage") or {}).get("prompt_tokens")
                    if isinstance(prompt, int):
                        tally.prompt_tokens = prompt
                    balancer.mark_ok(pod)
        except LegError as error:
            outcome = _Failed(error.failure, error.detail)
        except BaseException:
            # The client left (or the router failed) with the leg in flight: P may finish, or may
            # have finished with its answer not yet read, so the KV handle would never reach us.
            # P is asked to free what this attempt holds by the request id it was sent with.
            self._spawn_release(request, pod, request_id)
            raise
        finally:
            balancer.release(pod, tokens)
            in_flight.dec()
        label = outcome.failure.value if isinstance(outcome, _Failed) else "ok"
        self.metrics.child(self.metrics.prefill_leg, label).observe(self.clock() - started)
        return outcome

    def _count_leg(self, role: str, pod: str) -> None:
        self.metrics.child(self.metrics.endpoint_legs, role, *self.state.endpoint_labels(pod)).inc()

    async def _relay(
        self,
        request: ClientRequest,
        role: str,
        pod: str,
        body: bytes,
        request_id: str,
        responder: Responder,
        tally: _Tally,
        metrics: PathMetrics,
    ) -> _Failed | None:
        """Runs a decode (or colocated) leg, passing its answer to the client; None on success."""
        balancer, started = self.state.balancer, self.clock()
        tally.leg_started = started
        tokens = request.facts.expected_tokens
        balancer.acquire(pod, tokens)
        self._count_leg(role, pod)
        in_flight = self.metrics.child(self.metrics.upstream_in_flight, role)
        in_flight.inc()
        outcome: _Failed | None = None
        try:
            outcome = await self._relay_answer(request, pod, body, request_id, responder, tally, metrics)
        except LegError as error:
            outcome = _Failed(error.failure, error.detail)
        finally:
            balancer.release(pod, tokens)
            in_flight.dec()
            path = "colocated" if role == "colocated" else "disaggregated"
            label = outcome.failure.value if outcome is not None else "ok"
            self.metrics.child(self.metrics.decode_leg, path, label).observe(self.clock() - started)
        if outcome is None:
            balancer.mark_ok(pod)
        return outcome

    async def _relay_answer(
        self,
        request: ClientRequest,
        pod: str,
        body: bytes,
        request_id: str,
        responder: Responder,
        tally: _Tally,
        metrics: PathMetrics,
    ) -> _Failed | None:
        url = pod + ENDPOINT_PATHS[request.endpoint]
        headers = self._headers(request, request_id)
        timeouts = self.timeouts
        async with self.upstream.stream(
            url, body, headers, idle_timeout_s=timeouts.decode_idle_s, total_timeout_s=timeouts.decode_total_s
        ) as answer:
            if answer.status != 200:
                data = await answer.read_all()
                failure = LegFailure.CLIENT_ERROR if 400 <= answer.status < 500 else LegFailure.SERVER_ERROR
                return _Failed(
                    failure,
                    f"engine answered {answer.status}",
                    Answer(answer.status, data, answer.content_type),
                )
            if not request.facts.stream:
                data = await answer.read_all()
                prompt, completion = _usage_of(data)
                if prompt is not None:
                    tally.prompt_tokens = prompt
                tally.usage_tokens = completion
                await responder.answer(200, data, answer.content_type)
                return None
            return await self._relay_stream(request, answer, responder, tally, metrics)

    async def _relay_stream(
        self,
        request: ClientRequest,
        answer: StreamingAnswer,
        responder: Responder,
        tally: _Tally,
        metrics: PathMetrics,
    ) -> _Failed | None:
        relay = StreamRelay(
            responder,
            answer,
            answer.content_type,
            _TokenTimes(tally, metrics, metrics.leg_first_token),
            idle_timeout_s=self.timeouts.decode_idle_s,
            deadline=answer.deadline,
            clock=self.clock,
            strip_usage=not _asks_usage(request.body),
        )
        try:
            answer.attach(relay)
            result = await relay.outcome
            if result is None and tally.on_answered is not None:
                tally.on_answered()
            if result is None and not relay.ended.done():
                # The client has its whole answer; reading the engine's end of body keeps the
                # connection reusable (otherwise leaving the stream closes it, which costs little).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(relay.ended), _BODY_END_WAIT_S)
        finally:
            relay.close()
        if result is None:
            return None
        if result.failure is None:
            raise ClientGone()
        return _Failed(result.failure, result.detail)
