"""Admission control of one router replica: per-tenant token buckets, the long-prompt cap, and
which decode pods have KV room.

Pure: every decision takes `now` (seconds, any monotonic origin) and does no I/O, so the tables in
`tests/unit/routing/test_admission.py` drive it with a fake clock. The limits are per router replica:
N replicas admit up to N times as much (the spec says so, and so do the docs).

Token buckets: a tenant has a bucket of requests and one of prompt tokens (each only when its rate
is set). A request is admitted when every bucket it draws on holds at least its cost (a prompt
larger than the whole bucket needs a full bucket) and then draws the cost, possibly into debt; a
refused request draws nothing. `Retry-After` is the time until the emptiest bucket holds the cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

RefusalReason = Literal["tenant_requests", "tenant_prompt_tokens", "long_prompts", "decode_kv_full"]
REFUSAL_REASONS: Final[tuple[RefusalReason, ...]] = (
    "tenant_requests",
    "tenant_prompt_tokens",
    "long_prompts",
    "decode_kv_full",
)


@dataclass(frozen=True, slots=True)
class Limits:
    """One tenant's limits; None: that dimension is not limited."""

    requests_per_second: float | None = None
    request_burst: int | None = None
    prompt_tokens_per_second: float | None = None
    prompt_token_burst: int | None = None

    def request_capacity(self) -> float | None:
        rate = self.requests_per_second
        if rate is None:
            return None
        return float(self.request_burst if self.request_burst is not None else max(1, math.ceil(rate)))

    def token_capacity(self) -> float | None:
        rate = self.prompt_tokens_per_second
        if rate is None:
            return None
        burst = self.prompt_token_burst
        return float(burst if burst is not None else max(1, math.ceil(rate)))


@dataclass(slots=True)
class TokenBucket:
    """`capacity` units, refilled at `rate` per second; starts full."""

    rate: float
    capacity: float
    level: float
    updated: float

    @classmethod
    def full(cls, rate: float, capacity: float, now: float) -> TokenBucket:
        return cls(rate, capacity, capacity, now)

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def wait_for(self, cost: float, now: float) -> float:
        """Seconds until the bucket can admit `cost` (0: now). Draws nothing."""
        self.refill(now)
        need = min(cost, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def draw(self, cost: float) -> None:
        self.level -= cost


@dataclass(frozen=True, slots=True)
class LongPromptCap:
    min_tokens: int
    max_concurrent: int


@dataclass(frozen=True, slots=True)
class Policy:
    """What admission enforces; `limits` by tenant label, `default` for any other label."""

    limits: Mapping[str, Limits] = field(default_factory=dict)
    default: Limits | None = None
    long_prompts: LongPromptCap | None = None

    def limits_of(self, tenant: str) -> Limits | None:
        found = self.limits.get(tenant)
        return found if found is not None else self.default


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: RefusalReason
    retry_after_s: int  # whole seconds, at least 1 (the `Retry-After` header)
    message: str


def retry_after(wait_s: float) -> int:
    """`Retry-After` in whole seconds: rounded up, at least 1 (0 would invite an immediate retry)."""
    return max(1, math.ceil(wait_s - 1e-9))


@dataclass(slots=True)
class Ticket:
    """An admitted request; `release` when it ends (frees its long-prompt slot, if it took one)."""

    admission: Admission | None
    long: bool

    def release(self) -> None:
        if self.admission is not None:
            if self.long:
                self.admission.long_in_flight = max(0, self.admission.long_in_flight - 1)
            self.admission = None


@dataclass
class _TenantBuckets:
    limits: Limits
    requests: TokenBucket | None
    tokens: TokenBucket | None


class Admission:
    """Per-tenant buckets and the long-prompt count of one router replica."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()
        self.long_in_flight = 0
        self._buckets: dict[str, _TenantBuckets] = {}

    def configure(self, policy: Policy) -> None:
        """A new policy; buckets of tenants whose limits did not change keep their level."""
        self.policy = policy
        for tenant in list(self._buckets):
            if self._buckets[tenant].limits != policy.limits_of(tenant):
                del self._buckets[tenant]

    def _buckets_of(self, tenant: str, limits: Limits, now: float) -> _TenantBuckets:
        found = self._buckets.get(tenant)
        if found is None:
            req_cap, tok_cap = limits.request_capacity(), limits.token_capacity()
            found = self._buckets[tenant] = _TenantBuckets(
                limits,
                None
                if req_cap is None or limits.requests_per_second is None
                else TokenBucket.full(limits.requests_per_second, req_cap, now),
                None
                if tok_cap is None or limits.prompt_tokens_per_second is None
                else TokenBucket.full(limits.prompt_tokens_per_second, tok_cap, now),
            )
        return found

    def admit(self, tenant: str, prompt_tokens: int, now: float) -> Ticket | Refusal:
        """Admits (drawing from the tenant's buckets, taking a long-prompt slot) or refuses."""
        policy = self.policy
        long_cap = policy.long_prompts
        is_long = long_cap is not None and prompt_tokens >= long_cap.min_tokens
        limits = policy.limits_of(tenant)
        buckets = None if limits is None else self._buckets_of(tenant, limits, now)
        if buckets is not None:
            if buckets.requests is not None:
                wait = buckets.requests.wait_for(1, now)
                if wait > 0:
                    return Refusal(
                        "tenant_requests",
                        retry_after(wait),
                        f"tenant {tenant!r} is over its request rate "
                        f"({buckets.requests.rate:g}/s, burst {buckets.requests.capacity:g})",
                    )
            if buckets.tokens is not None:
                wait = buckets.tokens.wait_for(prompt_tokens, now)
                if wait > 0:
                    return Refusal(
                        "tenant_prompt_tokens",
                        retry_after(wait),
                        f"tenant {tenant!r} is over its prompt-token rate "
                        f"({buckets.tokens.rate:g}/s, burst {buckets.tokens.capacity:g})",
                    )
        if is_long and long_cap is not None and self.long_in_flight >= long_cap.max_concurrent:
            return Refusal(
                "long_prompts",
                1,
                f"{self.long_in_flight} long prompts (at least {long_cap.min_tokens} tokens) are in flight, "
                f"the most this router admits at once",
            )
        if buckets is not None:
            if buckets.requests is not None:
                buckets.requests.draw(1)
            if buckets.tokens is not None:
                buckets.tokens.draw(prompt_tokens)
        if is_long:
            self.long_in_flight += 1
        return Ticket(self, is_long)


def pods_with_room(pods: Iterable[str], kv_usage: Mapping[str, float], full_at: float) -> list[str]:
    """The decode pods whose last reported KV usage (0..1) is below `full_at` (0..1).

    A pod with no reading yet (new, or its /metrics unreadable) counts as having room: backpressure
    holds off pods known to be full, it never takes an unknown pod out of rotation.
    """
    return [pod for pod in pods if kv_usage.get(pod, 0.0) < full_at]
