"""Prefix information for the simulator's prefix caching: a prompt's cacheable KV blocks.

vLLM caches full blocks of 16 tokens, each named by a hash chained over the blocks before it, so two
prompts share cached block i exactly when they share tokens 0..16(i+1)-1. The simulator does not
carry tokens: a `Request.prefix` is a tuple of *runs* `(key, blocks)`, each `blocks` consecutive
engine blocks (at most `RUN_BLOCKS` = 32, 512 tokens) named by one chained key. The invariant every
builder here keeps: two runs with the same key hold the same tokens in their first min(blocks)
blocks and follow the same prefix. A replica's cache then holds, per key, how many leading blocks of
that run it has (`tandem.sim.replica`), which is what a cache of engine blocks keyed by
`chain_keys` over the same tokens holds when a run's blocks are evicted tail first (vLLM frees a
request's blocks in reverse order, so its tail is evicted first). `engine_block_keys` expands runs to
one chained key per engine block (the reference the tests compare the runs against), and
`route_keys` gives the router's keys (one per `block_tokens` tokens) without expanding the rest.

Two sources:
- **Mooncake** (`mooncake_prefix`): each `hash_ids` entry names a 512-token block; it expands into
  deterministic tokens (`mooncake_tokens`: token j of block h is the first 4 bytes of blake2b(h, j)),
  so its 32 engine blocks line up with vLLM's, and one run is one Mooncake block: key chained over the
  hash ids so far, blocks = the full engine blocks inside it (the last one is partial).
- **Multi-turn sessions** (`sessions`): built from a trace of single requests (the Azure conversation
  trace) with stated parameters. Every `turns` consecutive requests of the trace are one session,
  started at the first one's arrival; request k of the session gives turn k's new user message (its
  prompt tokens) and its reply (its output tokens); turn k's prompt resends the session's system
  prompt and the conversation so far: `system + sum_{j<k}(user_j + reply_j) + user_k`. Turns follow
  each other by exponential gaps of mean `think_seconds` (open loop: a gap from one turn's arrival to
  the next, replies included). A session draws its system prompt from `system_prompts` distinct ones
  (uniformly; with `hot_share`, system prompt 0 takes that share of sessions and the rest share the
  remainder). Runs: the system prompt's full blocks in runs of 32 keyed by (system prompt, run), so
  sessions with the same system prompt share them; then the session's own stream (the block that
  straddles the system prompt's end belongs to it) in runs of 32 keyed by (session, run), chained
  after the system prompt's; every turn's prompt is a prefix of its session's stream, so its runs are
  the stream's, the last one cut at the prompt's full blocks.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from tandem.routing.prefix import chain_keys
from tandem.sim.requests import Request

ENGINE_BLOCK_TOKENS = 16  # vLLM's default --block-size on CUDA
MOONCAKE_BLOCK_TOKENS = 512
RUN_BLOCKS = MOONCAKE_BLOCK_TOKENS // ENGINE_BLOCK_TOKENS  # 32 engine blocks per run at most

Runs = tuple[tuple[int, int], ...]
_MASK64 = 0xFFFF_FFFF_FFFF_FFFF


# --- Mooncake -----------------------------------------------------------------------------------------
def mooncake_tokens(hash_ids: Sequence[int], input_length: int) -> list[int]:
    """The prompt's tokens: block i's 512 tokens derived from `hash_ids[i]` alone, cut at `input_length`."""
    tokens: list[int] = []
    for h in hash_ids:
        seed = h.to_bytes(8, "little", signed=True)
        for j in range(MOONCAKE_BLOCK_TOKENS):
            if len(tokens) == input_length:
                return tokens
            digest = hashlib.blake2b(seed + j.to_bytes(2, "little"), digest_size=4).digest()
            tokens.append(int.from_bytes(digest, "little"))
    return tokens


def token_block_keys(tokens: Sequence[int]) -> list[int]:
    """vLLM's chained keys of the full 16-token blocks of `tokens` (the partial tail has none)."""
    full = len(tokens) // ENGINE_BLOCK_TOKENS
    return chain_keys(
        [tuple(tokens[i * ENGINE_BLOCK_TOKENS : (i + 1) * ENGINE_BLOCK_TOKENS]) for i in range(full)]
    )


def _runs(keys: Sequence[int], blocks: int, first_sizes: Sequence[int] = ()) -> Runs:
    """Runs over `blocks` full engine blocks: `first_sizes` (runs of the given sizes) then runs of
    `RUN_BLOCKS`, each named by the next key; the last run is cut at `blocks`."""
    out: list[tuple[int, int]] = []
    left = blocks
    for i, key in enumerate(keys):
        if left <= 0:
            break
        size = first_sizes[i] if i < len(first_sizes) else RUN_BLOCKS
        n = size if size < left else left
        out.append((key, n))
        left -= n
    return tuple(out)


def mooncake_prefix(hash_ids: Sequence[int], input_length: int) -> Runs:
    """One run per Mooncake block: the key chained over the hash ids so far, the full engine blocks in it."""
    keys = chain_keys([("mooncake", h) for h in hash_ids])
    return _runs(keys, input_length // ENGINE_BLOCK_TOKENS)


def with_mooncake_prefix(requests: Sequence[Request]) -> list[Request]:
    """The requests with `prefix` filled from their `hash_ids` (unchanged where they have none)."""
    memo: dict[tuple[int, ...], list[int]] = {}
    out: list[Request] = []
    for r in requests:
        if not r.hash_ids:
            out.append(r)
            continue
        keys = memo.get(r.hash_ids)
        if keys is None:
            keys = memo[r.hash_ids] = chain_keys([("mooncake", h) for h in r.hash_ids])
        out.append(r._replace(prefix=_runs(keys, r.prompt_tokens // ENGINE_BLOCK_TOKENS)))
    return out


# --- what the runs stand for ------------------------------------------------------------------------
def _block_key(run_key: int, j: int) -> int:
    """Engine block j of a run: a chained key in effect (the run's key covers every block before it
    and which tokens the run holds, so (run key, j) names blocks 0..j of it and all before)."""
    return ((run_key << 6) | j) & _MASK64  # 64 bits, as chain_keys' (58 of the run key's)


def engine_block_keys(prefix: Runs) -> list[int]:
    """One key per engine block (its leading-block equality is the runs')."""
    return [_block_key(key, j) for key, n in prefix for j in range(n)]


def route_keys(prefix: Runs | None, block_tokens: int, max_keys: int) -> list[int]:
    """The router's keys: one per full `block_tokens` tokens (a multiple of 16 that divides 512, or a
    multiple of 512), at most `max_keys`, each naming the prefix up to its end as chained keys do."""
    if not prefix or max_keys < 1:
        return []
    step = block_tokens // ENGINE_BLOCK_TOKENS
    if step < 1 or block_tokens % ENGINE_BLOCK_TOKENS:
        raise ValueError("block_tokens must be a positive multiple of 16")
    keys: list[int] = []
    if step == 1:  # one key per engine block (the router's default chunk is about one)
        for key, n in prefix:
            base = (key << 6) & _MASK64
            keys.extend([base | j for j in range(n)])
            if len(keys) >= max_keys:
                return keys[:max_keys]
        return keys
    done = 0  # engine blocks covered so far
    for key, n in prefix:
        end = done + n
        boundary = (done // step + 1) * step  # the next key's last block + 1
        while boundary <= end:
            keys.append(_block_key(key, boundary - done - 1))
            if len(keys) >= max_keys:
                return keys
            boundary += step
        done = end
    return keys


def shared_blocks(a: Runs | None, b: Runs | None) -> int:
    """Leading engine blocks two prompts share."""
    if not a or not b:
        return 0
    total = 0
    for (ka, na), (kb, nb) in zip(a, b, strict=False):
        if ka != kb:
            break
        total += na if na < nb else nb
        if na != nb:
            break  # one of them is cut: the prompt's last run
    return total


# --- multi-turn sessions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SessionParams:
    """How `sessions` turns a trace of single requests into multi-turn sessions (see the module doc)."""

    turns: int = 4  # requests per session (the trace's consecutive requests)
    think_seconds: float = 60.0  # mean gap between a session's turns (exponential), replies included
    system_prompt_tokens: int = 2000  # the shared system prompt every turn starts with
    system_prompts: int = 8  # distinct system prompts sessions draw from
    hot_share: float | None = None  # share of sessions on system prompt 0 (None: all equally likely)
    max_prompt_tokens: int | None = None  # a session ends before a turn whose prompt + reply exceeds this
    seed: int = 0

    def __post_init__(self) -> None:
        if self.turns < 1 or self.system_prompts < 1 or self.system_prompt_tokens < 0:
            raise ValueError("turns and system_prompts must be >= 1, system_prompt_tokens >= 0")
        if not self.think_seconds >= 0:
            raise ValueError("think_seconds must be >= 0")
        if self.hot_share is not None and not 0 <= self.hot_share <= 1:
            raise ValueError("hot_share must be within [0, 1]")


def _system_prompt(rng: random.Random, params: SessionParams) -> int:
    if params.hot_share is None or params.system_prompts == 1:
        return rng.randrange(params.system_prompts)
    if rng.random() < params.hot_share:
        return 0
    return 1 + rng.randrange(params.system_prompts - 1)


def _session_prefix(
    system: int, session: int, system_blocks: int, stream_blocks: int
) -> list[tuple[Hashable, int]]:
    """(chain item, run size) for a session's stream of `stream_blocks` full blocks."""
    items: list[tuple[Hashable, int]] = []
    for i in range(-(-system_blocks // RUN_BLOCKS)):
        items.append((("system", system, i), min(RUN_BLOCKS, system_blocks - i * RUN_BLOCKS)))
    rest = stream_blocks - system_blocks
    for i in range(max(0, -(-rest // RUN_BLOCKS))):
        items.append((("session", session, i), RUN_BLOCKS))
    return items


def sessions(base: Sequence[Request], params: SessionParams) -> list[Request]:
    """Multi-turn sessions from `base` (sorted by arrival), sorted by arrival; `tenant` is
    `system-<n>` (which system prompt), deterministic for a given `params.seed`."""
    return [request for request, _, _ in session_turns(base, params)]


def session_turns(base: Sequence[Request], params: SessionParams) -> list[tuple[Request, int, int]]:
    """`sessions`, each request with its session's number and its turn in it (0: the first)."""
    rng = random.Random(params.seed)
    system_tokens = params.system_prompt_tokens
    system_blocks = system_tokens // ENGINE_BLOCK_TOKENS
    out: list[tuple[Request, int, int]] = []
    for session, start in enumerate(range(0, len(base), params.turns)):
        turns = base[start : start + params.turns]
        system = _system_prompt(rng, params)
        arrival = turns[0].arrival
        prompts: list[tuple[float, int, int]] = []
        context = system_tokens
        for k, turn in enumerate(turns):
            if k:
                arrival += rng.expovariate(1.0 / params.think_seconds) if params.think_seconds > 0 else 0.0
            prompt = context + turn.prompt_tokens
            limit = params.max_prompt_tokens
            if limit is not None and prompt + turn.output_tokens > limit:
                break
            prompts.append((arrival, prompt, turn.output_tokens))
            context = prompt + turn.output_tokens
        if not prompts:
            continue
        items = _session_prefix(system, session, system_blocks, prompts[-1][1] // ENGINE_BLOCK_TOKENS)
        keys = chain_keys([item for item, _ in items])
        sizes = [size for _, size in items]
        for number, (arrival, prompt, output) in enumerate(prompts):
            prefix = _runs(keys, prompt // ENGINE_BLOCK_TOKENS, sizes)
            out.append((Request(arrival, prompt, output, f"system-{system}", None, prefix), session, number))
    out.sort(key=lambda found: found[0].arrival)
    return out
