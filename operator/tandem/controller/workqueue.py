"""A keyed work queue with delays: each key is processed by one worker at a time.

Adding a key that is already pending keeps the earliest due time; adding a key while it is being
processed schedules one more pass after the current one. This is what makes reconciles
level-based and never concurrent for one object.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._due: dict[K, float] = {}
        self._processing: set[K] = set()
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._due)

    def add(self, key: K, delay: float = 0.0) -> None:
        due = asyncio.get_running_loop().time() + max(0.0, delay)
        self._due[key] = min(due, self._due.get(key, due))
        self._changed.set()

    def forget(self, key: K) -> None:
        self._due.pop(key, None)

    def done(self, key: K) -> None:
        self._processing.discard(key)
        self._changed.set()

    async def get(self) -> K:
        """Wait for the next key that is due and not being processed, and mark it processing."""
        loop = asyncio.get_running_loop()
        while True:
            ready = [(due, key) for key, due in self._due.items() if key not in self._processing]
            timeout: float | None = None
            if ready:
                due, key = min(ready, key=lambda item: item[0])
                if due <= loop.time():
                    del self._due[key]
                    self._processing.add(key)
                    return key
                timeout = due - loop.time()
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
