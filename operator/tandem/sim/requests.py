"""The simulator's input: one request of a trace (arrival, prompt and output lengths, tenant, prefix hashes,
and the prompt's cacheable blocks for prefix caching).

A `Request` is an immutable NamedTuple (cheap to build a million of); traces produce them, sorted by
arrival, with arrival times in seconds from the start of the trace.
"""

from __future__ import annotations

from typing import NamedTuple


class Request(NamedTuple):
    arrival: float  # seconds from the start of the trace
    prompt_tokens: int
    output_tokens: int
    tenant: str | None = None
    # Mooncake's remapped prefix-block ids (one per 512-token block); kept for prefix caching.
    hash_ids: tuple[int, ...] | None = None
    # The prompt's full 16-token KV blocks for prefix caching, as runs `(key, blocks)`: `blocks`
    # consecutive engine blocks named by one chained `key` (`tandem.sim.traces.prefix`). Two runs with
    # the same key hold the same tokens in their first min(blocks) blocks, and the same prefix before
    # them. None: nothing of this prompt is shared (no prefix-cache hit, nothing worth caching).
    prefix: tuple[tuple[int, int], ...] | None = None
