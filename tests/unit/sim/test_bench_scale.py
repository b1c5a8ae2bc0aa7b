"""The realistic-scale plumbing of the autoscaler bench (`bench/autoscale.py --scale`, issue 25 item 2)
and the load-time cliff (`bench/load_cliff.py`, item 5): the scale case's model, TP, budget and
decision interval reach every policy, the simulator and the oracle; both benches run end to end on five
minutes of the scale day (the `--quick` hour shortened, so that CI stays fast)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from tandem.devcluster.testing import load_file

ROOT = Path(__file__).resolve().parents[3]


def _bench() -> ModuleType:
    return load_file("bench_autoscale_scale", ROOT / "bench" / "autoscale.py")


def test_scale_case_reaches_the_layout_the_policies_and_the_oracle() -> None:
    bench = _bench()
    case = replace(bench.SCALE_QUICK, interval_seconds=45, load_seconds=300.0)
    setup = bench.setup_of(case, {"prefill": 3, "decode": 2})
    for role, size in (("prefill", 3), ("decode", 2)):
        pool = setup.layout_pd.pools[role]
        assert pool.replicas == size
        assert pool.replica.tp == 4
        assert "70b" in pool.replica.profile.model.lower()
    assert setup.layout_pd.model_load_seconds == 300.0
    tandem = bench.make_policy(bench.TANDEM, setup)
    assert tandem.interval_seconds == 45
    hpa = bench.make_policy(bench.HPA, setup)
    assert hpa.interval_seconds == 45
    grid = bench.oracle_grid(case)
    assert (grid.max_prefill, grid.max_gpus, grid.interval_seconds) == (16, 128, 45.0)
    # the defaults are what the bench's own traces ran with before the scale cases existed
    plain = bench.setup_of(bench.QUICK, {"prefill": 2, "decode": 2})
    assert plain.layout_pd.pools["prefill"].replica.tp == 1
    assert plain.layout_pd.model_load_seconds == 120.0
    assert bench.make_policy(bench.TANDEM, plain).interval_seconds == 30
    assert bench.make_policy(bench.HPA, plain).interval_seconds == 15.0
    assert bench.oracle_grid(bench.QUICK).interval_seconds == 60.0


@pytest.mark.timeout(300)
def test_quick_scale_bench_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _bench()
    monkeypatch.setattr(bench, "SCALE_QUICK", replace(bench.SCALE_QUICK, seconds=300.0))
    assert bench.main(["--quick", "--scale", "--out", str(tmp_path), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "model meta-llama/Llama-3.1-70B-Instruct on H100 TP4, model load 120 s" in out
    assert "servegen-70b-quick: " in out
    results = {r["policy"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    peak = results["static peak"]["summary"]
    assert peak["attainment"] >= 0.95
    assert peak["peak_gpus"] % 4 == 0  # TP4 replicas
    assert "grid 1-16 x 1-16 <= 128 GPUs" in results["oracle"]["note"]
    for policy in ("tandem", "hpa", "oracle", "oracle-instant"):
        summary = results[policy]["summary"]
        assert summary["requests"] == peak["requests"]
        assert summary["gpu_hours"] > 0


def test_load_cliff_runs_the_oracle_searches_first_and_each_planner_once_per_load() -> None:
    cliff = load_file("bench_load_cliff_work", ROOT / "bench" / "load_cliff.py")
    bench = cliff.bench
    policies = [bench.TANDEM, bench.DYNAMO_BOTH, "oracle"]
    work = cliff.work_list(bench.SCALE_QUICK, policies, [10.0, 300.0], [30, 60], {"prefill": 3, "decode": 2})
    runs = [(w[1], w[0].interval_seconds, w[0].load_seconds) for w in work]
    # the two searches first (each replays every load itself), then one run per interval and load
    assert [r[:2] for r in runs[:2]] == [("oracle", 30), ("oracle", 60)]
    assert work[0][3] == [10.0, 300.0]
    assert sorted(r for r in runs if r[0] == bench.TANDEM) == [
        (bench.TANDEM, i, load) for i in (30, 60) for load in (10.0, 300.0)
    ]
    # the planner keeps its own interval: once per load, not once per swept interval
    planner = [r for r in runs if r[0] == bench.DYNAMO_BOTH]
    assert sorted(r[2] for r in planner) == [10.0, 300.0]
    assert len(runs) == 2 + 4 + 2


@pytest.mark.timeout(300)
def test_load_cliff_quick_sweeps_load_and_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cliff = load_file("bench_load_cliff", ROOT / "bench" / "load_cliff.py")
    short = replace(cliff.bench.SCALE_QUICK, seconds=300.0)
    cliff.bench.SCALE_QUICK = short
    argv = ["--quick", "--initial", "3:2", "--policies", "tandem,oracle", "--intervals", "30,60"]
    assert cliff.main([*argv, "--jobs", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "model load times 10, 300 s; decision intervals 30, 60 s" in out
    rows = json.loads((tmp_path / "results.json").read_text())
    runs = {(r["policy"], r.get("interval_seconds"), r.get("load_seconds")) for r in rows}
    for interval in (30, 60):
        for load in (10.0, 300.0):
            assert ("tandem", interval, load) in runs
            assert ("oracle", interval, load) in runs
        assert ("oracle-instant", interval, 0.0) in runs
    requests = {r["summary"]["requests"] for r in rows}
    assert len(requests) == 1  # the same requests in every run
    by = {(r["policy"], r.get("interval_seconds"), r.get("load_seconds")): r["summary"] for r in rows}
    # a longer load holds each ordered replica longer: the same oracle schedule costs more
    assert by[("oracle", 60, 300.0)]["gpu_hours"] >= by[("oracle", 60, 10.0)]["gpu_hours"]
    assert "| tandem | 30 | 300 |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "load-cliff.png").stat().st_size > 10_000
