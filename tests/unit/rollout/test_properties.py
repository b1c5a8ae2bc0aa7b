"""Properties of step() over random configs and random runs of verdicts, commands and time (hypothesis)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.rollout.config import Analysis, OnMetricsUnavailable, RolloutConfig, Step
from tandem.rollout.judge import Result, Verdict
from tandem.rollout.machine import Command, Observed, Transition, step
from tandem.rollout.state import TARGET_SERVING, Phase, RollbackStage, RolloutState, start, weight_of

T0 = 1_800_000_000.0
PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw: st.DrawFn) -> RolloutConfig:
    weights = sorted(draw(st.sets(st.integers(1, 100), min_size=1, max_size=5)))
    if draw(st.booleans()):
        weights.insert(0, 0)  # the tenants stage
    pauses = st.sampled_from([None, 0.0, 30.0, 300.0])
    return RolloutConfig(
        steps=tuple(Step(w, draw(pauses)) for w in weights),
        analysis=Analysis(
            window_seconds=draw(st.sampled_from([30.0, 60.0])),
            metrics_unavailable_seconds=draw(st.sampled_from([0.0, 60.0])),
            inconclusive_pause_seconds=draw(st.sampled_from([0.0, 120.0, 600.0])),
            on_metrics_unavailable=draw(st.sampled_from(list(OnMetricsUnavailable))),
        ),
        auto_rollback=draw(st.booleans()),
        scale_down_delay_seconds=draw(st.sampled_from([0.0, 30.0])),
    )


@dataclass(frozen=True)
class Event:
    dt: float
    verdict: str  # "-", Pass, Fail, Inconclusive, Missing
    length: float  # window length in analysis windows
    command: str  # "-", promote, abort, retry, or an unknown word
    token: int  # the same token again repeats the command's id
    ready: bool
    pods: int | None


ALL_VERDICTS = ["-", "Pass", "Fail", "Inconclusive", "Missing"]
ALL_COMMANDS = ["-", "promote", "abort", "retry", "resume"]
# Mostly healthy runs, so that rollouts also reach Promoted through their verdicts.
HEALTHY_VERDICTS = ["Pass"] * 6 + ["-", "Inconclusive", "Fail"]
RARE_COMMANDS = ["-"] * 12 + ["promote", "abort", "retry"]


def events(verdicts: list[str], commands: list[str]) -> st.SearchStrategy[list[Event]]:
    event = st.builds(
        Event,
        dt=st.sampled_from([0.0, 10.0, 30.0, 60.0, 300.0]),
        verdict=st.sampled_from(verdicts),
        length=st.sampled_from([1.0, 2.0]),
        command=st.sampled_from(commands),
        token=st.integers(0, 2),
        ready=st.sampled_from([True, True, True, False]),
        pods=st.sampled_from([None, 0, 2]),
    )
    return st.lists(event, max_size=60)


def make_verdict(e: Event, now: float, window: float) -> Verdict | None:
    if e.verdict == "-":
        return None
    begin = now - e.length * window
    if e.verdict == "Missing":
        return Verdict(Result.Inconclusive, "metrics unavailable: x", {}, begin, now, ("x",))
    return Verdict(Result(e.verdict), e.verdict, {"targetRequests": 1.0}, begin, now)


def make_command(e: Event) -> Command | None:
    return None if e.command == "-" else Command(e.command, f"{e.command}/{e.token}")


def replay(config: RolloutConfig, run: list[Event]) -> list[tuple[RolloutState, Event, float, Transition]]:
    """Every pass of the run: (the state before, the event, now, the transition)."""
    s = start(config, T0)
    now = T0
    out = []
    for e in run:
        now += e.dt
        t = step(
            s,
            make_verdict(e, now, config.analysis.window_seconds),
            make_command(e),
            now,
            config,
            Observed(target_ready=e.ready, target_pods=e.pods),
        )
        out.append((s, e, now, t))
        s = t.state
    return out


@PROPERTY_SETTINGS
@given(configs(), st.one_of(events(ALL_VERDICTS, ALL_COMMANDS), events(HEALTHY_VERDICTS, RARE_COMMANDS)))
def test_invariants_of_every_pass(config: RolloutConfig, run: list[Event]) -> None:
    published = 0  # the weight the previous pass wrote to status (start: 0)
    serving = False  # whether the target took traffic then (a step: the tenants stage at 0 too)
    for before, e, now, t in replay(config, run):
        s = t.state
        # The weight is always a configured one, 0 or 100, and the one the phase and step imply.
        assert t.weight in config.weights()
        assert t.weight == weight_of(s.phase, s.step, config)
        # Never Promoted without a Pass at the last step, or a promote command there.
        if s.phase is Phase.Promoted and before.phase is not Phase.Promoted:
            cmd = make_command(e)
            promoted_by_hand = cmd is not None and cmd.action == "promote" and cmd.id != before.last_command
            assert before.step == config.last_step
            assert promoted_by_hand or (e.verdict == "Pass" and before.phase is Phase.Shifting)
        # The target arm may be scaled down only once 0 was already published.
        if t.scale_down_allowed:
            assert t.weight == 0
            assert published == 0
            assert not serving, "the routers were last told the target takes the chosen tenants"
        if s.phase is Phase.RollingBack and before.phase is not Phase.RollingBack and serving:
            assert s.rollback_stage is RollbackStage.RestoringWeight
        # At most one step forward per pass; back to 0 only by a new attempt.
        assert s.step <= before.step + 1
        if s.step < before.step:
            assert (s.phase, s.attempt) == (Phase.Preparing, before.attempt + 1)
        # A restart between any two passes changes nothing: status round-trips exactly.
        restored = RolloutState.from_dict(json.loads(json.dumps(before.to_dict())))
        assert restored == before
        again = step(
            restored,
            make_verdict(e, now, config.analysis.window_seconds),
            make_command(e),
            now,
            config,
            Observed(target_ready=e.ready, target_pods=e.pods),
        )
        assert again == t
        published, serving = t.weight, s.phase in TARGET_SERVING


@PROPERTY_SETTINGS
@given(configs(), events(["-", "Inconclusive", "Missing"], ["-", "abort", "retry", "resume"]))
def test_without_a_pass_or_a_promote_no_step_is_ever_taken(config: RolloutConfig, run: list[Event]) -> None:
    for _, _, _, t in replay(config, run):
        assert t.state.phase is not Phase.Promoted
        assert t.state.step == 0
        assert t.weight in (0, config.steps[0].weight)


@PROPERTY_SETTINGS
@given(configs(), events(ALL_VERDICTS, ALL_COMMANDS), st.sampled_from(ALL_COMMANDS[1:]))
def test_a_command_seen_twice_acts_once(config: RolloutConfig, run: list[Event], action: str) -> None:
    for _, _, now, t in replay(config, run):
        cmd = Command(action, f"{action}/again")
        once = step(t.state, None, cmd, now, config)
        twice = step(once.state, None, cmd, now, config)
        plain = step(once.state, None, None, now, config)
        assert (twice.state, twice.scale_down_allowed) == (plain.state, plain.scale_down_allowed)
