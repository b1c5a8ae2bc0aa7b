"""controller.revisions.advance_rollout: a revision change under spec.rollout runs the rollout machine
with arms = old and new revision; promotion and rollback traced pass by pass with a fake clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.api.status import RevisionRecord, RevisionsStatus
from tandem.controller.revisions import advance_rollout, rollout_conditions
from tandem.rollout.arms import config_from
from tandem.rollout.judge import ArmWindow, Verdict, Window, judge
from tandem.rollout.machine import Command
from tandem.rollout.state import RolloutState

A = RevisionRecord(id="aaaaaaaaaa", prefix="demo", legacy=True)
NEW = "bbbbbbbbbb"
B = RevisionRecord(id=NEW, prefix=f"demo-{NEW}")
WINDOW = 10.0
DELAY = 5.0
CONFIG = config_from(
    [(50, 0), (100, 0)],
    window_seconds=WINDOW,
    min_samples=10,
    attainment_floor=0.9,
    max_attainment_drop=0.2,
    max_error_rate=0.01,
    max_kv_failure_rate=0.01,
    min_kv_bandwidth_ratio=0.5,
    on_metrics_unavailable="Pause",
    metrics_unavailable_seconds=0,
    inconclusive_pause_seconds=120,
    auto_rollback=True,
    scale_down_delay_seconds=DELAY,
)
GOOD = ArmWindow(requests=40, attainment=1.0)
BAD = ArmWindow(requests=40, attainment=0.3)


@dataclass
class Run:
    """Passes of the operator against one stored status; `arm` is what the next window reads."""

    status: RevisionsStatus
    now: float = 1000.0
    arm: ArmWindow = GOOD
    ready: bool = False
    pods: int | None = 2
    reads: list[tuple[str, str]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    def verdict(self, state: RolloutState, new: RevisionRecord, old: RevisionRecord) -> Verdict:
        self.reads.append((new.id, old.id))
        window = Window(self.now - WINDOW, self.now, target=self.arm, baseline=GOOD)
        return judge(window, CONFIG.analysis)

    def step(self, dt: float = 0.0, command: str | None = None, spec: str = NEW) -> RevisionsStatus:
        self.now += dt
        self.status, events = advance_rollout(
            self.status,
            "demo",
            spec,
            config=CONFIG,
            current_ready=self.ready,
            current_pods=self.pods,
            command=Command(command, command) if command else None,
            verdict_for=self.verdict,
            now=self.now,
        )
        self.events += [reason for _, reason, _ in events]
        return self.status


def phase(status: RevisionsStatus) -> tuple[Any, ...]:
    r = status.rollout
    return (
        r.phase if r else None,
        status.weight,
        status.current.id,
        status.previous.id if status.previous else None,
    )


def started() -> Run:
    run = Run(RevisionsStatus(current=A, weight=100))
    assert phase(run.step()) == ("Preparing", 0, NEW, A.id)
    assert run.status.current == B
    assert run.events == ["RevisionRolloutStarted"]
    return run


def test_promotion_step_by_step_then_the_old_pair_goes() -> None:
    run = started()
    assert phase(run.step(5)) == ("Preparing", 0, NEW, A.id), "no traffic before the new pair is ready"
    run.ready = True
    assert phase(run.step(5)) == ("Shifting", 50, NEW, A.id)
    assert run.reads == []
    run.step(5)  # within the step's bake: the window does not cover the step yet
    assert phase(run.step(WINDOW)) == ("Shifting", 100, NEW, A.id)
    assert run.reads[-1] == (NEW, A.id), "the window compares the new revision with the old"
    assert phase(run.step(WINDOW + 1)) == ("Promoted", 100, NEW, A.id)
    assert phase(run.step(DELAY - 1)) == ("Promoted", 100, NEW, A.id), "the old pair drains"
    final = run.step(1)
    assert final == RevisionsStatus(current=B, weight=100)
    assert run.events[-1] == "RevisionRemoved"
    assert "RevisionRolloutPromoted" in run.events


def test_a_failed_step_rolls_back_weight_first_then_deletes_the_new_pair_and_holds() -> None:
    run = started()
    run.ready = True
    run.step(5)
    run.arm = BAD
    back = run.step(WINDOW + 1)
    assert phase(back) == ("RollingBack", 0, NEW, A.id), "weight back to the old pair, both pairs kept"
    assert back.rollout is not None
    assert "below" in back.rollout.reason
    assert phase(run.step(DELAY - 1)) == ("RollingBack", 0, NEW, A.id)
    rolled = run.step(1)
    assert phase(rolled) == ("RolledBack", 100, A.id, None), "the old revision is current again"
    assert rolled.rollout is not None
    assert rolled.rollout.target == NEW
    assert run.events[-1] == "RevisionRolledBack"
    assert [e for e in run.events if "Back" in e or "ScalingDown" in e] == [
        "RevisionRolloutRollingBack",
        "RevisionRolledBack",
    ], "one Event per moment: the stage that deletes the new pair is RevisionRolledBack alone"
    # The spec still names the rejected revision: held, until retry.
    assert phase(run.step(30)) == ("RolledBack", 100, A.id, None)
    retried = run.step(1, command="retry")
    assert phase(retried) == ("Preparing", 0, NEW, A.id)
    assert retried.rollout is not None
    assert retried.rollout.attempt == 2
    assert run.events[-1] == "RevisionRolloutRetried"


def test_abort_and_spec_back_to_the_old_revision() -> None:
    run = started()
    run.ready = True
    run.step(5)
    aborted = run.step(1, command="abort")
    assert phase(aborted) == ("RollingBack", 0, NEW, A.id)
    assert aborted.rollout is not None
    assert (aborted.rollout.last_command_outcome or "").startswith(
        "revision rollout: abort command at step 0"
    )
    run = started()
    run.ready = True
    run.step(5)
    reverted = run.step(1, spec=A.id)
    assert (reverted.current, reverted.previous, reverted.weight) == (A, B, 50)
    assert reverted.rollout is None, "back to the old revision: the old pair takes the traffic back"
    assert run.events[-1] == "RevisionReverted"


def test_no_data_never_promotes() -> None:
    run = started()
    run.ready = True
    run.step(5)
    run.arm = ArmWindow(requests=0)
    for _ in range(10):
        assert phase(run.step(WINDOW))[:2] in (("Shifting", 50), ("Paused", 50))


def test_a_revision_rollouts_phase_is_in_the_rollout_conditions() -> None:
    """RolloutProgressing / RolledBack follow the revision rollout pass by pass (no mode rollout)."""
    run = started()

    def conditions() -> dict[str, tuple[str, str, str]]:
        return {kind: (status, reason, message) for kind, status, reason, message in
                rollout_conditions(run.status, [])}  # fmt: skip

    assert conditions()["RolloutProgressing"][:2] == ("True", "Preparing")
    assert conditions()["RolloutProgressing"][2].startswith(f"revision {A.id} -> revision {NEW}, weight 0%")
    run.ready = True
    run.step(5)
    assert conditions()["RolloutProgressing"][:2] == ("True", "Shifting")
    run.arm = BAD
    run.step(WINDOW + 1)
    assert conditions()["RolledBack"][:2] == ("True", "RollingBack")
    assert "below" in conditions()["RolledBack"][2], "the cause with its figures"
    run.step(DELAY)
    assert run.status.current == A
    rolled = conditions()
    assert rolled["RolledBack"][:2] == ("True", "RolledBack")
    assert rolled["RolloutProgressing"][:2] == ("False", "RolledBack")
    assert rolled["RolledBack"][2].startswith(f"revision {A.id} -> revision {NEW}"), "held: A serves"
    assert rollout_conditions(RevisionsStatus(current=A, weight=100), []) == []
