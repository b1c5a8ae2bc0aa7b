"""Who sizes each pool and at what size: sources, the autoscaler's carried-over state, due times."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.api.models import PDDeploymentSpec
from tandem.api.status import (
    AutoscalingPoolsStatus,
    AutoscalingStatus,
    DrainStatus,
    PoolAutoscalingStatus,
    Recommendation,
    ReplicaSource,
)
from tandem.autoscale.bounds import autoscaled_roles
from tandem.controller import replicas


def spec(**autoscaling: Any) -> PDDeploymentSpec:
    """Prefill fixed at 1, decode autoscaled in [1, 6] from 2, colocated absent."""
    decode: dict[str, Any] = {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 6}}
    decode["autoscaling"].update(autoscaling.pop("decode", {}))
    return PDDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"type": "sim", "image": "img"},
            "prefill": {"replicas": 1},
            "decode": decode,
            "slo": {"ttftMs": 500, "tpotMs": 50},
            "autoscaling": {"enabled": True, **autoscaling},
        }
    )


def held(decode: int | None, **extra: Any) -> AutoscalingStatus:
    return AutoscalingStatus(
        mode="Active",
        last_evaluated=100.0,
        pools=AutoscalingPoolsStatus(decode=PoolAutoscalingStatus(desired_replicas=decode, **extra)),
    )


NO_STS: dict[str, int | None] = {}
NOW = 200.0


@pytest.mark.parametrize(
    ("kwargs", "paused", "decode_source", "mode"),
    [
        ({}, False, ReplicaSource.autoscaler, "Active"),
        ({}, True, ReplicaSource.autoscaler, "Paused"),
        ({"mode": "Advisory"}, False, ReplicaSource.spec, "Advisory"),
        ({"decode": {"external": True}}, False, ReplicaSource.external, "Active"),
    ],
)
def test_sources_and_mode(
    kwargs: dict[str, Any], paused: bool, decode_source: ReplicaSource, mode: str
) -> None:
    s = spec(**kwargs)
    assert replicas.source(s, "decode", paused) is decode_source
    assert replicas.source(s, "prefill", paused) is ReplicaSource.spec
    assert replicas.mode(s, paused) == mode


def test_disabled_autoscaling_drops_the_state_of_pools_it_no_longer_sizes() -> None:
    s = spec(enabled=False, decode={"external": True})  # bounds need enabled autoscaling, or external
    assert autoscaled_roles(s) == []
    before = held(5)
    before = before.model_copy(
        update={"pools": AutoscalingPoolsStatus(prefill=PoolAutoscalingStatus(desired_replicas=3))}
    )
    state = replicas.prepare_state(s, before, {"decode": 4}, False, NOW)
    assert state is not None
    assert state.mode == "Disabled"
    assert state.pools.prefill.desired_replicas is None  # re-enabling starts from the spec again
    assert state.pools.decode.desired_replicas == 4
    assert replicas.pool_sizes(s, state) == {"prefill": 1, "decode": None, "colocated": 0}


def test_first_pass_starts_from_the_spec() -> None:
    state = replicas.prepare_state(spec(), None, NO_STS, False, NOW)
    assert state is not None
    assert state.pools.decode.desired_replicas == 2
    assert state.pools.decode.recommendations == [Recommendation(time=NOW - 0.001, replicas=2)]  # HPA's
    assert state.last_evaluated is None
    assert replicas.pool_sizes(spec(), state)["decode"] == 2


def test_decided_size_survives_passes_and_ignores_spec_replicas() -> None:
    history = [Recommendation(time=90.0, replicas=5)]
    drain = DrainStatus(pod="x-decode-4", pods=["x-decode-4"], started_at=95.0, target_replicas=4)
    before = held(5, recommendations=history, capacity_correction=0.8, draining=drain)
    state = replicas.prepare_state(spec(), before, NO_STS, False, NOW)
    assert state is not None
    assert state.pools.decode.desired_replicas == 5  # not the spec's 2: a re-applied manifest changes nothing
    assert state.pools.decode.recommendations == history
    assert state.pools.decode.capacity_correction == 0.8
    assert state.pools.decode.draining == drain
    assert state.last_evaluated == 100.0
    assert replicas.pool_sizes(spec(), state) == {"prefill": 1, "decode": 5, "colocated": 0}


def test_lowered_bounds_clamp_the_held_size() -> None:
    state = replicas.prepare_state(spec(decode={"maxReplicas": 3}), held(5), NO_STS, False, NOW)  # was 6
    assert state is not None
    assert state.pools.decode.desired_replicas == 3


def test_advisory_runs_the_spec_size() -> None:
    state = replicas.prepare_state(spec(mode="Advisory"), held(5), NO_STS, False, NOW)
    assert state is not None
    assert state.pools.decode.desired_replicas == 2
    assert replicas.pool_sizes(spec(mode="Advisory"), state)["decode"] == 2


def test_external_pool_reports_the_live_count_and_renders_without_replicas() -> None:
    s = spec(decode={"external": True})
    state = replicas.prepare_state(s, held(2), {"decode": 7}, False, NOW)
    assert state is not None
    assert state.pools.decode.desired_replicas == 7  # a hand-back continues from the HPA's count
    assert replicas.pool_sizes(s, state)["decode"] is None


def test_nothing_configured_has_no_state() -> None:
    plain = PDDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"type": "sim", "image": "img"},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 2},
        }
    )
    assert replicas.prepare_state(plain, None, NO_STS, False, NOW) is None
    assert replicas.pool_sizes(plain, None) == {"prefill": 1, "decode": 2, "colocated": 0}


@pytest.mark.parametrize(
    ("last", "now", "generation", "decided", "due"),
    [
        (None, 100.0, 1, 1, True),  # never decided
        (100.0, 104.0, 1, 1, False),
        (100.0, 105.0, 1, 1, True),  # one interval later
        (100.0, 101.0, 2, 1, True),  # the spec changed since
        (100.0, 101.0, 1, None, True),  # no condition yet
        (100.0, 50.0, 1, 1, True),  # the clock went back (another leader's clock)
    ],
)
def test_decision_due(
    last: float | None, now: float, generation: int, decided: int | None, due: bool
) -> None:
    state = AutoscalingStatus(last_evaluated=last)
    assert replicas.decision_due(state, 5.0, now, generation, decided) is due


def test_seconds_until_due() -> None:
    assert replicas.seconds_until_due(AutoscalingStatus(last_evaluated=100.0), 30.0, 110.0) == 20.0
    assert replicas.seconds_until_due(AutoscalingStatus(last_evaluated=100.0), 30.0, 140.0) == 0.0
    assert replicas.seconds_until_due(None, 30.0, 140.0) == 0.0


def test_an_external_pool_renders_without_replicas() -> None:
    from tandem.api.models import PDDeployment
    from tandem.render import render

    pdd = PDDeployment(metadata={"name": "llama", "namespace": "ns"}, spec=spec(decode={"external": True}))
    sts = {o["metadata"]["name"]: o["spec"] for o in render(pdd) if o["kind"] == "StatefulSet"}
    assert "replicas" not in sts["llama-decode"]
    assert sts["llama-prefill"]["replicas"] == 1
    sized = {
        o["metadata"]["name"]: o["spec"] for o in render(pdd, {"decode": 3}) if o["kind"] == "StatefulSet"
    }
    assert sized["llama-decode"]["replicas"] == 3  # the caller decides: a new external pool starts at a size


def test_the_documented_hpa_example_targets_the_pool_it_hands_over() -> None:
    from pathlib import Path

    import yaml

    from tandem.api.models import PDDeployment
    from tandem.render import render

    path = Path(__file__).parents[3] / "docs" / "examples" / "hpa-decode.yaml"
    pdd_doc, hpa = yaml.safe_load_all(path.read_text())
    pdd = PDDeployment.from_object(pdd_doc)
    sts = next(o for o in render(pdd) if o["kind"] == "StatefulSet" and "replicas" not in o["spec"])
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": sts["metadata"]["name"],
    }
    assert hpa["metadata"]["namespace"] == pdd.metadata.namespace
    assert replicas.source(pdd.spec, "decode", False) is ReplicaSource.external
    assert replicas.source(pdd.spec, "prefill", False) is ReplicaSource.autoscaler
