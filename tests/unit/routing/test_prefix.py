"""The prefix-aware prefill choice: chained keys, the learned index, bounded load."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.api.models import PrefixAwareSpec
from tandem.routing.prefix import (
    KEY_BLOCKS,
    MAX_BLOCK_CHARS,
    MAX_BLOCKS,
    PodLoad,
    PrefixIndex,
    PrefixKnobs,
    chain_keys,
    choose_prefill,
    prompt_text,
    sparse_keys,
    text_keys,
)

A, B, C = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"
KNOBS = PrefixKnobs(block_chars=8, max_blocks=64, load_bound=1.25, tokens_per_request=100.0)


def idle(*names: str) -> list[PodLoad]:
    return [PodLoad(name, 0, 0) for name in names]


# --- keys ---------------------------------------------------------------------------------------


def test_chain_keys_same_prefix_same_keys_and_chaining() -> None:
    one = chain_keys(["aaaa", "bbbb", "cccc"])
    two = chain_keys(["aaaa", "bbbb", "dddd"])
    assert one[:2] == two[:2]
    assert one[2] != two[2]
    # A different earlier block changes every later key, even where the blocks are equal.
    three = chain_keys(["zzzz", "bbbb", "cccc"])
    assert all(x != y for x, y in zip(one, three, strict=True))
    # Key i depends on blocks 0..i only.
    assert chain_keys(["aaaa"]) == one[:1]
    assert len(set(one)) == 3


def test_chain_keys_types_do_not_collide() -> None:
    assert chain_keys([1]) != chain_keys(["1"])
    assert chain_keys([(1, 2)]) != chain_keys([(12,)])
    assert chain_keys([(1, 2), (3,)]) == chain_keys([(1, 2), (3,)])
    assert chain_keys([]) == []


def test_chain_keys_are_the_same_in_another_process() -> None:
    code = "from tandem.routing.prefix import chain_keys; print(chain_keys(['ab', (1, 2), 7]))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    ).stdout.strip()
    assert out == str(chain_keys(["ab", (1, 2), 7]))


def test_key_blocks_are_each_power_of_two_and_one_and_a_half_times_it() -> None:
    assert KEY_BLOCKS[:14] == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
    assert KEY_BLOCKS[-2:] == (3072, MAX_BLOCKS)
    assert len(KEY_BLOCKS) == 24


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("", 0),
        ("x" * 7, 0),
        ("x" * 8, 1),  # one full chunk of 8
        ("x" * 15, 1),
        ("x" * 16, 2),
        ("x" * 40, 4),  # 5 chunks: keys at 1, 2, 3, 4
        ("x" * 48, 5),  # 6 chunks: and 6
        ("x" * 1000, 12),  # 125 chunks, capped at max_blocks 64: 1 ... 48, 64
    ],
)
def test_text_keys_full_chunks_only_sampled_capped(text: str, keys: int) -> None:
    assert len(text_keys(text, KNOBS)) == keys


def test_sparse_keys_pick_the_keys_ending_at_key_blocks() -> None:
    dense = list(range(100, 200))  # 100 blocks
    assert sparse_keys(dense) == [100 + count - 1 for count in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96)]
    assert sparse_keys([]) == []


def test_text_keys_extend_when_a_conversation_grows() -> None:
    first = text_keys("system prompt, then turn one", KNOBS)
    second = text_keys("system prompt, then turn one, and turn two", KNOBS)
    assert second[: len(first)] == first
    assert len(second) > len(first)


def test_text_keys_are_the_same_in_another_process_and_name_the_prefix() -> None:
    text = "shared head " * 10 + "and a tail"
    code = (
        "from tandem.routing.prefix import PrefixKnobs, text_keys; "
        f"print(text_keys({text!r}, PrefixKnobs(8)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "777", "PATH": ""},
    ).stdout.strip()
    assert out == str(text_keys(text, KNOBS))
    keys = text_keys(text, KNOBS)
    assert len(set(keys)) == len(keys)  # "shared h", "ead shar", ...: equal chunks, distinct prefixes
    other = text_keys("X" + text[1:], KNOBS)
    assert all(a != b for a, b in zip(keys, other, strict=True))  # a different first chunk: all differ


@settings(max_examples=300, deadline=None)
@given(
    a=st.text(alphabet="ab", max_size=80),
    b=st.text(alphabet="ab", max_size=80),
    size=st.integers(1, 9),
)
def test_text_keys_agree_exactly_where_the_prefixes_do(a: str, b: str, size: int) -> None:
    """Key j of two texts is equal exactly when their first KEY_BLOCKS[j] chunks are: a two-letter
    alphabet and short chunks make shared and near-miss prefixes common."""
    knobs = PrefixKnobs(block_chars=size, max_blocks=MAX_BLOCKS)
    for j, (key_a, key_b) in enumerate(zip(text_keys(a, knobs), text_keys(b, knobs), strict=False)):
        end = KEY_BLOCKS[j] * size
        assert (key_a == key_b) == (a[:end] == b[:end])


@pytest.mark.parametrize("offset", [0, 1, 7, 8, 63, 64, 500, 6143])
@pytest.mark.parametrize("byte", [1, 128, 255])
def test_one_changed_byte_changes_the_keys_past_it_and_no_earlier_one(offset: int, byte: int) -> None:
    """Any single byte changed anywhere, by any amount, changes every key whose prefix holds it."""
    knobs = PrefixKnobs(block_chars=64, max_blocks=MAX_BLOCKS)
    text = "".join(chr(32 + i % 90) for i in range(6912))  # 108 chunks: keys up to 96 chunks (6,144)
    changed = text[:offset] + chr(ord(text[offset]) ^ byte) + text[offset + 1 :]
    keys, other = text_keys(text, knobs), text_keys(changed, knobs)
    assert len(keys) == len(other) == 13
    first = next(j for j, count in enumerate(KEY_BLOCKS) if count * 64 > offset)
    assert keys[:first] == other[:first]
    assert all(x != y for x, y in zip(keys[first:], other[first:], strict=False))


def test_text_keys_at_the_largest_knobs() -> None:
    knobs = PrefixKnobs(block_chars=MAX_BLOCK_CHARS, max_blocks=MAX_BLOCKS)
    assert len(text_keys("x" * (MAX_BLOCK_CHARS * 3 + 1), knobs)) == 3
    small = PrefixKnobs(block_chars=1, max_blocks=MAX_BLOCKS)
    assert len(text_keys("y" * (MAX_BLOCKS + 5), small)) == len(KEY_BLOCKS)


def test_knob_bounds_are_the_specs() -> None:
    """The CRD's bounds for blockChars and maxBlocks are the knobs' (KEY_BLOCKS reaches maxBlocks)."""

    def most(field: str) -> object:
        return next(m.le for m in PrefixAwareSpec.model_fields[field].metadata if hasattr(m, "le"))

    assert most("block_chars") == MAX_BLOCK_CHARS
    assert most("max_blocks") == MAX_BLOCKS


def test_text_keys_chunk_utf8_bytes() -> None:
    assert len(text_keys("é" * 8, KNOBS)) == 2  # 16 bytes: two chunks of 8


def test_prompt_text() -> None:
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    assert prompt_text(chat) == "<|system|>\nbe brief\n<|user|>\nhi\n"
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}]}
    assert prompt_text(parts) == "<|user|>\na b\n"
    assert prompt_text({"prompt": "hello"}) == "hello"
    assert prompt_text({"prompt": ["hello"]}) == "hello"
    assert prompt_text({"prompt": [1, 2, 3]}) == "1,2,3,"
    assert prompt_text({"prompt": None}) == ""
    # A longer conversation's text starts with the shorter one's.
    longer = {"messages": [*chat["messages"], {"role": "assistant", "content": "hello"}]}
    assert prompt_text(longer).startswith(prompt_text(chat))


# --- index --------------------------------------------------------------------------------------


def test_index_matches_leading_blocks_only() -> None:
    index = PrefixIndex(capacity_blocks_per_pod=100)
    keys = chain_keys(["a", "b", "c", "d"])
    index.record(A, keys[:3])
    assert index.matched_keys(A, keys) == 3
    assert index.matched_keys(A, keys[:2]) == 2
    assert index.matched_keys(B, keys) == 0
    assert index.matched_keys(A, chain_keys(["x", "b", "c"])) == 0
    assert index.matched_keys(A, []) == 0


def test_index_lru_evicts_least_recent_and_tails_first() -> None:
    index = PrefixIndex(capacity_blocks_per_pod=4)
    old = chain_keys(["o1", "o2", "o3"])
    new = chain_keys(["n1", "n2"])
    index.record(A, old)
    index.record(A, new)  # 5 blocks > 4: the oldest entry goes, which is old's tail block
    assert index.size(A) == 4
    assert index.matched_keys(A, old) == 2
    assert index.matched_keys(A, new) == 2
    index.record(A, old[:1])  # touch old's head: now the least recent is old's second block
    index.record(A, chain_keys(["m1"]))
    assert index.matched_keys(A, old) == 1
    assert index.matched_keys(A, new) == 2


def test_index_forget_pod() -> None:
    index = PrefixIndex(capacity_blocks_per_pod=10)
    keys = chain_keys(["a", "b"])
    index.record(A, keys)
    index.record(B, keys)
    index.forget_pod(A)
    assert index.matched_keys(A, keys) == 0
    assert index.matched_keys(B, keys) == 2
    assert index.pods() == [B]
    with pytest.raises(ValueError, match="capacity_blocks_per_pod"):
        PrefixIndex(0)


# --- choice -------------------------------------------------------------------------------------


def test_no_pods_no_choice() -> None:
    assert choose_prefill([], chain_keys(["a"]), PrefixIndex(10), KNOBS) is None


@pytest.mark.parametrize(
    ("held", "loads", "expected", "why"),
    [
        ({A: 3, B: 1}, {A: (0, 0), B: (0, 0)}, A, "longest cached prefix wins"),
        ({A: 1, B: 3}, {A: (0, 0), B: (0, 0)}, B, "longest cached prefix wins"),
        ({A: 3, B: 1}, {A: (1, 0), B: (0, 0)}, A, "a small load difference is within the bound"),
        ({A: 3, B: 1}, {A: (5, 0), B: (0, 0)}, B, "A over 1.25 x mean + 1 = 4.1: next best prefix"),
        ({A: 3, B: 0}, {A: (5, 0), B: (0, 0), C: (0, 0)}, C, "bound 3.1: A out; B, C tie: lighter/hash"),
        ({A: 2, B: 2}, {A: (2, 0), B: (1, 0)}, B, "equal prefix: the lighter pod"),
        ({}, {A: (2, 0), B: (1, 0), C: (3, 0)}, B, "no prefix anywhere: the least loaded"),
        ({A: 2}, {A: (1, 300), B: (1, 0)}, A, "tokens count: A weighs 4 <= 1.25 x mean 2.5 + 1"),
        ({A: 2}, {A: (1, 500), B: (1, 0)}, B, "A weighs 6 > 1.25 x mean 3.5 + 1 = 5.4: out"),
        ({A: 2}, {A: (1, 200), B: (1, 0)}, A, "A weighs 3 <= 1.25 x mean 2 + 1 = 3.5"),
    ],
)
def test_choice_table(
    held: dict[str, int], loads: dict[str, tuple[int, int]], expected: str, why: str
) -> None:
    keys = chain_keys(["k1", "k2", "k3", "k4"])
    index = PrefixIndex(100)
    for pod, blocks in held.items():
        index.record(pod, keys[:blocks])
    pods = [PodLoad(name, r, t) for name, (r, t) in loads.items()]
    assert choose_prefill(pods, keys, index, KNOBS) == expected, why
    # Pure: the same inputs give the same answer and the index is unchanged.
    before = {pod: index.matched_keys(pod, keys) for pod in (A, B, C)}
    assert choose_prefill(pods, keys, index, KNOBS) == expected
    assert {pod: index.matched_keys(pod, keys) for pod in (A, B, C)} == before


def test_idle_pool_spreads_new_prefixes_and_sticks() -> None:
    index = PrefixIndex(1000)
    pods = idle(A, B, C)
    chosen = {}
    for n in range(60):
        keys = chain_keys([f"conversation {n}", "turn"])
        chosen[n] = choose_prefill(pods, keys, index, KNOBS)
        assert chosen[n] is not None
        index.record(chosen[n] or "", keys)
    counts = {pod: list(chosen.values()).count(pod) for pod in (A, B, C)}
    assert all(count >= 10 for count in counts.values()), counts  # rendezvous spreads them
    # Each conversation's next turn goes back to its pod, whatever the order of the pods.
    for n in range(60):
        keys = chain_keys([f"conversation {n}", "turn", "next turn"])
        assert choose_prefill(list(reversed(pods)), keys, index, KNOBS) == chosen[n]


def test_hot_prefix_is_bounded_and_replicated() -> None:
    """Every request shares one prefix. Requests arrive and stay outstanding (no completions): the
    pod holding the prefix takes them while within the bound, then the others take their share and
    learn the prefix too; no pod ever exceeds 1.25 x mean + 1 at the time it is chosen."""
    index = PrefixIndex(1000)
    outstanding = {A: 0, B: 0, C: 0}
    hot = ["system prompt " * 4, "tools"]
    index.record(A, chain_keys(hot))
    picks: list[str] = []
    for n in range(90):
        keys = chain_keys([*hot, f"question {n}"])
        pods = [PodLoad(name, count, 0) for name, count in outstanding.items()]
        mean = sum(outstanding.values()) / 3
        pick = choose_prefill(pods, keys, index, KNOBS)
        assert pick is not None
        assert outstanding[pick] <= 1.25 * mean + 1
        outstanding[pick] += 1
        index.record(pick, keys)
        picks.append(pick)
    assert picks[0] == A
    assert picks[:2] == [A, A]  # the holder first, until it is past the bound
    assert max(outstanding.values()) <= 1.25 * 30 + 1, outstanding
    assert min(outstanding.values()) >= 25, outstanding
    # The prefix is now on every pod: a new request finds its 2 blocks wherever it goes.
    keys = chain_keys([*hot, "new question"])
    assert all(index.matched_keys(pod, keys) == 2 for pod in (A, B, C))


def test_hot_prefix_with_completions_prefers_the_holder_while_it_keeps_up() -> None:
    """Requests finish as fast as they come (load stays low): they all stay on the holder."""
    index = PrefixIndex(1000)
    hot = ["shared document " * 2]
    index.record(B, chain_keys(hot))
    for n in range(30):
        keys = chain_keys([*hot, f"q{n}"])
        pick = choose_prefill([PodLoad(A, 0, 0), PodLoad(B, 1, 0), PodLoad(C, 0, 0)], keys, index, KNOBS)
        assert pick == B  # load 1 <= 1.25 * 1/3 + 1
        index.record(B, keys)


def test_pods_leaving_and_joining() -> None:
    index = PrefixIndex(1000)
    keys = chain_keys(["conversation", "turn one"])
    index.record(A, keys)
    assert choose_prefill(idle(A, B), keys, index, KNOBS) == A
    # A leaves the pool (the router forgets it): the request goes elsewhere and is learnt there.
    index.forget_pod(A)
    pick = choose_prefill(idle(B, C), keys, index, KNOBS)
    assert pick in (B, C)
    index.record(pick or "", keys)
    # A comes back empty (a new pod with the same address): the holder stays the one that learnt.
    assert choose_prefill(idle(A, B, C), keys, index, KNOBS) == pick


def test_single_pod_always_chosen_even_when_loaded() -> None:
    keys = chain_keys(["a"])
    assert choose_prefill([PodLoad(A, 50, 10_000)], keys, PrefixIndex(10), KNOBS) == A


def test_no_keys_is_load_only() -> None:
    pods = [PodLoad(A, 2, 0), PodLoad(B, 0, 0), PodLoad(C, 1, 0)]
    assert choose_prefill(pods, [], PrefixIndex(10), KNOBS) == B


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_chars": 0},
        {"block_chars": MAX_BLOCK_CHARS + 1},
        {"max_blocks": 0},
        {"max_blocks": MAX_BLOCKS + 1},
        {"load_bound": 0.9},
        {"tokens_per_request": 0.0},
    ],
)
def test_knobs_are_checked(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PrefixKnobs(**kwargs)  # type: ignore[arg-type]


def _linear_matched(index: PrefixIndex, pod: str, keys: list[int]) -> int:
    count = 0
    for key in keys:
        if key not in index._pods.get(pod, {}):
            break
        count += 1
    return count


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 40),
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=30),
    probe=st.lists(st.integers(0, 3), min_size=0, max_size=14),
)
def test_matched_keys_by_bisection_equals_the_first_miss(
    capacity: int, prompts: list[list[int]], probe: list[int]
) -> None:
    """What `record` and LRU eviction leave is closed under prefixes, so the binary search finds the
    same count as walking to the first missing key, whatever was recorded and evicted."""
    index = PrefixIndex(capacity)
    for i, chunks in enumerate(prompts):
        index.record(f"pod{i % 2}", chain_keys(chunks))
        if i % 7 == 6:
            index.resize(max(1, capacity // 2))
    keys = chain_keys(probe)
    for pod in ("pod0", "pod1"):
        assert index.matched_keys(pod, keys) == _linear_matched(index, pod, keys)


def test_the_index_counts_the_blocks_each_sampled_key_stands_for() -> None:
    keys = chain_keys(list(range(6)))  # keys ending at blocks 1, 2, 3, 4, 6, 8: 1+1+1+1+2+2 blocks
    index = PrefixIndex(capacity_blocks_per_pod=100)
    index.record(A, keys)
    assert index.size(A) == 8
    index.resize(6)  # the last key (blocks 7-8) goes first
    assert (index.size(A), index.matched_keys(A, keys)) == (6, 5)
    index.resize(3)
    assert (index.size(A), index.matched_keys(A, keys)) == (3, 3)
    small = PrefixIndex(capacity_blocks_per_pod=1)
    small.record(B, keys)
    assert (small.size(B), small.matched_keys(B, keys)) == (1, 1)
    with pytest.raises(ValueError, match="at most 24 keys"):
        index.record(A, list(range(25)))
