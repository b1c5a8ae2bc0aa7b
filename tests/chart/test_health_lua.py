"""The Argo CD health check against status fixtures (Argo CD's health_test.yaml format) and against
statuses the operator's own `derive_status` produces, in a real Lua 5.1 interpreter."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeployment
from tandem.api.status import RevisionRecord, RevisionsStatus, RolloutStatus
from tandem.status.derive import ConditionValue, Observed, PodProblem, WorkloadState, derive_status

from .helm import REPO
from .lua_health import health

FIXTURES = Path(__file__).parent / "argocd_health"
CASES = yaml.safe_load((FIXTURES / "health_test.yaml").read_text())["tests"]
NOW = "2026-11-29T09:00:00Z"


@pytest.mark.parametrize("case", CASES, ids=[Path(c["inputPath"]).stem for c in CASES])
def test_fixture(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((FIXTURES / case["inputPath"]).read_text())
    assert health(obj) == (case["healthStatus"]["status"], case["healthStatus"]["message"])


def test_fixtures_cover_every_health_status_and_phase() -> None:
    statuses = {c["healthStatus"]["status"] for c in CASES}
    assert statuses == {"Healthy", "Progressing", "Degraded", "Suspended"}
    phases = set()
    for c in CASES:
        obj = yaml.safe_load((FIXTURES / c["inputPath"]).read_text())
        phases.add((obj.get("status") or {}).get("phase"))
    assert {"Healthy", "Progressing", "Paused", "Degraded", None} <= phases


def test_script_uses_no_library_argo_cd_leaves_closed(tmp_path: Path) -> None:
    """The sandbox really is closed: a script calling string.format fails there."""
    script = tmp_path / "bad.lua"
    script.write_text('local hs = {}\nhs.status = string.format("%s", "Healthy")\nreturn hs\n')
    with pytest.raises(Exception, match="string"):
        health({}, script)


def example() -> PDDeployment:
    doc = yaml.safe_load((REPO / "examples" / "sim-pd.yaml").read_text())
    doc["metadata"].update(generation=4, uid="3a0c1f6e-0000-4000-8000-000000000001")
    return PDDeployment.from_object(doc)


def workload(ready: int, want: int) -> WorkloadState:
    return WorkloadState(
        generation=1, observed_generation=1, replicas=want, ready_replicas=ready, updated_replicas=want
    )


def as_object(pdd: PDDeployment, observed: Observed) -> dict[str, Any]:
    status = derive_status(pdd, observed, [], NOW)
    body: dict[str, Any] = {
        "metadata": {"name": pdd.metadata.name, "generation": pdd.metadata.generation},
        "status": status.model_dump(by_alias=True, mode="json", exclude_none=True),
    }
    return body


WANT = {"prefill": 1, "decode": 2, "colocated": 0, "router": 1}
OBSERVED = {
    "converged": (
        Observed(
            workloads={"prefill": workload(1, 1), "decode": workload(2, 2), "router": workload(1, 1)},
            desired_replicas=WANT,
        ),
        "Healthy",
    ),
    "starting": (
        Observed(
            workloads={"prefill": workload(0, 1), "decode": workload(1, 2), "router": workload(1, 1)},
            desired_replicas=WANT,
        ),
        "Progressing",
    ),
    "nothing-yet": (Observed(desired_replicas=WANT), "Progressing"),
    "unschedulable": (
        Observed(
            workloads={"prefill": workload(1, 1), "decode": workload(1, 2), "router": workload(1, 1)},
            desired_replicas=WANT,
            pod_problems=[
                PodProblem("sim-pd-decode-1", "decode", "Unschedulable", "0/9 nodes are available")
            ],
        ),
        "Degraded",
    ),
    "apply-failed": (
        Observed(desired_replicas=WANT, apply_errors=["StatefulSet/sim-pd-decode: forbidden"]),
        "Degraded",
    ),
}


def _rollout(phase: str, weight: int, **extra: Any) -> RolloutStatus:
    return RolloutStatus(
        phase=phase, weight=weight, started_at=0, step_started_at=0, phase_since=0, reason=phase, **extra
    )


_CONVERGED = OBSERVED["converged"][0]
for _name, _rollout_status, _health in (
    ("rollout-preparing", _rollout("Preparing", 0), "Progressing"),
    ("rollout-shifting", _rollout("Shifting", 50), "Progressing"),
    ("rollout-rolling-back", _rollout("RollingBack", 0, rollback_stage="RestoringWeight"), "Progressing"),
    ("rollout-paused", _rollout("Paused", 50, pause_cause="AwaitingPromote"), "Suspended"),
    ("rollout-rolled-back", _rollout("RolledBack", 0), "Degraded"),
    ("rollout-promoted", _rollout("Promoted", 100), "Healthy"),
):
    OBSERVED[_name] = (dataclasses.replace(_CONVERGED, rollout=_rollout_status), _health)


_KV_SLOW: ConditionValue = (
    "True",
    "BandwidthBelowThreshold",
    "effective KV bandwidth 1.0 Gb/s, 10% of the configured 10 Gb/s",
)
OBSERVED["kv-transport-degraded"] = (dataclasses.replace(_CONVERGED, kv_condition=_KV_SLOW), "Degraded")
OBSERVED["kv-transport-healthy"] = (
    dataclasses.replace(_CONVERGED, kv_condition=("False", "BandwidthHealthy", "98% of the link")),
    "Healthy",
)
# A revision change of the P/D pair under spec.rollout (no mode rollout): its phase is the deployment's.
_REVISION_A = RevisionRecord(id="aaaaaaaaaa", prefix="sim-pd", legacy=True)
_REVISION_B = RevisionRecord(id="bbbbbbbbbb", prefix="sim-pd-bbbbbbbbbb")
for _name, _rollout_status, _health in (
    ("revision-rollout-preparing", _rollout("Preparing", 0, target="bbbbbbbbbb"), "Progressing"),
    ("revision-rollout-shifting", _rollout("Shifting", 50, target="bbbbbbbbbb"), "Progressing"),
    (
        "revision-rollout-paused",
        _rollout("Paused", 50, target="bbbbbbbbbb", pause_cause="AwaitingPromote"),
        "Suspended",
    ),
    ("revision-rollout-rolled-back", _rollout("RolledBack", 0, target="bbbbbbbbbb"), "Degraded"),
    ("revision-rollout-promoted", _rollout("Promoted", 100, target="bbbbbbbbbb"), "Healthy"),
):
    _revisions = RevisionsStatus(
        current=_REVISION_B, previous=_REVISION_A, weight=_rollout_status.weight, rollout=_rollout_status
    )
    OBSERVED[_name] = (dataclasses.replace(_CONVERGED, revisions=_revisions), _health)


def test_kv_transport_degraded_keeps_ready_and_says_why() -> None:
    obj = as_object(example(), OBSERVED["kv-transport-degraded"][0])
    conditions = {c["type"]: c for c in obj["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True", "requests are still served"
    assert "KVTransportDegraded: effective KV bandwidth 1.0 Gb/s" in conditions["Ready"]["message"]
    assert conditions["Stalled"]["status"] == "False"
    assert health(obj) == ("Degraded", "BandwidthBelowThreshold: " + _KV_SLOW[2])


def test_kv_transport_degraded_kept_between_reads() -> None:
    """A pass that does not read the transport (kv_condition None) keeps the condition, and the phase."""
    pdd = example()
    first = derive_status(pdd, OBSERVED["kv-transport-degraded"][0], [], NOW)
    second = derive_status(pdd, _CONVERGED, first.conditions, NOW)
    assert (first.phase.value, second.phase.value) == ("Degraded", "Degraded")
    assert second.conditions == first.conditions


def test_revision_rollout_sets_reconciling_with_its_target() -> None:
    obj = as_object(example(), OBSERVED["revision-rollout-shifting"][0])
    reconciling = next(c for c in obj["status"]["conditions"] if c["type"] == "Reconciling")
    assert (reconciling["status"], reconciling["reason"]) == ("True", "RolloutShifting")
    assert reconciling["message"].startswith("revision rollout to bbbbbbbbbb Shifting at 50%")


@pytest.mark.parametrize("name", sorted(OBSERVED))
def test_statuses_the_operator_derives(name: str) -> None:
    observed, expected = OBSERVED[name]
    obj = as_object(example(), observed)
    status, message = health(obj)
    assert status == expected, (obj["status"], message)
    assert obj["status"]["phase"] == {"Suspended": "Paused"}.get(expected, expected)
