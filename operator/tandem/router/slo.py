"""Is one finished request within SLO? The per-request rule of `reference/autoscaler-evaluation.md`.

Pure. A request is within SLO when it succeeded (status 200), its TTFT (arrival at the router to
the first token reaching the client) is at most the TTFT target, and its TPOT ((last token - first
token) / (output tokens - 1)) is at most the TPOT target; a request with one output token (or
none) has no TPOT and is judged on TTFT alone. A refused or failed request is never within SLO.

A non-streamed answer reaches the client whole, so its first token arrives with the end of the
answer: its TTFT is its end-to-end latency and its TPOT is 0 (all tokens arrived at once).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SloTargets:
    """`spec.slo` in seconds (the spec says milliseconds)."""

    ttft_s: float
    tpot_s: float

    @classmethod
    def from_ms(cls, ttft_ms: float, tpot_ms: float) -> SloTargets:
        return cls(ttft_ms / 1000.0, tpot_ms / 1000.0)


def within_slo(
    targets: SloTargets,
    *,
    status: int,
    arrived: float,
    first_token_at: float | None,
    last_token_at: float | None,
    output_tokens: int,
    ended: float,
) -> bool:
    """The request's verdict; times on one clock, `ended` when the answer's last byte went out."""
    if status != 200:
        return False
    first = first_token_at if first_token_at is not None else ended
    if first - arrived > targets.ttft_s:
        return False
    if output_tokens <= 1 or first_token_at is None or last_token_at is None:
        return True
    return (last_token_at - first_token_at) / (output_tokens - 1) <= targets.tpot_s
