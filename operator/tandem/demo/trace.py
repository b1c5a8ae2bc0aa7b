"""Reads a window of the Azure LLM inference trace and scales its arrival rate (pure)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime


@dataclass(frozen=True)
class TraceRequest:
    """One request: when to send it (seconds from the start) and how much work it is."""

    at: float
    input_tokens: int
    output_tokens: int
    phase: str = ""  # the segment of a `surge` schedule it belongs to


def _parse_time(text: str) -> float:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits, more than fromisoformat takes.
    head, _, frac = text.strip().partition(".")
    base = datetime.fromisoformat(head).timestamp()
    return base + (float(f"0.{frac}") if frac else 0.0)


def parse_azure_csv(text: str) -> list[tuple[float, int, int]]:
    """(seconds since the first row, context tokens, generated tokens) for every row."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        return []
    t0 = _parse_time(rows[0]["TIMESTAMP"])
    return [
        (_parse_time(r["TIMESTAMP"]) - t0, int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in rows
    ]


def window(
    rows: list[tuple[float, int, int]],
    *,
    start_s: float,
    length_s: float,
    rate_scale: float,
    max_model_len: int,
) -> list[TraceRequest]:
    """Requests arriving in [start_s, start_s + length_s) of the trace, re-timed to start at 0 and
    stretched by 1/rate_scale (rate_scale 0.25 plays a 40 s window in 160 s). Requests that would not
    fit the model's context are dropped, never truncated."""
    if rate_scale <= 0:
        raise ValueError("rate_scale must be positive")
    out = []
    for at, inp, outp in rows:
        if start_s <= at < start_s + length_s and inp >= 1 and outp >= 1 and inp + outp <= max_model_len:
            out.append(TraceRequest((at - start_s) / rate_scale, inp, outp))
    return out


@dataclass(frozen=True)
class Segment:
    """`wall_seconds` of replay at `rate_scale` times the trace's arrival rate."""

    label: str
    wall_seconds: float
    rate_scale: float

    @property
    def trace_seconds(self) -> float:
        return self.wall_seconds * self.rate_scale


def surge(
    rows: list[tuple[float, int, int]],
    *,
    start_s: float,
    segments: Sequence[Segment],
    max_model_len: int,
) -> list[TraceRequest]:
    """Consecutive windows of the trace from `start_s`, each replayed at its segment's rate scale,
    one after the other: a quiet segment at a low scale, then a surge at a higher one, then quiet
    again, is the trace's own arrivals (and lengths) with a stated rate step in the middle."""
    out: list[TraceRequest] = []
    trace_at, wall_at = start_s, 0.0
    for seg in segments:
        part = window(
            rows,
            start_s=trace_at,
            length_s=seg.trace_seconds,
            rate_scale=seg.rate_scale,
            max_model_len=max_model_len,
        )
        out += [replace(r, at=r.at + wall_at, phase=seg.label) for r in part]
        trace_at += seg.trace_seconds
        wall_at += seg.wall_seconds
    return out


def prompt_ids(index: int, length: int, vocab_size: int | None = None) -> list[int]:
    """A deterministic token-id prompt of `length` tokens, different for every request index: ids in
    [1, 32000], or in [1, vocab_size) for a small model's vocabulary (the real-vLLM tests' tiny one)."""
    modulus = 32000 if vocab_size is None else vocab_size - 1
    return [1 + (index * 7919 + i * 104729) % modulus for i in range(length)]
