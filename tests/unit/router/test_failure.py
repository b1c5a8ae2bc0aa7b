"""The failure rules as decisions, and the router-wide retry budget."""

from __future__ import annotations

import pytest

from tandem.router.failure import (
    Action,
    LegFailure,
    RetryBudget,
    blames_pod,
    client_status,
    on_decode_failure,
    on_prefill_failure,
)

F = LegFailure


@pytest.mark.parametrize(
    ("failure", "may_retry", "action"),
    [
        (F.CONNECT, True, Action.RETRY_PREFILL),
        (F.SERVER_ERROR, True, Action.RETRY_PREFILL),
        (F.TIMEOUT, True, Action.RETRY_PREFILL),
        (F.BAD_ANSWER, True, Action.RETRY_PREFILL),
        (F.SERVER_ERROR, False, Action.FAIL),
        (F.CLIENT_ERROR, True, Action.PASS_THROUGH),
        (F.CLIENT_ERROR, False, Action.PASS_THROUGH),
    ],
)
def test_prefill_failures(failure: LegFailure, may_retry: bool, action: Action) -> None:
    assert on_prefill_failure(failure, may_retry) is action


@pytest.mark.parametrize(
    ("failure", "client_has_bytes", "may_retry", "action"),
    [
        (F.SERVER_ERROR, False, True, Action.REPREFILL),  # KV pull failed on D: 500
        (F.STREAM_ERROR, False, True, Action.REPREFILL),  # error event before any byte left
        (F.TRUNCATED, False, True, Action.REPREFILL),
        (F.CONNECT, False, False, Action.FAIL),
        (F.TRUNCATED, True, True, Action.END_STREAM),  # never splice two generations
        (F.STREAM_ERROR, True, True, Action.END_STREAM),
        (F.TIMEOUT, True, False, Action.END_STREAM),
        (F.CLIENT_ERROR, False, True, Action.PASS_THROUGH),
    ],
)
def test_decode_failures(
    failure: LegFailure, client_has_bytes: bool, may_retry: bool, action: Action
) -> None:
    assert on_decode_failure(failure, client_has_bytes, may_retry) is action


def test_only_client_errors_spare_the_pod() -> None:
    assert [f for f in LegFailure if not blames_pod(f)] == [F.CLIENT_ERROR]


def test_timeouts_are_504_and_the_rest_502() -> None:
    assert client_status(F.TIMEOUT) == 504
    assert client_status(F.CONNECT) == 502


def test_retry_budget_spends_and_refills() -> None:
    budget = RetryBudget(ratio=0.5, min_per_s=1.0, burst=3.0, _tokens=0.0)
    budget.on_request(0.0)
    assert not budget.try_spend(0.0)  # 0.5 tokens
    budget.on_request(0.0)
    assert budget.try_spend(0.0)  # 1.0 -> spent
    assert not budget.try_spend(0.5)  # +0.5 from time
    assert budget.try_spend(1.0)  # +0.5 more
    for _ in range(100):
        budget.on_request(2.0)
    assert budget.available == 3.0  # capped at the burst
