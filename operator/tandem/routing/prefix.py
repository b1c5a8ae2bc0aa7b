"""Prefix-aware choice of the prefill pod: expected prefix-cache hit against load. Pure.

No I/O, no clock, no randomness. The router and the cluster simulator both call `choose_prefill`.

Keys. A request's prompt is cut into blocks and each block gets a key chained over the blocks
before it (`chain_keys`), as vLLM's automatic prefix caching hashes token blocks: key i stands
for the whole prefix made of blocks 0..i, so two prompts share key i exactly when they share
their first i+1 blocks. Only full blocks get keys (vLLM caches full blocks only). The simulator
passes token blocks (or trace block hashes) to `chain_keys`; the router, which has no tokenizer,
keys text chunks of `block_chars` characters (`text_keys`, a cheaper prefix hash of the same
meaning). A text chunk is not an engine block: with about
4 characters per token and 16-token engine blocks, 64 characters is about one engine block, but
the boundaries do not line up and the ratio depends on the text. What carries over is the order:
a request whose first k chunks match another's shares at least about k * block_chars characters of
prompt with it, so the pod that prefilled the other holds about that many tokens' worth of blocks
(unless it evicted them since). The index is an estimate of the engines' caches, not a copy.

Sampled keys. The choice does not use every block's key, only those ending at the block counts of
`KEY_BLOCKS` (1, 2, 3, 4, 6, 8, 12, 16, 24, ...: each power of two and 1.5 times it): a prompt of
n blocks has about 2 log2(n) keys (13 for 108 blocks) instead of n (`sparse_keys` picks them from
`chain_keys`' list; `text_keys` computes only those). A match is then known to within a third of
its length (a pod holding 100 blocks of a prompt counts as holding 96), which is as fine as a
choice between pods needs: which pod holds the most, not exactly how much. The cost per request
falls with the count: in the router under load (256 streams), keys, choice and record of a
108-chunk prompt took 45 us sampled against 120 us for every chunk's key.

Index. `PrefixIndex` remembers which pod was sent which keys: the balancer's own choices, not the
engines' state. Each pod has an LRU of keys holding at most `capacity_blocks_per_pod` blocks, each
sampled key counting for the blocks since the one before it, approximating the engine's cache
size; a recorded prompt touches its tail keys first and its head last, so under pressure a prefix
loses its tail first, as vLLM's free-block queue evicts a request's tail blocks first.

Choice (bounded load). A pod's load is `outstanding_requests + outstanding_tokens /
tokens_per_request`. A pod is eligible when its load is at most `load_bound * mean load + 1`
(the "+1" lets an idle pool take a request anywhere); among eligible pods the one with the most
leading keys held wins, ties to the lighter pod, then to a rendezvous hash of the first key
past the matched ones (so different new prompts spread over an idle pool, even when they share a
system prompt every pod holds, and the same prompt goes to the same pod). A request with no cached
prefix anywhere eligible goes to the least-loaded pod the same way. So a hot prefix fills the pod
that holds it up to the bound, then spills to the next-best pod, which records it too: the hot
prefix is replicated instead of overloading one pod. While load is low, prompts sharing a prefix
held by one pod all go there (a hit, and the pod has room): expected hit wins until load says no.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import zlib
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "KEY_BLOCKS",
    "MAX_BLOCKS",
    "MAX_BLOCK_CHARS",
    "PREFILL_POLICIES",
    "PodLoad",
    "PrefillPolicy",
    "PrefixIndex",
    "PrefixKnobs",
    "PrefixSettings",
    "chain_keys",
    "choose_prefill",
    "prompt_text",
    "sparse_keys",
    "text_keys",
]

_ROOT: Final = b"tandem-prefix-v1"

# How the router picks prefill (and colocated) pods: by expected prefix hit against load, by load
# only (power of two choices), or in turn (round-robin over the healthy untried pods).
PrefillPolicy = Literal["PrefixAware", "LeastLoaded", "RoundRobin"]
PREFILL_POLICIES: Final[tuple[PrefillPolicy, ...]] = ("PrefixAware", "LeastLoaded", "RoundRobin")


@dataclass(frozen=True)
class PodLoad:
    """One candidate prefill (or colocated) pod and its outstanding work."""

    name: str
    outstanding_requests: int
    outstanding_tokens: int  # prompt tokens (or an estimate) queued or in prefill on it


# The most `block_chars` and `max_blocks` can be (spec.router.prefixAware's bounds, the CRD's too).
MAX_BLOCK_CHARS: Final = 8192
MAX_BLOCKS: Final = 4096


def _key_blocks(limit: int) -> tuple[int, ...]:
    counts: list[int] = []
    power = 1
    while power <= limit:
        counts.append(power)
        if power >= 2 and power * 3 // 2 <= limit:
            counts.append(power * 3 // 2)
        power *= 2
    return tuple(counts)


# The block counts whose prefixes get a key: 1, 2, 3, 4, 6, 8, 12, ..., 3072, 4096 (24 of them).
KEY_BLOCKS: Final = _key_blocks(MAX_BLOCKS)
# The blocks each of those keys stands for in the index: those since the key before it.
_KEY_WEIGHTS: Final = tuple(b - a for a, b in zip((0, *KEY_BLOCKS), KEY_BLOCKS, strict=False))


@dataclass(frozen=True)
class PrefixKnobs:
    block_chars: int = 64  # router: characters per text chunk (~16 tokens at ~4 characters a token)
    max_blocks: int = 256  # leading blocks considered (keys beyond are not computed)
    load_bound: float = 1.25  # c >= 1: eligible only if load <= c * mean load + 1
    tokens_per_request: float = 512.0  # outstanding tokens that weigh as much as one request

    def __post_init__(self) -> None:
        if not 1 <= self.block_chars <= MAX_BLOCK_CHARS:
            raise ValueError(f"block_chars must be between 1 and {MAX_BLOCK_CHARS}")
        if not 1 <= self.max_blocks <= MAX_BLOCKS:
            raise ValueError(f"max_blocks must be between 1 and {MAX_BLOCKS}")
        if self.load_bound < 1.0:
            raise ValueError("load_bound must be at least 1")
        if self.tokens_per_request <= 0:
            raise ValueError("tokens_per_request must be positive")


DEFAULT_INDEX_BLOCKS_PER_POD: Final = 32768


@dataclass(frozen=True)
class PrefixSettings:
    """The router's prefix-aware choice as configured: spec.router.prefixAware, or flags."""

    enabled: bool = True
    knobs: PrefixKnobs = PrefixKnobs()
    index_blocks_per_pod: int = DEFAULT_INDEX_BLOCKS_PER_POD
    # spec.router.prefillPolicy: None = by `enabled` (PrefixAware when on, LeastLoaded when off).
    policy: PrefillPolicy | None = None

    @property
    def prefill_policy(self) -> PrefillPolicy:
        """The policy in force: `policy` when set, else PrefixAware or LeastLoaded by `enabled`."""
        if self.policy is not None:
            return self.policy
        return "PrefixAware" if self.enabled else "LeastLoaded"

    @classmethod
    def from_spec(
        cls, spec: Mapping[str, Any] | None, base: PrefixSettings | None = None, policy: object = None
    ) -> PrefixSettings:
        """From spec.router.prefixAware (camelCase) and spec.router.prefillPolicy (`policy`); fields
        they lack keep `base`'s (else defaults). A value of the wrong type or out of range keeps the
        base's too (the CRD refuses those)."""
        base = base or cls()
        if policy in PREFILL_POLICIES:
            base = dataclasses.replace(base, policy=policy)
        if not spec:
            return base
        knobs = base.knobs

        def number(key: str, current: float, lowest: float, integer: bool, highest: float = math.inf) -> Any:
            value = spec.get(key)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not lowest <= value <= highest
            ):
                return current
            if integer and not isinstance(value, int):
                return current
            return value

        enabled = spec.get("enabled")
        return cls(
            enabled=enabled if isinstance(enabled, bool) else base.enabled,
            knobs=PrefixKnobs(
                block_chars=number("blockChars", knobs.block_chars, 1, True, MAX_BLOCK_CHARS),
                max_blocks=number("maxBlocks", knobs.max_blocks, 1, True, MAX_BLOCKS),
                load_bound=float(number("loadBound", knobs.load_bound, 1.0, False)),
                tokens_per_request=knobs.tokens_per_request,
            ),
            index_blocks_per_pod=number("indexBlocksPerPod", base.index_blocks_per_pod, 1, True),
            policy=base.policy,
        )


def _item_bytes(item: Hashable) -> bytes:
    """A stable byte form of one block (no Python `hash()`: it is randomised per process)."""
    if isinstance(item, str):
        return b"s" + item.encode()
    if isinstance(item, bytes):
        return b"b" + item
    if isinstance(item, bool):
        return b"o" + (b"1" if item else b"0")
    if isinstance(item, int):
        return b"i" + str(item).encode()
    if isinstance(item, tuple):
        return b"t(" + b",".join(_item_bytes(part) for part in item) + b")"
    return b"r" + repr(item).encode()


def chain_keys(block_tokens_or_chunks: Sequence[Hashable]) -> list[int]:
    """Key i = hash(key i-1, block i): 64-bit, the same in every process (blake2b)."""
    keys: list[int] = []
    parent = _ROOT
    for item in block_tokens_or_chunks:
        digest = hashlib.blake2b(parent + _item_bytes(item), digest_size=8).digest()
        keys.append(int.from_bytes(digest, "little"))
        parent = digest
    return keys


def sparse_keys(keys: Sequence[int]) -> list[int]:
    """The keys of `chain_keys`' list (one per block) that the choice uses: those ending at the block
    counts of `KEY_BLOCKS`."""
    return [keys[count - 1] for count in KEY_BLOCKS if count <= len(keys)]


def text_keys(text: str, knobs: PrefixKnobs) -> list[int]:
    """The sampled keys of the text's full `block_chars` chunks (of its UTF-8 bytes: characters, for
    ASCII), counting at most `max_blocks` chunks: key j is a 64-bit hash of the text up to the end of
    chunk `KEY_BLOCKS[j]`.

    The router's hot path, so cheaper than `chain_keys`: CRC-32 and Adler-32 carried from one
    sampled end to the next, which is the CRC and Adler of the whole prefix, as chaining names the
    whole prefix; one C call each per key (13 for 108 chunks), none per chunk. Deterministic across
    processes. Not collision-resistant: a collision only makes the router believe a pod holds more
    of a prompt than it does."""
    data = memoryview(text.encode())
    size = knobs.block_chars
    chunks = min(len(data) // size, knobs.max_blocks)
    keys: list[int] = []
    crc, adler, start = 0, 1, 0
    crc32, adler32 = zlib.crc32, zlib.adler32
    for count in KEY_BLOCKS:
        if count > chunks:
            break
        end = count * size
        segment = data[start:end]
        crc = crc32(segment, crc)
        adler = adler32(segment, adler)
        keys.append(crc << 32 | adler)
        start = end
    return keys


def prompt_text(body: Mapping[str, Any]) -> str:
    """The text a request's prompt is made of, in order: chat messages (role and text) or the prompt.

    Token-id prompts become their ids as text. Only the prefix matters, so anything the engine's
    chat template adds around the messages is left out (it is the same for every request)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            parts.append(f"<|{message.get('role', 'user')}|>\n{content or ''}\n")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return ",".join(str(t) for t in prompt) + ","
    return ""


class PrefixIndex:
    """Which pod is believed to hold which key, learned from the balancer's own choices, with a
    per-pod LRU capacity in blocks (approximating the engine's cache).

    Keys are a prompt's sampled keys, as `text_keys` and `sparse_keys` give them: key j of a list
    ends at block `KEY_BLOCKS[j]` and counts for the blocks since key j-1."""

    def __init__(self, capacity_blocks_per_pod: int) -> None:
        if capacity_blocks_per_pod < 1:
            raise ValueError("capacity_blocks_per_pod must be at least 1")
        self.capacity_blocks_per_pod = capacity_blocks_per_pod
        self._pods: dict[str, OrderedDict[int, int]] = {}  # key -> the blocks it counts for
        self._blocks: dict[str, int] = {}  # blocks held per pod: the sum of its keys' counts

    def matched_keys(self, pod: str, keys: Sequence[int]) -> int:
        """How many leading keys of `keys` this pod holds (up to the first one it lacks).

        A binary search: what a pod holds is closed under prefixes, since `record` makes a prompt's
        earlier keys more recent than its later ones and eviction takes the least recent, so a
        pod never holds a key without the keys before it."""
        held = self._pods.get(pod)
        if not held or not keys or keys[0] not in held:
            return 0
        low, high = 1, len(keys)  # keys[:low] are held; keys[high:] are not known to be
        while low < high:
            middle = (low + high + 1) // 2
            if keys[middle - 1] in held:
                low = middle
            else:
                high = middle - 1
        return low

    def record(self, pod: str, keys: Sequence[int]) -> None:
        """The pod now holds these keys' blocks: most recent use, the head most recent of all."""
        if not keys:
            return
        if len(keys) > len(KEY_BLOCKS):
            raise ValueError(f"at most {len(KEY_BLOCKS)} keys a prompt (KEY_BLOCKS), not {len(keys)}")
        held = self._pods.setdefault(pod, OrderedDict())
        blocks = self._blocks.get(pod, 0)
        for j in range(len(keys) - 1, -1, -1):
            key = keys[j]
            if key in held:
                held.move_to_end(key)
            else:
                held[key] = _KEY_WEIGHTS[j]
                blocks += _KEY_WEIGHTS[j]
        self._blocks[pod] = self._evict(held, blocks)

    def _evict(self, held: OrderedDict[int, int], blocks: int) -> int:
        while blocks > self.capacity_blocks_per_pod and held:
            blocks -= held.popitem(last=False)[1]
        return blocks

    def forget_pod(self, pod: str) -> None:
        self._pods.pop(pod, None)
        self._blocks.pop(pod, None)

    def resize(self, capacity_blocks_per_pod: int) -> None:
        """A new per-pod capacity; pods over it forget their least recently used keys."""
        if capacity_blocks_per_pod < 1:
            raise ValueError("capacity_blocks_per_pod must be at least 1")
        self.capacity_blocks_per_pod = capacity_blocks_per_pod
        for pod, held in self._pods.items():
            self._blocks[pod] = self._evict(held, self._blocks.get(pod, 0))

    def pods(self) -> list[str]:
        return sorted(self._pods)

    def size(self, pod: str) -> int:
        """Blocks the pod is believed to hold."""
        return self._blocks.get(pod, 0)


def _load(pod: PodLoad, knobs: PrefixKnobs) -> float:
    return pod.outstanding_requests + pod.outstanding_tokens / knobs.tokens_per_request


def _rendezvous(pod: str, key: int) -> int:
    digest = hashlib.blake2b(pod.encode() + key.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def choose_prefill(
    pods: Sequence[PodLoad], keys: Sequence[int], index: PrefixIndex, knobs: PrefixKnobs
) -> str | None:
    """The pod to prefill on: most leading keys held among pods within the load bound.

    Pure (the index is not changed: the caller records its choice). None when `pods` is empty.
    """
    if not pods:
        return None
    loads = [_load(pod, knobs) for pod in pods]
    bound = knobs.load_bound * (sum(loads) / len(loads)) + 1.0
    best: tuple[int, float, int, str] | None = None  # (-matched, load, -rendezvous, name)
    chosen: str | None = None
    for pod, load in zip(pods, loads, strict=True):
        if load > bound:
            continue
        matched = index.matched_keys(pod.name, keys) if keys else 0
        # Ties between pods holding the same prefix go by the first key past it: the part that
        # tells this request's prompt from others sharing that prefix (a common system prompt).
        split = keys[min(matched, len(keys) - 1)] if keys else 0
        rank = (-matched, load, -_rendezvous(pod.name, split), pod.name)
        if best is None or rank < best:
            best, chosen = rank, pod.name
    if chosen is None:  # cannot happen (the least-loaded pod is always within the bound); be safe
        chosen = min(zip(pods, loads, strict=True), key=lambda pl: (pl[1], pl[0].name))[0].name
    return chosen
