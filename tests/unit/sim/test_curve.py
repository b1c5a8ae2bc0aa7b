"""A swept policy's curve of GPU-hours against attainment (`tandem.sim.report.envelope`, `gpu_hours_at`):
the monotone envelope, linear between its points, "at most" below its range and "not reached" above."""

from __future__ import annotations

import pytest

from tandem.sim.report import CurvePoint, envelope, gpu_hours_at


def _curve(*points: tuple[float, float]) -> list[CurvePoint]:
    return [CurvePoint(f"p{i}", a, h) for i, (a, h) in enumerate(points)]


@pytest.mark.parametrize(
    ("points", "kept"),
    [
        ([], []),
        ([(0.5, 10.0)], [(0.5, 10.0)]),
        # already monotone: all kept, by attainment
        ([(0.9, 14.0), (0.5, 10.0), (0.7, 12.0)], [(0.5, 10.0), (0.7, 12.0), (0.9, 14.0)]),
        # (0.6, 13) costs more than (0.7, 12) for less: it goes
        ([(0.5, 10.0), (0.6, 13.0), (0.7, 12.0)], [(0.5, 10.0), (0.7, 12.0)]),
        # the same attainment twice: the cheaper stays
        ([(0.7, 12.0), (0.7, 11.0), (0.9, 14.0)], [(0.7, 11.0), (0.9, 14.0)]),
        # the same GPU-hours for more attainment: the one with less goes
        ([(0.5, 12.0), (0.7, 12.0)], [(0.7, 12.0)]),
    ],
)
def test_envelope_keeps_the_points_nothing_beats(
    points: list[tuple[float, float]], kept: list[tuple[float, float]]
) -> None:
    assert [(p.attainment, p.gpu_hours) for p in envelope(_curve(*points))] == kept


CURVE = _curve((0.20, 5.0), (0.60, 7.0), (0.90, 10.0), (0.80, 12.0), (0.97, 13.0))  # (0.80, 12) is beaten


@pytest.mark.parametrize(
    ("attainment", "hours", "how", "between"),
    [
        (0.60, 7.0, "exact", (0.60,)),
        (0.40, 6.0, "interpolated", (0.20, 0.60)),  # halfway from 5 to 7
        (0.75, 8.5, "interpolated", (0.60, 0.90)),  # through (0.8, 12), which is beaten: not used
        (0.95, 10.0 + 3.0 * 5 / 7, "interpolated", (0.90, 0.97)),
        (0.97, 13.0, "exact", (0.97,)),
        (0.10, 5.0, "at most", (0.20,)),  # below the range: the cheapest point already does better
        (0.20, 5.0, "exact", (0.20,)),
        (0.98, None, "not reached", (0.97,)),  # above: no extrapolation
        (1.00, None, "not reached", (0.97,)),
    ],
)
def test_gpu_hours_at_an_attainment(
    attainment: float, hours: float | None, how: str, between: tuple[float, ...]
) -> None:
    at = gpu_hours_at(CURVE, attainment)
    assert at.how == how
    assert at.gpu_hours == (None if hours is None else pytest.approx(hours))
    assert tuple(p.attainment for p in at.between) == between


def test_an_empty_curve_reaches_nothing() -> None:
    at = gpu_hours_at([], 0.5)
    assert (at.gpu_hours, at.how, at.between) == (None, "not reached", ())


def test_a_flat_curve_is_one_point() -> None:
    """A sweep whose factors change nothing (the quick run's planner): every point the same."""
    flat = _curve((0.372, 0.6), (0.372, 0.6))
    assert gpu_hours_at(flat, 0.372).how == "exact"
    assert gpu_hours_at(flat, 0.95).how == "not reached"
