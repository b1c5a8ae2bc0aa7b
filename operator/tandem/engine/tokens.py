"""A deterministic stand-in tokenizer and sampler.

Prompt tokens: words and punctuation (`\\w+|[^\\w\\s]`), so counts are stable and easy to predict.
Output token i is a pure function of (prompt, seed, i): a disaggregated decode engine, which samples
every output token itself after pulling the KV, returns the same text as a colocated engine.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence

_WORD = re.compile(r"\w+|[^\w\s]")
_MASK64 = (1 << 64) - 1
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "ch", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ei")
_CODAS = ("", "n", "r", "s", "l")
# 16 x 8 x 5 = 640 syllables; words of two syllables give a vocabulary of 409,600 strings.
_SYLLABLES = tuple(o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS)
_SYLLABLE_BYTES = tuple(s.encode() for s in _SYLLABLES)
VOCAB_SIZE = len(_SYLLABLES) ** 2
_STRIDE = 0xD1B54A32D192ED03


def count_prompt_tokens(text: str) -> int:
    return len(_WORD.findall(text))


def prompt_tokens_of(text: str) -> list[str]:
    """The prompt's tokens (what the prefix cache hashes; `count_prompt_tokens` is their number)."""
    return _WORD.findall(text)


def output_token_word(key: int, seed: int, index: int) -> str:
    """Output token i as the token it is when a later prompt sends its text back (one word)."""
    return token_text(output_token_id(key, seed, index))[1:]


def prompt_key(prompt: str | Sequence[int]) -> int:
    """A 64-bit identity of the prompt (text, or token ids as OpenAI's API also accepts)."""
    data = prompt.encode() if isinstance(prompt, str) else b",".join(str(t).encode() for t in prompt)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _mix(x: int) -> int:
    """splitmix64 finaliser: a cheap, well-spread 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=1024)
def _seed_mix(seed: int) -> int:
    return _mix(seed & _MASK64)


def sampler_base(key: int, seed: int) -> int:
    """What `output_token_id` derives from (prompt, seed); a stream computes it once."""
    return key ^ _seed_mix(seed)


def token_id_at(base: int, index: int) -> int:
    # One mix per token (this runs once per streamed token): a distinct odd stride per index.
    return _mix((base + index * _STRIDE) & _MASK64) % VOCAB_SIZE


def output_token_id(key: int, seed: int, index: int) -> int:
    return token_id_at(key ^ _seed_mix(seed), index)


def natural_length(key: int, seed: int) -> int:
    """Where the "model" samples EOS when the client sets no token limit: 64..511 tokens."""
    return 64 + _mix(key ^ _seed_mix(seed) ^ 0xE05) % 448


def token_text(token_id: int) -> str:
    first, second = divmod(token_id, len(_SYLLABLES))
    return " " + _SYLLABLES[first] + _SYLLABLES[second]


def token_json(token_id: int) -> bytes:
    """`json.dumps(token_text(token_id)).encode()`, built from bytes: syllables need no escaping."""
    first, second = divmod(token_id, len(_SYLLABLES))
    return b'" ' + _SYLLABLE_BYTES[first] + _SYLLABLE_BYTES[second] + b'"'


def output_text(key: int, seed: int, start: int, stop: int) -> str:
    """Text of output tokens start..stop-1."""
    return "".join(token_text(output_token_id(key, seed, i)) for i in range(start, stop))


def render_chat(messages: Sequence[dict[str, object]]) -> str:
    """A fixed chat template; what matters is that P and D render the same prompt."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<|{message.get('role', 'user')}|>\n{content or ''}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)
