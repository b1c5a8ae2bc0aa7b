"""The config's checks (each naming its field) and the state's mapping onto status.rollout."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import pytest

from tandem.rollout.config import Analysis, OnMetricsUnavailable, RolloutConfig, Step
from tandem.rollout.judge import Result, Verdict
from tandem.rollout.state import (
    MAX_VERDICTS,
    PauseCause,
    Phase,
    RollbackStage,
    RolloutState,
    VerdictRecord,
    start,
    weight_of,
)

T = 1_800_000_000.0
CONFIG = RolloutConfig(steps=(Step(5, 300), Step(25, 300), Step(100, None)))

BAD_CONFIGS = [
    # id, build, field named in the error
    ("no-steps", lambda: RolloutConfig(steps=()), "rollout.steps"),
    ("weight-negative", lambda: RolloutConfig(steps=(Step(-1),)), "rollout.steps[0].weight"),
    # 0 is the tenants stage: the first step or none
    ("weight-0-not-first", lambda: RolloutConfig(steps=(Step(10), Step(0))), "rollout.steps[1].weight"),
    ("weight-101", lambda: RolloutConfig(steps=(Step(50), Step(101))), "rollout.steps[1].weight"),
    ("decreasing", lambda: RolloutConfig(steps=(Step(50), Step(20))), "rollout.steps[1].weight"),
    ("repeated", lambda: RolloutConfig(steps=(Step(50), Step(50))), "rollout.steps[1].weight"),
    ("negative-pause", lambda: RolloutConfig(steps=(Step(50, -1),)), "rollout.steps[0].pauseSeconds"),
    ("nan-pause", lambda: RolloutConfig(steps=(Step(50, math.nan),)), "rollout.steps[0].pauseSeconds"),
    (
        "negative-delay",
        lambda: RolloutConfig(steps=(Step(50),), scale_down_delay_seconds=-1),
        "rollout.scaleDownDelaySeconds",
    ),
    ("short-window", lambda: Analysis(window_seconds=0.5), "analysis.windowSeconds"),
    ("no-samples", lambda: Analysis(min_samples=0), "analysis.minSamples"),
    ("floor-over-1", lambda: Analysis(attainment_floor=1.5), "analysis.attainmentFloor"),
    ("drop-negative", lambda: Analysis(max_attainment_drop=-0.1), "analysis.maxAttainmentDrop"),
    ("error-rate-nan", lambda: Analysis(max_error_rate=math.nan), "analysis.maxErrorRate"),
    ("kv-failure-over-1", lambda: Analysis(max_kv_failure_rate=2), "analysis.maxKVFailureRate"),
    ("kv-ratio-negative", lambda: Analysis(min_kv_bandwidth_ratio=-1), "analysis.minKVBandwidthRatio"),
    (
        "grace-negative",
        lambda: Analysis(metrics_unavailable_seconds=-1),
        "analysis.metricsUnavailableSeconds",
    ),
    (
        "inconclusive-inf",
        lambda: Analysis(inconclusive_pause_seconds=math.inf),
        "analysis.inconclusivePauseSeconds",
    ),
]


@pytest.mark.parametrize(("build", "field"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_refused_naming_the_field(build: Any, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(field)}: "):
        build()


def test_bake_and_weights() -> None:
    config = dataclasses.replace(CONFIG, analysis=Analysis(window_seconds=120))
    assert [config.bake_seconds(i) for i in range(3)] == [300, 300, 120]
    assert config.weights() == {0, 5, 25, 100}
    assert [weight_of(p, 1, config) for p in Phase] == [0, 25, 25, 100, 0, 0]


def record(step: int, result: Result, end: float, **figures: float) -> VerdictRecord:
    missing = ("prometheus: timeout",) if result is Result.Inconclusive and not figures else ()
    return VerdictRecord(step, Verdict(result, f"{result} at {end}", figures, end - 60, end, missing))


STATES = [
    start(CONFIG, T),
    start(CONFIG, T, last_command="abort/1", attempt=3),
    RolloutState(
        phase=Phase.Shifting,
        step=1,
        weight=25,
        started_at=T,
        step_started_at=T + 400.5,
        phase_since=T + 400.5,
        reason="step 1: baking",
        metrics_missing_since=T + 420,
        last_command="promote",
        last_command_outcome="promote command at step 0; step 1: 25% to the target arm",
        verdicts=tuple(
            record(i % 2, Result.Pass, T + 60 * i, targetRequests=400, attainmentDrop=-0.01) for i in range(5)
        ),
    ),
    RolloutState(
        phase=Phase.Paused,
        step=2,
        weight=100,
        started_at=T,
        step_started_at=T + 900,
        phase_since=T + 960,
        reason="waiting for a promote command",
        pause_cause=PauseCause.AwaitingPromote,
        verdicts=(record(2, Result.Inconclusive, T + 960),),
    ),
    RolloutState(
        phase=Phase.RollingBack,
        step=0,
        weight=0,
        started_at=T,
        step_started_at=T,
        phase_since=T + 30,
        reason="step 0 failed",
        rollback_stage=RollbackStage.RestoringWeight,
        verdicts=(record(0, Result.Fail, T + 30, targetAttainment=0.5),),
    ),
    RolloutState(
        phase=Phase.Promoted,
        step=2,
        weight=100,
        started_at=T,
        step_started_at=T,
        phase_since=T,
        reason="done",
    ),
]


@pytest.mark.parametrize("s", STATES, ids=[f"{s.phase}-{i}" for i, s in enumerate(STATES)])
def test_state_round_trips_through_json(s: RolloutState) -> None:
    data = json.loads(json.dumps(s.to_dict()))
    assert RolloutState.from_dict(data) == s
    assert {"phase", "step", "weight", "startedAt", "stepStartedAt", "reason", "verdicts"} <= set(data)


def test_status_keys_are_camel_case_and_none_left_out() -> None:
    data = STATES[3].to_dict()
    assert data["pauseCause"] == "AwaitingPromote"
    assert "rollbackStage" not in data
    assert "lastCommand" not in data
    assert data["verdicts"][0] == {
        "step": 2,
        "result": "Inconclusive",
        "reason": f"Inconclusive at {T + 960}",
        "figures": {},
        "windowStart": T + 900,
        "windowEnd": T + 960,
        "missing": ["prometheus: timeout"],
    }


GOOD = STATES[2].to_dict()
BAD_STATUS = [
    # id, change to a good status.rollout, words in the error
    ("not-a-mapping", None, "must be a mapping"),
    ("no-phase", {"phase": None}, "status.rollout.phase: must be one of Preparing"),
    ("unknown-phase", {"phase": "Canarying"}, "status.rollout.phase"),
    ("string-step", {"step": "1"}, "status.rollout.step: must be an integer"),
    ("bool-weight", {"weight": True}, "status.rollout.weight: must be an integer"),
    ("weight-over-100", {"weight": 101}, "weight must be within 0..100"),
    ("negative-step", {"step": -1}, "step must be >= 0"),
    ("nan-time", {"startedAt": math.nan}, "status.rollout.startedAt: must be a finite number"),
    ("cause-not-paused", {"pauseCause": "Inconclusive"}, "pauseCause must be set exactly when Paused"),
    ("paused-no-cause", {"phase": "Paused"}, "pauseCause must be set exactly when Paused"),
    ("rollingback-no-stage", {"phase": "RollingBack"}, "rollbackStage must be set exactly when RollingBack"),
    ("bad-stage", {"phase": "RollingBack", "rollbackStage": "Sideways"}, "status.rollout.rollbackStage"),
    ("verdicts-not-list", {"verdicts": {}}, "status.rollout.verdicts: must be a list"),
    ("too-many-verdicts", {"verdicts": GOOD["verdicts"] * 2}, f"at most {MAX_VERDICTS} verdicts"),
    ("verdict-not-mapping", {"verdicts": ["Pass"]}, "status.rollout.verdicts[0]: must be a mapping"),
    ("verdict-result", {"verdicts": [{**GOOD["verdicts"][0], "result": "Maybe"}]}, "verdicts[0].result"),
    (
        "verdict-figures",
        {"verdicts": [{**GOOD["verdicts"][0], "figures": {"x": "1"}}]},
        "verdicts[0].figures: must map names to finite numbers",
    ),
    ("verdict-missing", {"verdicts": [{**GOOD["verdicts"][0], "missing": "x"}]}, "verdicts[0].missing"),
    ("command-not-string", {"lastCommand": 3}, "status.rollout.lastCommand: must be a string"),
]


@pytest.mark.parametrize(("change", "words"), [c[1:] for c in BAD_STATUS], ids=[c[0] for c in BAD_STATUS])
def test_malformed_status_is_refused_naming_the_key(change: dict[str, Any] | None, words: str) -> None:
    data: Any = None if change is None else {**GOOD, **change}
    with pytest.raises(ValueError, match=r"status\.rollout") as error:
        RolloutState.from_dict(data)
    assert words in str(error.value)


def test_defaults_are_filled_for_optional_keys() -> None:
    minimal = {
        "phase": "Promoted",
        "step": 2,
        "weight": 100,
        "startedAt": T,
        "stepStartedAt": T,
        "phaseSince": T,
    }
    s = RolloutState.from_dict(minimal)
    assert (s.attempt, s.reason, s.verdicts, s.last_command, s.last_command_outcome) == (1, "", (), None, "")


def test_on_metrics_unavailable_values() -> None:
    assert [m.value for m in OnMetricsUnavailable] == ["Pause", "Rollback"]
