"""The simulator's input: one request of a trace (arrival, prompt and output lengths, tenant, prefix hashes).

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
