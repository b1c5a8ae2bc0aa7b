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
