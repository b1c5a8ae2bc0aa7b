"""Decode-heavy traffic (issue 25, item 4): a trace's arrivals and prompts with reasoning-length outputs.

A reasoning model answers a prompt with thousands of tokens of thought. No public trace of such serving
ships with the repository, so the mix is synthesized: the arrival curve and prompt lengths of a real trace
(the shared Azure or Mooncake traces), each output length drawn log-uniformly between `low` and `high`
tokens (1k-8k by default: as many requests of 1-2k as of 4-8k), with a seeded generator, so the same
seed gives the same mix. Pure: a list of requests in, a new list out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from tandem.sim.requests import Request

REASONING_OUTPUT_TOKENS = (1024, 8192)


def reasoning_mix(
    requests: Sequence[Request],
    low: int = REASONING_OUTPUT_TOKENS[0],
    high: int = REASONING_OUTPUT_TOKENS[1],
    seed: int = 0,
) -> list[Request]:
    """`requests` with every output length replaced by a log-uniform draw in [low, high] tokens."""
    if not 1 <= low <= high:
        raise ValueError(f"output lengths need 1 <= low <= high, got {low}, {high}")
    rng = random.Random(seed)
    lo, hi = math.log(low), math.log(high + 1)
    return [r._replace(output_tokens=min(high, int(math.exp(rng.uniform(lo, hi))))) for r in requests]
