"""vLLM V1's automatic prefix caching: chained block hashes and a KV block pool that keeps them. Pure.

Hashes (vLLM `hash_block_tokens`): the tokens are cut into blocks of `block_size`; only full blocks
get a hash, and block i's hash covers (block i-1's hash, block i's tokens), so equal hashes mean
equal prefixes. vLLM seeds the first parent with NONE_HASH and also mixes extra keys (LoRA,
multimodal, cache salt) the sim engine does not have; it hashes token ids, the sim engine hashes its
tokens (the words of the stand-in tokenizer, or the ids of a token-id prompt), with blake2b, so the
hashes are the same in every process (vLLM needs PYTHONHASHSEED or sha256 for that).

Pool (vLLM `BlockPool` + `FreeKVCacheBlockQueue`): each block has a reference count. A block in
use (count > 0) is never evicted. A freed block (count 0) joins the tail of the free queue but keeps
its hash, so it can still be hit: a hit takes it back out of the queue ("touch"). Allocation takes
blocks from the head of the queue, the least recently freed; a block taken that still has a hash
is evicted from the cache then. Requests free their blocks tail first, so a prefix loses its tail
blocks before its head. Usage counts free blocks, cached or not, as free, as vLLM does.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Final

from tandem.engine.blocks import PoolCounts

__all__ = ["NONE_HASH", "CachingBlockPool", "block_hashes", "hash_block_tokens"]

NONE_HASH: Final = int.from_bytes(hashlib.blake2b(b"tandem-sim-none-hash", digest_size=8).digest(), "little")


def hash_block_tokens(parent: int, tokens: Sequence[Hashable]) -> int:
    """One block's hash: over its parent's hash and its tokens (64 bits); a token id `7` and a
    token `"7"` differ."""
    text = "\x00".join([t if isinstance(t, str) else f"#{t}" for t in tokens])
    data = parent.to_bytes(8, "little") + text.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def block_hashes(tokens: Sequence[Hashable], block_size: int, parent: int = NONE_HASH) -> list[int]:
    """Chained hashes of the full blocks of `tokens` (a partial last block has none)."""
    out: list[int] = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, tokens[start : start + block_size])
        out.append(parent)
    return out


class CachingBlockPool(PoolCounts):
    """The KV block pool with a prefix cache; the same interface as `blocks.BlockPool` plus the cache.

    `allocate` and `free` are reference-counted: a block shared by two requests (a prefix hit) is
    freed when both have freed it.
    """

    _free: OrderedDict[int, None]

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._ref = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        # Free blocks, least recently freed first (evicted first); cached-free blocks included.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.evictions = 0

    # --- the BlockPool interface (the counts are PoolCounts') -------------------------------
    def allocate(self, count: int) -> list[int] | None:
        """`count` fresh blocks from the head of the free queue (evicting their cached content), or
        None (and nothing taken) when not enough are free."""
        if count > len(self._free):
            return None
        taken: list[int] = []
        for _ in range(max(count, 0)):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self._ref[block] = 1
            taken.append(block)
        return taken

    def free(self, blocks: list[int]) -> None:
        """Drops one reference to each block; the tail block is queued (and evicted) first."""
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] <= 0:
                self._ref[block] = 0
                self._free[block] = None

    # --- the cache ----------------------------------------------------------------------------
    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """The cached blocks of the longest prefix of `hashes` (no reference taken)."""
        found: list[int] = []
        for block_hash in hashes:
            block = self._cached.get(block_hash)
            if block is None:
                break
            found.append(block)
        return found

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of these blocks sit in the free queue: touching them uses up free blocks."""
        return sum(1 for block in blocks if self._ref[block] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Takes a reference to cached blocks (a hit): a free one leaves the free queue."""
        for block in blocks:
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1

    def cache(self, block: int, block_hash: int) -> bool:
        """Registers a full, computed block under its hash; False when another block has it already
        (the duplicate stays uncached and is reused as a plain block once freed)."""
        if block_hash in self._cached or self._hash_of[block] is not None:
            return False
        self._cached[block_hash] = block
        self._hash_of[block] = block_hash
        return True

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def is_cached(self, block: int) -> bool:
        return self._hash_of[block] is not None

    def _evict(self, block: int) -> None:
        block_hash = self._hash_of[block]
        if block_hash is not None:
            del self._cached[block_hash]
            self._hash_of[block] = None
            self.evictions += 1
