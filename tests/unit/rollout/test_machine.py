"""step(): the transition table (phase x verdict x command), time, bake, commands, rollback, restart.

Everything runs on a fake clock: `now` is an argument, T is "now" in the table.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from tandem.rollout.config import Analysis, OnMetricsUnavailable, RolloutConfig, Step
from tandem.rollout.judge import Result, Verdict
from tandem.rollout.machine import Command, Observed, Transition, parse_command, step
from tandem.rollout.state import PauseCause, Phase, RollbackStage, RolloutState, start

T = 1_800_000_000.0
WINDOW = 60.0
CONFIG = RolloutConfig(
    steps=(Step(10, 300), Step(50, 300), Step(80, 300)),
    analysis=Analysis(window_seconds=WINDOW, min_samples=100, inconclusive_pause_seconds=600),
    auto_rollback=True,
    scale_down_delay_seconds=30,
)


def verdict(kind: str, end: float = T, length: float = WINDOW) -> Verdict | None:
    """A verdict of `kind` over [end - length, end]; "-" is no verdict this pass."""
    start_ = end - length
    if kind == "-":
        return None
    if kind == "Missing":
        return Verdict(
            Result.Inconclusive, "metrics unavailable: prometheus down", {}, start_, end, ("prometheus down",)
        )
    reason = {
        "Pass": "fine",
        "Fail": "SLO attainment 80.0% below the floor 95.0%",
        "Inconclusive": "only 3 requests",
    }
    return Verdict(Result(kind), reason[kind], {"targetRequests": 500.0}, start_, end)


def command(kind: str, token: str = "") -> Command | None:
    return None if kind == "-" else Command(kind, kind + token)


def state(name: str) -> RolloutState:
    """The table's starting states, each at a point where time alone would change nothing."""
    base = start(CONFIG, T - 100)
    if name == "Preparing":
        return base
    if name == "Shifting":  # step 1, its 300 s bake over, 500 s before it would pause as inconclusive
        return dataclasses.replace(
            base, phase=Phase.Shifting, step=1, weight=50, step_started_at=T - 400, phase_since=T - 400
        )
    if name == "Paused/Inconclusive":
        return dataclasses.replace(
            base,
            phase=Phase.Paused,
            step=1,
            weight=50,
            step_started_at=T - 2000,
            phase_since=T - 500,
            pause_cause=PauseCause.Inconclusive,
        )
    if name == "Promoted":
        return dataclasses.replace(base, phase=Phase.Promoted, step=2, weight=100, phase_since=T - 500)
    if name == "RollingBack/RestoringWeight":  # the weight has been back 60 s (the delay is 30 s)
        return dataclasses.replace(
            base,
            phase=Phase.RollingBack,
            step=1,
            weight=0,
            phase_since=T - 60,
            rollback_stage=RollbackStage.RestoringWeight,
        )
    if name == "RolledBack":
        return dataclasses.replace(base, phase=Phase.RolledBack, step=1, weight=0, phase_since=T - 500)
    raise AssertionError(name)


def label(s: RolloutState) -> str:
    detail = s.pause_cause or s.rollback_stage
    return f"{s.phase}/{detail}" if detail else str(s.phase)


# Every (phase x verdict x command) at T. The verdict's window is [T - 60, T]; "pause" is an unknown
# command. Preparing's target arm is not ready; RollingBack's target arm still has pods.
# from                      verdict       command  -> to                       step weight scaleDown problem
TABLE = """
Preparing                   -             -        Preparing                   0    0  no   no
Preparing                   -             promote  Preparing                   0    0  no   yes
Preparing                   -             abort    RollingBack/ScalingDown     0    0  yes  no
Preparing                   -             retry    Preparing                   0    0  no   yes
Preparing                   -             pause    Preparing                   0    0  no   yes
Preparing                   Pass          -        Preparing                   0    0  no   no
Preparing                   Pass          promote  Preparing                   0    0  no   yes
Preparing                   Pass          abort    RollingBack/ScalingDown     0    0  yes  no
Preparing                   Pass          retry    Preparing                   0    0  no   yes
Preparing                   Pass          pause    Preparing                   0    0  no   yes
Preparing                   Fail          -        Preparing                   0    0  no   no
Preparing                   Fail          promote  Preparing                   0    0  no   yes
Preparing                   Fail          abort    RollingBack/ScalingDown     0    0  yes  no
Preparing                   Fail          retry    Preparing                   0    0  no   yes
Preparing                   Fail          pause    Preparing                   0    0  no   yes
Preparing                   Inconclusive  -        Preparing                   0    0  no   no
Preparing                   Inconclusive  promote  Preparing                   0    0  no   yes
Preparing                   Inconclusive  abort    RollingBack/ScalingDown     0    0  yes  no
Preparing                   Inconclusive  retry    Preparing                   0    0  no   yes
Preparing                   Inconclusive  pause    Preparing                   0    0  no   yes
Preparing                   Missing       -        Preparing                   0    0  no   no
Preparing                   Missing       promote  Preparing                   0    0  no   yes
Preparing                   Missing       abort    RollingBack/ScalingDown     0    0  yes  no
Preparing                   Missing       retry    Preparing                   0    0  no   yes
Preparing                   Missing       pause    Preparing                   0    0  no   yes
Shifting                    -             -        Shifting                    1   50  no   no
Shifting                    -             promote  Shifting                    2   80  no   no
Shifting                    -             abort    RollingBack/RestoringWeight 1    0  no   no
Shifting                    -             retry    Shifting                    1   50  no   yes
Shifting                    -             pause    Shifting                    1   50  no   yes
Shifting                    Pass          -        Shifting                    2   80  no   no
Shifting                    Pass          promote  Shifting                    2   80  no   no
Shifting                    Pass          abort    RollingBack/RestoringWeight 1    0  no   no
Shifting                    Pass          retry    Shifting                    2   80  no   yes
Shifting                    Pass          pause    Shifting                    2   80  no   yes
Shifting                    Fail          -        RollingBack/RestoringWeight 1    0  no   no
Shifting                    Fail          promote  Shifting                    2   80  no   no
Shifting                    Fail          abort    RollingBack/RestoringWeight 1    0  no   no
Shifting                    Fail          retry    RollingBack/RestoringWeight 1    0  no   yes
Shifting                    Fail          pause    RollingBack/RestoringWeight 1    0  no   yes
Shifting                    Inconclusive  -        Shifting                    1   50  no   no
Shifting                    Inconclusive  promote  Shifting                    2   80  no   no
Shifting                    Inconclusive  abort    RollingBack/RestoringWeight 1    0  no   no
Shifting                    Inconclusive  retry    Shifting                    1   50  no   yes
Shifting                    Inconclusive  pause    Shifting                    1   50  no   yes
Shifting                    Missing       -        Paused/MetricsUnavailable   1   50  no   no
Shifting                    Missing       promote  Shifting                    2   80  no   no
Shifting                    Missing       abort    RollingBack/RestoringWeight 1    0  no   no
Shifting                    Missing       retry    Paused/MetricsUnavailable   1   50  no   yes
Shifting                    Missing       pause    Paused/MetricsUnavailable   1   50  no   yes
Paused/Inconclusive         -             -        Paused/Inconclusive         1   50  no   no
Paused/Inconclusive         -             promote  Shifting                    2   80  no   no
Paused/Inconclusive         -             abort    RollingBack/RestoringWeight 1    0  no   no
Paused/Inconclusive         -             retry    Shifting                    1   50  no   no
Paused/Inconclusive         -             pause    Paused/Inconclusive         1   50  no   yes
Paused/Inconclusive         Pass          -        Paused/Inconclusive         1   50  no   no
Paused/Inconclusive         Pass          promote  Shifting                    2   80  no   no
Paused/Inconclusive         Pass          abort    RollingBack/RestoringWeight 1    0  no   no
Paused/Inconclusive         Pass          retry    Shifting                    1   50  no   no
Paused/Inconclusive         Pass          pause    Paused/Inconclusive         1   50  no   yes
Paused/Inconclusive         Fail          -        RollingBack/RestoringWeight 1    0  no   no
Paused/Inconclusive         Fail          promote  Shifting                    2   80  no   no
Paused/Inconclusive         Fail          abort    RollingBack/RestoringWeight 1    0  no   no
Paused/Inconclusive         Fail          retry    Shifting                    1   50  no   no
Paused/Inconclusive         Fail          pause    RollingBack/RestoringWeight 1    0  no   yes
Paused/Inconclusive         Inconclusive  -        Paused/Inconclusive         1   50  no   no
Paused/Inconclusive         Inconclusive  promote  Shifting                    2   80  no   no
Paused/Inconclusive         Inconclusive  abort    RollingBack/RestoringWeight 1    0  no   no
Paused/Inconclusive         Inconclusive  retry    Shifting                    1   50  no   no
Paused/Inconclusive         Inconclusive  pause    Paused/Inconclusive         1   50  no   yes
Paused/Inconclusive         Missing       -        Paused/Inconclusive         1   50  no   no
Paused/Inconclusive         Missing       promote  Shifting                    2   80  no   no
Paused/Inconclusive         Missing       abort    RollingBack/RestoringWeight 1    0  no   no
Paused/Inconclusive         Missing       retry    Shifting                    1   50  no   no
Paused/Inconclusive         Missing       pause    Paused/Inconclusive         1   50  no   yes
Promoted                    -             -        Promoted                    2  100  no   no
Promoted                    -             promote  Promoted                    2  100  no   yes
Promoted                    -             abort    Promoted                    2  100  no   yes
Promoted                    -             retry    Promoted                    2  100  no   yes
Promoted                    -             pause    Promoted                    2  100  no   yes
Promoted                    Pass          -        Promoted                    2  100  no   no
Promoted                    Pass          promote  Promoted                    2  100  no   yes
Promoted                    Pass          abort    Promoted                    2  100  no   yes
Promoted                    Pass          retry    Promoted                    2  100  no   yes
Promoted                    Pass          pause    Promoted                    2  100  no   yes
Promoted                    Fail          -        Promoted                    2  100  no   no
Promoted                    Fail          promote  Promoted                    2  100  no   yes
Promoted                    Fail          abort    Promoted                    2  100  no   yes
Promoted                    Fail          retry    Promoted                    2  100  no   yes
Promoted                    Fail          pause    Promoted                    2  100  no   yes
Promoted                    Inconclusive  -        Promoted                    2  100  no   no
Promoted                    Inconclusive  promote  Promoted                    2  100  no   yes
Promoted                    Inconclusive  abort    Promoted                    2  100  no   yes
Promoted                    Inconclusive  retry    Promoted                    2  100  no   yes
Promoted                    Inconclusive  pause    Promoted                    2  100  no   yes
Promoted                    Missing       -        Promoted                    2  100  no   no
Promoted                    Missing       promote  Promoted                    2  100  no   yes
Promoted                    Missing       abort    Promoted                    2  100  no   yes
Promoted                    Missing       retry    Promoted                    2  100  no   yes
Promoted                    Missing       pause    Promoted                    2  100  no   yes
RollingBack/RestoringWeight -             -        RollingBack/ScalingDown     1    0  yes  no
RollingBack/RestoringWeight -             promote  RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight -             abort    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight -             retry    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight -             pause    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Pass          -        RollingBack/ScalingDown     1    0  yes  no
RollingBack/RestoringWeight Pass          promote  RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Pass          abort    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Pass          retry    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Pass          pause    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Fail          -        RollingBack/ScalingDown     1    0  yes  no
RollingBack/RestoringWeight Fail          promote  RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Fail          abort    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Fail          retry    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Fail          pause    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Inconclusive  -        RollingBack/ScalingDown     1    0  yes  no
RollingBack/RestoringWeight Inconclusive  promote  RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Inconclusive  abort    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Inconclusive  retry    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Inconclusive  pause    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Missing       -        RollingBack/ScalingDown     1    0  yes  no
RollingBack/RestoringWeight Missing       promote  RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Missing       abort    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Missing       retry    RollingBack/ScalingDown     1    0  yes  yes
RollingBack/RestoringWeight Missing       pause    RollingBack/ScalingDown     1    0  yes  yes
RolledBack                  -             -        RolledBack                  1    0  yes  no
RolledBack                  -             promote  RolledBack                  1    0  yes  yes
RolledBack                  -             abort    RolledBack                  1    0  yes  yes
RolledBack                  -             retry    Preparing                   0    0  no   no
RolledBack                  -             pause    RolledBack                  1    0  yes  yes
RolledBack                  Pass          -        RolledBack                  1    0  yes  no
RolledBack                  Pass          promote  RolledBack                  1    0  yes  yes
RolledBack                  Pass          abort    RolledBack                  1    0  yes  yes
RolledBack                  Pass          retry    Preparing                   0    0  no   no
RolledBack                  Pass          pause    RolledBack                  1    0  yes  yes
RolledBack                  Fail          -        RolledBack                  1    0  yes  no
RolledBack                  Fail          promote  RolledBack                  1    0  yes  yes
RolledBack                  Fail          abort    RolledBack                  1    0  yes  yes
RolledBack                  Fail          retry    Preparing                   0    0  no   no
RolledBack                  Fail          pause    RolledBack                  1    0  yes  yes
RolledBack                  Inconclusive  -        RolledBack                  1    0  yes  no
RolledBack                  Inconclusive  promote  RolledBack                  1    0  yes  yes
RolledBack                  Inconclusive  abort    RolledBack                  1    0  yes  yes
RolledBack                  Inconclusive  retry    Preparing                   0    0  no   no
RolledBack                  Inconclusive  pause    RolledBack                  1    0  yes  yes
RolledBack                  Missing       -        RolledBack                  1    0  yes  no
RolledBack                  Missing       promote  RolledBack                  1    0  yes  yes
RolledBack                  Missing       abort    RolledBack                  1    0  yes  yes
RolledBack                  Missing       retry    Preparing                   0    0  no   no
RolledBack                  Missing       pause    RolledBack                  1    0  yes  yes
"""
ROWS = [line.split() for line in TABLE.strip().splitlines()]


@pytest.mark.parametrize("row", ROWS, ids=["|".join(r[:3]) for r in ROWS])
def test_transition_table(row: list[str]) -> None:
    origin, v, c, to, step_, weight, scale_down, problem = row
    before = state(origin)
    out = step(before, verdict(v), command(c), T, CONFIG)
    assert (label(out.state), out.state.step, out.weight) == (to, int(step_), int(weight))
    assert out.scale_down_allowed is (scale_down == "yes")
    assert bool(out.problems) is (problem == "yes"), out.problems
    assert out.changed is (label(out.state) != origin or out.state.step != before.step)
    assert out.state.weight in CONFIG.weights()
    if c in ("promote", "abort", "retry"):  # known commands are consumed, acted on or not
        assert out.state.last_command == c
        assert out.state.last_command_outcome
    else:
        assert out.state.last_command is None
    if out.changed:
        assert out.state.phase_since == T


def test_the_table_covers_every_phase_verdict_and_command() -> None:
    combos = {(r[0].split("/")[0], r[1], r[2]) for r in ROWS}
    assert len(combos) == len(ROWS) == 6 * 5 * 5
    assert {r[0].split("/")[0] for r in ROWS} == {p.value for p in Phase}


READY = Observed(target_ready=True)


# --- time -------------------------------------------------------------------------------------------


def run(
    s: RolloutState,
    until: float,
    kind: str = "-",
    every: float = 30.0,
    config: RolloutConfig = CONFIG,
    observed: Observed = READY,
) -> list[Transition]:
    """Passes every `every` seconds up to `until`, each with a verdict of `kind` over the last window."""
    out = []
    now = s.phase_since
    while now < until:
        now += every
        t = step(s, verdict(kind, end=now), None, now, config, observed)
        out.append(t)
        s = t.state
    return out


def test_preparing_waits_for_the_target_arm_without_sending_it_traffic() -> None:
    config = dataclasses.replace(CONFIG, prepare_timeout_seconds=None)  # the deadline: tested below
    s = start(config, T)
    passes = run(s, T + 36_000, "Pass", config=config, observed=Observed(target_ready=False))
    assert {(t.state.phase, t.weight) for t in passes} == {(Phase.Preparing, 0)}
    ready = step(passes[-1].state, None, None, T + 36_030, config, Observed(target_ready=True))
    assert (ready.state.phase, ready.state.step, ready.weight, ready.changed) == (Phase.Shifting, 0, 10, True)
    assert ready.state.step_started_at == T + 36_030


@pytest.mark.parametrize(
    ("kind", "cause", "paused_after"),
    [
        # No verdict at all, or only too-few-samples ones: hold through the bake (300 s) and the
        # inconclusive time (600 s), then pause at the step's weight.
        ("-", PauseCause.Inconclusive, 900),
        ("Inconclusive", PauseCause.Inconclusive, 900),
        # Metrics unavailable: onMetricsUnavailable (Pause) at once (metricsUnavailableSeconds 0).
        ("Missing", PauseCause.MetricsUnavailable, 30),
    ],
)
def test_time_passing_without_data_never_promotes(kind: str, cause: PauseCause, paused_after: float) -> None:
    shifting = step(start(CONFIG, T), None, None, T, CONFIG, Observed(target_ready=True)).state
    passes = run(shifting, T + 10 * 3600, kind)
    assert all(t.state.step == 0 and t.weight in (10,) for t in passes)
    assert not any(t.state.phase is Phase.Promoted for t in passes)
    first_pause = next(t for t in passes if t.state.phase is Phase.Paused)
    assert first_pause.state.pause_cause is cause
    assert first_pause.state.phase_since - T == paused_after
    assert passes[-1].state.phase is Phase.Paused


@pytest.mark.parametrize(
    ("pause", "window", "advances_at"),
    [
        (300, 60, 300),  # the step's pause is longer than a window
        (0, 60, 60),  # no pause: one full window in the step
        (30, 120, 120),  # a pause shorter than the window: the window wins
        (100, 60, 120),  # passes every 30 s from 60 s on; 120 is the first at or after 100
    ],
)
def test_a_step_bakes_for_its_pause_and_at_least_one_window(
    pause: float, window: float, advances_at: float
) -> None:
    config = dataclasses.replace(
        CONFIG,
        steps=(Step(10, pause), Step(50, pause)),
        analysis=dataclasses.replace(CONFIG.analysis, window_seconds=window),
    )
    s = step(start(config, T), None, None, T, config, Observed(target_ready=True)).state
    # Verdicts over the last window, every 30 s; windows that began before the step never pass it.
    history = []
    now = T
    while s.step == 0:
        now += 30
        t = step(s, verdict("Pass", end=now, length=window), None, now, config)
        history.append(t)
        s = t.state
    assert now - T == advances_at
    assert (s.phase, s.step, s.weight, s.step_started_at) == (Phase.Shifting, 1, 50, now)
    assert all(t.state.step == 0 for t in history[:-1])


def test_a_pass_over_a_window_that_began_before_the_step_holds() -> None:
    s = state("Shifting")  # the step began at T - 400
    t = step(s, verdict("Pass", end=T, length=500), None, T, CONFIG)
    assert (t.state.phase, t.state.step) == (Phase.Shifting, 1)
    assert "began before the step" in t.state.reason
    assert t.state.verdicts[-1].verdict.result is Result.Pass  # recorded all the same


def test_a_fail_over_a_window_that_began_before_the_step_counts() -> None:
    t = step(state("Shifting"), verdict("Fail", end=T, length=500), None, T, CONFIG)
    assert t.state.phase is Phase.RollingBack


def test_verdicts_measured_before_the_step_seen_again_or_from_the_future_are_not_used() -> None:
    s = state("Shifting")
    before = step(s, verdict("Fail", end=T - 400), None, T, CONFIG)  # ended when the step began
    assert (before.state.phase, before.state.verdicts) == (Phase.Shifting, ())
    future = step(s, verdict("Fail", end=T + 1), None, T, CONFIG)
    assert future.state.phase is Phase.Shifting
    assert "after now" in future.problems[0]
    once = step(s, verdict("Inconclusive", end=T - 10), None, T - 10, CONFIG).state
    again = step(once, verdict("Pass", end=T - 10), None, T, CONFIG)  # same window, e.g. after a restart
    assert (again.state.step, len(again.state.verdicts)) == (1, 1)


def test_the_happy_path_walks_every_weight_then_promotes() -> None:
    s = start(CONFIG, T)
    weights = [s.weight]
    now = T
    while s.phase is not Phase.Promoted:
        now += 30
        t = step(s, verdict("Pass", end=now), None, now, CONFIG, Observed(target_ready=True))
        if t.changed:
            weights.append(t.weight)
            assert t.state.reason
        s = t.state
    assert weights == [0, 10, 50, 80, 100]
    assert now - T == 30 + 3 * 300
    assert len(s.verdicts) == 5


def test_a_manual_gate_waits_for_promote_after_its_pass() -> None:
    config = dataclasses.replace(CONFIG, steps=(Step(10, None), Step(100, 0)))
    s = step(start(config, T), None, None, T, config, Observed(target_ready=True)).state
    t = step(s, verdict("Pass", end=T + 60), None, T + 60, config)
    assert (t.state.phase, t.state.pause_cause, t.weight) == (Phase.Paused, PauseCause.AwaitingPromote, 10)
    held = run(t.state, T + 3600, "Pass", config=config)
    assert all(x.state.pause_cause is PauseCause.AwaitingPromote for x in held)
    promoted = step(held[-1].state, None, command("promote"), T + 3630, config)
    assert (promoted.state.phase, promoted.state.step, promoted.weight) == (Phase.Shifting, 1, 100)


# --- commands ---------------------------------------------------------------------------------------

PHASES = [
    "Preparing",
    "Shifting",
    "Paused/Inconclusive",
    "Promoted",
    "RollingBack/RestoringWeight",
    "RolledBack",
]


@pytest.mark.parametrize("origin", PHASES)
@pytest.mark.parametrize("action", ["promote", "abort", "retry", "pause"])
def test_a_command_seen_again_does_nothing(origin: str, action: str) -> None:
    first = step(state(origin), None, command(action), T, CONFIG)
    again = step(first.state, None, command(action), T, CONFIG)
    plain = step(first.state, None, None, T, CONFIG)
    assert again.state == plain.state
    assert again.scale_down_allowed == plain.scale_down_allowed
    if action == "pause":  # unknown: reported on every pass while the annotation says so
        assert again.problems == first.problems
        assert "unknown rollout command 'pause'" in again.problems[0]
    else:
        assert again.problems == plain.problems == ()


def test_the_same_action_with_a_new_token_is_a_new_command() -> None:
    s = state("Shifting")
    once = step(s, None, command("promote"), T, CONFIG).state
    assert once.step == 2
    same = step(once, None, command("promote"), T + 1, CONFIG).state
    assert same.step == 2
    second = step(same, None, command("promote", "/2"), T + 2, CONFIG).state
    assert (second.phase, second.last_command) == (Phase.Promoted, "promote/2")


def test_a_command_that_does_not_apply_is_consumed_not_saved_for_later() -> None:
    s = state("Shifting")
    early = step(s, None, command("retry"), T, CONFIG)
    assert "retry ignored" in early.problems[0]
    assert early.state.last_command_outcome == early.problems[0]
    failed = step(early.state, verdict("Fail", end=T + 30), command("retry"), T + 30, CONFIG).state
    assert failed.phase is Phase.RollingBack
    later = run(failed, T + 120, observed=Observed(target_pods=0))
    assert later[-1].state.phase is Phase.RolledBack
    stays = step(later[-1].state, None, command("retry"), T + 200, CONFIG)
    assert (stays.state.phase, stays.problems) == (Phase.RolledBack, ())


def test_an_unknown_command_changes_nothing_but_is_reported() -> None:
    s = state("Shifting")
    t = step(s, None, Command("promote-full", "promote-full"), T, CONFIG)
    plain = step(s, None, None, T, CONFIG)
    assert t.state == plain.state
    assert t.problems == ("unknown rollout command 'promote-full' ignored (known: promote, abort, retry)",)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("  ", None),
        ("promote", Command("promote", "promote")),
        ("promote/2026-11-30T10:00:00Z", Command("promote", "promote/2026-11-30T10:00:00Z")),
        (" abort ", Command("abort", "abort")),
        ("retry/", Command("retry", "retry/")),
        ("Promote", Command("Promote", "Promote")),  # case matters: reported as unknown
    ],
)
def test_parse_command(value: str | None, expected: Command | None) -> None:
    assert parse_command(value) == expected


def test_retry_after_a_rollback_starts_a_new_attempt_from_preparing() -> None:
    t = step(state("RolledBack"), None, command("retry"), T, CONFIG)
    s = t.state
    assert (s.phase, s.step, s.weight, s.attempt, s.started_at) == (Phase.Preparing, 0, 0, 2, T)
    assert s.last_command == "retry"


# --- rollback -----------------------------------------------------------------------------------------


def test_rollback_puts_the_weight_back_first_and_scales_down_only_after_the_delay() -> None:
    t = step(state("Shifting"), verdict("Fail"), None, T, CONFIG)
    assert (t.state.rollback_stage, t.weight, t.scale_down_allowed) == (
        RollbackStage.RestoringWeight,
        0,
        False,
    )
    assert "failed: SLO attainment 80.0%" in t.state.reason
    seen = [(t.weight, t.scale_down_allowed)]
    s = t.state
    for now in (T + 10, T + 29, T + 30, T + 60, T + 90):
        pods = 0 if now >= T + 90 else 3
        t = step(s, verdict("Fail", end=now), None, now, CONFIG, Observed(target_pods=pods))
        seen.append((t.weight, t.scale_down_allowed))
        s = t.state
    assert seen == [(0, False), (0, False), (0, False), (0, True), (0, True), (0, True)]
    assert s.phase is Phase.RolledBack
    # The cause and its figures stay in the reason through every stage.
    assert s.reason == (
        "step 1 failed: SLO attainment 80.0% below the floor 95.0%; "
        "rolled back: the source arm serves all requests"
    )


def test_a_long_rollback_reason_is_clipped_before_its_stage() -> None:
    long = Verdict(Result.Fail, "x" * 5000, {}, T - 60, T)
    s = step(state("Shifting"), long, None, T, CONFIG).state
    assert len(s.reason) == 1024
    assert s.reason.endswith("...; rolling back: weight back to the source arm first")
    s = step(s, None, None, T + 60, CONFIG).state
    assert s.reason.endswith("...; rolling back: scaling the target arm down")


def test_rolled_back_needs_the_target_arm_gone() -> None:
    s = dataclasses.replace(state("RollingBack/RestoringWeight"), rollback_stage=RollbackStage.ScalingDown)
    for pods in (None, 2):
        assert step(s, None, None, T, CONFIG, Observed(target_pods=pods)).state.phase is Phase.RollingBack
    done = step(s, None, None, T, CONFIG, Observed(target_pods=0))
    assert (done.state.phase, done.scale_down_allowed, done.changed) == (Phase.RolledBack, True, True)


def test_a_zero_scale_down_delay_still_takes_one_pass_with_the_weight_back() -> None:
    config = dataclasses.replace(CONFIG, scale_down_delay_seconds=0)
    t = step(state("Shifting"), verdict("Fail"), None, T, config)
    assert (t.weight, t.scale_down_allowed) == (0, False)
    assert step(t.state, None, None, T, config).scale_down_allowed


@pytest.mark.parametrize("cause", list(PauseCause))
def test_a_fail_while_paused_rolls_back(cause: PauseCause) -> None:
    s = dataclasses.replace(state("Paused/Inconclusive"), pause_cause=cause)
    t = step(s, verdict("Fail"), None, T, CONFIG)
    assert (t.state.phase, t.weight) == (Phase.RollingBack, 0)


# --- autoRollback off, onMetricsUnavailable -------------------------------------------------------------

NO_AUTO = dataclasses.replace(CONFIG, auto_rollback=False)
ROLLBACK_ON_MISSING = dataclasses.replace(
    CONFIG,
    analysis=dataclasses.replace(CONFIG.analysis, on_metrics_unavailable=OnMetricsUnavailable.Rollback),
)


@pytest.mark.parametrize(
    ("config", "kind", "phase", "cause", "weight"),
    [
        (CONFIG, "Fail", Phase.RollingBack, None, 0),
        (NO_AUTO, "Fail", Phase.Paused, PauseCause.Failed, 50),
        (CONFIG, "Missing", Phase.Paused, PauseCause.MetricsUnavailable, 50),
        (ROLLBACK_ON_MISSING, "Missing", Phase.RollingBack, None, 0),
        (
            dataclasses.replace(ROLLBACK_ON_MISSING, auto_rollback=False),
            "Missing",
            Phase.Paused,
            PauseCause.MetricsUnavailable,
            50,
        ),
    ],
    ids=["fail", "fail-no-auto", "missing-pause", "missing-rollback", "missing-rollback-no-auto"],
)
def test_fail_and_missing_metrics_by_policy(
    config: RolloutConfig, kind: str, phase: Phase, cause: PauseCause | None, weight: int
) -> None:
    t = step(state("Shifting"), verdict(kind), None, T, config)
    assert (t.state.phase, t.state.pause_cause, t.weight) == (phase, cause, weight)


def test_paused_on_a_fail_without_auto_rollback_stays_until_abort() -> None:
    paused = step(state("Shifting"), verdict("Fail"), None, T, NO_AUTO).state
    assert "autoRollback is off" in paused.reason
    held = run(paused, T + 3600, "Fail", config=NO_AUTO)
    assert {(x.state.phase, x.weight) for x in held} == {(Phase.Paused, 50)}
    aborted = step(held[-1].state, None, command("abort"), T + 3630, NO_AUTO)
    assert (aborted.state.phase, aborted.weight, aborted.scale_down_allowed) == (Phase.RollingBack, 0, False)


def test_metrics_may_be_missing_for_the_grace_time_and_data_resets_it() -> None:
    config = dataclasses.replace(
        ROLLBACK_ON_MISSING,
        analysis=dataclasses.replace(ROLLBACK_ON_MISSING.analysis, metrics_unavailable_seconds=90),
    )
    s = state("Shifting")
    s = step(s, verdict("Missing", end=T), None, T, config).state
    s = step(s, verdict("Missing", end=T + 60), None, T + 60, config).state
    assert (s.phase, s.metrics_missing_since) == (Phase.Shifting, T)
    assert "onMetricsUnavailable (Rollback) after 90 s" in s.reason
    s = step(s, verdict("Inconclusive", end=T + 70), None, T + 70, config).state  # data is back
    assert s.metrics_missing_since is None
    s = step(s, verdict("Missing", end=T + 100), None, T + 100, config).state
    s = step(s, verdict("Missing", end=T + 150), None, T + 150, config).state
    assert s.phase is Phase.Shifting  # missing since T + 100 only
    s = step(s, verdict("Missing", end=T + 190), None, T + 190, config).state
    assert s.phase is Phase.RollingBack
    assert "for 90 s" in s.reason


# --- restart and config changes ----------------------------------------------------------------------------


def test_an_operator_restart_mid_rollout_continues_from_status() -> None:
    """Two runs of the same passes: one keeps the state in memory, the other writes it to status
    (JSON) and reads it back before every pass, as a restarted operator would."""
    kinds = ["-", "Inconclusive", "Pass"] * 4 + ["Fail"] + ["-"] * 4
    observed = Observed(target_ready=True, target_pods=0)
    memory = restarted = start(CONFIG, T)
    visited = []
    for i, kind in enumerate(kinds):
        now = T + 60 * (i + 1)
        cmd = command("promote") if i == 5 else None
        a = step(memory, verdict(kind, end=now), cmd, now, CONFIG, observed)
        stored = json.loads(json.dumps(restarted.to_dict()))
        b = step(RolloutState.from_dict(stored), verdict(kind, end=now), cmd, now, CONFIG, observed)
        assert a == b
        memory, restarted = a.state, b.state
        visited.append((memory.phase, memory.step))
    assert visited[:4] == [(Phase.Shifting, 0)] * 4
    assert (Phase.Shifting, 1) in visited
    assert (Phase.RollingBack, 2) in visited
    assert memory.phase is Phase.RolledBack
    assert memory.last_command == "promote"


def test_a_state_from_a_longer_config_is_fitted_and_reported() -> None:
    s = dataclasses.replace(state("Shifting"), step=2, weight=80)
    short = dataclasses.replace(CONFIG, steps=(Step(20, 300), Step(40, 300)))
    t = step(s, None, None, T, short)
    assert (t.state.step, t.weight) == (1, 40)
    assert t.problems == (
        "step 2 no longer exists (2 steps): at step 1",
        "weight 80% is not step 1's: now 40%",
    )


@pytest.mark.parametrize(
    ("config", "phase"),
    [
        (CONFIG, Phase.Paused),  # onMetricsUnavailable: Pause: already paused, stays
        (ROLLBACK_ON_MISSING, Phase.RollingBack),
        (dataclasses.replace(ROLLBACK_ON_MISSING, auto_rollback=False), Phase.Paused),
    ],
    ids=["pause", "rollback", "rollback-no-auto"],
)
def test_metrics_unavailable_while_paused(config: RolloutConfig, phase: Phase) -> None:
    s = state("Paused/Inconclusive")
    t = step(s, verdict("Missing"), None, T, config)
    assert t.state.phase is phase
    if phase is Phase.Paused:  # the cause and reason it paused for are kept
        assert (t.state.pause_cause, t.state.reason, t.state.metrics_missing_since) == (
            PauseCause.Inconclusive,
            s.reason,
            T,
        )


# --- Preparing deadline (prepareTimeoutSeconds) ----------------------------------------------------------

# (waited in Preparing, target ready, deadline) -> the phase after the pass and the weight published.
PREPARE_DEADLINE = [
    (899.0, False, 900.0, Phase.Preparing),
    (900.0, False, 900.0, Phase.RollingBack),
    (5000.0, False, 900.0, Phase.RollingBack),
    (900.0, True, 900.0, Phase.Shifting),  # ready in the pass the deadline falls: it goes on
    (9.0, False, 10.0, Phase.Preparing),
    (10.0, False, 10.0, Phase.RollingBack),
    (86400.0, False, None, Phase.Preparing),  # no deadline: waits for abort
]


@pytest.mark.parametrize(("waited", "ready", "deadline", "phase"), PREPARE_DEADLINE)
def test_preparing_rolls_back_past_its_deadline(
    waited: float, ready: bool, deadline: float | None, phase: Phase
) -> None:
    config = dataclasses.replace(CONFIG, prepare_timeout_seconds=deadline)
    s = start(config, T - waited)
    t = step(s, None, None, T, config, Observed(target_ready=ready))
    assert t.state.phase is phase
    if phase is Phase.RollingBack:
        # No traffic ever went to the target: the scale-down may start at once; the reason names the timeout.
        assert (t.weight, t.state.rollback_stage, t.scale_down_allowed, t.changed) == (
            0,
            RollbackStage.ScalingDown,
            True,
            True,
        )
        assert t.state.reason.startswith("PrepareTimeout: the target arm was not ready within")
        assert f"prepareTimeoutSeconds ({deadline:.0f} s)" in t.state.reason
        done = step(t.state, None, None, T + 5, config, Observed(target_pods=0))
        assert done.state.phase is Phase.RolledBack
        assert done.state.reason.startswith("PrepareTimeout: ")
        assert done.state.reason.endswith("rolled back: the source arm serves all requests")
    elif phase is Phase.Preparing:
        assert (t.weight, t.scale_down_allowed) == (0, False)


def test_a_retry_after_a_prepare_timeout_gets_a_new_deadline() -> None:
    config = dataclasses.replace(CONFIG, prepare_timeout_seconds=100.0)
    s = step(start(config, T - 100), None, None, T, config).state
    s = step(s, None, None, T + 1, config, Observed(target_pods=0)).state
    assert s.phase is Phase.RolledBack
    retried = step(s, None, Command("retry", "retry/1"), T + 2, config).state
    assert retried.phase is Phase.Preparing
    assert step(retried, None, None, T + 101, config).state.phase is Phase.Preparing
    assert step(retried, None, None, T + 102, config).state.phase is Phase.RollingBack


def test_prepare_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"rollout\.prepareTimeoutSeconds"):
        RolloutConfig(steps=(Step(50),), prepare_timeout_seconds=0)


def test_each_moment_of_a_rollback_is_one_event_reason() -> None:
    s = state("Shifting")
    back = step(s, verdict("Fail"), None, T, CONFIG)
    assert back.event_reason(s, "Rollout") == "RolloutRollingBack"
    held = step(back.state, None, None, T + 1, CONFIG)
    assert held.event_reason(back.state, "Rollout") is None
    down = step(held.state, None, None, T + 30, CONFIG)
    assert down.state.rollback_stage is RollbackStage.ScalingDown
    assert down.event_reason(held.state, "Rollout") == "RolloutScalingDown", "not RollingBack again"
    done = step(down.state, None, None, T + 31, CONFIG, Observed(target_pods=0))
    assert done.event_reason(down.state, "X") == "XRolledBack"


# --- the tenants stage: a first step of weight 0 (only spec.rollout.tenants on the target arm) -------

TENANTS = dataclasses.replace(CONFIG, steps=(Step(0, 120), Step(50, 300), Step(100, 300)))


def tenants_stage(config: RolloutConfig = TENANTS) -> RolloutState:
    """Shifting in the tenants stage since T - 400 (its 120 s bake over, 320 s before it would pause as
    inconclusive)."""
    s = step(start(config, T - 500), None, None, T - 400, config, READY).state
    assert (s.phase, s.step, s.weight, s.step_started_at) == (Phase.Shifting, 0, 0, T - 400)
    return s


# From the tenants stage at T: the verdict's window is [T - 60, T], inside the stage.
# verdict       command  -> to                       step weight scaleDown
TENANTS_TABLE = """
-             -        Shifting                    0    0  no
Pass          -        Shifting                    1   50  no
Fail          -        RollingBack/RestoringWeight 0    0  no
Inconclusive  -        Shifting                    0    0  no
Missing       -        Paused/MetricsUnavailable   0    0  no
-             promote  Shifting                    1   50  no
Fail          promote  Shifting                    1   50  no
-             abort    RollingBack/RestoringWeight 0    0  no
Pass          abort    RollingBack/RestoringWeight 0    0  no
-             retry    Shifting                    0    0  no
"""
TENANTS_ROWS = [line.split() for line in TENANTS_TABLE.strip().splitlines()]


@pytest.mark.parametrize("row", TENANTS_ROWS, ids=["|".join(r[:2]) for r in TENANTS_ROWS])
def test_the_tenants_stage_is_judged_like_a_step(row: list[str]) -> None:
    v, c, to, step_, weight, scale_down = row
    t = step(tenants_stage(), verdict(v), command(c), T, TENANTS)
    assert (label(t.state), t.state.step, t.weight) == (to, int(step_), int(weight))
    assert t.scale_down_allowed is (scale_down == "yes")


def test_a_rollout_with_a_tenants_stage_walks_it_first_then_every_weight() -> None:
    s = start(TENANTS, T)
    seen = [(s.phase, s.step, s.weight)]
    reasons = []
    now = T
    while s.phase is not Phase.Promoted:
        now += 30
        t = step(s, verdict("Pass", end=now), None, now, TENANTS, READY)
        if t.changed:
            seen.append((t.state.phase, t.state.step, t.weight))
            reasons.append(t.state.reason)
        s = t.state
    assert seen == [
        (Phase.Preparing, 0, 0),
        (Phase.Shifting, 0, 0),  # the tenants stage: weight 0 for everyone else
        (Phase.Shifting, 1, 50),
        (Phase.Shifting, 2, 100),
        (Phase.Promoted, 2, 100),
    ]
    assert reasons[0] == "target arm ready; step 0: spec.rollout.tenants only to the target arm"
    assert reasons[1].startswith("step 0 passed: fine")
    assert reasons[1].endswith("step 1: 50% to the target arm")
    assert now - T == 30 + 120 + 300 + 300  # the stage bakes max(pauseSeconds, window) like a step


def test_a_rollback_from_the_tenants_stage_waits_for_the_routers_before_the_scale_down() -> None:
    """At weight 0 the chosen tenants are still on the target arm: unlike an abort while Preparing, the
    target keeps its pods for scaleDownDelaySeconds after the routers are told (phase RollingBack)."""
    t = step(tenants_stage(), verdict("Fail"), None, T, TENANTS)
    assert (t.state.rollback_stage, t.weight, t.scale_down_allowed) == (
        RollbackStage.RestoringWeight,
        0,
        False,
    )
    assert t.state.reason.startswith("step 0 failed: SLO attainment 80.0%")
    assert not step(t.state, None, None, T + 29, TENANTS).scale_down_allowed
    assert step(t.state, None, None, T + 30, TENANTS).scale_down_allowed
    preparing = step(start(TENANTS, T), None, command("abort"), T, TENANTS)
    assert preparing.scale_down_allowed, "no traffic ever went to a target that was not ready"


@pytest.mark.parametrize(
    ("config", "kind", "phase", "cause"),
    [
        (dataclasses.replace(TENANTS, auto_rollback=False), "Fail", Phase.Paused, PauseCause.Failed),
        (TENANTS, "Missing", Phase.Paused, PauseCause.MetricsUnavailable),
    ],
    ids=["fail-no-auto", "missing"],
)
def test_the_tenants_stage_pauses_in_place(
    config: RolloutConfig, kind: str, phase: Phase, cause: PauseCause
) -> None:
    t = step(tenants_stage(config), verdict(kind), None, T, config)
    assert (t.state.phase, t.state.pause_cause, t.state.step, t.weight) == (phase, cause, 0, 0)
    assert t.state.reason.endswith("paused in the tenants stage (weight 0)")


def test_a_tenants_stage_without_pause_seconds_is_a_manual_gate() -> None:
    config = dataclasses.replace(TENANTS, steps=(Step(0, None), Step(100, 0)))
    s = tenants_stage(config)
    t = step(s, verdict("Pass"), None, T, config)
    assert (t.state.phase, t.state.pause_cause, t.weight) == (Phase.Paused, PauseCause.AwaitingPromote, 0)
    promoted = step(t.state, None, command("promote"), T + 10, config)
    assert (promoted.state.phase, promoted.state.step, promoted.weight) == (Phase.Shifting, 1, 100)


def test_a_quiet_tenants_stage_pauses_as_inconclusive() -> None:
    """Few requests from the chosen tenants never pass the stage: it pauses like any step."""
    passes = run(tenants_stage(), T + 1000, "Inconclusive", config=TENANTS)
    paused = next(x.state for x in passes if x.state.phase is Phase.Paused)
    assert (paused.pause_cause, paused.step, paused.weight) == (PauseCause.Inconclusive, 0, 0)
    assert paused.phase_since == T - 400 + 120 + 600  # the bake's end + inconclusivePauseSeconds


def test_the_steps_are_described_with_the_tenants_stage() -> None:
    assert TENANTS.describe_steps() == "tenants only, 50%, 100%"
    assert CONFIG.describe_steps() == "10%, 50%, 80%"
