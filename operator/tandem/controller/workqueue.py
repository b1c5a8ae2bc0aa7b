"""A keyed work queue with delays: each key is processed by one worker at a time.

Adding a key that is already pending keeps the earliest due time; adding a key while it is being
processed schedules one more pass after the current one. This is what makes reconciles
level-based and never concurrent for one object.

The pending keys are a heap by due time, so taking the next one costs O(log n) whatever the number
of keys: with a thousand PDDeployments and every worker woken by each add, a scan of all pending
keys per wake-up grew with the square of the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        # key -> (due, sequence): the one heap entry with that pair is the key's live entry; others
        # are stale (the key was taken, forgotten, or moved earlier) and dropped when they surface.
        self._due: dict[K, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._sequence = itertools.count()
        self._processing: set[K] = set()
        self._parked: set[K] = set()  # due while being processed: back on the heap when done
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._due)

    def _push(self, key: K, due: float) -> None:
        entry = (due, next(self._sequence))
        self._due[key] = entry
        heapq.heappush(self._heap, (*entry, key))

    def add(self, key: K, delay: float = 0.0) -> None:
        due = asyncio.get_running_loop().time() + max(0.0, delay)
        current = self._due.get(key)
        if current is None or due < current[0]:
            self._parked.discard(key)  # a new live entry: the parked one is stale
            self._push(key, due)
        self._changed.set()

    def forget(self, key: K) -> None:
        self._due.pop(key, None)
        self._parked.discard(key)

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._parked:
            self._parked.discard(key)
            entry = self._due.get(key)
            if entry is not None:
                self._push(key, entry[0])
        self._changed.set()

    def _next(self) -> tuple[float, K] | None:
        """The earliest live entry whose key is not being processed, left on the heap."""
        while self._heap:
            due, sequence, key = self._heap[0]
            if self._due.get(key) != (due, sequence):
                heapq.heappop(self._heap)  # stale
            elif key in self._processing:
                heapq.heappop(self._heap)
                self._parked.add(key)
            else:
                return due, key
        return None

    async def get(self) -> K:
        """Wait for the next key that is due and not being processed, and mark it processing."""
        loop = asyncio.get_running_loop()
        while True:
            head = self._next()
            timeout: float | None = None
            if head is not None:
                due, key = head
                if due <= loop.time():
                    heapq.heappop(self._heap)
                    del self._due[key]
                    self._processing.add(key)
                    return key
                timeout = due - loop.time()
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
