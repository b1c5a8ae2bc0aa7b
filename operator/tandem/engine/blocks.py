"""The KV block pool: a fixed number of block ids, handed out and returned. Pure."""

from __future__ import annotations

from collections.abc import Sized


class PoolCounts:
    """What every block pool reports: its size and its free blocks (`_free`, any sized collection)."""

    num_blocks: int
    _free: Sized

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.num_blocks = num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks


class BlockPool(PoolCounts):
    _free: list[int]

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        # Popped from the end: low ids first, which keeps block ids in debug output readable.
        self._free = list(range(num_blocks - 1, -1, -1))

    def allocate(self, count: int) -> list[int] | None:
        """`count` block ids, or None (and nothing taken) when not enough are free."""
        if count > len(self._free):
            return None
        if count <= 0:
            return []
        taken = self._free[-count:]
        del self._free[-count:]
        taken.reverse()
        return taken

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
