"""Pools on different GPU types: each pool is sized with the profile of its own `gpuType`, so a faster
prefill GPU changes the prefill pool's sizing and not the decode pool's, and the other way round."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tandem.api.status import AutoscalingPoolsStatus, AutoscalingStatus, PoolAutoscalingStatus
from tandem.autoscale.capacity import pool_gpu, pool_model
from tandem.autoscale.decide import Decision, decide

if TYPE_CHECKING:
    from conftest import Kit

T0 = 1_800_000_000.0
H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
B200 = "NVIDIA-B200"
A100 = "NVIDIA-A100-SXM4-80GB"


def _state() -> AutoscalingStatus:
    pools = {role: PoolAutoscalingStatus(desired_replicas=1) for role in ("prefill", "decode")}
    return AutoscalingStatus(mode="Active", last_evaluated=T0 - 30, pools=AutoscalingPoolsStatus(**pools))


def _decide(kit: Kit, prefill_gpu: str | None, decode_gpu: str | None) -> Decision:
    """One decision under the same absolute load (built on the all-H100 kit): 2.5 H100 replicas' worth of
    prompt tokens, 2.5 of running sequences, on one replica of each pool."""
    patch: dict[str, Any] = {}
    if prefill_gpu is not None:
        patch["prefill"] = {"gpuType": prefill_gpu}
    if decode_gpu is not None:
        patch["decode"] = {"gpuType": decode_gpu}
    snapshot = kit.snapshot(T0, sizes={"prefill": (1, 1), "decode": (1, 1)}, prefill=2.5, decode=2.5)
    return decide(kit.with_spec(**patch).spec, snapshot, _state(), T0)


# id, prefill gpuType, decode gpuType, prefill target vs all-H100 (-1 fewer, 0 same, 1 more), decode's
GPU_CASES = [
    ("h100-labels-are-the-default", H100, H100, 0, 0),
    ("prefill-on-b200", B200, None, -1, 0),  # 2.3x the TFLOPS: fewer prefill replicas
    ("prefill-on-a100", A100, None, 1, 0),  # a third of the TFLOPS: more
    ("prefill-on-h200", H200, None, 0, 0),  # the H100's compute: prefill is compute-bound
    ("decode-on-h200", None, H200, 0, -1),  # 1.43x the bandwidth and 1.76x the KV memory: fewer decode
    ("decode-on-a100", None, A100, 0, 1),  # 0.61x the bandwidth: more
    ("split-b200-prefill-h200-decode", B200, H200, -1, -1),
]


@pytest.mark.parametrize(
    ("prefill_gpu", "decode_gpu", "prefill_change", "decode_change"),
    [c[1:] for c in GPU_CASES],
    ids=[c[0] for c in GPU_CASES],
)
def test_each_pool_is_sized_with_its_own_gpu_profile(
    kit: Kit, prefill_gpu: str | None, decode_gpu: str | None, prefill_change: int, decode_change: int
) -> None:
    base = _decide(kit, None, None)
    decision = _decide(kit, prefill_gpu, decode_gpu)

    def sign(x: float) -> int:
        return (x > 0) - (x < 0)

    for role, change, capacity in (
        ("prefill", prefill_change, "capacityTokensPerSecond"),
        ("decode", decode_change, "capacitySequences"),
    ):
        pool, before = decision.pools[role], base.pools[role]
        assert sign(pool.target - before.target) == change, (role, before.target, pool.target)
        if change:  # the per-replica capacity moves the other way from the replica count
            assert sign(before.figures[capacity] - pool.figures[capacity]) == change, role
        else:  # within 1% (the H200's faster weight read trims a long prefill's fixed part only)
            assert pool.figures[capacity] == pytest.approx(before.figures[capacity], rel=0.01), role
        assert "profileFallback" not in pool.figures


def test_pool_gpu_is_the_gpu_types_profile_gpu_else_the_default(kit: Kit) -> None:
    split = kit.with_spec(prefill={"gpuType": B200}, decode={"gpuType": H200}).spec
    assert pool_gpu(split, "prefill") == ("B200", False)
    assert pool_gpu(split, "decode") == ("H200", False)
    assert pool_model(split, "prefill").profile.gpu == "B200"
    assert pool_model(split, "decode").profile.gpu == "H200"
    assert pool_gpu(kit.spec, "prefill") == ("H100", False)  # no gpuType: spec.autoscaling.gpu
    on_a100 = kit.with_spec(autoscaling={"gpu": "A100"}, decode={"gpuType": H200}).spec
    assert pool_model(on_a100, "prefill").profile.gpu == "A100"
    assert pool_model(on_a100, "decode").profile.gpu == "H200"


def test_a_gpu_type_of_no_known_gpu_is_sized_on_the_default_and_says_so(kit: Kit) -> None:
    spec = kit.with_spec(prefill={"gpuType": "NVIDIA-L4"}).spec
    assert pool_gpu(spec, "prefill") == ("H100", True)
    model = pool_model(spec, "prefill")
    assert model.fallback
    assert model.profile == pool_model(kit.spec, "prefill").profile
    assert not pool_model(spec, "decode").fallback
    snapshot = kit.snapshot(T0, sizes={"prefill": (1, 1), "decode": (1, 1)}, prefill=2.5, decode=2.5)
    decision = decide(spec, snapshot, _state(), T0)
    assert decision.pools["prefill"].figures["profileFallback"] == 1.0
    assert "profileFallback" not in decision.pools["decode"].figures


def test_a_sim_engines_pool_runs_its_gpu_types_profile_unless_the_user_pins_one(kit: Kit) -> None:
    sim = {"type": "sim"}
    spec = kit.with_spec(engine=sim, prefill={"gpuType": B200}).spec
    assert pool_model(spec, "prefill").profile.gpu == "B200"
    pinned = kit.with_spec(
        engine={**sim, "env": [{"name": "TANDEM_SIM_GPU", "value": "A100"}]}, prefill={"gpuType": B200}
    ).spec
    assert pool_model(pinned, "prefill").profile.gpu == "A100"  # what the pods run (the user's env wins)
