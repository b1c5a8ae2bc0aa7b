"""tandem.perf.fit: profiles fitted through points made from known coefficients, and bad input refused."""

from __future__ import annotations

import math

import pytest

from tandem.perf.fit import (
    DecodePoint,
    FitError,
    PrefillPoint,
    decode_errors,
    fit_decode,
    fit_prefill,
    fit_profile,
    link_gbps,
    nonneg_least_squares,
    prefill_errors,
)

LENGTHS = (24, 200, 600, 1100, 1800)
SPREAD = (10, 100, 1000, 2000)


@pytest.mark.parametrize(
    ("rows", "values", "expected"),
    [
        # exact solution inside the feasible region
        ([[1, 0], [0, 1], [1, 1]], [2, 3, 5], [2, 3]),
        # the unconstrained optimum has a negative slope: clamped to 0, the intercept is the mean
        ([[1, 1], [1, 2], [1, 3]], [3, 2, 1], [2, 0]),
        # every coefficient would be negative: all 0
        ([[1], [2]], [-1, -2], [0]),
        # columns six orders of magnitude apart are still solved
        ([[1, n, n * n] for n in SPREAD], [1 + 2e-3 * n + 3e-7 * n * n for n in SPREAD], [1, 2e-3, 3e-7]),
    ],
)  # fmt: skip
def test_nonneg_least_squares(rows: list[list[float]], values: list[float], expected: list[float]) -> None:
    x, _ = nonneg_least_squares(rows, values)
    assert x == pytest.approx(expected, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize(
    ("intercept_ms", "per_token_ms", "per_token_sq_ms"),
    [(20.0, 0.02, 1e-6), (5.0, 0.0, 4e-6), (0.0, 0.05, 0.0), (30.0, 0.01, 0.0)],
)
def test_prefill_fit_recovers_the_coefficients(
    intercept_ms: float, per_token_ms: float, per_token_sq_ms: float
) -> None:
    points = [
        PrefillPoint(n, (intercept_ms + per_token_ms * n + per_token_sq_ms * n * n) / 1000) for n in LENGTHS
    ]
    fit = fit_prefill(points)
    assert fit.floor_ms == 0
    assert fit.intercept_ms == pytest.approx(intercept_ms, rel=1e-6, abs=1e-9)
    assert fit.per_token_ms == pytest.approx(per_token_ms, rel=1e-6, abs=1e-12)
    assert fit.per_token_sq_ms == pytest.approx(per_token_sq_ms, rel=1e-6, abs=1e-15)


@pytest.mark.parametrize(
    ("base_ms", "knee", "per_seq_ms", "per_context_ms", "fitted_knee", "fitted_base_ms"),
    [
        (6.0, 0, 1.0, 1e-4, 0, 6.0),
        (5.0, 3, 2.0, 0.0, 3, 5.0),  # flat to 3 sequences, then 2 ms each: only knee 3 fits
        (8.0, 0, 0.0, 5e-4, 0, 8.0),  # no per-sequence cost: the smallest knee
        # knee 1 and knee 0 fit batches 1, 3, 6 equally (base 7 vs 6.5): the smaller knee wins the tie
        (7.0, 1, 0.5, 2e-5, 0, 6.5),
    ],
)
def test_decode_fit_recovers_the_coefficients_and_the_knee(
    base_ms: float,
    knee: int,
    per_seq_ms: float,
    per_context_ms: float,
    fitted_knee: int,
    fitted_base_ms: float,
) -> None:
    points = [
        DecodePoint(b, b * c, (base_ms + per_seq_ms * max(0, b - knee) + per_context_ms * b * c) / 1000)
        for b in (1, 3, 6)
        for c in (64, 1000)
    ]
    fit = fit_decode(points)
    assert fit.knee_batch == fitted_knee
    assert fit.base_ms == pytest.approx(fitted_base_ms, rel=1e-6)
    assert fit.per_seq_beyond_knee_ms == pytest.approx(per_seq_ms, rel=1e-6, abs=1e-9)
    assert fit.per_context_token_ms == pytest.approx(per_context_ms, rel=1e-6, abs=1e-12)


def test_the_fit_minimises_relative_error_and_reports_it() -> None:
    """Noisy points: the fitted profile's relative errors are small and reported per point."""
    noise = (1.04, 0.97, 1.02, 0.99, 1.03)
    prefill = [PrefillPoint(n, (20 + 0.02 * n) / 1000 * k) for n, k in zip(LENGTHS, noise, strict=True)]
    decode = [
        DecodePoint(b, b * c, (6 + b + 1e-4 * b * c) / 1000 * k)
        for (b, c), k in zip(
            [(1, 64), (1, 1000), (3, 64), (3, 1000), (6, 64), (6, 1000)], (*noise, 1.0), strict=True
        )
    ]
    profile = fit_profile("tandem/tiny-llama", "CPU", 3.27, prefill, decode)
    assert (profile.model, profile.gpu, profile.tensor_parallel_size) == ("tandem/tiny-llama", "CPU", 1)
    assert max(abs(e) for e in prefill_errors(profile, prefill)) < 0.05
    assert max(abs(e) for e in decode_errors(profile, decode)) < 0.05
    # the error is relative: doubling every measurement doubles the coefficients, same errors
    doubled = fit_prefill([PrefillPoint(p.tokens, 2 * p.seconds) for p in prefill])
    assert doubled.intercept_ms == pytest.approx(2 * profile.prefill.intercept_ms)
    assert doubled.per_token_ms == pytest.approx(2 * profile.prefill.per_token_ms)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fit_prefill([PrefillPoint(10, 0.01), PrefillPoint(20, 0.02)]), "3 distinct prompt lengths"),
        (lambda: fit_prefill([PrefillPoint(10, 0.01)] * 2 + [PrefillPoint(20, 0.02)]), "3 distinct"),
        (lambda: fit_prefill([PrefillPoint(n, 0.0) for n in LENGTHS]), "positive"),
        (lambda: fit_prefill([PrefillPoint(n, math.nan) for n in LENGTHS]), "positive"),
        (
            lambda: fit_prefill([PrefillPoint(n - 24, 0.01) for n in LENGTHS]),
            "prompt lengths must be positive",
        ),
        (lambda: fit_decode([DecodePoint(1, 64, 0.01), DecodePoint(1, 1000, 0.01)]), "2 batch sizes"),
        (lambda: fit_decode([DecodePoint(1, 64, 0.01), DecodePoint(3, 64, 0.01)]), "2 context sizes"),
        (lambda: fit_decode([DecodePoint(0, 64, 0.01), DecodePoint(3, 0, 0.01)]), "batches must be positive"),
        (lambda: nonneg_least_squares([], []), "no points"),
        (lambda: nonneg_least_squares([[1, 2], [1]], [1, 2]), "same number of terms"),
        (lambda: link_gbps([(0, 0.1)]), "no KV transfer"),
        (lambda: link_gbps([(1e6, 0)]), "no KV transfer"),
    ],
)
def test_bad_points_are_refused(call: object, message: str) -> None:
    with pytest.raises(FitError, match=message):
        call()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("transfers", "gbps"),
    [
        ([(1.25e6, 0.01)], 1.0),  # 10 Mb in 10 ms
        ([(1e6, 0.001), (1e6, 0.015)], 1.0),  # total bits over total time, not a mean of rates
        ([(5e8, 0.1)], 40.0),
    ],
)
def test_link_is_total_bits_over_total_time(transfers: list[tuple[float, float]], gbps: float) -> None:
    assert link_gbps(transfers) == pytest.approx(gbps)
