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

Index. `PrefixIndex` remembers which pod was sent which keys: the balancer's own choices, not the
engines' state. Each pod has an LRU of at most `capacity_blocks_per_pod` keys, approximating the
engine's cache size; a recorded prompt touches its tail keys first and its head last, so under
pressure a prefix loses its tail first, as vLLM's free-block queue evicts a request's tail blocks
first.

Choice (bounded load). A pod's load is `outstanding_requests + outstanding_tokens /
tokens_per_request`. A pod is eligible when its load is at most `load_bound * mean load + 1`
(the "+1" lets an idle pool take a request anywhere); among eligible pods the one with the most
leading blocks cached wins, ties to the lighter pod, then to a rendezvous hash of the first key
past the matched blocks (so different new prompts spread over an idle pool, even when they share a
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
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_BLOCKS",
    "MAX_BLOCK_CHARS",
    "PREFILL_POLICIES",
    "PodLoad",
    "PrefillPolicy",
    "PrefixIndex",
    "PrefixKnobs",
    "PrefixSettings",
    "bytes_keys",
    "chain_keys",
    "choose_prefill",
    "prompt_text",
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


def _odd_weights(label: bytes, count: int) -> npt.NDArray[np.uint64]:
    """`count` odd 64-bit weights from SHAKE-256 of `label`: the same in every process and version."""
    weights = np.frombuffer(hashlib.shake_256(label).digest(8 * count), dtype="<u8").astype(np.uint64)
    return weights | np.uint64(1)


# Weights of a byte's offset in its chunk and of a chunk's place in the prompt (text_keys).
_BYTE_WEIGHTS: Final = _odd_weights(_ROOT + b"/byte", MAX_BLOCK_CHARS)
_CHUNK_WEIGHTS: Final = _odd_weights(_ROOT + b"/chunk", MAX_BLOCKS)


def text_keys(text: str, knobs: PrefixKnobs) -> list[int]:
    """Keys of the text's full `block_chars` chunks (of its UTF-8 bytes: characters, for ASCII), at
    most `max_blocks` of them: key i is a 64-bit hash of the text up to the end of chunk i.

    The router's hot path, so cheaper than `chain_keys`, and with no Python loop over the chunks:
    a linear hash modulo 2**64, key i = the sum over chunks c <= i and their bytes b of
    chunk_weight[c] * byte_weight[offset of b] * b, all weights odd. Key i is a function of the
    prefix through chunk i only, so it names the prefix as chaining does, and the keys of all chunks
    are one numpy cumulative sum (a 108-chunk prompt: 12-15 us, against 36 us for a CRC-32 and
    Adler-32 carried chunk to chunk in a Python loop). Two different prefixes differ in some byte by
    at most 255, whose product with an odd weight cannot vanish modulo 2**64, so keys are equal by
    accident only when several differences cancel. Not collision-resistant: a collision only makes
    the router believe a pod holds one more chunk than it does. The same in every process."""
    return bytes_keys(text.encode(), knobs)


def bytes_keys(data: bytes, knobs: PrefixKnobs) -> list[int]:
    """`text_keys` of text already encoded."""
    size = knobs.block_chars
    blocks = min(len(data) // size, knobs.max_blocks)
    if blocks == 0:
        return []
    chunks = np.frombuffer(data, dtype=np.uint8, count=blocks * size).reshape(blocks, size)
    chunk_sums = chunks @ _BYTE_WEIGHTS[:size]  # uint64, wrapping modulo 2**64
    keys: list[int] = np.cumsum(chunk_sums * _CHUNK_WEIGHTS[:blocks], dtype=np.uint64).tolist()
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
    """Which pod is believed to hold which block key, learned from the balancer's own choices,
    with per-pod LRU capacity in blocks (approximating the engine's cache)."""

    def __init__(self, capacity_blocks_per_pod: int) -> None:
        if capacity_blocks_per_pod < 1:
            raise ValueError("capacity_blocks_per_pod must be at least 1")
        self.capacity_blocks_per_pod = capacity_blocks_per_pod
        self._pods: dict[str, OrderedDict[int, None]] = {}

    def matched_blocks(self, pod: str, keys: Sequence[int]) -> int:
        """How many leading blocks of `keys` this pod holds (up to the first one it lacks).

        A binary search: what a pod holds is closed under prefixes, since `record` makes a prompt's
        earlier keys more recent than its later ones and eviction takes the least recent, so a
        pod never holds a key without the keys before it. About 7 lookups for a 108-chunk prompt
        instead of 108 (this was a third of the choice's cost in the router, by py-spy)."""
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
        """The pod now holds these blocks: most recent use, the head most recent of all."""
        if not keys:
            return
        held = self._pods.setdefault(pod, OrderedDict())
        for key in reversed(keys):
            if key in held:
                held.move_to_end(key)
            else:
                held[key] = None
        while len(held) > self.capacity_blocks_per_pod:
            held.popitem(last=False)

    def forget_pod(self, pod: str) -> None:
        self._pods.pop(pod, None)

    def resize(self, capacity_blocks_per_pod: int) -> None:
        """A new per-pod capacity; pods over it forget their least recently used keys."""
        if capacity_blocks_per_pod < 1:
            raise ValueError("capacity_blocks_per_pod must be at least 1")
        self.capacity_blocks_per_pod = capacity_blocks_per_pod
        for held in self._pods.values():
            while len(held) > capacity_blocks_per_pod:
                held.popitem(last=False)

    def pods(self) -> list[str]:
        return sorted(self._pods)

    def size(self, pod: str) -> int:
        return len(self._pods.get(pod, ()))


def _load(pod: PodLoad, knobs: PrefixKnobs) -> float:
    return pod.outstanding_requests + pod.outstanding_tokens / knobs.tokens_per_request


def _rendezvous(pod: str, key: int) -> int:
    digest = hashlib.blake2b(pod.encode() + key.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def choose_prefill(
    pods: Sequence[PodLoad], keys: Sequence[int], index: PrefixIndex, knobs: PrefixKnobs
) -> str | None:
    """The pod to prefill on: most cached leading blocks among pods within the load bound.

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
        matched = index.matched_blocks(pod.name, keys) if keys else 0
        # Ties between pods holding the same prefix go by the first key past it: the part that
        # tells this request's prompt from others sharing that prefix (a common system prompt).
        split = keys[min(matched, len(keys) - 1)] if keys else 0
        rank = (-matched, load, -_rendezvous(pod.name, split), pod.name)
        if best is None or rank < best:
            best, chosen = rank, pod.name
    if chosen is None:  # cannot happen (the least-loaded pod is always within the bound); be safe
        chosen = min(zip(pods, loads, strict=True), key=lambda pl: (pl[1], pl[0].name))[0].name
    return chosen
