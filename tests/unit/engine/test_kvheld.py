"""Prefill-side held KV: reads, releases, heartbeats and lease expiry, with time passed in."""

from __future__ import annotations

import pytest

from tandem.engine.kvheld import HeldKVError, HeldKVTable


def test_a_completed_read_frees_the_blocks_once() -> None:
    table = HeldKVTable(lease_seconds=30)
    table.hold("r1", [4, 5, 6], 40, now=0)
    assert table.num_blocks == 3
    table.begin_read("r1", [4, 5, 6], 40)
    assert table.end_read("r1", ok=True) == [4, 5, 6]
    assert len(table) == 0
    with pytest.raises(HeldKVError, match="unknown or expired"):
        table.begin_read("r1", [4, 5, 6], 40)


def test_a_failed_read_keeps_the_blocks_for_a_retry() -> None:
    table = HeldKVTable(lease_seconds=30)
    table.hold("r1", [1], 5, now=0)
    table.begin_read("r1", [1], 5)
    assert table.end_read("r1", ok=False) == []
    table.begin_read("r1", [1], 5)


@pytest.mark.parametrize(
    ("blocks", "tokens", "message"), [([9], 5, "remote_block_ids"), ([1], 6, "prompt mismatch")]
)
def test_mismatched_reads_are_refused(blocks: list[int], tokens: int, message: str) -> None:
    table = HeldKVTable(lease_seconds=30)
    table.hold("r1", [1], 5, now=0)
    with pytest.raises(HeldKVError, match=message):
        table.begin_read("r1", blocks, tokens)


def test_leases_expire_unless_being_read_or_extended() -> None:
    table = HeldKVTable(lease_seconds=30)
    table.hold("idle", [1], 1, now=0)
    table.hold("reading", [2], 1, now=0)
    table.hold("beating", [3], 1, now=0)
    table.begin_read("reading", [2], 1)
    assert table.extend("beating", now=25)  # -> expires at 45
    assert [h.remote_request_id for h in table.expire(now=29.9)] == []
    assert [h.remote_request_id for h in table.expire(now=30)] == ["idle"]
    assert table.expired_total == 1
    assert table.expired_ids == ["idle"]
    assert [h.remote_request_id for h in table.expire(now=45)] == ["beating"]
    assert not table.extend("idle", now=50)


def test_release_frees_at_once() -> None:
    table = HeldKVTable(lease_seconds=30)
    table.hold("r1", [7, 8], 20, now=0)
    assert table.release("r1") == [7, 8]
    assert table.release("r1") == []


def test_a_different_prompt_of_the_same_length_is_refused() -> None:
    table = HeldKVTable(lease_seconds=30)
    table.hold("r1", [1], 5, now=0, prompt_key=111)
    with pytest.raises(HeldKVError, match="prompts differ"):
        table.begin_read("r1", [1], 5, prompt_key=222)
    table.begin_read("r1", [1], 5, prompt_key=111)


@pytest.mark.parametrize("ok", [True, False])
def test_a_release_during_a_read_frees_when_the_read_ends(ok: bool) -> None:
    table = HeldKVTable(lease_seconds=30)
    table.hold("r1", [1, 2], 5, now=0)
    table.begin_read("r1", [1, 2], 5)
    assert table.release("r1") == []  # the reader still uses them
    assert table.num_blocks == 2
    assert table.end_read("r1", ok=ok) == [1, 2]  # freed even by a failed read: nobody wants them
    assert len(table) == 0


def test_releasing_an_unknown_handle_frees_nothing() -> None:
    table = HeldKVTable(lease_seconds=30)
    assert table.release("nobody") == []


@pytest.mark.parametrize(
    ("gone", "named"),
    [
        ("released", "cmpl-req-7-0-ab"),  # by the handle
        ("released", "req-7"),  # by the X-Request-Id the prefill came with (its handle never arrived)
        ("read", "req-7"),
        ("expired", "req-7"),
    ],
)
def test_a_release_may_name_the_caller_id_until_the_entry_is_gone(gone: str, named: str) -> None:
    table = HeldKVTable(lease_seconds=30)
    table.hold("cmpl-req-7-0-ab", [3, 4], 20, now=0, caller_id="req-7")
    if gone == "released":
        assert table.release(named) == [3, 4]
    elif gone == "read":
        table.begin_read("cmpl-req-7-0-ab", [3, 4], 20)
        assert table.end_read("cmpl-req-7-0-ab", ok=True) == [3, 4]
    else:
        assert len(table.expire(now=31)) == 1
    assert len(table) == 0
    # Gone however it went: a later release by either name frees nothing, and a new prefill that
    # reuses the caller id is released by it, not confused with the old one.
    assert table.release(named) == []
    table.hold("cmpl-req-7-0-cd", [5], 5, now=40, caller_id="req-7")
    assert table.release("req-7") == [5]
