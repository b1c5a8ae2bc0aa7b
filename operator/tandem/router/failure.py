"""What the router does when a leg fails: the failure rules as pure decisions, and the retry budget.

The rules (DESIGN.md "Router", reference `vllm-pd.md` §2.5):
- prefill fails -> try another prefill pod;
- decode fails before the client got a byte -> prefill again elsewhere, dropping the old KV;
- decode fails after the first byte -> end the client's stream with an error (never splice two
  generations into one answer);
- an engine's 4xx is the client's fault: pass it through, retry nothing, blame no pod;
- retries stop when the request's attempts or the router-wide retry budget run out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class LegFailure(Enum):
    """Why a leg failed; the value is the `reason` label of the failure and retry counters."""

    CONNECT = "connect"  # could not connect / connection reset before an answer
    TIMEOUT = "timeout"  # a per-leg timeout expired
    SERVER_ERROR = "http_5xx"  # the engine answered 5xx (a failed KV pull on D is a 500)
    CLIENT_ERROR = "http_4xx"  # the engine refused the request itself
    STREAM_ERROR = "stream_error"  # an error event inside a 200 stream
    TRUNCATED = "truncated"  # the stream ended without `[DONE]` (engine died mid-answer)
    BAD_ANSWER = "bad_answer"  # 200 but not a usable answer (unparseable prefill JSON)


class Action(Enum):
    RETRY_PREFILL = "retry_prefill"  # same request, another prefill pod
    REPREFILL = "reprefill"  # prefill again elsewhere, then decode on (preferably) another pod
    PASS_THROUGH = "pass_through"  # give the engine's own answer to the client
    FAIL = "fail"  # answer the client with an error status (nothing sent yet)
    END_STREAM = "end_stream"  # the client already has bytes: close the stream with an error event


def blames_pod(failure: LegFailure) -> bool:
    """Whether the failure says something about the pod (quarantine it) rather than the request."""
    return failure is not LegFailure.CLIENT_ERROR


def on_prefill_failure(failure: LegFailure, may_retry: bool) -> Action:
    if failure is LegFailure.CLIENT_ERROR:
        return Action.PASS_THROUGH
    return Action.RETRY_PREFILL if may_retry else Action.FAIL


def on_decode_failure(failure: LegFailure, client_has_bytes: bool, may_retry: bool) -> Action:
    if client_has_bytes:
        return Action.END_STREAM
    if failure is LegFailure.CLIENT_ERROR:
        return Action.PASS_THROUGH
    return Action.REPREFILL if may_retry else Action.FAIL


def client_status(failure: LegFailure) -> int:
    """The HTTP status the client gets when the router gives up on a request."""
    return 504 if failure is LegFailure.TIMEOUT else 502


@dataclass
class RetryBudget:
    """Router-wide cap on retries: at most `ratio` retries per request over time, plus a small floor.

    Tokens accrue `ratio` per request (capped at `burst`) and `min_per_s` per second; a retry spends
    one. When a whole pool is failing this stops retries from multiplying the load on it.
    """

    ratio: float = 0.2
    min_per_s: float = 10.0
    burst: float = 100.0
    _tokens: float = field(default=10.0)
    _last: float | None = field(default=None)

    def _refill(self, now: float) -> None:
        if self._last is not None and now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.min_per_s)
        self._last = now if self._last is None else max(self._last, now)

    def on_request(self, now: float) -> None:
        self._refill(now)
        self._tokens = min(self.burst, self._tokens + self.ratio)

    def try_spend(self, now: float) -> bool:
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    @property
    def available(self) -> float:
        return self._tokens
