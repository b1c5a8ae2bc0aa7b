"""Fitting a `Profile` to measured step times (bench/real_fidelity.py: a real engine on a calibration grid).

Pure. The forms are `Profile`'s own (perf/profile.py):

- prefill of n tokens, one request alone: `intercept + per_token * n + per_token_sq * n^2` ms (the
  `floor` of the form is set to 0: with a non-negative `per_token`, a floor under the intercept would
  never bind, and a fit has no point below the smallest prompt measured to place one);
- decode step of B sequences holding sumC context tokens: `base + per_seq * max(0, B - knee) +
  per_context_token * sumC` ms, the knee chosen from the batches measured.

Every coefficient is non-negative (`Profile` refuses others), so the fit is a non-negative least
squares: small (3 unknowns), solved exactly by trying each set of free coefficients (the others held
at 0) and keeping the feasible solution with the smallest error. Errors are relative (each point's
residual divided by its measured value), so a 20 ms point counts as much as a 2 s one: the fidelity
target is relative too.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

from tandem.perf.profile import DecodeCoefficients, PrefillCoefficients, Profile

_MS = 1e-3


class FitError(ValueError):
    """Too few or unusable points for a fit; the message says which."""


class PrefillPoint(NamedTuple):
    """A prompt of `tokens` tokens prefilled alone in `seconds`."""

    tokens: int
    seconds: float


class DecodePoint(NamedTuple):
    """One decode step of `batch` sequences holding `context_tokens` tokens in total took `seconds`."""

    batch: int
    context_tokens: int
    seconds: float


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """x with matrix @ x = rhs (Gaussian elimination with partial pivoting); None when singular."""
    n = len(rhs)
    a = [[*row, b] for row, b in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def nonneg_least_squares(
    rows: Sequence[Sequence[float]], values: Sequence[float]
) -> tuple[list[float], float]:
    """(x >= 0 minimising sum((row . x - value)^2), that sum) for a few unknowns.

    Exact: the optimum has some coefficients at 0 and the others at the unconstrained optimum of the
    rest, so every subset of free coefficients is solved by its normal equations and the best
    feasible one kept. Columns are scaled to unit norm first (the prefill columns 1, n and n^2 differ
    by six orders of magnitude)."""
    if not rows:
        raise FitError("no points to fit")
    k = len(rows[0])
    if any(len(r) != k for r in rows) or len(rows) != len(values):
        raise FitError("every point needs the same number of terms, and one value")
    norms = [math.sqrt(sum(r[j] ** 2 for r in rows)) or 1.0 for j in range(k)]
    scaled = [[r[j] / norms[j] for j in range(k)] for r in rows]
    best: tuple[list[float], float] | None = None
    for size in range(k + 1):
        for free in itertools.combinations(range(k), size):
            x = [0.0] * k
            if free:
                normal = [[sum(r[i] * r[j] for r in scaled) for j in free] for i in free]
                rhs = [sum(r[i] * v for r, v in zip(scaled, values, strict=True)) for i in free]
                solved = _solve(normal, rhs)
                if solved is None or any(s < -1e-12 for s in solved):
                    continue
                for i, s in zip(free, solved, strict=True):
                    x[i] = max(0.0, s)
            error = sum(
                (sum(r[j] * x[j] for j in range(k)) - v) ** 2 for r, v in zip(scaled, values, strict=True)
            )
            if best is None or error < best[1] - 1e-15:
                best = (x, error)
    assert best is not None  # the empty subset is always feasible
    return [x / n for x, n in zip(best[0], norms, strict=True)], best[1]


def _relative(rows: list[list[float]], values: Sequence[float]) -> tuple[list[list[float]], list[float]]:
    """Rows and values divided by each value: least squares on these minimises relative errors."""
    if any(v <= 0 or math.isnan(v) for v in values):
        raise FitError("every measured time must be positive")
    return [[x / v for x in r] for r, v in zip(rows, values, strict=True)], [1.0] * len(values)


def fit_prefill(points: Sequence[PrefillPoint]) -> PrefillCoefficients:
    """Prefill coefficients (ms) through prompts prefilled alone; at least three prompt lengths."""
    if len({p.tokens for p in points}) < 3:
        raise FitError(f"a prefill fit needs at least 3 distinct prompt lengths, got {len(points)} points")
    if any(p.tokens <= 0 for p in points):
        raise FitError("prompt lengths must be positive")
    rows, ones = _relative(
        [[1.0, float(p.tokens), float(p.tokens) ** 2] for p in points], [p.seconds for p in points]
    )
    (intercept, per_token, per_token_sq), _ = nonneg_least_squares(rows, ones)
    return PrefillCoefficients(
        floor_ms=0.0,
        intercept_ms=intercept / _MS,
        per_token_ms=per_token / _MS,
        per_token_sq_ms=per_token_sq / _MS,
    )


def fit_decode(points: Sequence[DecodePoint]) -> DecodeCoefficients:
    """Decode coefficients (ms) through measured steps; the knee is the measured batch (or 0) that fits
    best, the smaller on a tie. Needs at least two batch sizes and two contexts."""
    if len({p.batch for p in points}) < 2 or len({p.context_tokens for p in points}) < 2:
        raise FitError("a decode fit needs at least 2 batch sizes and 2 context sizes")
    if any(p.batch <= 0 or p.context_tokens < 0 for p in points):
        raise FitError("batches must be positive and contexts non-negative")
    best: tuple[float, int, list[float]] | None = None
    for knee in sorted({0, *(p.batch for p in points)}):
        rows, ones = _relative(
            [[1.0, float(max(0, p.batch - knee)), float(p.context_tokens)] for p in points],
            [p.seconds for p in points],
        )
        x, error = nonneg_least_squares(rows, ones)
        if best is None or error < best[0] - 1e-12:
            best = (error, knee, x)
    assert best is not None
    _, knee, (base, per_seq, per_context) = best
    return DecodeCoefficients(
        base_ms=base / _MS,
        knee_batch=knee,
        per_seq_beyond_knee_ms=per_seq / _MS,
        per_context_token_ms=per_context / _MS,
    )


def fit_profile(
    model: str,
    gpu: str,
    gpu_memory_gib: float,
    prefill: Sequence[PrefillPoint],
    decode: Sequence[DecodePoint],
) -> Profile:
    """A TP1 profile of `model` on `gpu` through the measured points."""
    return Profile(
        model=model,
        gpu=gpu,
        tensor_parallel_size=1,
        gpu_memory_gib=gpu_memory_gib,
        prefill=fit_prefill(prefill),
        decode=fit_decode(decode),
    )


def prefill_errors(profile: Profile, points: Sequence[PrefillPoint]) -> list[float]:
    """Per point, (modelled - measured) / measured."""
    return [profile.prefill_seconds(p.tokens) / p.seconds - 1 for p in points]


def decode_errors(profile: Profile, points: Sequence[DecodePoint]) -> list[float]:
    """Per point, (modelled - measured) / measured."""
    return [profile.decode_step_seconds(p.batch, p.context_tokens) / p.seconds - 1 for p in points]


def link_gbps(transfers: Sequence[tuple[float, float]]) -> float:
    """The link speed (Gb/s) that `kv_transfer_seconds` needs to spend the measured time on the measured
    bytes: total bits over total seconds of (bytes, seconds) transfers."""
    total_bytes = sum(b for b, _ in transfers)
    total_seconds = sum(s for _, s in transfers)
    if total_bytes <= 0 or total_seconds <= 0:
        raise FitError("no KV transfer with bytes and time to fit a link to")
    return total_bytes * 8 / total_seconds / 1e9
