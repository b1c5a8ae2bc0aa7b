"""vLLM V1's automatic prefix caching in the sim engine: block hashes, the caching pool, the scheduler."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Hashable, Iterable

import pytest

from tandem.engine.prefixcache import NONE_HASH, CachingBlockPool, block_hashes, hash_block_tokens
from tandem.engine.scheduler import Scheduler, Sequence, Status
from tandem.engine.tokens import prompt_tokens_of
from tandem.perf import load_profile

BS = 4  # small blocks keep the hand-made token lists readable

# --- hashing ------------------------------------------------------------------------------------


def test_only_full_blocks_get_a_hash() -> None:
    assert block_hashes([], BS) == []
    assert block_hashes([1, 2, 3], BS) == []
    assert len(block_hashes([1, 2, 3, 4], BS)) == 1
    assert len(block_hashes(list(range(11)), BS)) == 2
    assert len(block_hashes(list(range(12)), BS)) == 3


def test_hashes_chain_over_the_parent() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    hashes = block_hashes(tokens, BS)
    first = hash_block_tokens(NONE_HASH, [1, 2, 3, 4])
    second = hash_block_tokens(first, [5, 6, 7, 8])
    assert hashes[:2] == [first, second]
    assert hashes[2] == hash_block_tokens(second, [9, 10, 11, 12])
    # The same tokens under another parent hash differently: a block's hash names its whole prefix.
    assert hash_block_tokens(NONE_HASH, [5, 6, 7, 8]) != second


def test_same_prefix_same_hashes_different_earlier_block_different_later_hashes() -> None:
    base = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    same_start = [1, 2, 3, 4, 5, 6, 7, 8, 99, 10, 11, 12]
    other_start = [0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    a, b, c = (block_hashes(t, BS) for t in (base, same_start, other_start))
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    assert all(x != y for x, y in zip(a, c, strict=True))  # blocks 1 and 2 equal, hashes not


def test_words_and_ids_hash_as_tokens() -> None:
    words = prompt_tokens_of("the cat sat on the mat, then slept")  # 9 tokens: 2 full blocks
    assert len(block_hashes(words, BS)) == 2
    assert block_hashes(["1", "2", "3", "4"], BS) != block_hashes([1, 2, 3, 4], BS)
    # Tokens are hashed one by one, not as their concatenated text.
    assert block_hashes(["ab", "c", "d", "e"], BS) != block_hashes(["a", "bc", "d", "e"], BS)


def test_hashes_are_the_same_in_another_process() -> None:
    code = "from tandem.engine.prefixcache import block_hashes; print(block_hashes(['a', 1, 'b', 2] * 3, 4))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "4242", "PATH": ""},
    ).stdout.strip()
    assert out == str(block_hashes(["a", 1, "b", 2] * 3, 4))


# --- the pool -----------------------------------------------------------------------------------


def test_freed_blocks_stay_cached_until_evicted_lru_tail_first() -> None:
    pool = CachingBlockPool(6)
    first = pool.allocate(3)
    assert first == [0, 1, 2]
    hashes = block_hashes(list(range(12)), BS)
    for block, h in zip(first, hashes, strict=True):
        assert pool.cache(block, h)
    pool.free(first)
    assert pool.num_free == 6  # cached-free blocks count as free (usage 0), as vLLM's
    assert pool.usage == 0.0
    assert pool.lookup(hashes) == first
    # Fresh blocks come from the head of the free queue: never-used 3, 4, 5 first ...
    assert pool.allocate(3) == [3, 4, 5]
    assert pool.lookup(hashes) == first
    # ... then the least recently freed: the request freed its tail first, so its tail goes first.
    assert pool.allocate(1) == [2]
    assert pool.evictions == 1
    assert pool.lookup(hashes) == [0, 1]
    assert pool.num_cached == 2


def test_blocks_in_use_are_never_evicted() -> None:
    pool = CachingBlockPool(4)
    held = pool.allocate(2)
    assert held is not None
    hashes = block_hashes(list(range(8)), BS)
    for block, h in zip(held, hashes, strict=True):
        pool.cache(block, h)
    assert pool.allocate(3) is None  # only 2 free: nothing is taken, nothing evicted
    assert pool.num_free == 2
    rest = pool.allocate(2)
    assert rest is not None
    assert pool.lookup(hashes) == held
    assert pool.evictions == 0


def test_a_hit_shares_blocks_by_reference() -> None:
    pool = CachingBlockPool(4)
    blocks = pool.allocate(2)
    assert blocks is not None
    hashes = block_hashes(list(range(8)), BS)
    for block, h in zip(blocks, hashes, strict=True):
        pool.cache(block, h)
    pool.free(blocks)
    assert pool.num_evictable(blocks) == 2
    pool.touch(blocks)  # a hit by request two: out of the free queue
    assert pool.num_free == 2
    pool.touch(blocks)  # and request three
    assert pool.ref_count(blocks[0]) == 2
    pool.free(blocks)
    assert pool.num_free == 2  # still held by one request
    assert pool.allocate(4) is None
    pool.free(blocks)
    assert pool.num_free == 4
    assert pool.lookup(hashes) == blocks


def test_a_duplicate_block_is_not_cached_twice() -> None:
    pool = CachingBlockPool(4)
    a, b = pool.allocate(1), pool.allocate(1)
    assert a is not None
    assert b is not None
    h = block_hashes([1, 2, 3, 4], BS)[0]
    assert pool.cache(a[0], h)
    assert not pool.cache(b[0], h)
    assert pool.lookup([h]) == a
    assert not pool.is_cached(b[0])


# --- the scheduler ------------------------------------------------------------------------------


def make(blocks: int = 100, batched: int = 2048, chunked: bool = True) -> Scheduler:
    return Scheduler(CachingBlockPool(blocks), BS, 64, batched, chunked)


def seq(rid: str, tokens: Iterable[Hashable], max_tokens: int = 1, remote_kv: bool = False) -> Sequence:
    units = tuple(tokens)
    s = Sequence(rid, len(units), max_tokens, 0.0, remote_kv=remote_kv)
    s.tokens = units
    s.output_token = lambda i: f"out{i}"
    return s


def run_to_end(sched: Scheduler, start: float = 0.0) -> tuple[int, int]:
    """Steps until idle; (cache queries, cache hits) over them."""
    queries = hits = 0
    t = start
    while sched.has_work:
        step = sched.schedule(t)
        queries, hits = queries + step.cache_queries, hits + step.cache_hits
        t += 1.0
        sched.complete(step, t)
    return queries, hits


def test_a_repeated_prompt_skips_its_cached_blocks() -> None:
    sched = make()
    prompt = list(range(1, 19))  # 18 tokens: 4 full blocks + 2
    sched.add(seq("one", prompt))
    assert run_to_end(sched) == (18, 0)
    again = seq("two", prompt)
    sched.add(again)
    step = sched.schedule(10.0)
    assert [(e.offset, e.tokens) for e in step.entries] == [(16, 2)]  # only the uncached tail
    assert (step.cache_queries, step.cache_hits) == (18, 16)
    assert again.num_cached_tokens == 16
    sched.complete(step, 11.0)
    assert again.finished


def test_a_whole_prompt_in_full_blocks_recomputes_its_last_block() -> None:
    """At most (tokens - 1) // block_size blocks hit: the last token is computed to sample from."""
    sched = make()
    prompt = list(range(1, 17))  # 16 tokens = 4 full blocks
    sched.add(seq("one", prompt))
    run_to_end(sched)
    sched.add(seq("two", prompt))
    step = sched.schedule(10.0)
    assert [(e.offset, e.tokens) for e in step.entries] == [(12, 4)]
    assert step.cache_hits == 12


def test_a_shared_prefix_hits_and_a_different_first_block_does_not() -> None:
    sched = make()
    sched.add(seq("one", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]))
    run_to_end(sched)
    sched.add(seq("longer", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]))
    sched.add(seq("other", [0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]))
    step = sched.schedule(10.0)
    assert sorted((e.seq.request_id, e.offset, e.tokens) for e in step.entries) == [
        ("longer", 8, 6),
        ("other", 0, 14),
    ]
    assert (step.cache_queries, step.cache_hits) == (28, 8)


def test_cached_tokens_cost_no_prefill_time() -> None:
    profile = load_profile("meta-llama/Llama-3.1-8B-Instruct", "H100", 1)
    prompt = list(range(4000))
    sched = make(blocks=2000, batched=8192)
    sched.add(seq("one", prompt))
    first = sched.schedule(0.0)
    cold = profile.step_seconds(*first.perf_inputs())
    sched.complete(first, 1.0)
    sched.add(seq("two", prompt))
    second = sched.schedule(2.0)
    warm = profile.step_seconds(*second.perf_inputs())
    assert [(e.offset, e.tokens) for e in second.entries] == [(3996, 4)]
    assert warm < cold / 10, (warm, cold)  # a step's fixed cost stays


def test_output_blocks_are_cached_for_the_next_turn() -> None:
    """A conversation's next prompt is its last prompt plus the answer's tokens: those hit too."""
    sched = make()
    prompt = [1, 2, 3, 4, 5, 6]
    first = seq("turn1", prompt, max_tokens=7)
    sched.add(first)
    run_to_end(sched)
    answer = [first.output_token(i) for i in range(7)] if first.output_token else []
    nxt = seq("turn2", [*prompt, *answer, 7, 8, 9])  # 6 + 7 + 3 = 16 tokens
    sched.add(nxt)
    step = sched.schedule(20.0)
    # 12 computed tokens (6 prompt + 6 fed back outputs) are 3 full blocks; the 7th output was
    # sampled but never fed back through the model, so its block was not complete.
    assert step.cache_hits == 12


def test_eviction_under_pressure_and_running_blocks_kept() -> None:
    sched = make(blocks=6)
    old = list(range(100, 116))  # 4 blocks
    sched.add(seq("old", old))
    run_to_end(sched)
    runner = seq("runner", list(range(200, 208)), max_tokens=50)  # 2 blocks + growth
    sched.add(runner)
    sched.complete(sched.schedule(10.0), 11.0)
    cache = sched.cache
    assert cache is not None
    # runner took the 2 never-used blocks; old's 4 are cached-free. Growing runner evicts old's tail.
    for t in range(12, 20):
        sched.complete(sched.schedule(float(t)), float(t + 1))
    assert cache.evictions >= 1
    assert all(cache.ref_count(b) == 1 for b in runner.blocks)
    hashes = block_hashes(old, BS)
    held = cache.lookup(hashes)
    assert len(held) < 4  # the tail went first ...
    assert held == cache.lookup(hashes[: len(held)])  # ... and what is left is a head


def test_preempted_sequence_hits_its_own_blocks_on_readmission() -> None:
    """Two sequences outgrow 11 blocks: the newer is preempted with 9 outputs (20 tokens computed,
    5 full blocks cached). The survivor's growth evicts the victim's tail block; readmitted, the
    victim hits its other 4 blocks, prompt and first output block, and computes only the rest."""
    sched = Scheduler(CachingBlockPool(11), BS, 64, 2048, True)
    a = seq("a", list(range(12)), max_tokens=16)  # 3 blocks, 7 at the end
    b = seq("b", list(range(50, 62)), max_tokens=16)
    sched.add(a)
    sched.add(b)
    t = 0.0
    while sched.num_preemptions == 0:
        step = sched.schedule(t)
        t += 1
        sched.complete(step, t)
    assert b.status is Status.WAITING
    assert (b.num_computed, b.num_output, b.blocks) == (0, 9, [])
    while not a.finished:
        step = sched.schedule(t)
        t += 1
        sched.complete(step, t)
    step = sched.schedule(t)
    assert [(e.seq.request_id, e.offset, e.tokens) for e in step.entries] == [("b", 16, 5)]
    assert b.num_cached_tokens == 16
    assert (step.cache_queries, step.cache_hits) == (21, 16)
    assert sched.num_preemptions == 1


def test_remote_kv_pulls_only_past_the_local_hit() -> None:
    sched = make()
    prompt = list(range(1, 23))  # 22 tokens
    sched.add(seq("local", prompt[:13]))  # caches 3 blocks (12 tokens)
    run_to_end(sched)
    remote = seq("remote", prompt, max_tokens=2, remote_kv=True)
    sched.add(remote)
    step = sched.schedule(10.0)
    assert step.pulls == [remote]
    assert remote.num_cached_tokens == 12
    assert remote.num_computed == 0  # marked computed when the pull lands
    assert len(remote.blocks) == 6  # 3 shared + 3 new for the pulled part
    assert (step.cache_queries, step.cache_hits) == (22, 12)
    assert sched.remote_kv_done(remote, True, 11.0)
    assert remote.num_computed == 21
    assert remote.prompt_tokens_from_remote == 21 - 12
    run_to_end(sched, 12.0)
    # The pulled blocks are cached on this engine now: the next turn pulls even less.
    nxt = seq("next", [*prompt, 30, 31], remote_kv=True)
    sched.add(nxt)
    sched.schedule(20.0)
    assert nxt.num_cached_tokens == 20


def test_without_tokens_nothing_is_cached_or_counted() -> None:
    sched = make()
    plain = Sequence("plain", 20, 1, 0.0)
    sched.add(plain)
    assert run_to_end(sched) == (0, 0)
    again = Sequence("again", 20, 1, 0.0)
    sched.add(again)
    step = sched.schedule(5.0)
    assert [(e.offset, e.tokens) for e in step.entries] == [(0, 20)]


@pytest.mark.parametrize("chunked", [True, False])
def test_hit_admits_what_would_not_fit_the_budget(chunked: bool) -> None:
    sched = make(batched=8, chunked=chunked)
    prompt = list(range(1, 31))  # 30 tokens
    sched.add(seq("one", prompt))
    if not chunked:
        # Without chunking, 30 tokens never fit a budget of 8: it waits.
        assert not sched.schedule(0.0).has_compute
        return
    run_to_end(sched)
    sched.add(seq("two", prompt))
    step = sched.schedule(10.0)
    assert [(e.offset, e.tokens) for e in step.entries] == [(28, 2)]
