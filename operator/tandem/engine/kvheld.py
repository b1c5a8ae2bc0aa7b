"""Prefill side of the NIXL protocol: KV blocks held for decode engines, with leases. Pure.

A prefill that finished length-capped for a remote decode keeps its blocks here under its
`remote_request_id`, until a decode engine reads them (freed on read completion), releases them
(a decode engine that aborted the request, or the router's release of an abandoned one), or the
lease lapses (`kv_lease_duration`, else VLLM_NIXL_ABORT_REQUEST_TIMEOUT, else 30 s).
Expired entries are what a real cluster would leak for that long; they are counted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class HeldKV:
    remote_request_id: str
    blocks: list[int]
    prompt_tokens: int
    held_at: float
    expires_at: float
    prompt_key: int | None = None  # identity of the prompt the KV was computed for
    caller_id: str | None = None  # the X-Request-Id the prefill came with (a release may name it)
    reading: bool = False  # a decode engine is reading it right now
    released: bool = False  # released while being read: freed when the read ends, however it ends


class HeldKVError(LookupError):
    """Why a read cannot be served: unknown/expired handle, or a mismatch."""


class HeldKVTable:
    def __init__(self, lease_seconds: float) -> None:
        self.lease_seconds = lease_seconds
        self._held: dict[str, HeldKV] = {}
        self._by_caller: dict[str, str] = {}  # caller_id -> remote_request_id
        self.expired_total = 0
        self.expired_ids: list[str] = []  # most recent last, capped

    def __len__(self) -> int:
        return len(self._held)

    @property
    def num_blocks(self) -> int:
        return sum(len(h.blocks) for h in self._held.values())

    def entries(self) -> list[HeldKV]:
        return list(self._held.values())

    def hold(
        self,
        remote_request_id: str,
        blocks: list[int],
        prompt_tokens: int,
        now: float,
        prompt_key: int | None = None,
        caller_id: str | None = None,
    ) -> HeldKV:
        entry = HeldKV(
            remote_request_id, blocks, prompt_tokens, now, now + self.lease_seconds, prompt_key, caller_id
        )
        self._held[remote_request_id] = entry
        if caller_id is not None:
            self._by_caller[caller_id] = remote_request_id
        return entry

    def _drop(self, entry: HeldKV) -> None:
        del self._held[entry.remote_request_id]
        if entry.caller_id is not None and self._by_caller.get(entry.caller_id) == entry.remote_request_id:
            del self._by_caller[entry.caller_id]

    def begin_read(
        self,
        remote_request_id: str,
        block_ids: list[int],
        prompt_tokens: int | None,
        prompt_key: int | None = None,
    ) -> HeldKV:
        entry = self._held.get(remote_request_id)
        if entry is None:
            raise HeldKVError(f"unknown or expired KV handle {remote_request_id!r}")
        if entry.reading:
            raise HeldKVError(f"KV of {remote_request_id!r} is already being read")
        if list(block_ids) != entry.blocks:
            raise HeldKVError(f"remote_block_ids do not match the blocks held for {remote_request_id!r}")
        if prompt_tokens is not None and prompt_tokens != entry.prompt_tokens:
            raise HeldKVError(
                f"prompt mismatch for {remote_request_id!r}: decode has {prompt_tokens} tokens, "
                f"prefill computed {entry.prompt_tokens}"
            )
        if prompt_key is not None and entry.prompt_key is not None and prompt_key != entry.prompt_key:
            raise HeldKVError(f"prompt mismatch for {remote_request_id!r}: the prompts differ")
        entry.reading = True
        return entry

    def end_read(self, remote_request_id: str, ok: bool) -> list[int]:
        """Blocks to free after a read: all of them when it completed, none when it failed."""
        entry = self._held.get(remote_request_id)
        if entry is None:
            return []
        entry.reading = False
        if not ok and not entry.released:
            return []
        self._drop(entry)
        return entry.blocks

    def release(self, request_id: str) -> list[int]:
        """Blocks to free now; none while a read is under way (they go when it ends). `request_id`
        is the entry's remote_request_id or the X-Request-Id its prefill came with."""
        entry = self._held.get(request_id) or self._held.get(self._by_caller.get(request_id, ""))
        if entry is None:
            return []
        if entry.reading:
            entry.released = True
            return []
        self._drop(entry)
        return entry.blocks

    def extend(self, remote_request_id: str, now: float) -> bool:
        """A heartbeat: push the expiry to at least now + 2/3 of the lease (vLLM >= 0.22)."""
        entry = self._held.get(remote_request_id)
        if entry is None:
            return False
        entry.expires_at = max(entry.expires_at, now + self.lease_seconds * 2 / 3)
        return True

    def expire(self, now: float) -> list[HeldKV]:
        """Drops every lease that has lapsed (not while being read) and returns them."""
        lapsed = [h for h in self._held.values() if h.expires_at <= now and not h.reading]
        for entry in lapsed:
            self._drop(entry)
            self.expired_ids.append(entry.remote_request_id)
        self.expired_total += len(lapsed)
        del self.expired_ids[:-100]
        return lapsed
