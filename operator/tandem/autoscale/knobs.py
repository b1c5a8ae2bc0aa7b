"""The policy's tuning constants, in one frozen record so the simulator can sweep them.

The spec carries what users decide (SLO, bounds, windows, steps, budget); these are the policy's
internal constants. `decide(..., knobs=Knobs(...))` overrides them; everything else uses `KNOBS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Knobs:
    # Dead band: hold while the needed replicas are within this fraction of the current size.
    dead_band: float = 0.10
    # The dead band holds a scale-up only while the pool's latency is comfortably within its target
    # (under comfortable_ratio of it): near the target a small excess is not noise. On (was off): ServeGen
    # days 1-3 93.9% -> 95.2% at 1.8% fewer GPU-hours, the other tuning traces the same or cheaper; held
    # out, the same attainment at up to 3.9% more (docs/simulator.md, "The dead band near the SLO").
    dead_band_up_needs_comfort: bool = True
    # Prefill: a replica is loaded to at most this share of its raw prompt-token throughput, less the
    # queueing room the TTFT target leaves (see capacity.prefill_capacity). 0.7 (was 0.85): bursts that
    # outrun a model load queue for minutes at 0.85 (docs/simulator.md, Results).
    prefill_utilisation_cap: float = 0.7
    prefill_utilisation_floor: float = 0.30
    # Waiting time at the SLO's quantile, in service times (exponential tail: -ln(1 - 0.95) = 3).
    ttft_quantile_factor: float = 3.0
    # Decode: a replica's batch is sized at this share of the TPOT target (the quantile runs above the
    # mean step time), and its KV cache filled to at most this share.
    tpot_headroom: float = 0.85
    kv_target_usage: float = 0.85
    # ... and its output tokens/s loaded to at most this share of what that batch generates.
    decode_utilisation_cap: float = 0.9
    # A decode pod whose KV cache is this full cannot admit: a TTFT miss then is decode's, not prefill's.
    kv_full_usage: float = 0.95
    # Queued prompt tokens are to be drained within this many seconds (0: the decision interval).
    queue_drain_seconds: float = 0.0
    # While pods of a pool are starting, the backlog terms may raise the recommendation above the
    # current size (which counts the starting pods) by this share of their excess only (0: not at all).
    starting_backlog_share: float = 0.0
    # Used while no request finished in the window to say how long prompts and outputs are.
    default_prompt_tokens: float = 1024.0
    default_output_tokens: float = 256.0
    # Capacity correction (measured / profile capacity per replica): bounds, smoothing, SLO feedback.
    correction_min: float = 0.25
    correction_max: float = 4.0
    correction_smoothing: float = 0.3  # weight of a new sample in the geometric moving average
    # On an SLO miss the model did not predict, the correction is multiplied by target/measured
    # latency, kept within [miss_shrink_min, miss_shrink_max]; only when the pool is at least
    # miss_min_load busy (else the miss is not for want of replicas).
    miss_shrink_min: float = 0.80
    miss_shrink_max: float = 0.95
    miss_min_load: float = 0.5
    # Within two windows of a prefill scale-up (new pods load, drain the backlog, then a window passes),
    # a TTFT miss is the window's past, not the pool's present,
    # when the prompts queued now would drain (at the ready replicas' busy rate) within this share of
    # the TTFT target: the window's quantile still holds requests that queued before the scale-up. Then
    # the size holds (no +1, no shrink of the correction). 0: every miss counts as present.
    miss_present_wait_share: float = 0.5
    decode_learn_min_share: float = 0.5  # decode learns from TPOT only at this share of its capacity
    comfortable_ratio: float = 0.80  # latency under this share of its target is "comfortably within"
    # No scale-down while the pool's own latency at the SLO quantile is at or above this share of its
    # target, or attainment is under target (a pool near its SLO is not shrunk into the next burst);
    # the hold is recorded, so the scale-down window restarts. inf: off.
    down_slo_ratio: float = 0.80
    # Comfortably within SLO while at least miss_min_load busy, a correction below 1 moves this share of
    # the way back to 1 per pass (not while lightly loaded: comfort then proves nothing).
    relax_rate: float = 0.10
    # A snapshot older than this many decision intervals is stale (no data).
    stale_intervals: float = 3.0
    # Forecast (`autoscale.forecast`, on with spec.autoscaling.forecast.enabled). Holt's level and trend
    # follow the demand with these time constants (seconds, so irregular passes weigh by their spacing).
    forecast_level_seconds: float = 60.0
    forecast_trend_seconds: float = 300.0
    # A pass more than this after the last one restarts the level and trend (no trend across a gap).
    forecast_gap_seconds: float = 600.0
    # Weight of the latest period's mean in each bucket of the seasonal profile.
    forecast_season_weight: float = 0.5
    # The forecast stays within [level / this, level x this]: a noisy trend or a near-empty bucket of the
    # profile cannot order more than this multiple of the demand now.
    forecast_max_ratio: float = 2.0
    # The forecast and the measured demand agree when they differ by at most this share of the demand;
    # then, with the forecast over the skipped part of the window no higher, the scale-down window is
    # `forecast_down_share` of its length. 1 (off): at 0.5 the sooner scale-downs cost attainment on every
    # tuning trace (ServeGen m-mid days 1-3: 90.7% against 95.4% at 1; docs/autoscaling.md, Forecast).
    forecast_agree_tolerance: float = 0.15
    forecast_down_share: float = 1.0
    # spec.autoscaling.scaleDown.descentStabilizationSeconds when unset: this share of the scale-down
    # window. 1 (off): at 0.2 it saved 5-7% on the Azure conversation and the decode-heavy mix at equal
    # attainment, but cost ServeGen m-mid days 1-3 (compressed 24x) 2.4 points of attainment
    # (docs/autoscaling.md, "A descent's shorter window").
    descent_window_share: float = 1.0


KNOBS = Knobs()
