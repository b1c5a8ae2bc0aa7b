"""Reconcile passes of a PDDeployment under `spec.rollout`, against the in-memory API of the
autoscaler's tests and a scripted Prometheus (virtual clock): a colocated -> P/D rollout step by
step, a failed step rolling back weight first, commands acted on once, a restart mid-rollout, no
status write for a countdown, the cut-over without a rollout, and the steady-state fall-back."""

from __future__ import annotations

import copy
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.api.status import RevisionRecord, RevisionsStatus, RolloutStatus
from tandem.api.testing import stored
from tandem.controller.events import EventRecorder
from tandem.controller.reconcile import Reconciler
from tandem.controller.rollout import budget_order
from tandem.kube.pods import pdd_info_from

_path = Path(__file__).parents[1] / "controller" / "test_reconcile_autoscaling.py"
_spec = importlib.util.spec_from_file_location("reconcile_world", _path)
assert _spec is not None
assert _spec.loader is not None
world_module: Any = importlib.util.module_from_spec(_spec)
sys.modules["reconcile_world"] = world_module  # dataclasses look their module up there
_spec.loader.exec_module(world_module)

NS, NAME, T0 = world_module.NS, world_module.NAME, world_module.T0
URL = "http://127.0.0.1:9090"
COMMAND = "tandem.dev/rollout-command"


@dataclass
class Traffic:
    """What the routers counted per path over any window: requests, within SLO, 5xx."""

    by_path: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    reads: int = 0
    fail: str = ""  # a query error for every rollout query

    def run(self, queries: dict[str, str], at: float) -> tuple[dict[str, Any], dict[str, str]]:
        if not any(name.startswith("rollout_") for name in queries):
            return {}, {}  # the KV transport's queries: no NIXL metrics here
        self.reads += 1
        if self.fail:
            return {}, dict.fromkeys(queries, self.fail)

        def answer(index: int) -> list[dict[str, Any]]:
            return [{"metric": {"path": p}, "value": [at, str(v[index])]} for p, v in self.by_path.items()]

        return {
            "rollout_requests": answer(0),
            "rollout_within_slo": answer(1),
            "rollout_errors": answer(2),
        }, {}


class Reader(world_module.ScriptedReader):  # type: ignore[misc]
    def __init__(self, traffic: Traffic) -> None:
        super().__init__()
        self.traffic = traffic

    def run(self, queries: dict[str, str], at: float) -> tuple[dict[str, Any], dict[str, str]]:
        return self.traffic.run(queries, at)


def manifest(mode: str = "Colocated", **rollout: Any) -> dict[str, Any]:
    return stored(
        {
            "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"type": "sim", "image": "img"},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 2},
            "colocated": {"replicas": 2},
            "router": {"replicas": 1},
            "slo": {"ttftMs": 1000, "tpotMs": 50},
            "autoscaling": {"prometheus": {"url": URL}},
            "serving": {"mode": mode},
            "rollout": {
                "steps": [{"weight": 50, "pauseSeconds": 0}, {"weight": 100, "pauseSeconds": 0}],
                "analysis": {"windowSeconds": 20, "minSamples": 10},
                "scaleDownDelaySeconds": 10,
                **rollout,
            },
        },
        name=NAME,
        namespace=NS,
    )


class World(world_module.World):  # type: ignore[misc]
    def __init__(self, doc: dict[str, Any]) -> None:
        self.traffic = Traffic()
        super().__init__(doc)

    def reader_for(self, url: str, timeout: float) -> Reader:
        assert (url, timeout) == (URL, 5.0)
        return Reader(self.traffic)

    def restart(self) -> None:
        """A new operator process: nothing in memory but the reader."""
        autoscaler = world_module.Autoscaler(self.kube, URL, reader_for=self.reader_for)
        self.reconciler = Reconciler(self.kube, EventRecorder(self.kube), autoscaler)

    def set_mode(self, mode: str) -> None:
        self.pdd["spec"]["serving"]["mode"] = mode
        self.pdd["metadata"]["generation"] += 1

    def command(self, value: str) -> None:
        self.pdd["metadata"].setdefault("annotations", {})[COMMAND] = value

    @property
    def rollout(self) -> dict[str, Any]:
        rollout: dict[str, Any] = self.pdd["status"].get("rollout") or {}
        return rollout

    def size(self, role: str) -> int:
        sts = self.kube.objects.get(("StatefulSet", NS, f"{NAME}-{role}"))
        return int(sts["spec"]["replicas"]) if sts is not None else 0

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.pdd["status"]["conditions"] if c["type"] == kind)

    def router_share(self) -> int | None:
        info = pdd_info_from(self.pdd)
        if info.rollout_weight is not None:
            return info.rollout_weight
        return 0 if info.serving_mode == "Colocated" else 100

    def healthy(self) -> None:
        self.traffic.by_path = {"disaggregated": (50, 50, 0), "colocated": (50, 50, 0)}

    def broken(self) -> None:
        self.traffic.by_path = {"disaggregated": (50, 20, 0), "colocated": (50, 50, 0)}


def started() -> World:
    world = World(manifest())
    world.run()
    assert world.pdd["status"]["mode"] == "Colocated"
    assert "rollout" not in world.pdd["status"]
    assert (world.size("colocated"), world.size("prefill"), world.size("decode")) == (2, 0, 0), (
        "the arm not in effect holds no pods"
    )
    world.set_mode("Disaggregated")
    world.run(1.0)
    return world


def test_a_rollout_completes_step_by_step() -> None:
    world = started()
    assert (world.rollout["phase"], world.rollout["weight"], world.rollout["target"]) == (
        "Preparing",
        0,
        "Disaggregated",
    )
    assert world.pdd["status"]["mode"] == "Colocated"
    assert world.router_share() == 0
    assert (world.size("prefill"), world.size("decode")) == (1, 1), "P/D sized for the first step"
    assert "RolloutStarted" in world.events()
    world.healthy()
    world.run(1.0)  # the P/D pods are ready (settled): step 0
    assert (world.rollout["phase"], world.rollout["weight"]) == ("Shifting", 50)
    assert world.router_share() == 50
    assert (world.size("colocated"), world.size("prefill"), world.size("decode")) == (1, 1, 1)
    assert world.condition("RolloutProgressing")["status"] == "True"
    assert world.pdd["status"]["phase"] == "Progressing"
    world.run(21.0)  # a whole window inside the step, passing
    assert (world.rollout["phase"], world.rollout["weight"]) == ("Shifting", 100)
    assert world.rollout["verdicts"][-1]["result"] == "Pass"
    assert world.rollout["verdicts"][-1]["figures"]["targetRequests"] == 50
    world.run(21.0)
    assert (world.rollout["phase"], world.rollout["weight"]) == ("Promoted", 100)
    assert world.pdd["status"]["mode"] == "Disaggregated"
    assert world.router_share() == 100
    assert world.size("colocated") == 1, "the source keeps a pod through the scale-down delay"
    assert (world.size("prefill"), world.size("decode")) == (1, 2)
    world.run(11.0)
    assert world.size("colocated") == 0
    world.run(1.0)
    assert world.condition("RolloutProgressing")["reason"] == "Promoted"
    assert world.pdd["status"]["phase"] == "Healthy"
    events = world.events()
    assert events.index("RolloutStarted") < events.index("RolloutShifting") < events.index("RolloutPromoted")


def test_a_failing_step_rolls_back_weight_first() -> None:
    world = started()
    world.broken()
    world.run(1.0)
    assert world.rollout["phase"] == "Shifting"
    world.run(21.0)
    assert (world.rollout["phase"], world.rollout["weight"], world.rollout["rollbackStage"]) == (
        "RollingBack",
        0,
        "RestoringWeight",
    )
    assert world.router_share() == 0
    assert world.size("colocated") == 2, "the source arm is restored at once"
    assert (world.size("prefill"), world.size("decode")) == (1, 1), "P/D keeps its pods for the delay"
    assert "40.0%" in world.rollout["reason"], "the cause keeps its figures"
    rolled = world.condition("RolledBack")
    assert rolled["status"] == "True"
    assert "40.0%" in rolled["message"]
    world.run(5.0)
    assert (world.size("prefill"), world.size("decode")) == (1, 1)
    world.run(6.0)  # the delay is over: scale-down allowed
    assert (world.size("prefill"), world.size("decode")) == (0, 0)
    world.run(1.0)
    assert world.rollout["phase"] == "RolledBack"
    assert world.pdd["status"]["mode"] == "Colocated"
    assert world.pdd["status"]["phase"] == "Degraded"
    assert world.condition("Stalled")["reason"] == "RolledBack"
    assert pdd_info_from(world.pdd).rollout_weight == 0
    # One Event per moment: rolling back (weight first), scaling down, rolled back; no generic
    # "RolledBack" Warning from the Stalled condition beside RolloutRolledBack.
    events = world.events()
    assert [e for e in events if "RolledBack" in e or "RollingBack" in e or "ScalingDown" in e] == [
        "RolloutRollingBack",
        "RolloutScalingDown",
        "RolloutRolledBack",
    ]


def test_commands_act_once_and_unknown_ones_are_reported() -> None:
    world = started()
    world.command("promote")
    world.run(1.0)
    assert world.rollout["lastCommand"] == "promote"
    assert "ignored" in world.rollout["lastCommandOutcome"], "no traffic before the target is ready"
    world.healthy()
    world.run(1.0)
    assert (world.rollout["phase"], world.rollout["weight"]) == ("Shifting", 50), (
        "the same value is not re-run"
    )
    world.command("promote/2")
    world.run(1.0)
    assert (world.rollout["phase"], world.rollout["weight"]) == ("Shifting", 100)
    world.command("pause")
    world.run(1.0)
    assert any("unknown rollout command 'pause'" in p for p in world.rollout["problems"])
    ignored = world.events().count("RolloutCommandIgnored")
    world.run(1.0)
    assert world.events().count("RolloutCommandIgnored") == ignored, "reported once while it holds"
    world.command("abort")
    world.run(1.0)
    assert (world.rollout["phase"], world.rollout["weight"]) == ("RollingBack", 0)
    world.run(11.0)
    world.run(1.0)
    assert world.rollout["phase"] == "RolledBack"
    world.command("retry")
    world.run(1.0)
    assert (world.rollout["phase"], world.rollout["attempt"]) == ("Preparing", 2)


def test_an_operator_restart_resumes_from_status() -> None:
    world = started()
    world.healthy()
    world.run(1.0)
    assert world.rollout["phase"] == "Shifting"
    before = copy.deepcopy(world.rollout)
    world.restart()
    world.run(1.0)
    assert world.rollout["stepStartedAt"] == before["stepStartedAt"], "not restarted"
    world.run(21.0)
    assert world.rollout["weight"] == 100


def test_a_countdown_alone_writes_no_status() -> None:
    world = started()
    world.healthy()
    world.run(1.0)
    world.run(5.0)  # a verdict (inconclusive: the window began before the step) is recorded
    writes = len(world.kube.writes)
    world.run(1.0)  # no verdict due, only the bake countdown moved
    assert ("status",) not in world.kube.writes[writes:]


def test_setting_the_mode_back_aborts_weight_first() -> None:
    world = started()
    world.healthy()
    world.run(1.0)
    assert world.rollout["weight"] == 50
    world.set_mode("Colocated")
    world.run(1.0)
    assert (world.rollout["phase"], world.rollout["weight"]) == ("RollingBack", 0)
    assert "RolloutReverted" in world.events()
    world.run(11.0)
    world.run(1.0)
    world.run(1.0)
    assert "rollout" not in world.pdd["status"] or world.pdd["status"].get("rollout") is None
    assert world.pdd["status"]["mode"] == "Colocated"
    assert (world.size("prefill"), world.size("decode")) == (0, 0)


def test_without_a_rollout_the_old_arm_stays_until_the_new_one_is_ready() -> None:
    doc = manifest()
    del doc["spec"]["rollout"]
    doc["spec"]["prefill"]["replicas"] = 0
    doc["spec"]["decode"]["replicas"] = 0
    world = World(doc)
    world.run()
    assert world.pdd["status"]["mode"] == "Colocated"
    spec = world.pdd["spec"]
    spec["serving"]["mode"] = "Disaggregated"
    spec["prefill"]["replicas"], spec["decode"]["replicas"], spec["colocated"]["replicas"] = 1, 1, 0
    world.pdd["metadata"]["generation"] += 1
    body = copy.deepcopy(world.pdd)
    stamp = "2027-01-15T08:00:01Z"
    result = world.reconciler.reconcile(body, stamp, T0 + 1)  # before the P/D pods exist
    assert result.deleted == [], "the colocated pool is not deleted before P/D is ready"
    assert world.size("colocated") == 2
    assert world.pdd["status"]["mode"] == "Colocated"
    assert world.router_share() == 0
    world.settle()
    world.run(1.0)
    assert world.pdd["status"]["mode"] == "Disaggregated"
    assert world.router_share() == 100
    assert "ModeSwitched" in world.events()
    # The pass that switches keeps the old arm: it goes once status.mode says P/D.
    assert ("delete", "StatefulSet", f"{NAME}-colocated") not in world.kube.writes
    assert world.size("colocated") == 2
    world.run(1.0)
    assert ("delete", "StatefulSet", f"{NAME}-colocated") in world.kube.writes


def test_a_steady_pd_deployment_falls_back_when_its_slo_fails_at_full_size() -> None:
    world = World(manifest(mode="Disaggregated"))
    world.run()
    assert world.pdd["status"]["mode"] == "Disaggregated"
    assert world.size("colocated") == 0
    world.traffic.by_path = {"disaggregated": (100, 99, 0)}
    world.run(6.0)
    assert "rollout" not in world.pdd["status"], "a passing window changes nothing"
    world.traffic.by_path = {"disaggregated": (100, 60, 0)}
    world.run(6.0)
    assert (world.rollout["phase"], world.rollout["weight"]) == ("RollingBack", 0)
    assert "steady P/D breach" in world.rollout["reason"]
    assert "60.0%" in world.rollout["reason"]
    # The verdict that decided it is recorded with its figures, like a step's.
    (verdict,) = world.rollout["verdicts"]
    assert (verdict["result"], verdict["figures"]["targetAttainment"]) == ("Fail", 0.6)
    assert verdict["figures"]["targetRequests"] == 100
    assert "60.0%" in verdict["reason"]
    assert verdict["windowEnd"] - verdict["windowStart"] == 20
    assert world.size("colocated") == 2
    assert (world.size("prefill"), world.size("decode")) == (1, 2), "P/D serves until colocated is ready"


def test_metrics_unavailable_never_promotes() -> None:
    world = started()
    world.traffic.fail = "Prometheus at http://127.0.0.1:9090 unreachable"
    world.run(1.0)
    for _ in range(10):
        world.run(6.0)
        assert world.rollout["weight"] <= 50
    assert (world.rollout["phase"], world.rollout["pauseCause"]) == ("Paused", "MetricsUnavailable")
    assert world.pdd["status"]["phase"] == "Paused"


def test_autoscaled_arms_trade_the_gpu_budget() -> None:
    """With the autoscaler: the arm not in effect is decided at 0 (it claims none of maxGPUs), and a
    rollout's target arm is decided at its floor (1 + 1 while Preparing), not below."""
    doc = manifest()
    spec = doc["spec"]
    spec["autoscaling"] = {"enabled": True, "intervalSeconds": 5, "prometheus": {"url": URL}}
    spec["colocated"] = {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}
    spec["prefill"] = {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 2}}
    spec["decode"] = {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 2}}
    spec["maxGPUs"] = 4
    world = World(doc)
    world.run()
    world.run(6.0)
    pools = world.pdd["status"]["autoscaling"]["pools"]
    assert (pools["prefill"]["desiredReplicas"], pools["decode"]["desiredReplicas"]) == (0, 0)
    assert pools["colocated"]["desiredReplicas"] == 2
    assert (world.size("prefill"), world.size("decode"), world.size("colocated")) == (0, 0, 2)
    world.set_mode("Disaggregated")
    world.run(1.0)
    assert world.rollout["phase"] == "Preparing"
    assert (world.size("prefill"), world.size("decode")) == (1, 1)
    pools = world.pdd["status"]["autoscaling"]["pools"]
    assert (pools["prefill"]["desiredReplicas"], pools["decode"]["desiredReplicas"]) == (1, 1)


def test_an_overlong_command_is_reported_not_run() -> None:
    world = started()
    world.command("abort/" + "x" * 400)
    world.run(1.0)
    assert world.rollout["phase"] == "Shifting", "not aborted (the target arm got ready meanwhile)"
    assert "lastCommand" not in world.rollout
    assert any("longer than 253" in p for p in world.rollout["problems"])
    world.command("abort/" + "y" * 2000)
    world.run(1.0)
    assert world.rollout["phase"] == "Shifting"
    world.command("abort")
    world.run(1.0)
    assert world.rollout["phase"] == "RollingBack"


def test_a_long_prometheus_error_fits_in_status() -> None:
    world = started()
    world.traffic.fail = "unreachable " + "z" * 3000
    world.run(1.0)
    world.run(6.0)
    missing = world.rollout["verdicts"][-1]["missing"]
    assert missing
    assert all(len(m) <= 1024 for m in missing)


def test_a_command_names_the_rollout_it_applies_to() -> None:
    """The outcome echoes the kind of rollout; a command scoped to the revision rollout is not the mode
    rollout's; a command already on the object when a rollout starts is not acted on by it."""
    world = World(manifest())
    world.run()
    world.command("abort")  # left from before: the rollout that starts now does not take it
    world.set_mode("Disaggregated")
    world.run(1.0)
    assert world.rollout["phase"] == "Preparing"
    assert world.rollout["lastCommand"] == "abort"
    world.healthy()
    world.run(1.0)
    assert world.rollout["phase"] == "Shifting"
    world.command("revision:abort")  # for the revision rollout (none runs): not this one's
    world.run(1.0)
    assert (world.rollout["phase"], world.rollout["lastCommand"]) == ("Shifting", "abort")
    world.command("mode:promote/1")
    world.run(1.0)
    assert (world.rollout["phase"], world.rollout["weight"]) == ("Shifting", 100)
    assert world.rollout["lastCommand"] == "mode:promote/1"
    assert world.rollout["lastCommandOutcome"].startswith("mode rollout: promote command at step 0")


def test_a_rollout_trades_capacity_within_max_gpus() -> None:
    """colocated 4, prefill 2, decode 4 (1 GPU each) under maxGPUs 8 (admission: P/D 6 + one replica
    per pool of the other side; without spec.rollout it would need 10): the total never exceeds 8, a
    failing step at 100% rolls back with P/D giving way while colocated comes back."""
    doc = manifest()
    spec = doc["spec"]
    spec["colocated"], spec["prefill"], spec["decode"] = {"replicas": 4}, {"replicas": 2}, {"replicas": 4}
    spec["maxGPUs"] = 8
    world = World(doc)
    world.run()
    world.set_mode("Disaggregated")
    world.healthy()
    totals: list[tuple[str, int, int, int, int]] = []
    roles = ("colocated", "prefill", "decode")
    halfway: dict[str, str] = {}  # status.pools.<role>.limitedBy at 50%
    for _ in range(14):  # Preparing, 50%, 100%
        world.run(5.0)
        sizes = (world.size("colocated"), world.size("prefill"), world.size("decode"))
        totals.append((world.rollout["phase"], world.rollout["weight"], *sizes))
        if world.rollout["weight"] == 100:
            break
        if world.rollout["weight"] == 50:
            halfway = {role: world.pdd["status"]["pools"][role]["limitedBy"] for role in roles}
    assert totals[-1][:2] == ("Shifting", 100), totals
    assert halfway == {"colocated": "rolloutArm", "prefill": "rolloutArm", "decode": "rolloutArm"}
    limits: dict[str, str] = {}
    world.broken()
    for _ in range(12):  # the step fails: weight back first, then P/D scaled down
        world.run(5.0)
        sizes = (world.size("colocated"), world.size("prefill"), world.size("decode"))
        totals.append((world.rollout["phase"], world.rollout["weight"], *sizes))
        if world.rollout["phase"] == "RollingBack" and not limits:
            limits = {role: world.pdd["status"]["pools"][role]["limitedBy"] for role in roles}
        if world.rollout["phase"] == "RolledBack":
            break
    print(totals, limits)
    # The first RollingBack pass: colocated whole again, decode cut from 4 so that both arms fit.
    assert limits == {"colocated": "spec", "prefill": "spec", "decode": "maxGPUs"}
    assert all(sum(t[2:]) <= 8 for t in totals), totals
    assert ("Shifting", 50, 2, 1, 2) in totals, "each arm at its share"
    back = [t for t in totals if t[0] == "RollingBack"]
    assert back, totals
    assert back[0][2:] == (4, 2, 2), "colocated back to 4 at once, P/D giving way (the largest first)"
    assert totals[-1] == ("RolledBack", 0, 4, 0, 0)


def test_budget_order() -> None:
    def record(phase: str, weight: int, target: str) -> RolloutStatus:
        return RolloutStatus.model_validate(
            {"phase": phase, "weight": weight, "startedAt": 0, "stepStartedAt": 0, "phaseSince": 0,
             "reason": "", "target": target}
        )  # fmt: skip

    pd, colo = ["prefill", "decode"], ["colocated"]
    assert budget_order(None, None) is None
    assert budget_order(record("Preparing", 0, "Disaggregated"), None) == [pd, colo]
    assert budget_order(record("Shifting", 10, "Disaggregated"), None) == [pd, colo]
    assert budget_order(record("Shifting", 90, "Disaggregated"), None) == [colo, pd]
    assert budget_order(record("RollingBack", 0, "Colocated"), None) == [colo, pd]
    assert budget_order(record("Promoted", 100, "Colocated"), None) == [pd, colo]
    old, new = RevisionRecord(id="a", prefix="x", legacy=True), RevisionRecord(id="b", prefix="x-b")
    cut_over = RevisionsStatus(current=new, previous=old, weight=0)
    assert budget_order(None, cut_over) is None, "a cut-over keeps the old pair whole"
    promoted = RevisionsStatus(current=new, previous=old, weight=100, rollout=record("Promoted", 100, "b"))
    assert budget_order(None, promoted) == [["previous/prefill", "previous/decode"], pd, colo]


@dataclass
class ModeTraffic(Traffic):
    """The routers' per-mode series of a disaggregation rollout (`mode` label), besides the paths."""

    by_mode: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def run(self, queries: dict[str, str], at: float) -> tuple[dict[str, Any], dict[str, str]]:
        if not any(name.startswith("disaggregation_") for name in queries):
            return super().run(queries, at)

        def answer(index: int) -> list[dict[str, Any]]:
            return [{"metric": {"mode": m}, "value": [at, str(v[index])]} for m, v in self.by_mode.items()]

        names = ("disaggregation_requests", "disaggregation_within_slo", "disaggregation_errors")
        return {name: answer(i) for i, name in enumerate(names)}, {}


def pd_only() -> World:
    """A P/D-only deployment (no colocated replicas) under spec.rollout with a tenants stage, serving
    with the mode Always; a steady P/D window that fails throughout (it has no arm to fall back to)."""
    doc = manifest(
        mode="Disaggregated",
        steps=[{"weight": 0, "pauseSeconds": 0}, {"weight": 100, "pauseSeconds": 0}],
        tenants=["team-a"],
    )
    doc["spec"]["colocated"] = {"replicas": 0}
    doc["spec"]["router"]["tenants"] = [{"name": "team-a"}]
    world = World(doc)
    world.traffic = ModeTraffic()
    world.traffic.by_path = {"disaggregated": (100, 10, 0)}
    world.run()
    world.run(1.0)
    assert world.pdd["status"]["phase"] == "Healthy"
    world.pdd["spec"]["router"]["disaggregation"] = {"mode": "Auto"}
    world.pdd["metadata"]["generation"] += 1
    world.run(1.0)
    return world


def disaggregation_rollout(world: World) -> tuple[Any, ...]:
    r = world.pdd["status"]["disaggregation"].get("rollout") or {}
    return (world.pdd["status"]["disaggregation"]["mode"], r.get("phase"), r.get("step"), r.get("weight"))


def test_a_pd_only_deployment_rolls_its_disaggregation_mode_and_shows_it_in_status() -> None:
    world = pd_only()
    # The tenants stage: team-a's P/D requests decided by Auto, everyone else's by Always.
    assert disaggregation_rollout(world) == ("Always", "Shifting", 0, 0)
    info = pdd_info_from(world.pdd)
    assert (info.disaggregation_target, info.disaggregation_weight, info.disaggregation_tenants_first) == (
        "Auto",
        0,
        True,
    )
    status = world.pdd["status"]
    assert status["phase"] == "Progressing"
    reconciling = world.condition("Reconciling")
    assert (reconciling["status"], reconciling["reason"]) == ("True", "RolloutShifting")
    assert reconciling["message"].startswith("disaggregation rollout to Auto Shifting at 0%")
    progressing = world.condition("RolloutProgressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "Shifting")
    assert progressing["message"].startswith("disaggregation Always -> Auto, weight 0%")
    assert "rollout" not in status, "no serving-mode rollout"
    assert status["mode"] == "Disaggregated"
    assert world.size("colocated") == 0

    world.traffic.by_mode = {"Auto": (40, 40, 0), "Always": (60, 60, 0)}
    for _ in range(12):
        world.run(6.0)
        assert "rollout" not in world.pdd["status"], "a P/D-only deployment never falls back to colocated"
        if disaggregation_rollout(world)[1] == "Promoted":
            break
    assert disaggregation_rollout(world) == ("Auto", "Promoted", 1, 100)
    assert world.size("colocated") == 0
    world.run(30.0)
    assert world.pdd["status"]["phase"] == "Healthy"
    progressing = world.condition("RolloutProgressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "Promoted")


def test_a_failed_disaggregation_window_degrades_the_deployment_until_retry() -> None:
    world = pd_only()
    world.traffic.by_mode = {"Auto": (40, 10, 0), "Always": (60, 60, 0)}
    for _ in range(10):
        world.run(6.0)
        if disaggregation_rollout(world)[1] == "RolledBack":
            break
    assert disaggregation_rollout(world) == ("Always", "RolledBack", 0, 0)
    assert pdd_info_from(world.pdd).disaggregation_tenants_first is False
    assert world.pdd["status"]["phase"] == "Degraded"
    stalled, rolled = world.condition("Stalled"), world.condition("RolledBack")
    assert (stalled["status"], stalled["reason"]) == ("True", "RolledBack")
    assert (rolled["status"], rolled["reason"]) == ("True", "RolledBack")
    assert "rollout" not in world.pdd["status"]
    # The spec back at the mode in effect ends it: healthy again, no rollout running.
    world.pdd["spec"]["router"]["disaggregation"] = {"mode": "Always"}
    world.pdd["metadata"]["generation"] += 1
    world.run(1.0)
    world.run(1.0)
    assert world.pdd["status"]["phase"] == "Healthy"
    assert world.condition("RolloutProgressing")["reason"] == "NoRollout"


def test_a_disaggregation_rollout_holds_the_steady_pd_fall_back() -> None:
    """With a colocated arm, the steady P/D fall-back waits while a disaggregation rollout judges."""
    doc = manifest(mode="Disaggregated", steps=[{"weight": 50, "pauseSeconds": 0}, {"weight": 100}])
    world = World(doc)
    world.traffic = ModeTraffic()
    world.run()
    world.pdd["spec"]["router"]["disaggregation"] = {"mode": "Auto"}
    world.run(1.0)
    assert disaggregation_rollout(world) == ("Always", "Shifting", 0, 50)
    world.traffic.by_path = {"disaggregated": (100, 10, 0)}
    world.traffic.by_mode = {}  # no verdict either way: the step holds
    world.run(6.0)
    world.run(6.0)
    assert "rollout" not in world.pdd["status"]
    world.pdd["spec"]["router"]["disaggregation"] = {"mode": "Always"}
    world.run(1.0)  # the rollout ends: the fall-back watches again
    world.run(6.0)
    assert world.rollout["phase"] == "RollingBack"
