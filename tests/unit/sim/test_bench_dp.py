"""The autoscaler bench with decode in data-parallel groups (`bench/autoscale.py --decode-dp D`): the group
reaches every policy, the static search, the oracle's grid and the simulator, and every policy's run holds
D GPUs for each decode replica it keeps (five minutes of the quick case, so that CI stays fast)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from tandem.devcluster.testing import load_file

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_file("bench_autoscale_dp", ROOT / "bench" / "autoscale.py")


def test_the_decode_group_reaches_every_policy_and_the_oracle(bench: ModuleType) -> None:
    case = bench.with_decode_dp(bench.QUICK, 4)
    assert (case.name, case.decode_dp) == ("azure-conv-quick-dp4", 4)
    assert bench.with_decode_dp(bench.QUICK, 1) is bench.QUICK
    assert case.gpus_per_replica == {"prefill": 1, "decode": 4}
    setup = bench.setup_of(case, {"prefill": 2, "decode": 1})
    decode = setup.layout_pd.pools["decode"]
    assert (decode.replicas, decode.gpus_per_replica, decode.instance.data) == (1, 4, 4)
    assert setup.layout_pd.pools["prefill"].gpus_per_replica == 1
    assert setup.layout_colocated.pools["colocated"].gpus_per_replica == 1  # colocated: one engine each
    spec = bench.case_spec(case, {"prefill": 2, "decode": 1})
    assert spec.decode.parallelism.data == 4
    assert spec.decode.autoscaling is not None
    assert spec.decode.autoscaling.max_replicas == 16 // 4
    assert bench.make_policy(bench.HPA, setup).gpus_per_replica == {"prefill": 1, "decode": 4}
    planner = bench.make_policy(bench.DYNAMO_180, setup)
    assert planner.config.decode_ranks == 4
    both = bench.make_policy(bench.DYNAMO_BOTH, setup)
    assert both.gpus_per_replica == {"prefill": 1, "decode": 4}
    assert both.config.throughput.decode_ranks == 4
    grid = bench.oracle_grid(case)
    assert (grid.max_prefill, grid.max_decode, grid.max_gpus) == (8, 2, 16)
    assert bench.layout_text(case, bench.StaticLayout(2, 1)) == "2P+1D(DP4)"
    assert bench.layout_text(bench.QUICK, bench.StaticLayout(2, 1)) == "2P+1D"


@pytest.mark.timeout(300)
def test_every_policy_holds_whole_decode_groups(bench: ModuleType, tmp_path: Path) -> None:
    case = bench.with_decode_dp(replace(bench.QUICK, seconds=300.0), 4)
    policies = [bench.STATIC_PEAK, bench.HPA, bench.DYNAMO_180, bench.DYNAMO_LOAD, bench.DYNAMO_BOTH]
    policies += [bench.TANDEM, bench.ORACLE]
    outcomes = bench.run_all([case], policies, 1)
    by_policy = {o.policy: o for o in outcomes}
    assert set(by_policy) == {*policies, bench.ORACLE_INSTANT}
    peak = by_policy[bench.STATIC_PEAK]
    assert peak.summary is not None
    assert peak.summary.attainment >= 0.95
    layout = peak.extra["layout"]
    assert peak.summary.peak_gpus == layout["prefill"] + 4 * layout["decode"]
    assert peak.note == f"{layout['prefill']}P+{layout['decode']}D(DP4)"
    for o in outcomes:
        assert o.summary is not None, o.policy
        assert o.summary.requests == peak.summary.requests
        assert o.series, o.policy
        assert all(s.gpus == s.replicas["prefill"] + 4 * s.replicas["decode"] for s in o.series), o.policy
        if o.policy in bench.DYNAMIC:
            assert o.note == f"from {peak.note}"
    assert "grid 1-8 x 1-2 <= 16 GPUs" in by_policy[bench.ORACLE].note
    table = bench.report([case], outcomes, tmp_path, docs=False)
    assert "| vs oracle |" in table
    for policy in policies:
        assert f"| {case.name} (tuned) | {policy} |" in table
