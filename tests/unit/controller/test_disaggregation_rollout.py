"""controller.disaggregation.advance: spec.router.disaggregation's mode in effect, and a change of it
moving through spec.rollout's steps (arms: the new mode and the mode in effect), pass by pass with a
fake clock; the routers' reading of it (kube.pods)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.api.status import DisaggregationStatus
from tandem.controller.disaggregation import active, advance
from tandem.kube.pods import pdd_info_from
from tandem.rollout.config import RolloutConfig
from tandem.rollout.judge import ArmWindow, Verdict, Window, judge
from tandem.rollout.machine import Command
from tandem.rollout.state import RolloutState

from .test_reconcile_autoscaling import NAME, NS, World, manifest
from .test_revision_rollout import BAD, CONFIG, DELAY, GOOD, WINDOW  # the same steps and analysis


@dataclass
class Run:
    """Passes of the operator against one stored status; `arm` is what the next window reads."""

    status: DisaggregationStatus | None = None
    now: float = 1000.0
    arm: ArmWindow = GOOD
    config: RolloutConfig | None = CONFIG
    reads: list[tuple[str, str]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    def verdict(self, state: RolloutState, target: str, mode: str) -> Verdict:
        self.reads.append((target, mode))
        return judge(Window(self.now - WINDOW, self.now, target=self.arm, baseline=GOOD), CONFIG.analysis)

    def step(
        self, spec: str | None, dt: float = 0.0, command: str | None = None, first: bool = False
    ) -> tuple[Any, ...]:
        self.now += dt
        self.status, events = advance(
            self.status,
            spec,
            first_pass=first,
            config=self.config,
            command=Command(command, command) if command else None,
            verdict_for=self.verdict,
            now=self.now,
        )
        self.events += [reason for _, reason, _ in events]
        return seen(self.status)


def seen(status: DisaggregationStatus | None) -> tuple[Any, ...]:
    """(mode in effect, the rollout's target, phase, weight): what the routers act on."""
    if status is None:
        return (None,)
    r = status.rollout
    return (status.mode, r.target, r.phase, r.weight) if r is not None else (status.mode,)


def test_no_field_no_record_and_a_new_object_takes_the_spec_at_once() -> None:
    run = Run()
    assert run.step(None) == (None,)
    assert run.step(None, first=True) == (None,)
    assert Run().step("Auto", first=True) == ("Auto",)
    assert run.events == []


def test_without_spec_rollout_a_change_switches_at_once() -> None:
    run = Run(config=None)
    assert run.step("Auto") == ("Auto",)
    assert run.events == ["DisaggregationModeSwitched"]
    assert run.step("Auto") == ("Auto",)
    assert run.step(None) == ("Always",)
    assert run.events == ["DisaggregationModeSwitched"] * 2


def test_a_change_steps_through_the_weights_and_promotes() -> None:
    run = Run()
    # Nothing to prepare: the first step's weight at once.
    assert run.step("Auto") == ("Always", "Auto", "Shifting", 50)
    assert run.events == ["DisaggregationRolloutStarted"]
    # A window must lie within the step: the next pass a window later judges it.
    assert run.step("Auto", dt=WINDOW + 1) == ("Always", "Auto", "Shifting", 100)
    assert run.reads[-1] == ("Auto", "Always")
    assert run.step("Auto", dt=WINDOW + 1) == ("Auto", "Auto", "Promoted", 100)
    assert active(run.status) is False
    # Settled: nothing moves, nothing is read.
    reads = len(run.reads)
    assert run.step("Auto", dt=60) == ("Auto", "Auto", "Promoted", 100)
    assert len(run.reads) == reads
    # A second change starts again from the mode now in effect.
    assert run.step("Threshold") == ("Auto", "Threshold", "Shifting", 50)


def test_a_failed_window_rolls_back_and_holds_until_retry() -> None:
    run = Run(arm=BAD)
    run.step("Auto")
    assert run.step("Auto", dt=WINDOW + 1) == ("Always", "Auto", "RollingBack", 0)
    assert run.step("Auto", dt=DELAY) == ("Always", "Auto", "RolledBack", 0)
    assert run.events[-2:] == ["DisaggregationRolloutRollingBack", "DisaggregationRolloutRolledBack"]
    assert active(run.status) is False
    assert run.step("Auto", dt=30) == ("Always", "Auto", "RolledBack", 0)  # held: the spec still says Auto
    run.arm = GOOD
    assert run.step("Auto", command="retry") == ("Always", "Auto", "Shifting", 50)
    assert run.status is not None
    assert run.status.rollout is not None
    assert run.status.rollout.last_command_outcome is not None
    assert run.status.rollout.last_command_outcome.startswith("disaggregation rollout: ")


def test_abort_and_revert() -> None:
    run = Run()
    run.step("Auto")
    assert run.step("Auto", command="abort")[:4] == ("Always", "Auto", "RollingBack", 0)
    other = Run()
    other.step("Auto")
    assert other.step(None) == ("Always",)  # the spec back at the mode in effect: over at once
    assert other.events[-1] == "DisaggregationRolloutReverted"
    third = Run()
    third.step("Auto")
    assert third.step("Threshold") == ("Always", "Threshold", "Shifting", 50)
    # spec.rollout removed mid-way: the spec's mode at once.
    third.config = None
    assert third.step("Threshold") == ("Threshold",)


def pdd(status: dict[str, Any] | None, spec: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "demo"}, "spec": {"router": {}}}
    if spec is not None:
        obj["spec"]["router"]["disaggregation"] = spec
    if status is not None:
        obj["status"] = {"disaggregation": status}
    return obj


def test_routers_read_the_mode_in_effect_and_the_split() -> None:
    run = Run()
    run.step("Auto")
    assert run.status is not None
    status = run.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    info = pdd_info_from(pdd(status, {"mode": "Auto", "maxLocalTokens": 64}))
    assert info.disaggregation == {"mode": "Always", "maxLocalTokens": 64}
    assert (info.disaggregation_target, info.disaggregation_weight) == ("Auto", 50)
    run.step("Auto", dt=WINDOW + 1)
    run.step("Auto", dt=WINDOW + 1)
    status = run.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    info = pdd_info_from(pdd(status, {"mode": "Auto"}))
    assert info.disaggregation == {"mode": "Auto"}
    assert (info.disaggregation_target, info.disaggregation_weight) == (None, 0)  # promoted: no split
    # Without a field and without a record: nothing (the router's flags decide: Always).
    assert pdd_info_from(pdd(None, None)).disaggregation is None


def test_reconcile_passes_record_the_mode_and_start_a_rollout() -> None:
    """Through the operator's pass (in-memory API): status.disaggregation, Events, the requeue."""
    doc = manifest()
    doc["spec"]["colocated"] = {"replicas": 1}
    doc["spec"]["rollout"] = {"steps": [{"weight": 50}, {"weight": 100}], "analysis": {"windowSeconds": 10}}
    doc["spec"]["router"]["disaggregation"] = {"mode": "Auto"}
    world = World(doc)
    world.run()
    assert world.pdd["status"]["disaggregation"] == {"mode": "Auto"}  # a new object: the spec's at once
    world.kube.objects[("PDDeployment", NS, NAME)]["spec"]["router"]["disaggregation"] = {
        "mode": "Threshold",
        "thresholdTokens": 128,
    }
    result = world.run(1.0)
    record = world.pdd["status"]["disaggregation"]
    assert record["mode"] == "Auto"
    assert (record["rollout"]["target"], record["rollout"]["phase"], record["rollout"]["weight"]) == (
        "Threshold",
        "Shifting",
        50,
    )
    assert "DisaggregationRolloutStarted" in world.events()
    assert result.requeue_after is not None
    info = pdd_info_from(world.pdd)
    assert (info.disaggregation_target, info.disaggregation_weight) == ("Threshold", 50)
    # No Prometheus answers here: the windows are "metrics unavailable" and the step holds (Pause).
    world.run(30.0)
    assert world.pdd["status"]["disaggregation"]["rollout"]["weight"] == 50
    world.kube.objects[("PDDeployment", NS, NAME)]["spec"]["router"]["disaggregation"] = {"mode": "Auto"}
    world.run(1.0)
    assert world.pdd["status"]["disaggregation"] == {"mode": "Auto"}
    assert "DisaggregationRolloutReverted" in world.events()
