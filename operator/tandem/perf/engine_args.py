"""vLLM command-line facts that render (which writes a pool's `vllm serve` line) and the capacity
model (`tandem.autoscale.capacity`, which reads the same line back) must agree on. Pure.

Moved here from `render/command.py` so that the autoscaler does not import render: both sit on the
pure-core floor and read this from the floor below (`docs/architecture.md`).
"""

from __future__ import annotations

from collections.abc import Sequence

# Colocated serves prefill and decode in one batch; a step carries at most this many prefill tokens,
# which bounds how long a long prompt stalls running streams. vLLM's tuning guide recommends a
# small budget such as 2048 for inter-token latency (its H100 default, 8192, favours TTFT).
COLOCATED_MAX_NUM_BATCHED_TOKENS = 2048


def flag_values(args: Sequence[str], flag: str) -> list[str | None]:
    """Values given for `flag` in `args` (`--f v`, `--f=v`; None for a bare flag), in order."""
    values: list[str | None] = []
    for i, arg in enumerate(args):
        if arg == flag:
            nxt = args[i + 1] if i + 1 < len(args) else None
            values.append(None if nxt is None or nxt.startswith("-") else nxt)
        elif arg.startswith(flag + "="):
            values.append(arg[len(flag) + 1 :])
    return values
