"""ServeGen's per-client load curve (Alibaba Model Studio, `traces/servegen-alibaba/`) -> requests.

ServeGen publishes statistics, not requests: per client and 10-minute window a rate and a fitted
inter-arrival distribution (Gamma or Weibull, scipy's shape and scale), and per client and 6-hour window
input/output length statistics (mean, p50, p90, p99). `generate(...)` turns them into requests with one
seeded `random.Random`, clients in id order and windows in time order, so the same arguments give the same
trace:
- arrivals: per client and window, gaps drawn from the fitted distribution and rescaled so their mean
  is 1 / (rate x `rate_scale`), as ServeGen's own generator does; each window's process starts 20 mean
  gaps before the window (a bursty renewal process started at an arrival over-counts) and only arrivals
  inside the window are kept;
- lengths, drawn independently for input and output, from a piecewise-linear quantile function through
  (0, lo), (0.5, p50), (0.9, p90), (0.99, p99), (1, hi): lo = max(1, 2 p50 - p90) capped at p50 and hi
  chosen so the distribution's mean is the published mean (within [p99, 10 p99]) [derived];
- a window without length statistics uses the client's nearest window that has them; a client without
  any (35 clients' source files were too large to copy) draws, per request, a donor among the clients
  with statistics, weighted by their request rate in the same 6-hour window [derived].
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tandem.sim.requests import Request
from tandem.sim.traces.readers import TraceError, numbered_lines

RATE_WINDOW_SECONDS = 600.0
LENGTH_WINDOW_SECONDS = 6 * 3600.0
_RATE_HEADER = ["client_id", "window_start_s", "rate_rps", "iat_cv", "iat_dist", "dist_param1", "dist_param2"]
_LENGTH_HEADER = [
    "client_id",
    "window_start_s",
    "input_tokens_mean",
    "input_tokens_p50",
    "input_tokens_p90",
    "input_tokens_p99",
    "output_tokens_mean",
    "output_tokens_p50",
    "output_tokens_p90",
    "output_tokens_p99",
]


@dataclass(frozen=True, slots=True)
class RateWindow:
    client: int
    start: float
    rate: float  # requests/s
    dist: str  # "Gamma" | "Weibull"
    shape: float
    scale: float


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """A piecewise-linear quantile function (see the module docstring)."""

    knots: tuple[float, ...]  # quantiles at probabilities _PROBS

    @classmethod
    def from_stats(cls, mean: float, p50: float, p90: float, p99: float) -> LengthDistribution:
        lo = min(p50, max(1.0, 2 * p50 - p90))
        # The mean of a piecewise-linear quantile function is a sum of trapezoids: solve the last one for
        # hi; when even hi = p99 is too much, keep hi = p99 and solve the first one for lo instead.
        middle = 0.4 * (p50 + p90) / 2 + 0.09 * (p90 + p99) / 2
        hi = 2 * (mean - middle - 0.25 * (lo + p50)) / 0.01 - p99
        if hi < p99:
            hi = p99
            lo = min(p50, max(1.0, 4 * (mean - middle - 0.005 * (p99 + hi)) - p50))
        return cls((lo, p50, p90, p99, min(hi, 10 * p99)))

    def sample(self, u: float) -> int:
        i = bisect.bisect_right(_PROBS, u) - 1
        i = min(i, len(_PROBS) - 2)
        p0, p1 = _PROBS[i], _PROBS[i + 1]
        q0, q1 = self.knots[i], self.knots[i + 1]
        return max(1, round(q0 + (q1 - q0) * (u - p0) / (p1 - p0)))

    @property
    def mean(self) -> float:
        k = self.knots
        return sum((_PROBS[i + 1] - _PROBS[i]) * (k[i] + k[i + 1]) / 2 for i in range(len(_PROBS) - 1))


_PROBS = (0.0, 0.5, 0.9, 0.99, 1.0)
_Pair = tuple[LengthDistribution, LengthDistribution]


@dataclass(frozen=True, slots=True)
class ServeGenData:
    rates: tuple[RateWindow, ...]  # sorted by (client, start)
    lengths: dict[int, dict[float, _Pair]]  # client -> 6-hour window start -> (input, output)


def _rows(path: Path, header: list[str]) -> list[tuple[str, list[str]]]:
    rows: list[tuple[str, list[str]]] = []
    lines = numbered_lines(path)
    for number, line in lines:
        if [h.strip() for h in line.strip().split(",")] != header:
            raise TraceError(f"{path}:{number}: expected the header {','.join(header)}")
        break
    for number, line in lines:
        if not line.strip():
            continue
        fields = line.strip().split(",")
        where = f"{path}:{number}"
        if len(fields) != len(header):
            raise TraceError(f"{where}: expected {len(header)} fields, got {len(fields)}")
        rows.append((where, fields))
    if not rows:
        raise TraceError(f"{path}: no rows")
    return rows


def _number(text: str, what: str, where: str, minimum: float = 0.0) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {what} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < minimum:
        raise TraceError(f"{where}: {what} must be a finite number >= {minimum:g}, got {text!r}")
    return value


def load(rates_path: str | Path, lengths_path: str | Path) -> ServeGenData:
    """Reads `<tag>_client_rates.csv.gz` and `<tag>_client_lengths.csv.gz`."""
    rates: list[RateWindow] = []
    for where, f in _rows(Path(rates_path), _RATE_HEADER):
        dist = f[4]
        if dist not in ("Gamma", "Weibull"):
            raise TraceError(f"{where}: iat_dist must be Gamma or Weibull, got {dist!r}")
        shape = _number(f[5], "dist_param1 (shape)", where)
        scale = _number(f[6], "dist_param2 (scale)", where)
        if shape <= 0 or scale <= 0:
            raise TraceError(f"{where}: the distribution's shape and scale must be positive")
        rates.append(
            RateWindow(
                client=int(_number(f[0], "client_id", where)),
                start=_number(f[1], "window_start_s", where),
                rate=_number(f[2], "rate_rps", where),
                dist=dist,
                shape=shape,
                scale=scale,
            )
        )
    rates.sort(key=lambda w: (w.client, w.start))
    lengths: dict[int, dict[float, _Pair]] = {}
    for where, f in _rows(Path(lengths_path), _LENGTH_HEADER):
        values = [
            _number(x, name, where, minimum=0.0) for x, name in zip(f[2:], _LENGTH_HEADER[2:], strict=True)
        ]
        client = int(_number(f[0], "client_id", where))
        start = _number(f[1], "window_start_s", where)
        lengths.setdefault(client, {})[start] = (
            LengthDistribution.from_stats(*values[:4]),
            LengthDistribution.from_stats(*values[4:]),
        )
    return ServeGenData(tuple(rates), lengths)


def _gap_mean(window: RateWindow) -> float:
    if window.dist == "Gamma":
        return window.shape * window.scale
    return window.scale * math.gamma(1 + 1 / window.shape)


def _nearest(lengths: dict[float, _Pair], slot: float) -> _Pair:
    return lengths.get(slot) or lengths[min(lengths, key=lambda s: abs(s - slot))]


class _Donors:
    """Covered clients of a 6-hour slot, to draw from by their request rate in that slot."""

    def __init__(self, data: ServeGenData, slot: float) -> None:
        weights: dict[int, float] = {}
        for w in data.rates:
            if slot <= w.start < slot + LENGTH_WINDOW_SECONDS and w.client in data.lengths:
                weights[w.client] = weights.get(w.client, 0.0) + w.rate
        if not weights:  # nobody covered is active then: any covered client, equally
            weights = dict.fromkeys(data.lengths, 1.0)
        self.clients = sorted(weights)
        self.cumulative: list[float] = []
        total = 0.0
        for client in self.clients:
            total += weights[client]
            self.cumulative.append(total)
        self.pairs = [_nearest(data.lengths[c], slot) for c in self.clients]

    def draw(self, u: float) -> _Pair:
        i = bisect.bisect_left(self.cumulative, u * self.cumulative[-1])
        return self.pairs[min(i, len(self.pairs) - 1)]


def generate(
    data: ServeGenData,
    *,
    start: float,
    duration: float,
    rate_scale: float = 1.0,
    seed: int = 0,
) -> list[Request]:
    """Requests arriving in [start, start + duration) of the curve (0 = 00:00 of day 1), re-based to 0,
    each client's rate multiplied by `rate_scale`; `tenant` is `client-<id>`."""
    if not rate_scale > 0 or not duration > 0 or start < 0:
        raise ValueError("need rate_scale > 0, duration > 0 and start >= 0")
    rng = random.Random(seed)
    end = start + duration
    donors: dict[float, _Donors] = {}
    out: list[Request] = []
    for window in data.rates:
        w_end = window.start + RATE_WINDOW_SECONDS
        if w_end <= start or window.start >= end or window.rate <= 0:
            continue
        mean_gap = 1.0 / (window.rate * rate_scale)
        factor = mean_gap / _gap_mean(window)
        shape, scale = window.shape, window.scale
        draw: Callable[[], float]
        if window.dist == "Gamma":
            draw = functools.partial(rng.gammavariate, shape, scale)
        else:
            draw = functools.partial(rng.weibullvariate, scale, shape)  # (scale, shape) in `random`
        slot = math.floor(window.start / LENGTH_WINDOW_SECONDS) * LENGTH_WINDOW_SECONDS
        own = data.lengths.get(window.client)
        pair = _nearest(own, slot) if own else None
        if pair is None and slot not in donors:
            donors[slot] = _Donors(data, slot)
        tenant = f"client-{window.client}"
        # A renewal process started at an arrival over-counts by (CV^2 - 1)/2 arrivals when bursty: start
        # it 20 mean gaps early so the window sees the process in its stationary state.
        t = window.start - 20 * mean_gap
        while t < w_end:
            if start <= t < end and t >= window.start:
                inputs, outputs = pair or donors[slot].draw(rng.random())
                out.append(
                    Request(t - start, inputs.sample(rng.random()), outputs.sample(rng.random()), tenant)
                )
            t += draw() * factor
    if not out:
        raise TraceError("the ServeGen curve has no requests in that window")
    out.sort(key=lambda r: r.arrival)
    return out


def aggregate_rate(data: ServeGenData, at: float) -> float:
    """The curve's total rate (requests/s, before any scaling) in the 10-minute window holding `at`."""
    slot = math.floor(at / RATE_WINDOW_SECONDS) * RATE_WINDOW_SECONDS
    return sum(w.rate for w in data.rates if w.start == slot)
