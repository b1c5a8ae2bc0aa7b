"""`judge(window, analysis) -> Verdict`: one analysis window of the two arms, pure.

A `Window` holds what clients saw on each arm over the same interval: the target arm (P/D during a
colocated -> P/D rollout, or the new revision) and the baseline arm (colocated, or the old
revision). Its producer (Prometheus live, the cluster simulator offline) lists in `metrics_missing`
every signal it could not read. Rules, in this order:

1. anything missing, or a figure that is not a finite number in range -> Inconclusive, with
   `Verdict.missing` set (step() then applies `onMetricsUnavailable`);
2. a window shorter than `analysis.window_seconds` -> Inconclusive;
3. fewer than `analysis.min_samples` requests on the target arm -> Inconclusive (no traffic is not
   a failure, and never a pass);
4. Fail when any threshold is broken: attainment below the floor, attainment more than the allowed
   drop below the baseline's (judged only when the baseline arm has `min_samples` requests too;
   otherwise the target is judged against the SLO alone, and `baselineCompared` is 0), error rate,
   KV-transfer failure rate, effective KV bandwidth ratio (the last two only where measured);
5. otherwise Pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum

from tandem.rollout.config import Analysis


class Result(StrEnum):
    Pass = "Pass"
    Fail = "Fail"
    Inconclusive = "Inconclusive"


@dataclass(frozen=True, slots=True)
class ArmWindow:
    """One arm over the window (the routers' counters and histograms, the engines' NIXL metrics)."""

    requests: int = 0  # requests finished on this arm
    attainment: float | None = None  # share of them within both the TTFT and TPOT target, 0..1
    ttft_seconds: float | None = None  # TTFT at the SLO's quantile (reported, not judged)
    tpot_seconds: float | None = None  # TPOT at the SLO's quantile (reported, not judged)
    error_rate: float = 0.0  # failed requests / requests, 0..1
    # Of `requests`, those meant for this arm that the other served because this one had no ready pod;
    # each counts as failed (in `error_rate`) and not within the SLO (in `attainment`).
    stood_in: int = 0
    kv_failure_rate: float | None = None  # failed KV transfers / transfers; None: no transfer (colocated)
    # Effective KV bandwidth over transfers above the minimum size / kvTransfer.bandwidthGbps;
    # None: no transfer large enough to judge.
    kv_bandwidth_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class Window:
    start: float  # unix (or virtual) seconds
    end: float
    target: ArmWindow
    baseline: ArmWindow = ArmWindow()
    metrics_missing: tuple[str, ...] = ()  # why some signal could not be read; non-empty: no data


@dataclass(frozen=True, slots=True)
class Verdict:
    result: Result
    reason: str  # one sentence with the figures
    figures: Mapping[str, float] = field(default_factory=dict)  # camelCase keys, finite values
    window_start: float = 0.0
    window_end: float = 0.0
    missing: tuple[str, ...] = ()  # set: Inconclusive because metrics are unavailable


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.3g}"


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def _bad_figures(name: str, arm: ArmWindow) -> list[str]:
    problems = []
    if arm.requests < 0:
        problems.append(f"{name} requests is {arm.requests}")
    for f in fields(arm):
        value = getattr(arm, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{name} {f.name} is {value}")
        elif isinstance(value, float) and value < 0:
            problems.append(f"{name} {f.name} is negative ({_fmt(value)})")
    for rate in ("attainment", "error_rate", "kv_failure_rate"):
        value = getattr(arm, rate)
        if value is not None and math.isfinite(value) and value > 1:
            problems.append(f"{name} {rate} is above 1 ({_fmt(value)})")
    return problems


def _figures(window: Window) -> dict[str, float]:
    figures: dict[str, float] = {"windowSeconds": window.end - window.start}
    for prefix, arm in (("target", window.target), ("baseline", window.baseline)):
        figures[f"{prefix}Requests"] = float(arm.requests)
        if arm.stood_in:
            figures[f"{prefix}StoodIn"] = float(arm.stood_in)
        for key, value in (
            ("Attainment", arm.attainment),
            ("TtftSeconds", arm.ttft_seconds),
            ("TpotSeconds", arm.tpot_seconds),
            ("ErrorRate", arm.error_rate),
            ("KvFailureRate", arm.kv_failure_rate),
            ("KvBandwidthRatio", arm.kv_bandwidth_ratio),
        ):
            if value is not None and math.isfinite(value):
                figures[f"{prefix}{key}"] = float(value)
    return figures


def judge(window: Window, analysis: Analysis) -> Verdict:
    """The verdict on one window; see the module docstring for the rules and their order."""

    def verdict(
        result: Result, reason: str, figures: Mapping[str, float], missing: tuple[str, ...] = ()
    ) -> Verdict:
        return Verdict(result, reason, figures, window.start, window.end, missing)

    missing = list(window.metrics_missing)
    if not (math.isfinite(window.start) and math.isfinite(window.end)):
        missing.append(f"window [{window.start}, {window.end}] is not finite")
    missing += _bad_figures("target", window.target) + _bad_figures("baseline", window.baseline)
    if window.target.requests >= analysis.min_samples and window.target.attainment is None:
        missing.append(f"target attainment is unknown over {window.target.requests} requests")
    if missing:
        return verdict(Result.Inconclusive, "metrics unavailable: " + "; ".join(missing), {}, tuple(missing))

    figures = _figures(window)
    target, baseline = window.target, window.baseline
    length = window.end - window.start
    if length < analysis.window_seconds:
        return verdict(
            Result.Inconclusive,
            f"window of {_fmt(length)} s is shorter than the analysis window "
            f"({_fmt(analysis.window_seconds)} s)",
            figures,
        )
    if target.requests < analysis.min_samples:
        return verdict(
            Result.Inconclusive,
            f"only {target.requests} requests on the target arm in {_fmt(length)} s "
            f"(at least {analysis.min_samples} needed)",
            figures,
        )

    assert target.attainment is not None  # checked with the missing figures
    failures = []
    if target.attainment < analysis.attainment_floor:
        failures.append(
            f"SLO attainment {_pct(target.attainment)} below the floor {_pct(analysis.attainment_floor)}"
        )
    compared = baseline.requests >= analysis.min_samples and baseline.attainment is not None
    figures["baselineCompared"] = 1.0 if compared else 0.0
    if compared:
        assert baseline.attainment is not None
        drop = baseline.attainment - target.attainment
        figures["attainmentDrop"] = drop
        if drop > analysis.max_attainment_drop + 1e-9:  # a drop met exactly passes, float error aside
            failures.append(
                f"SLO attainment {_pct(target.attainment)} is {_pct(drop)} below the baseline's "
                f"{_pct(baseline.attainment)} (at most {_pct(analysis.max_attainment_drop)})"
            )
    if target.error_rate > analysis.max_error_rate:
        stood_in = (
            f" ({target.stood_in} of them served by the other arm: no ready pod on this one)"
            if target.stood_in
            else ""
        )
        failures.append(
            f"error rate {_pct(target.error_rate)} above {_pct(analysis.max_error_rate)}{stood_in}"
        )
    if target.kv_failure_rate is not None and target.kv_failure_rate > analysis.max_kv_failure_rate:
        failures.append(
            f"KV-transfer failure rate {_pct(target.kv_failure_rate)} above "
            f"{_pct(analysis.max_kv_failure_rate)}"
        )
    if target.kv_bandwidth_ratio is not None and target.kv_bandwidth_ratio < analysis.min_kv_bandwidth_ratio:
        failures.append(
            f"KV bandwidth at {_pct(target.kv_bandwidth_ratio)} of the link's, below "
            f"{_pct(analysis.min_kv_bandwidth_ratio)}"
        )
    if failures:
        return verdict(
            Result.Fail, f"{target.requests} requests on the target arm: " + "; ".join(failures), figures
        )
    against = (
        f"the baseline's {_pct(baseline.attainment)}"
        if compared and baseline.attainment is not None
        else f"the SLO alone (baseline {baseline.requests} requests, fewer than {analysis.min_samples})"
    )
    return verdict(
        Result.Pass,
        f"{target.requests} requests on the target arm, SLO attainment {_pct(target.attainment)} "
        f"against {against}",
        figures,
    )
