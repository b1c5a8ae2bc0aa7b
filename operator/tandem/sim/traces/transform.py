"""Reshaping a trace without touching its token counts: time and rate scaling, a window, repetition, and
spreading quantised timestamps. Pure functions from request lists to new request lists.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tandem.sim.requests import Request


def scale_time(requests: Sequence[Request], factor: float) -> list[Request]:
    """Every arrival time multiplied by `factor` (0.5: the same requests in half the time)."""
    if not factor > 0:
        raise ValueError(f"a time factor must be positive, got {factor}")
    return [r._replace(arrival=r.arrival * factor) for r in requests]


def scale_rate(requests: Sequence[Request], factor: float) -> list[Request]:
    """The arrival rate multiplied by `factor` (timestamps compressed by it): 10 means ten times the load."""
    if not factor > 0:
        raise ValueError(f"a rate factor must be positive, got {factor}")
    return scale_time(requests, 1.0 / factor)


def window(requests: Sequence[Request], start: float, duration: float) -> list[Request]:
    """Requests arriving in [start, start + duration), re-based so that `start` is time 0."""
    if start < 0 or not duration > 0:
        raise ValueError("a window needs start >= 0 and a positive duration")
    end = start + duration
    return [r._replace(arrival=r.arrival - start) for r in requests if start <= r.arrival < end]


def repeat(requests: Sequence[Request], times: int, gap: float | None = None) -> list[Request]:
    """The trace played `times` times back to back; each copy starts `gap` seconds after the previous
    copy's last arrival (default: the trace's mean inter-arrival time, so the rate stays the same)."""
    if times < 1:
        raise ValueError("repeat at least once")
    if not requests:
        return []
    span = requests[-1].arrival - requests[0].arrival
    if gap is None:
        gap = span / (len(requests) - 1) if len(requests) > 1 else 1.0
    period = span + gap
    origin = requests[0].arrival
    return [r._replace(arrival=r.arrival - origin + copy * period) for copy in range(times) for r in requests]


def spread_ticks(requests: Sequence[Request], tick: float, seed: int = 0) -> list[Request]:
    """Timestamps quantised to `tick` seconds (Mooncake's ~3 s) spread uniformly inside their tick, with a
    fixed seed; the result is sorted again."""
    if not tick > 0:
        raise ValueError("a tick must be positive")
    rng = random.Random(seed)
    spread = [r._replace(arrival=r.arrival + rng.random() * tick) for r in requests]
    spread.sort(key=lambda r: r.arrival)
    return spread


def take(requests: Sequence[Request], count: int) -> list[Request]:
    """The first `count` requests."""
    return list(requests[:count])
