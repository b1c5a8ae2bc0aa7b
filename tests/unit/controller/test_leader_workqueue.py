"""Leader election rule and the keyed work queue."""

from __future__ import annotations

import asyncio

import pytest

from tandem.controller.leader import LeaseRecord, decide, lease_record
from tandem.controller.workqueue import WorkQueue


@pytest.mark.parametrize(
    ("record", "now", "action"),
    [
        (None, 100.0, "acquire"),
        (LeaseRecord("", 0.0, 30.0), 100.0, "acquire"),
        (LeaseRecord("me", 90.0, 30.0), 100.0, "renew"),
        (LeaseRecord("other", 90.0, 30.0), 100.0, "follow"),
        (LeaseRecord("other", 60.0, 30.0), 100.0, "acquire"),  # lapsed
    ],
)
def test_decide(record: LeaseRecord | None, now: float, action: str) -> None:
    assert decide(record, "me", now) == action


def test_lease_record_parses_micro_time() -> None:
    record = lease_record(
        {
            "spec": {
                "holderIdentity": "a",
                "renewTime": "2026-01-01T00:00:00.000000Z",
                "leaseDurationSeconds": 30,
            }
        }
    )
    assert record is not None
    assert record.holder == "a"
    assert record.duration == 30.0
    assert record.renewed_at > 0


async def test_queue_deduplicates_and_serialises_a_key() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    queue.add("a")
    queue.add("b")
    first = await queue.get()
    second = await queue.get()
    assert {first, second} == {"a", "b"}
    assert len(queue) == 0
    queue.add(first)  # re-added while processing: held until done()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), 0.05)
    queue.done(first)
    assert await asyncio.wait_for(queue.get(), 1) == first


async def test_queue_honours_delay_and_keeps_earliest() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a", delay=10)
    queue.add("a", delay=0)
    assert await asyncio.wait_for(queue.get(), 1) == "a"
    queue.done("a")
    queue.add("b", delay=10)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), 0.05)


async def test_queue_gives_keys_in_due_order_and_skips_forgotten_ones() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for key, delay in [("c", 0.03), ("a", 0.01), ("b", 0.02), ("d", 0.04)]:
        queue.add(key, delay)
    queue.add("d", 0.0)  # moved earlier: its first entry is stale
    queue.add("b", 5.0)  # later: the earlier due time holds
    queue.forget("c")
    taken = [await asyncio.wait_for(queue.get(), 1) for _ in range(3)]
    assert taken == ["d", "a", "b"]
    assert len(queue) == 0
    with pytest.raises(TimeoutError):  # "c" was forgotten, and no stale entry comes back
        await asyncio.wait_for(queue.get(), 0.1)


async def test_queue_holds_a_key_due_while_processing_until_done_and_keeps_its_earliest_time() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    assert await queue.get() == "a"
    queue.add("a", 5.0)
    queue.add("b", 0.05)
    assert await asyncio.wait_for(queue.get(), 1) == "b"  # "a" is parked, not blocking "b"
    queue.add("a", 0.0)  # earlier, still processing: still held
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), 0.05)
    queue.done("a")
    assert await asyncio.wait_for(queue.get(), 1) == "a"
    queue.done("a")
    queue.done("b")
    assert len(queue) == 0
    queue.add("a")
    queue.forget("a")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), 0.05)
