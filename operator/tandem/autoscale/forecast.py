"""A pool's demand forecast, one model load ahead: pure functions over `ForecastStatus`.

The demand is what the pool's recommendation sizes from (`Sizing.demand`): arriving prompt tokens/s for
prefill and colocated, output tokens/s (generated or about to arrive) for decode. Two parts:
- a Holt filter (level and trend) over every pass's demand, with time constants in seconds
  (`Knobs.forecast_level_seconds`, `forecast_trend_seconds`), so uneven spacing weighs correctly; a
  pass more than `forecast_gap_seconds` after the previous restarts level and trend at the new value
  (no trend is carried across a gap), and a non-finite or negative demand changes nothing;
- a seasonal profile: `FORECAST_BUCKETS` buckets over `seasonPeriodSeconds`, each the mean demand of
  its bucket in the latest period, blended period over period by `forecast_season_weight`. It is used
  only once a whole period has passed since the first observation, as the ratio of the profile one
  horizon ahead to the profile now (interpolated between bucket centres), applied to the level.
The forecast is the larger of the two, within [level / `forecast_max_ratio`, level x that]. The pool's
start-to-ready time is measured here too (`observe_starting`): the horizon is one model load.
"""

from __future__ import annotations

import math

from tandem.api.status import FORECAST_BUCKETS, ForecastStatus
from tandem.autoscale.knobs import Knobs

UNSEEN = -1.0  # a profile bucket no period has filled yet
MAX_LOAD_SECONDS = 3600.0


def _sig(value: float) -> float:
    """Four significant figures: the profile lives in status, where every digit is bytes."""
    return float(f"{value:.4g}")


def _width(period: int) -> float:
    return period / FORECAST_BUCKETS


def _fold(state: ForecastStatus, knobs: Knobs) -> list[float]:
    """The profile with the bucket being accumulated blended in."""
    profile = list(state.profile) or [UNSEEN] * FORECAST_BUCKETS
    if state.bucket is None or state.bucket_count == 0:
        return profile
    mean = state.bucket_sum / state.bucket_count
    slot = state.bucket % FORECAST_BUCKETS
    old = profile[slot]
    w = knobs.forecast_season_weight
    profile[slot] = _sig(mean if old < 0 else (1 - w) * old + w * mean)
    return profile


def update(
    state: ForecastStatus | None, demand: float, now: float, period: int, knobs: Knobs
) -> ForecastStatus:
    """`state` with one observation of the demand at `now` (seconds); `period`: seasonPeriodSeconds."""
    if state is None:
        state = ForecastStatus()
    if not math.isfinite(demand) or demand < 0 or not math.isfinite(now):
        return state
    if state.period_seconds != period:  # a profile of another period says nothing about this one
        state = ForecastStatus(starting_since=state.starting_since, load_seconds=state.load_seconds)
    level, trend = demand, 0.0
    last = state.updated_at
    if last is not None and now <= last:
        return state  # the same pass again, or a clock stepped back: nothing new to learn
    if last is not None and now - last <= knobs.forecast_gap_seconds:
        dt = now - last
        a = 1.0 - math.exp(-dt / knobs.forecast_level_seconds)
        b = 1.0 - math.exp(-dt / knobs.forecast_trend_seconds)
        predicted = state.level + state.trend * dt
        level = min(max(0.0, predicted + a * (demand - predicted)), max(demand, state.level))
        trend = state.trend + b * ((level - state.level) / dt - state.trend)
        bound = max(level, demand) / knobs.forecast_trend_seconds
        trend = min(bound, max(-bound, trend))
    bucket = math.floor(now / _width(period))
    profile, total, count = list(state.profile), state.bucket_sum, state.bucket_count
    if state.bucket is None or bucket != state.bucket:
        if state.bucket is not None and bucket > state.bucket:
            profile = _fold(state, knobs)
        total, count = 0.0, 0
    return state.model_copy(
        update={
            "level": level,
            "trend": trend,
            "updated_at": now,
            "first_at": state.first_at if state.first_at is not None else now,
            "period_seconds": period,
            "profile": profile,
            "bucket": bucket,
            "bucket_sum": total + demand,
            "bucket_count": count + 1,
        }
    )


def seasonal_at(state: ForecastStatus, t: float) -> float | None:
    """The profile at time `t`, interpolated between the centres of its buckets (None: not learnt)."""
    if not state.profile or state.period_seconds <= 0:
        return None
    width = _width(state.period_seconds)
    position = (t % state.period_seconds) / width - 0.5
    below = math.floor(position)
    frac = position - below
    lo = state.profile[below % FORECAST_BUCKETS]
    hi = state.profile[(below + 1) % FORECAST_BUCKETS]
    if lo < 0 and hi < 0:
        return None
    if lo < 0:
        return hi
    if hi < 0:
        return lo
    return (1 - frac) * lo + frac * hi


def season_ready(state: ForecastStatus, now: float) -> bool:
    """A whole period has passed since the first observation."""
    return (
        state.first_at is not None
        and state.period_seconds > 0
        and now - state.first_at >= state.period_seconds
    )


def predict(state: ForecastStatus | None, now: float, horizon: float, knobs: Knobs) -> float | None:
    """The demand expected at `now + horizon` (None before any observation)."""
    if state is None or state.updated_at is None:
        return None
    elapsed = max(0.0, now - state.updated_at) + max(0.0, horizon)
    forecast = max(0.0, state.level + state.trend * elapsed)
    if season_ready(state, now):
        here, ahead = seasonal_at(state, now), seasonal_at(state, now + horizon)
        if here is not None and ahead is not None and here > 0:
            forecast = max(forecast, state.level * ahead / here)
    ratio = knobs.forecast_max_ratio
    return min(state.level * ratio, max(state.level / ratio, forecast))


def observe_starting(state: ForecastStatus | None, starting: int, now: float) -> ForecastStatus:
    """Measure the start-to-ready time: from the first pass that sees pods starting to the first that
    sees none (within a pass of the truth at each end), averaged with the previous measurement."""
    if state is None:
        state = ForecastStatus()
    if starting > 0 and state.starting_since is None:
        return state.model_copy(update={"starting_since": now})
    if starting == 0 and state.starting_since is not None:
        sample = min(MAX_LOAD_SECONDS, max(0.0, now - state.starting_since))
        learnt = sample if state.load_seconds is None else 0.5 * (state.load_seconds + sample)
        return state.model_copy(update={"starting_since": None, "load_seconds": learnt})
    return state


def horizon(state: ForecastStatus | None, fallback: float) -> float:
    """One model load: the measured start-to-ready time, else `fallback` (spec.autoscaling.forecast)."""
    if state is None or state.load_seconds is None:
        return fallback
    return state.load_seconds
