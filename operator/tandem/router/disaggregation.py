"""The router's side of the per-request prefill choice (`tandem.routing.disaggregation`).

`Disaggregation` holds what the pure decision reads and this router learns: the knobs in force
(spec.router.disaggregation, else the flags), the cost model fitted to this router's own legs, the
decode pods' prefix index (which decode pod holds which prompt *and reply*: a conversation's next
turn resends both) and each decode pod's recent TPOT, output length and local prefills in flight;
and the metrics that count the choices and split TTFT and TPOT by side.

The decode index learns from answers: after a successful decode leg the pod holds the prompt (computed
there, or pulled) and the reply it generated, so the keys of `prompt text + reply` are recorded for
it. `ReplyTap` keeps the bytes the client was sent and `reply_text` reads the generated text back out of
them, once per request. All of this learning runs in every mode, Always included (only Auto and
Threshold choose from it): a switch to Auto, a rollout's first step, then decides from its first
request with lines and an index the Always traffic measured, instead of sending its first requests
remote as `unmeasured` and its conversations' next turns to a decode index that knows nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Final

from prometheus_client import Counter, Histogram

from tandem.router.metrics import RouterMetrics
from tandem.router.protocol import Endpoint
from tandem.routing.buckets import TPOT_BUCKETS, TTFT_BUCKETS
from tandem.routing.disaggregation import (
    REASONS,
    SIDES,
    Choice,
    CostModel,
    DecodeIndex,
    DecodePodStats,
    DisaggregationKnobs,
    Mode,
    Side,
)
from tandem.routing.paths import draw_for
from tandem.routing.prefix import DEFAULT_INDEX_BLOCKS_PER_POD

log = logging.getLogger(__name__)

MAX_REPLY_BYTES: Final = 1024 * 1024  # what ReplyTap keeps of one answer at most (~170 KB of text)


class Disaggregation:
    def __init__(self, metrics: RouterMetrics, default: DisaggregationKnobs) -> None:
        registry = metrics.registry
        self._child = metrics.child  # bound children, memoised
        self.default = default  # the flags' (static mode) or Always
        self.knobs = default  # the mode in effect (status.disaggregation.mode) and its knobs
        self.target: DisaggregationKnobs | None = None  # a rollout's new mode and its knobs
        self.weight = 0  # percent of P/D requests on the target
        self.tenants_first = False  # spec.rollout.tenants on the target at any weight
        self.costs = CostModel()
        self.index = DecodeIndex(DEFAULT_INDEX_BLOCKS_PER_POD)
        self.pods: dict[str, DecodePodStats] = {}
        self.choices = Counter(
            "tandem_router_disaggregation_total",
            "P/D attempts by where their prompt was prefilled (prefill: remote on a prefill pod, local"
            " on the decode pod) and why (spec.router.disaggregation); a retried attempt counts again.",
            ["prefill", "reason"], registry=registry,
        )  # fmt: skip
        self.requests = Counter(
            "tandem_router_disaggregation_requests_total",
            "P/D requests finished, by the disaggregation mode that chose (mode: a rollout's arm), where"
            " the last attempt prefilled, and HTTP status class.",
            ["mode", "prefill", "code"], registry=registry,
        )  # fmt: skip
        self.within_slo = Counter(
            "tandem_router_disaggregation_requests_within_slo_total",
            "P/D requests that succeeded within both SLO targets, by mode and prefill side.",
            ["mode", "prefill"], registry=registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "tandem_router_disaggregation_ttft_seconds",
            "Client-visible TTFT of successful P/D requests by mode and prefill side.",
            ["mode", "prefill"], buckets=TTFT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.tpot = Histogram(
            "tandem_router_disaggregation_tpot_seconds",
            "TPOT of successful P/D requests (2+ output tokens) by mode and prefill side.",
            ["mode", "prefill"], buckets=TPOT_BUCKETS, registry=registry,
        )  # fmt: skip
        # Every series from 0: a series born at 1 hides its first request from rate().
        self._choices = {(side, reason): self.choices.labels(side, reason) for side, reason in REASONS}
        self._know(default.mode)

    def _know(self, mode: Mode) -> None:
        """A mode's series exist from 0 (a rollout's verdict reads their rate())."""
        for side in SIDES:
            for code in ("2xx", "4xx", "5xx"):
                self._child(self.requests, mode, side, code)
            for metric in (self.within_slo, self.ttft, self.tpot):
                self._child(metric, mode, side)

    def configure(
        self,
        knobs: DisaggregationKnobs,
        index_blocks_per_pod: int,
        target: DisaggregationKnobs | None = None,
        weight: int = 0,
        tenants_first: bool = False,
    ) -> None:
        """The mode in effect and its knobs; during a rollout, the target's and its weight (percent),
        and whether spec.rollout.tenants go to the target whatever the weight (it takes traffic)."""
        weight = max(0, min(100, weight)) if target is not None else 0
        tenants_first = tenants_first and target is not None
        if (knobs, target, weight, tenants_first) != (
            self.knobs,
            self.target,
            self.weight,
            self.tenants_first,
        ):
            first = " (spec.rollout.tenants first)" if tenants_first else ""
            log.info("disaggregation: %s; rollout to %s at %d%%%s", knobs, target, weight, first)
        self.knobs, self.target, self.weight, self.tenants_first = knobs, target, weight, tenants_first
        self._know(knobs.mode)
        if target is not None:
            self._know(target.mode)
        if index_blocks_per_pod != self.index.capacity_blocks_per_pod:
            self.index.resize(index_blocks_per_pod)

    def knobs_for(self, request_id: str, first: bool = False) -> DisaggregationKnobs:
        """The mode (and knobs) that chooses for this request: during a rollout, the target's for
        `weight` percent of request ids (the same id always the same way, on any router replica).
        `first`: the request's tenant is one of spec.rollout.tenants: the target's while it takes
        traffic, at any weight (the tenants stage at 0)."""
        target = self.target
        if target is not None and first and self.tenants_first:
            return target
        if target is None or self.weight <= 0:
            return self.knobs
        if self.weight >= 100 or draw_for(request_id + _SALT) * 100 < self.weight:
            return target
        return self.knobs

    def count(self, choice: Choice) -> None:
        self._choices[(choice.side, choice.reason)].inc()

    def stats(self, pod: str) -> DecodePodStats:
        found = self.pods.get(pod)
        if found is None:
            found = self.pods[pod] = DecodePodStats()
        return found

    def forget_pod(self, pod: str) -> None:
        self.index.forget_pod(pod)
        self.pods.pop(pod, None)

    def finished(self, mode: Mode, side: Side, code: str) -> None:
        self._child(self.requests, mode, side, code).inc()

    def succeeded(
        self,
        mode: Mode,
        side: Side,
        pod: str | None,
        ttft_s: float,
        tpot_s: float | None,
        output: int,
        within_slo: bool,
    ) -> None:
        """A successful P/D request: TTFT, TPOT and within-SLO by mode and side; its decode pod's stats."""
        self._child(self.ttft, mode, side).observe(ttft_s)
        if tpot_s is not None:
            self._child(self.tpot, mode, side).observe(tpot_s)
        if within_slo:
            self._child(self.within_slo, mode, side).inc()
        if pod is not None and pod in self.pods:
            self.pods[pod].observe(tpot_s, output)


# Salts the request id's draw so that a disaggregation rollout's split is independent of the
# serving-mode rollout's and the revisions' (each hashes the bare id).
_SALT: Final = "#disaggregation"


class ReplyTap:
    """A client side (`flow.Responder`) that keeps a copy of what it is sent, for `reply_text`.

    Everything is passed on to `inner` unchanged; at most `MAX_REPLY_BYTES` are kept."""

    __slots__ = ("data", "inner", "kept")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.data: list[bytes] = []
        self.kept = 0

    def _keep(self, data: bytes) -> None:
        if self.kept < MAX_REPLY_BYTES:
            self.data.append(data)
            self.kept += len(data)

    @property
    def started(self) -> bool:
        return bool(self.inner.started)

    @property
    def writable(self) -> bool:
        return bool(self.inner.writable)

    def start_stream_nowait(self, status: int, content_type: str) -> None:
        self.inner.start_stream_nowait(status, content_type)

    def write_nowait(self, data: bytes) -> None:
        self._keep(data)
        self.inner.write_nowait(data)

    def finish_nowait(self, data: bytes) -> None:
        self._keep(data)
        self.inner.finish_nowait(data)

    def when_writable(self, callback: Callable[[], None]) -> None:
        self.inner.when_writable(callback)

    async def answer(self, status: int, body: bytes, content_type: str) -> None:
        if status == 200:
            self._keep(body)
        await self.inner.answer(status, body, content_type)

    async def finish(self, data: bytes) -> None:
        self._keep(data)
        await self.inner.finish(data)

    def set_header(self, name: str, value: str) -> None:
        self.inner.set_header(name, value)

    def reply(self, stream: bool) -> str:
        return reply_text(b"".join(self.data), stream)


def _choice_text(payload: Any) -> str:
    """The first choice's text in one decoded answer or chunk (JSON objects decode to dicts: `dict`
    checks, several times cheaper than `Mapping`'s, once per streamed token)."""
    if not isinstance(payload, dict):
        return ""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    text = choice.get("text")
    if isinstance(text, str):
        return text
    for key in ("delta", "message"):
        part = choice.get(key)
        if isinstance(part, dict):
            content = part.get("content")
            if isinstance(content, str):
                return content
    return ""


def reply_text(raw: bytes, stream: bool) -> str:
    """The generated text of the first choice in an answer as the client got it (SSE or JSON). A stream's
    chunks are decoded in one `json.loads` of them as a JSON array (one chunk at a time only when that
    fails: a chunk that is not JSON is skipped)."""
    if not stream:
        try:
            return _choice_text(json.loads(raw))
        except ValueError:
            return ""
    payloads: list[bytes] = []
    for line in raw.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data and data != b"[DONE]":
            payloads.append(data)
    try:
        chunks = json.loads(b"[" + b",".join(payloads) + b"]")
    except ValueError:
        chunks = []
        for data in payloads:
            try:
                chunks.append(json.loads(data))
            except ValueError:
                continue
    return "".join([_choice_text(chunk) for chunk in chunks])


def with_reply(text: str, reply: str, endpoint: Endpoint) -> str:
    """The text a conversation's next turn starts with: the prompt's text (`prefix.prompt_text`) and
    the reply, as the next turn's request will carry it (chat: an assistant message)."""
    if endpoint == "chat":
        return f"{text}<|assistant|>\n{reply}\n"
    return text + reply
