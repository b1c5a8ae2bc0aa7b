"""Admission control on a fake clock: token buckets, per-tenant limits, the long-prompt cap, decode room."""

from __future__ import annotations

import pytest

from tandem.routing.admission import (
    Admission,
    Limits,
    LongPromptCap,
    Policy,
    Refusal,
    Ticket,
    TokenBucket,
    pods_with_room,
    retry_after,
)


@pytest.mark.parametrize(
    ("rate", "capacity", "draws", "now", "cost", "wait"),
    [
        (1.0, 2.0, [], 0.0, 1, 0.0),  # starts full
        (1.0, 2.0, [1, 1], 0.0, 1, 1.0),  # empty: one unit a second
        (1.0, 2.0, [1, 1], 0.5, 1, 0.5),  # half refilled
        (1.0, 2.0, [1, 1], 10.0, 1, 0.0),  # refilled, capped at the capacity
        (2.0, 4.0, [4], 0.0, 3, 1.5),  # 3 units at 2/s
        (10.0, 100.0, [], 0.0, 500, 0.0),  # larger than the bucket: admitted when full...
        (10.0, 100.0, [500], 0.0, 1, 40.1),  # ...and leaves it in debt (-400 + 1 needed)
        (10.0, 100.0, [50], 0.0, 500, 5.0),  # larger than the bucket needs a full bucket
    ],
)
def test_bucket_wait(
    rate: float, capacity: float, draws: list[int], now: float, cost: int, wait: float
) -> None:
    bucket = TokenBucket.full(rate, capacity, 0.0)
    for draw in draws:
        bucket.draw(draw)
    assert bucket.wait_for(cost, now) == pytest.approx(wait)


def test_bucket_refill_never_goes_back_in_time() -> None:
    bucket = TokenBucket.full(1.0, 5.0, 10.0)
    bucket.draw(5)
    assert bucket.wait_for(1, 9.0) == pytest.approx(1.0)  # an earlier `now` adds nothing
    assert bucket.wait_for(1, 11.0) == 0.0


@pytest.mark.parametrize(
    ("wait", "header"), [(0.001, 1), (0.5, 1), (1.0, 1), (1.2, 2), (9.99, 10), (40.1, 41)]
)
def test_retry_after_rounds_up_to_whole_seconds(wait: float, header: int) -> None:
    assert retry_after(wait) == header


def test_limits_default_bursts() -> None:
    assert Limits(requests_per_second=0.5).request_capacity() == 1.0
    assert Limits(requests_per_second=2.5).request_capacity() == 3.0
    assert Limits(requests_per_second=2.5, request_burst=10).request_capacity() == 10.0
    assert Limits(prompt_tokens_per_second=1000).token_capacity() == 1000.0
    assert Limits().request_capacity() is None
    assert Limits().token_capacity() is None


A = Limits(requests_per_second=1.0, request_burst=2)
TOKENS = Limits(prompt_tokens_per_second=100.0, prompt_token_burst=300)


# (tenant, prompt tokens, now) -> expected: "ok" or (reason, Retry-After)
@pytest.mark.parametrize(
    ("limits", "default", "requests", "expected"),
    [
        # Two requests in the burst, the third refused for a second, admitted once refilled.
        (
            {"a": A},
            None,
            [("a", 10, 0.0), ("a", 10, 0.0), ("a", 10, 0.0), ("a", 10, 0.4), ("a", 10, 1.0)],
            ["ok", "ok", ("tenant_requests", 1), ("tenant_requests", 1), "ok"],
        ),
        # Another tenant is not limited by a's bucket; with no default, unlisted tenants are free.
        (
            {"a": A},
            None,
            [("a", 1, 0.0), ("a", 1, 0.0), ("a", 1, 0.0), ("b", 1, 0.0), ("b", 1, 0.0), ("b", 1, 0.0)],
            ["ok", "ok", ("tenant_requests", 1), "ok", "ok", "ok"],
        ),
        # The default applies to each unlisted label separately (other, default).
        (
            {},
            A,
            [("other", 1, 0.0), ("other", 1, 0.0), ("other", 1, 0.0), ("default", 1, 0.0)],
            ["ok", "ok", ("tenant_requests", 1), "ok"],
        ),
        # Prompt tokens: 300 burst at 100/s; a refusal draws nothing; Retry-After from the deficit.
        (
            {"t": TOKENS},
            None,
            [("t", 200, 0.0), ("t", 200, 0.0), ("t", 200, 1.0), ("t", 1000, 1.0), ("t", 1000, 5.0)],
            ["ok", ("tenant_prompt_tokens", 1), "ok", ("tenant_prompt_tokens", 3), "ok"],
        ),
        # A prompt larger than the bucket leaves it in debt: the next waits for the debt to clear.
        (
            {"t": TOKENS},
            None,
            [("t", 900, 0.0), ("t", 1, 0.0), ("t", 1, 6.0), ("t", 1, 6.02)],
            ["ok", ("tenant_prompt_tokens", 7), ("tenant_prompt_tokens", 1), "ok"],
        ),
        # Both dimensions: the request bucket refuses first, and a token refusal draws no request.
        (
            {"x": Limits(1.0, 1, 100.0, 100)},
            None,
            [("x", 150, 0.0), ("x", 10, 0.5), ("x", 80, 1.0), ("x", 10, 1.0)],
            ["ok", ("tenant_requests", 1), ("tenant_prompt_tokens", 1), "ok"],
        ),
    ],
)
def test_tenant_buckets(
    limits: dict[str, Limits],
    default: Limits | None,
    requests: list[tuple[str, int, float]],
    expected: list[object],
) -> None:
    admission = Admission(Policy(limits=limits, default=default))
    got: list[object] = []
    for tenant, tokens, now in requests:
        decision = admission.admit(tenant, tokens, now)
        got.append("ok" if isinstance(decision, Ticket) else (decision.reason, decision.retry_after_s))
    assert got == expected


def test_long_prompt_cap_holds_and_frees_slots() -> None:
    admission = Admission(Policy(long_prompts=LongPromptCap(min_tokens=1000, max_concurrent=2)))
    first, second = admission.admit("a", 1000, 0.0), admission.admit("b", 5000, 0.0)
    assert isinstance(first, Ticket)
    assert isinstance(second, Ticket)
    third = admission.admit("c", 2000, 0.0)
    assert isinstance(third, Refusal)
    assert third.reason == "long_prompts"
    assert third.retry_after_s == 1
    short = admission.admit("c", 999, 0.0)  # short prompts are never held by the cap
    assert isinstance(short, Ticket)
    assert not short.long
    assert admission.long_in_flight == 2
    first.release()
    first.release()  # releasing twice frees one slot only
    assert admission.long_in_flight == 1
    assert isinstance(admission.admit("c", 2000, 0.0), Ticket)
    assert isinstance(admission.admit("d", 2000, 0.0), Refusal)


def test_long_prompt_refused_by_its_tenant_takes_no_slot() -> None:
    admission = Admission(
        Policy(limits={"a": Limits(requests_per_second=1.0)}, long_prompts=LongPromptCap(100, 1))
    )
    assert isinstance(admission.admit("a", 500, 0.0), Ticket)
    refused = admission.admit("a", 500, 0.0)
    assert isinstance(refused, Refusal)
    assert refused.reason == "tenant_requests"
    assert admission.long_in_flight == 1


def test_configure_keeps_buckets_of_unchanged_limits() -> None:
    admission = Admission(Policy(limits={"a": A, "b": A}))
    for tenant in ("a", "a", "b", "b"):
        assert isinstance(admission.admit(tenant, 1, 0.0), Ticket)
    # a's limits change (a fresh, full bucket); b's do not (still empty)
    admission.configure(Policy(limits={"a": Limits(requests_per_second=1.0, request_burst=3), "b": A}))
    assert isinstance(admission.admit("a", 1, 0.0), Ticket)
    assert isinstance(admission.admit("b", 1, 0.0), Refusal)
    admission.configure(Policy())  # no limits at all
    assert all(isinstance(admission.admit("b", 1, 0.0), Ticket) for _ in range(10))


@pytest.mark.parametrize(
    ("usage", "full_at", "room"),
    [
        ({"d1": 0.95, "d2": 0.30}, 0.9, ["d2"]),
        ({"d1": 0.90, "d2": 0.89}, 0.9, ["d2"]),  # at the threshold is full
        ({"d1": 0.99}, 0.9, ["d2"]),  # no reading: has room
        ({"d1": 0.95, "d2": 1.0}, 0.9, []),
        ({"d1": 1.0, "d2": 1.0}, 1.0, []),
        ({}, 0.5, ["d1", "d2"]),
    ],
)
def test_pods_with_room(usage: dict[str, float], full_at: float, room: list[str]) -> None:
    assert pods_with_room(["d1", "d2"], usage, full_at) == room
