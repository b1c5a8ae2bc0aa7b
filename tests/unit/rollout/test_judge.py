"""judge(): one row per rule, with the boundaries (a threshold met exactly passes)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from tandem.rollout.config import Analysis
from tandem.rollout.judge import ArmWindow, Result, Window, judge

T = 1_800_000_000.0
ANALYSIS = Analysis(
    window_seconds=60,
    min_samples=100,
    attainment_floor=0.90,
    max_attainment_drop=0.05,
    max_error_rate=0.01,
    max_kv_failure_rate=0.02,
    min_kv_bandwidth_ratio=0.5,
)
GOOD_TARGET = ArmWindow(
    requests=400,
    attainment=0.97,
    ttft_seconds=0.3,
    tpot_seconds=0.03,
    error_rate=0.0,
    kv_failure_rate=0.0,
    kv_bandwidth_ratio=0.9,
)
BASELINE = ArmWindow(requests=1600, attainment=0.98, ttft_seconds=0.4, tpot_seconds=0.05, error_rate=0.001)


def window(
    target: dict[str, Any] | None = None, baseline: dict[str, Any] | None = None, **extra: Any
) -> Window:
    return Window(
        start=extra.pop("start", T - 60),
        end=extra.pop("end", T),
        target=dataclasses.replace(GOOD_TARGET, **(target or {})),
        baseline=dataclasses.replace(BASELINE, **(baseline or {})),
        **extra,
    )


CASES = [
    # id, window, result, words in the reason
    ("healthy", window(), Result.Pass, ["400 requests", "97.0%", "the baseline's 98.0%"]),
    ("floor-met-exactly", window({"attainment": 0.90}, {"attainment": 0.95}), Result.Pass, []),
    ("drop-met-exactly", window({"attainment": 0.93}, {"attainment": 0.98}), Result.Pass, []),
    ("drop-met-exactly-float-error", window({"attainment": 0.94}, {"attainment": 0.99}), Result.Pass, []),
    ("error-rate-met-exactly", window({"error_rate": 0.01}), Result.Pass, []),
    ("kv-ratio-met-exactly", window({"kv_bandwidth_ratio": 0.5}), Result.Pass, []),
    (
        "colocated-like-target-no-kv",
        window({"kv_failure_rate": None, "kv_bandwidth_ratio": None}),
        Result.Pass,
        [],
    ),
    (
        "small-baseline-judged-on-slo-alone",
        window({"attainment": 0.91}, {"requests": 20, "attainment": 1.0}),
        Result.Pass,
        ["the SLO alone", "baseline 20 requests"],
    ),
    (
        "below-floor",
        window({"attainment": 0.85}),
        Result.Fail,
        ["SLO attainment 85.0% below the floor 90.0%"],
    ),
    (
        "drop-vs-baseline",
        window({"attainment": 0.92}, {"attainment": 0.99}),
        Result.Fail,
        ["7.0% below the baseline's 99.0%"],
    ),
    ("errors", window({"error_rate": 0.05}), Result.Fail, ["error rate 5.0% above 1.0%"]),
    (
        "kv-failures",
        window({"kv_failure_rate": 0.10}),
        Result.Fail,
        ["KV-transfer failure rate 10.0% above 2.0%"],
    ),
    ("slow-link", window({"kv_bandwidth_ratio": 0.1}), Result.Fail, ["KV bandwidth at 10.0% of the link's"]),
    (
        "every-failure-named",
        window({"attainment": 0.5, "error_rate": 0.5, "kv_failure_rate": 0.5, "kv_bandwidth_ratio": 0.0}),
        Result.Fail,
        ["below the floor", "below the baseline's", "error rate", "KV-transfer failure", "KV bandwidth"],
    ),
    ("too-few-samples", window({"requests": 99}), Result.Inconclusive, ["only 99 requests", "at least 100"]),
    (
        "too-few-samples-even-if-bad",
        window({"requests": 10, "attainment": 0.0, "error_rate": 1.0}),
        Result.Inconclusive,
        ["only 10 requests"],
    ),
    ("no-traffic", window({"requests": 0, "attainment": None}), Result.Inconclusive, ["only 0 requests"]),
    ("short-window", window(start=T - 30), Result.Inconclusive, ["window of 30 s is shorter"]),
    (
        "metrics-missing",
        window(metrics_missing=("router histograms: timeout",)),
        Result.Inconclusive,
        ["metrics unavailable: router histograms: timeout"],
    ),
    ("nan-attainment", window({"attainment": math.nan}), Result.Inconclusive, ["target attainment is nan"]),
    (
        "inf-ttft",
        window(baseline={"ttft_seconds": math.inf}),
        Result.Inconclusive,
        ["baseline ttft_seconds is inf"],
    ),
    ("attainment-above-1", window({"attainment": 1.5}), Result.Inconclusive, ["attainment is above 1"]),
    ("negative-rate", window({"error_rate": -0.1}), Result.Inconclusive, ["error_rate is negative"]),
    (
        "negative-requests",
        window(baseline={"requests": -1}),
        Result.Inconclusive,
        ["baseline requests is -1"],
    ),
    ("unknown-attainment", window({"attainment": None}), Result.Inconclusive, ["attainment is unknown"]),
    ("infinite-window", window(end=math.inf), Result.Inconclusive, ["is not finite"]),
]


@pytest.mark.parametrize(("w", "result", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_judge(w: Window, result: Result, words: list[str]) -> None:
    v = judge(w, ANALYSIS)
    assert v.result is result, v.reason
    for word in words:
        assert word in v.reason
    assert (v.window_start, v.window_end) == (w.start, w.end)
    assert all(isinstance(x, float) and math.isfinite(x) for x in v.figures.values())
    assert len(v.figures) <= 32
    assert bool(v.missing) is v.reason.startswith("metrics unavailable")


def test_figures_name_both_arms_and_the_comparison() -> None:
    v = judge(window({"attainment": 0.95}), ANALYSIS)
    assert v.figures["targetRequests"] == 400
    assert v.figures["targetAttainment"] == 0.95
    assert v.figures["targetTtftSeconds"] == 0.3
    assert v.figures["baselineTpotSeconds"] == 0.05
    assert v.figures["targetKvBandwidthRatio"] == 0.9
    assert v.figures["attainmentDrop"] == pytest.approx(0.03)
    assert v.figures["baselineCompared"] == 1.0
    assert v.figures["windowSeconds"] == 60
    assert "baselineKvFailureRate" not in v.figures  # not measured on a colocated arm


def test_only_missing_metrics_set_missing() -> None:
    assert judge(window(metrics_missing=("a", "b")), ANALYSIS).missing == ("a", "b")
    assert judge(window({"requests": 1}), ANALYSIS).missing == ()
