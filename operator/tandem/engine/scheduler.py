"""Continuous batching, as vLLM V1's scheduler does it, with time passed in. Pure.

Each `schedule(now)` builds one engine step under the token budget (`max_num_batched_tokens`) and
the sequence cap (`max_num_seqs`): running sequences first (a decode is 1 token, an unfinished
prompt its next chunk), then one pass over the waiting queue in order, which stops at the first
sequence that cannot be given its chunk's KV blocks (strict FCFS: nothing behind it skips ahead).
Without chunked prefill a prompt is only admitted whole. When a running sequence needs a block and
none is free the newest running sequence is preempted (blocks freed, recomputed later) and put at
the head of the queue; a step that preempted admits nothing unless it preempted every running
sequence (vLLM then schedules again at once). `complete(step, now)` applies the step: computed
tokens advance and every sequence that caught up samples one output token.

Disaggregation: a sequence arriving with remote KV waits in WAITING_FOR_REMOTE_KVS; when the pass
reaches it, it gets blocks for its whole prompt (no token budget) and the step lists it in `pulls`;
while its pull is in flight it is skipped by the pass and counts against `max_num_seqs`.
`remote_kv_done` then marks all but the last prompt token computed (D recomputes that one and
samples the first output token itself), or applies the load-failure policy; the sequence keeps its
place in the queue. A prefill-for-remote-decode sequence finishes holding its blocks, which the
caller hands to the KV connector instead of freeing.

Prefix caching (when the pool is a `prefixcache.CachingBlockPool`, vLLM V1's automatic prefix
caching): a sequence admitted with no blocks first looks up the longest run of cached full blocks
of its tokens, at most (tokens - 1) // block_size blocks (the last token is always computed, to
sample from); it shares those blocks (reference counted) and its chunk starts after them, so the
step's time model charges only the uncached tokens. Prompt blocks are registered under their
chained hash as prefill steps complete them; blocks filled by output tokens when the sequence
finishes or is preempted (no other request can hit those while it runs: they hold its own
samples), which spares the decode steps any hashing. The admission counts its tokens as prefix-cache
queries and the hit tokens as hits (vLLM counts at each lookup; here once per admission). A
remote-KV sequence looks up its own cache the same way when its pull starts: only the blocks past
the local hit are pulled (`num_cached_tokens`), as the NIXL connector reads only the remote blocks
its local prefix cache lacks.

Two departures from vLLM V1: (1) vLLM checks `max_num_seqs` against running requests only, here
pulls in flight count too, so a decode engine does not fill its KV with pulls it has no slot to
run; (2) when the head cannot get blocks and nothing runs, queued sequences already holding their
(pulled) KV are admitted past it: strict FCFS would wedge there for good (a preempted sequence
at the head waiting for blocks held by pulled sequences behind it), as vLLM can.
"""

from __future__ import annotations

import contextlib
import enum
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from tandem.engine.blocks import BlockPool
from tandem.engine.prefixcache import NONE_HASH as _NONE_HASH
from tandem.engine.prefixcache import CachingBlockPool, hash_block_tokens
from tandem.perf import PrefillChunk


class Status(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. Times are engine-clock seconds."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    remote_kv: bool = False  # decode leg of P/D: the prompt's KV comes from a prefill engine
    hold_blocks_on_finish: bool = False  # prefill leg of P/D: keep KV for the decode engine to pull
    reason_at_max_tokens: str = "length"  # "stop" when max_tokens is where the model samples EOS
    status: Status = Status.WAITING
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    pull_started: bool = False
    finish_reason: str | None = None  # "length" | "stop" | "abort" | "error"
    error: str | None = None
    prompt_tokens_from_remote: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished_at: float | None = None
    # Prefix caching: the prompt's tokens and output token i's token (None: never cached or hit).
    tokens: tuple[Hashable, ...] | None = None
    output_token: Callable[[int], Hashable] | None = None
    block_hashes: list[int] = field(default_factory=list)  # of the full blocks hashed so far
    num_registered: int = 0  # leading blocks of `blocks` that are in the cache
    num_cached_tokens: int = 0  # prefix-cache hit of the last admission, in tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.num_output

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


@dataclass
class StepEntry:
    seq: Sequence
    tokens: int
    offset: int

    @property
    def is_decode(self) -> bool:
        return self.offset >= self.seq.prompt_tokens


@dataclass
class Step:
    entries: list[StepEntry] = field(default_factory=list)
    pulls: list[Sequence] = field(default_factory=list)  # start these KV pulls now
    preempted: int = 0
    cache_queries: int = 0  # tokens of the sequences admitted (looked up) in this step
    cache_hits: int = 0  # ... of which were found in the prefix cache

    @property
    def has_compute(self) -> bool:
        return bool(self.entries)

    @property
    def num_tokens(self) -> int:
        return sum(e.tokens for e in self.entries)

    def perf_inputs(self) -> tuple[list[PrefillChunk], int, int]:
        """(prefill chunks, decode batch, decode context tokens) for `Profile.step_seconds`."""
        chunks: list[PrefillChunk] = []
        batch = context = 0
        for e in self.entries:
            if e.offset >= e.seq.prompt_tokens:  # a decode
                batch += 1
                context += e.offset + 1
            else:
                chunks.append(PrefillChunk(e.offset, e.tokens))
        return chunks, batch, context


@dataclass
class StepResult:
    new_tokens: list[Sequence] = field(default_factory=list)  # sampled one token this step
    finished: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        pool: BlockPool | CachingBlockPool,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool,
        recompute_on_kv_failure: bool = False,
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.recompute_on_kv_failure = recompute_on_kv_failure
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.cache = pool if isinstance(pool, CachingBlockPool) else None

    # --- intake -------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING_FOR_REMOTE_KVS if seq.remote_kv else Status.WAITING
        self.waiting.append(seq)

    def abort(self, seq: Sequence, now: float, reason: str = "abort") -> None:
        if seq.finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)
        self._finish(seq, reason, now, hold=False)

    def remote_kv_done(self, seq: Sequence, ok: bool, now: float, error: str | None = None) -> bool:
        """Applies a finished pull; returns False when the request failed (policy `fail`)."""
        if seq.finished:
            return False
        seq.status = Status.WAITING
        if ok:
            seq.num_computed = max(0, seq.prompt_tokens - 1)
            seq.prompt_tokens_from_remote = max(0, seq.num_computed - seq.num_cached_tokens)
            self._register(seq)
            return True
        if self.recompute_on_kv_failure:
            seq.num_computed = min(seq.num_cached_tokens, seq.num_registered * self.block_size)
            return True
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.error = error or "KV transfer failed"
        self._finish(seq, "error", now, hold=False)
        return False

    # --- queries ------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def _blocks_needed(self, seq: Sequence, tokens_after: int) -> int:
        return max(0, math.ceil(tokens_after / self.block_size) - len(seq.blocks))

    def _grow(self, seq: Sequence, tokens_after: int) -> bool:
        if tokens_after <= len(seq.blocks) * self.block_size:
            return True  # the common decode step: the last block still has room
        got = self.pool.allocate(self._blocks_needed(seq, tokens_after))
        if got is None:
            return False
        seq.blocks.extend(got)
        return True

    # --- one step -----------------------------------------------------------------------------
    def schedule(self, now: float) -> Step:
        step = Step()
        budget = self.max_num_batched_tokens
        i = 0
        block_size = self.block_size
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            remaining = seq.prompt_tokens + seq.num_output - seq.num_computed
            n = remaining if remaining < budget else budget
            if n <= 0:
                i += 1
                continue
            preempted_self = False
            while (  # the common decode step: the last block still has room
                seq.num_computed + n > len(seq.blocks) * block_size
                and not self._grow(seq, seq.num_computed + n)
            ):
                victim = self.running[-1]
                self._preempt(victim)
                step.preempted += 1
                if victim is seq:
                    preempted_self = True
                    break
            if preempted_self:
                break
            step.entries.append(StepEntry(seq, n, seq.num_computed))
            budget -= n
            i += 1

        # As vLLM V1: no admission in a step that preempted, unless the preemptions emptied the
        # batch; then vLLM's next schedule comes at once with nothing running, which is this pass.
        if not step.preempted or not self.running:
            self._admit(step, budget, now)
        return step

    def _admit(self, step: Step, budget: int, now: float) -> None:
        """One pass over `waiting` in order, as vLLM V1's scheduler makes it.

        A pull in flight is skipped (it holds its blocks and waits for its KV); a remote-KV sequence
        not yet pulled gets blocks for its whole prompt and joins `step.pulls`, taking no budget;
        any other sequence is admitted with its next chunk. The pass stops at the first sequence
        that cannot get blocks (or budget, or a slot): nothing behind it skips ahead, so a preempted
        sequence at the head is not starved by later pulls. Pulls in flight count against
        `max_num_seqs` with the running sequences.
        """
        active = len(self.running) + sum(
            1 for s in self.waiting if s.status is Status.WAITING_FOR_REMOTE_KVS and s.pull_started
        )
        admitted: list[Sequence] = []
        blocked = False
        for seq in self.waiting:
            if seq.status is Status.WAITING_FOR_REMOTE_KVS and seq.pull_started:
                continue  # its KV is on the way; it does not block the queue
            if budget <= 0 or active >= self.max_num_seqs:
                break
            if seq.status is Status.WAITING_FOR_REMOTE_KVS:
                hits = self._lookup(seq, seq.prompt_tokens - 1)
                if not self._take(seq, hits, seq.prompt_tokens, step):
                    blocked = True
                    break
                seq.pull_started = True
                step.pulls.append(seq)
                active += 1
                continue
            hits = self._lookup(seq, seq.total_tokens - 1)
            computed = len(hits) * self.block_size if hits else seq.num_computed
            remaining = seq.total_tokens - computed
            n = min(remaining, budget)
            if n < remaining and not self.chunked_prefill:
                break
            if not self._take(seq, hits, computed + n, step):
                blocked = True
                break
            budget = self._start(seq, n, step, now, budget)
            admitted.append(seq)
            active += 1
        if blocked and not self.running:
            self._admit_resident(step, budget, now, active, admitted)
        for seq in admitted:
            self.waiting.remove(seq)

    def _admit_resident(
        self, step: Step, budget: int, now: float, active: int, admitted: list[Sequence]
    ) -> None:
        """The head cannot get blocks and nothing runs to free any: queued sequences whose pulled KV
        holds the blocks it waits for go first, or the engine would never step again.

        Strict FCFS deadlocks here (as vLLM V1 can when a preempted request lands ahead of requests
        holding loaded KV); only sequences already holding blocks skip ahead, and only while nothing
        runs, so no new pull takes blocks before the head and its wait stays bounded.
        """
        for seq in self.waiting:
            if budget <= 0 or active >= self.max_num_seqs:
                break
            if seq.status is not Status.WAITING or not seq.blocks:
                continue
            remaining = seq.total_tokens - seq.num_computed
            n = min(remaining, budget)
            if n < remaining and not self.chunked_prefill:
                continue
            if not self._grow(seq, seq.num_computed + n):
                continue
            budget = self._start(seq, n, step, now, budget)
            admitted.append(seq)
            active += 1

    # --- prefix caching -------------------------------------------------------------------------
    def _lookup(self, seq: Sequence, max_tokens: int) -> list[int]:
        """Cached blocks of the sequence's longest cached prefix (at most `max_tokens` tokens), for a
        sequence that holds no blocks; [] without a cache."""
        if self.cache is None or seq.tokens is None or seq.blocks:
            return []
        return self.cache.lookup(self._hashes(seq, max_tokens // self.block_size))

    def _take(self, seq: Sequence, hits: list[int], tokens_after: int, step: Step) -> bool:
        """Gives the sequence the hit blocks and blocks up to `tokens_after` tokens, all or nothing;
        records the lookup when the sequence had no blocks (an admission)."""
        cache = self.cache
        if cache is None or seq.blocks:
            return self._grow(seq, tokens_after)
        fresh = math.ceil(tokens_after / self.block_size) - len(hits)
        if fresh + cache.num_evictable(hits) > cache.num_free:
            return False
        cache.touch(hits)
        seq.blocks = list(hits)
        grown = self._grow(seq, tokens_after)
        assert grown, "blocks were counted"
        seq.num_registered = len(hits)
        seq.num_cached_tokens = len(hits) * self.block_size
        if seq.status is not Status.WAITING_FOR_REMOTE_KVS:
            seq.num_computed = seq.num_cached_tokens  # a pull marks its tokens computed when it lands
        if seq.tokens is not None:
            step.cache_queries += seq.total_tokens
            step.cache_hits += seq.num_cached_tokens
        return True

    def _hashes(self, seq: Sequence, blocks: int) -> list[int]:
        """The chained hashes of the sequence's first `blocks` full blocks (fewer when its tokens
        are not known that far)."""
        hashes = seq.block_hashes
        size = self.block_size
        tokens = seq.tokens or ()
        prompt = seq.prompt_tokens
        while len(hashes) < blocks:
            start = len(hashes) * size
            stop = start + size
            if stop <= prompt:
                if stop > len(tokens):
                    break
                block: tuple[Hashable, ...] | list[Hashable] = tokens[start:stop]
            else:
                if seq.output_token is None or stop > prompt + seq.num_output:
                    break
                head = list(tokens[start:prompt]) if start < prompt else []
                block = head + [seq.output_token(i - prompt) for i in range(max(start, prompt), stop)]
            hashes.append(hash_block_tokens(hashes[-1] if hashes else _NONE_HASH, block))
        return hashes[:blocks]

    def _register(self, seq: Sequence) -> None:
        """Caches the sequence's full blocks that are computed and not cached yet."""
        cache = self.cache
        if cache is None or seq.tokens is None:
            return
        full = min(seq.num_computed // self.block_size, len(seq.blocks))
        if full <= seq.num_registered:
            return
        hashes = self._hashes(seq, full)
        for j in range(seq.num_registered, len(hashes)):
            cache.cache(seq.blocks[j], hashes[j])
        seq.num_registered = max(seq.num_registered, len(hashes))

    def _start(self, seq: Sequence, n: int, step: Step, now: float, budget: int) -> int:
        seq.status = Status.RUNNING
        if seq.first_scheduled is None:
            seq.first_scheduled = now
        self.running.append(seq)
        step.entries.append(StepEntry(seq, n, seq.num_computed))
        return budget - n

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._register(seq)  # its computed blocks stay cached: readmitted, it hits them
        self.pool.free(seq.blocks)
        seq.blocks = []
        seq.num_registered = 0
        seq.num_computed = 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def complete(self, step: Step, now: float) -> StepResult:
        result = StepResult()
        finished = Status.FINISHED
        for entry in step.entries:
            seq = entry.seq
            if seq.status is finished:  # aborted while the step ran
                continue
            seq.num_computed = entry.offset + entry.tokens
            if (
                self.cache is not None
                and entry.offset < seq.prompt_tokens
                and seq.num_computed >= (seq.num_registered + 1) * self.block_size
            ):
                self._register(seq)  # prompt blocks as prefill completes them
            if seq.num_computed < seq.prompt_tokens + seq.num_output:
                continue
            seq.num_output += 1
            if seq.first_token is None:
                seq.first_token = now
            seq.last_token = now
            result.new_tokens.append(seq)
            if seq.num_output >= seq.max_tokens:
                self.running.remove(seq)
                self._finish(seq, seq.reason_at_max_tokens, now, hold=seq.hold_blocks_on_finish)
                result.finished.append(seq)
        return result

    def _finish(self, seq: Sequence, reason: str, now: float, hold: bool) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.finished_at = now
        self._register(seq)
        if not hold:
            self.pool.free(seq.blocks)
            seq.blocks = []
