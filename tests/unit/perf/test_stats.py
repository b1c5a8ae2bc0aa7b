"""The one nearest-rank percentile (`tandem.perf.stats`)."""

from __future__ import annotations

import math

import pytest

from tandem.perf.stats import nearest_rank, percentile


@pytest.mark.parametrize(
    ("q", "want"),
    [
        pytest.param(0.0, 1.0, id="q 0 is the smallest"),
        pytest.param(0.5, 2.0, id="the median of four is the 2nd"),
        pytest.param(0.9, 4.0, id="p90 of four rounds the rank up to the 4th"),
        pytest.param(1.0, 4.0, id="q 1 is the largest"),
    ],
)
def test_nearest_rank_is_the_ceil_qn_th_smallest(q: float, want: float) -> None:
    assert nearest_rank([1.0, 2.0, 3.0, 4.0], q) == want


def test_percentile_sorts_and_skips_nan() -> None:
    assert percentile([3.0, math.nan, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 90) == nearest_rank([1.0, 2.0, 3.0, 4.0], 0.9)


def test_no_values_give_nan() -> None:
    assert math.isnan(nearest_rank([], 0.5))
    assert math.isnan(percentile([math.nan], 50))
