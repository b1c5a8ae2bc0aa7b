"""The demand forecast (`autoscale.forecast`): a fake clock, tables and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.api.status import FORECAST_BUCKETS, ForecastStatus
from tandem.autoscale import forecast
from tandem.autoscale.knobs import KNOBS

DAY = 86400
STEP = 30.0


def run(series: list[float], start: float = 0.0, step: float = STEP, period: int = DAY) -> ForecastStatus:
    state: ForecastStatus | None = None
    for i, demand in enumerate(series):
        state = forecast.update(state, demand, start + i * step, period, KNOBS)
    assert state is not None
    return state


def diurnal(t: float, period: int = DAY) -> float:
    """A day's curve: 1,000 tokens/s at night, 9,000 at midday."""
    return 5000.0 - 4000.0 * math.cos(2 * math.pi * t / period)


@pytest.mark.parametrize(
    ("series", "horizon", "low", "high"),
    [
        ([1000.0] * 40, 120.0, 999.0, 1001.0),  # flat: the level
        (
            [1000.0 + 10 * i for i in range(60)],
            120.0,
            1590.0 + 10 * 4 - 30,
            1590.0 + 10 * 4 + 30,
        ),  # +1/3 per s
        ([5000.0 - 10 * i for i in range(60)], 120.0, 4410.0 - 40 - 30, 4410.0 - 40 + 30),  # falling
        ([0.0] * 20, 300.0, 0.0, 0.0),  # no traffic: no forecast of any
    ],
)
def test_level_and_trend(series: list[float], horizon: float, low: float, high: float) -> None:
    state = run(series)
    now = (len(series) - 1) * STEP
    predicted = forecast.predict(state, now, horizon, KNOBS)
    assert predicted is not None
    assert low <= predicted <= high


def test_no_observation_no_forecast() -> None:
    assert forecast.predict(None, 0.0, 120.0, KNOBS) is None
    assert forecast.predict(ForecastStatus(), 0.0, 120.0, KNOBS) is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0])
def test_a_window_without_data_changes_nothing(bad: float) -> None:
    state = run([2000.0] * 30)
    after = forecast.update(state, bad, 30 * STEP, DAY, KNOBS)
    assert after == state
    # and the next good observation continues from where it was
    resumed = forecast.update(after, 2000.0, 31 * STEP, DAY, KNOBS)
    assert resumed.level == pytest.approx(2000.0)
    assert all(math.isfinite(v) for v in (resumed.level, resumed.trend, resumed.bucket_sum))


def test_a_gap_restarts_the_trend() -> None:
    rising = run([1000.0 + 20 * i for i in range(60)])
    assert rising.trend > 0.3
    later = forecast.update(rising, 500.0, 59 * STEP + KNOBS.forecast_gap_seconds + 1, DAY, KNOBS)
    assert later.level == 500.0
    assert later.trend == 0.0


def test_a_clock_stepped_back_is_ignored() -> None:
    state = run([1000.0] * 10)
    assert forecast.update(state, 9000.0, 0.0, DAY, KNOBS) == state


def test_seasonal_recall_after_two_periods() -> None:
    """Two days of a diurnal curve: at dawn of the third, the profile sees the climb one horizon ahead
    that level and trend alone (flat data just before) cannot."""
    period = DAY
    step = 60.0
    state: ForecastStatus | None = None
    t = 0.0
    while t < 2 * period:
        state = forecast.update(state, diurnal(t, period), t, period, KNOBS)
        t += step
    assert state is not None
    assert forecast.season_ready(state, t)
    seen = [v for v in state.profile if v >= 0]
    assert len(seen) == FORECAST_BUCKETS
    # every bucket recalls its mean within 2% of the day's swing
    for i, value in enumerate(state.profile):
        centre = (i + 0.5) * period / FORECAST_BUCKETS
        assert abs(value - diurnal(centre, period)) < 0.02 * 8000.0
    # morning of day 3 at a level held flat (the filter alone would say "flat"): the profile says "more"
    now = 2 * period + 0.25 * period
    flat = forecast.update(state.model_copy(update={"trend": 0.0}), diurnal(now), now, period, KNOBS)
    flat = flat.model_copy(update={"trend": 0.0, "level": diurnal(now)})
    ahead = forecast.predict(flat, now, 3600.0, KNOBS)
    assert ahead is not None
    expected = diurnal(now) * diurnal(now + 3600.0) / diurnal(now)
    assert ahead == pytest.approx(expected, rel=0.03)
    assert ahead > diurnal(now) * 1.1


def test_profile_unused_before_a_whole_period() -> None:
    state = run([diurnal(i * 60.0) for i in range(100)], step=60.0)
    assert not forecast.season_ready(state, 99 * 60.0)
    level_only = state.level + state.trend * 600.0
    predicted = forecast.predict(state, 99 * 60.0, 600.0, KNOBS)
    assert predicted == pytest.approx(
        min(state.level * KNOBS.forecast_max_ratio, max(state.level / KNOBS.forecast_max_ratio, level_only))
    )


def test_a_new_period_forgets_the_profile() -> None:
    state = run([1000.0] * 200, step=600.0)
    assert any(v >= 0 for v in state.profile)
    other = forecast.update(state, 1000.0, 200 * 600.0, 3600, KNOBS)
    assert other.period_seconds == 3600
    assert other.profile == []
    assert other.first_at == 200 * 600.0


def test_status_stays_small() -> None:
    """A day of observations: the state serialised in status is about a kilobyte."""
    state = run([diurnal(i * 300.0) * 1.2345678 for i in range(2 * 288)], step=300.0)
    size = len(state.model_dump_json(by_alias=True, exclude_none=True))
    assert size < 2000, size


@pytest.mark.parametrize(
    ("passes", "expected"),
    [
        ([(0.0, 2), (30.0, 2), (150.0, 0)], 150.0),  # first seen starting, first seen all ready
        ([(0.0, 0), (30.0, 0)], None),  # nothing started
        ([(0.0, 1), (30.0, 1)], None),  # still loading
    ],
)
def test_start_to_ready(passes: list[tuple[float, int]], expected: float | None) -> None:
    state: ForecastStatus | None = None
    for now, starting in passes:
        state = forecast.observe_starting(state, starting, now)
    assert state is not None
    assert state.load_seconds == expected
    assert forecast.horizon(state, 180.0) == (expected if expected is not None else 180.0)


demands = st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=1, max_size=80)


@settings(max_examples=60, deadline=None)
@given(demands, st.floats(min_value=1.0, max_value=2000.0), st.floats(min_value=0.0, max_value=3600.0))
def test_bounded_state(series: list[float], step: float, horizon: float) -> None:
    state = run(series, step=step, period=3600)
    top = max(series)
    assert 0.0 <= state.level <= top
    assert abs(state.trend) <= top / KNOBS.forecast_trend_seconds + 1e-9
    assert all(v == forecast.UNSEEN or 0.0 <= v <= top * 1.001 for v in state.profile)
    predicted = forecast.predict(state, state.updated_at or 0.0, horizon, KNOBS)
    assert predicted is not None
    assert 0.0 <= predicted <= KNOBS.forecast_max_ratio * top + 1e-6


@settings(max_examples=60, deadline=None)
@given(
    demands,
    st.floats(min_value=1.0, max_value=1e5),
    st.floats(min_value=1.0, max_value=600.0),
    st.floats(min_value=0.0, max_value=3600.0),
)
def test_monotone_in_level(series: list[float], extra: float, step: float, horizon: float) -> None:
    """More demand observed last never forecasts less."""
    state = run(series, step=step, period=3600)
    now = (state.updated_at or 0.0) + step
    low = forecast.update(state, series[-1], now, 3600, KNOBS)
    high = forecast.update(state, series[-1] + extra, now, 3600, KNOBS)
    assert high.level >= low.level
    p_low, p_high = forecast.predict(low, now, horizon, KNOBS), forecast.predict(high, now, horizon, KNOBS)
    assert p_low is not None
    assert p_high is not None
    assert p_high >= p_low - 1e-6 * max(1.0, p_low)
