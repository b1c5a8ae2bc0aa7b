"""Data-parallel groups in the simulator (`parallelism.data` = D): a replica is a group of D ranks, each
an engine on the pool's per-rank profile, started and removed as a unit, balanced over as the pool's
`loadBalancing` says; GPU-hours count the group's GPUs.

The D=1 runs below are pinned to fingerprints taken before groups were modelled (commit d1eb9ec): the
summary, every request's first token, finish, path and preemptions, the scrape series and the
autoscaler's decisions, hashed; a D=1 pool must give exactly the same run."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from tandem.api.models import PDDeployment
from tandem.routing.disaggregation import DisaggregationKnobs
from tandem.sim import Request, ScheduledPolicy, SimResult, simulate
from tandem.sim import advise as adv
from tandem.sim.layout import SimConfig
from tandem.sim.tandem_policy import TandemPolicy
from tandem.sim.traces.prefix import SessionParams, sessions
from tandem.sim.traces.readers import read_azure
from tandem.sim.traces.transform import scale_rate, window

if TYPE_CHECKING:
    from conftest import SimKit

ROOT = Path(__file__).resolve().parents[3]


def fingerprint(result: SimResult, extra: str = "") -> str:
    digest = hashlib.sha256()
    digest.update(result.summary.model_dump_json().encode())
    records = result.records
    for column in (records.first, records.finished, records.path, records.preemptions):
        digest.update(column.tobytes())
    digest.update(repr(result.series).encode())
    digest.update(extra.encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def azure() -> list[Request]:
    """The Azure conversation trace's seconds 600-1800 at 4x its rate: 7,241 requests in 300 s."""
    trace = read_azure(ROOT / "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
    return scale_rate(window(trace, 600, 1200), 4)


def test_d1_autoscaled_run_is_unchanged(azure: list[Request]) -> None:
    """examples/sim-pd-autoscaling.yaml under tandem's autoscaler (it scales decode up twice)."""
    spec = PDDeployment.from_object(
        yaml.safe_load((ROOT / "examples/sim-pd-autoscaling.yaml").read_text())
    ).spec
    sim = adv.layout_of_spec(spec)
    assert sim.slo is not None
    policy = TandemPolicy(spec)
    result = simulate(azure, sim.layout, SimConfig(slo=sim.slo), policy)
    assert len(policy.decisions) == 2
    assert (result.summary.attainment, result.summary.gpu_hours) == (0.8103853058969755, 0.23122099951151437)
    assert fingerprint(result, repr(policy.decisions)) == "7435cbbe24677ffa"


def test_d1_prefix_routing_and_auto_prefill_are_unchanged(kit: SimKit) -> None:
    base = [Request(0.5 * i, 150, 60) for i in range(600)]
    trace = sessions(base, SessionParams(turns=4, think_seconds=5.0, system_prompt_tokens=1500, seed=2))
    config = kit.config().model_copy(
        update={"disaggregation": DisaggregationKnobs(mode="Auto"), "routing": "prefix"}
    )
    result = simulate(trace, kit.pd(prefill=2, decode=2), config)
    assert result.summary.gpu_hours == 0.36900178645229903
    assert fingerprint(result) == "8e5f741b09dff3dd"


def test_d1_scheduled_colocated_run_is_unchanged(kit: SimKit, azure: list[Request]) -> None:
    policy = ScheduledPolicy([(0.0, {"colocated": 1}), (60.0, {"colocated": 3}), (200.0, {"colocated": 1})])
    config = kit.config().model_copy(update={"routing": "least-loaded"})
    result = simulate(azure, kit.colocated(replicas=1, load=30.0), config, policy)
    assert result.summary.scale_actions == 2
    assert (result.summary.attainment, result.summary.gpu_hours) == (0.41803618284767297, 0.17992101660446622)
    assert fingerprint(result) == "71f832eb3ba0aa9b"
