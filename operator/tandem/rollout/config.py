"""What a rollout is told: its steps and its analysis thresholds, as frozen records.

They mirror `spec.rollout` but are not API models: the controller builds them from the API's
(`controller.rollout.rollout_config`). Construction checks every field and raises `ValueError`
naming it (the API refuses the same at apply time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class OnMetricsUnavailable(StrEnum):
    Pause = "Pause"
    Rollback = "Rollback"


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field}: {message}")


def _finite_at_least(value: float, low: float, field: str) -> None:
    _check(math.isfinite(value) and value >= low, field, f"must be a finite number >= {low:g}, got {value!r}")


def _fraction(value: float, field: str) -> None:
    _check(math.isfinite(value) and 0.0 <= value <= 1.0, field, f"must be within [0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class Step:
    # Percent of requests on the target arm, 1..100; 0 on the first step only: the tenants stage,
    # where only spec.rollout.tenants go to the target arm (the routers send them there in every
    # step, at any weight) and everyone else stays on the source.
    weight: int
    # Least time at this weight; the step also bakes for at least one analysis window.
    # None: a manual gate, after a passing verdict the rollout waits (Paused) for `promote`.
    pause_seconds: float | None = 0.0


@dataclass(frozen=True, slots=True)
class Analysis:
    window_seconds: float = 60.0  # one verdict judges this much traffic; also each step's least bake
    min_samples: int = 100  # requests the target arm must finish in a window for a conclusive verdict
    attainment_floor: float = 0.95  # the target arm's SLO attainment (0..1) must reach this
    max_attainment_drop: float = 0.05  # ... and be at most this far below the baseline arm's
    max_error_rate: float = 0.01  # failed requests / requests on the target arm
    max_kv_failure_rate: float = 0.01  # failed KV transfers / KV transfers on the target arm
    min_kv_bandwidth_ratio: float = 0.5  # effective KV bandwidth / kvTransfer.bandwidthGbps
    on_metrics_unavailable: OnMetricsUnavailable = OnMetricsUnavailable.Pause
    # Metrics may be missing this long before `on_metrics_unavailable` applies (0: at once).
    metrics_unavailable_seconds: float = 0.0
    # A step that stays neither passed nor failed this long after its bake pauses (Inconclusive).
    inconclusive_pause_seconds: float = 600.0

    def __post_init__(self) -> None:
        _finite_at_least(self.window_seconds, 1.0, "analysis.windowSeconds")
        _check(self.min_samples >= 1, "analysis.minSamples", f"must be >= 1, got {self.min_samples}")
        _fraction(self.attainment_floor, "analysis.attainmentFloor")
        _fraction(self.max_attainment_drop, "analysis.maxAttainmentDrop")
        _fraction(self.max_error_rate, "analysis.maxErrorRate")
        _fraction(self.max_kv_failure_rate, "analysis.maxKVFailureRate")
        _finite_at_least(self.min_kv_bandwidth_ratio, 0.0, "analysis.minKVBandwidthRatio")
        _finite_at_least(self.metrics_unavailable_seconds, 0.0, "analysis.metricsUnavailableSeconds")
        _finite_at_least(self.inconclusive_pause_seconds, 0.0, "analysis.inconclusivePauseSeconds")


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    steps: tuple[Step, ...]
    analysis: Analysis = Analysis()
    # Off: the operator never rolls back by itself: a Fail, or metrics unavailable with
    # `onMetricsUnavailable: Rollback`, pauses the rollout at its weight instead (Paused, Failed or
    # MetricsUnavailable); `abort` is then the way back.
    auto_rollback: bool = True
    # RollingBack keeps the target arm's pods this long after the weight went back to the source,
    # so routers have read the weight and in-flight requests have finished.
    scale_down_delay_seconds: float = 30.0
    # Preparing lasts at most this long: a target arm not ready by then (pods that never schedule,
    # never pull, never load) rolls back (reason `PrepareTimeout`). None: no deadline.
    prepare_timeout_seconds: float | None = 900.0

    def __post_init__(self) -> None:
        _check(len(self.steps) >= 1, "rollout.steps", "needs at least one step")
        previous = -1
        for i, s in enumerate(self.steps):
            low = 0 if i == 0 else 1  # 0: the tenants stage, first or not at all
            _check(
                low <= s.weight <= 100,
                f"rollout.steps[{i}].weight",
                f"must be within {low}..100, got {s.weight}",
            )
            _check(
                s.weight > previous,
                f"rollout.steps[{i}].weight",
                f"must be greater than the previous step's ({previous}), got {s.weight}",
            )
            previous = s.weight
            if s.pause_seconds is not None:
                _finite_at_least(s.pause_seconds, 0.0, f"rollout.steps[{i}].pauseSeconds")
        _finite_at_least(self.scale_down_delay_seconds, 0.0, "rollout.scaleDownDelaySeconds")
        if self.prepare_timeout_seconds is not None:
            _finite_at_least(self.prepare_timeout_seconds, 1.0, "rollout.prepareTimeoutSeconds")

    @property
    def last_step(self) -> int:
        return len(self.steps) - 1

    def bake_seconds(self, index: int) -> float:
        """Least time at step `index`: its pause, and at least one analysis window."""
        pause = self.steps[index].pause_seconds
        return max(pause or 0.0, self.analysis.window_seconds)

    def describe(self, index: int) -> str:
        """What step `index` sends to the target arm, for reasons and Events."""
        weight = self.steps[index].weight
        return (
            "spec.rollout.tenants only to the target arm" if weight == 0 else f"{weight}% to the target arm"
        )

    def describe_steps(self) -> str:
        """The steps in order, for the Event that starts a rollout: `tenants only, 50%, 100%`."""
        return ", ".join("tenants only" if s.weight == 0 else f"{s.weight}%" for s in self.steps)

    def weights(self) -> frozenset[int]:
        """Every weight a rollout may publish: the steps', 0 (source only) and 100 (promoted)."""
        return frozenset({0, 100, *(s.weight for s in self.steps)})
