"""The autoscaler bench's small fixed-seed run (`bench/autoscale.py --quick`): ten minutes of the Azure
conversation trace through static peak, HPA, the Dynamo-style planners (the 180-s throughput planner and
one tighter factor of it, the 5-s load-based loop alone and with the throughput floor, and its tighter
factor) and tandem, with the row "planner @ tandem's attainment" per swept planner. The whole bench is not
part of `make test`; this run is, so the bench cannot rot."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import ModuleType

import pytest

from tandem.devcluster.testing import load_file

ROOT = Path(__file__).resolve().parents[3]


def _bench() -> ModuleType:
    return load_file("bench_autoscale", ROOT / "bench" / "autoscale.py")


@pytest.mark.timeout(120)
def test_quick_bench_runs_every_policy_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _bench()
    decisions = tmp_path / "decisions"
    assert bench.main(["--quick", "--out", str(tmp_path), "--jobs", "1", "--decisions", str(decisions)]) == 0
    out = capsys.readouterr().out
    assert f"seed {bench.SEED}" in out
    assert "rate x" in out
    assert "whole bench:" in out
    table = (tmp_path / "table.md").read_text()
    dynamic = ("hpa", "dynamo-180s", "dynamo-180s@0.5", "dynamo-load", "dynamo-180s+load", "tandem")
    for policy in ("static peak", *dynamic, "dynamo-180s+load@0.5", "oracle", "oracle-instant"):
        assert f"| {policy} |" in table
    assert "| vs oracle |" in table
    assert "oracle replay" in out
    assert f"  {bench.QUICK.name}: tandem " in out
    assert "the oracle's GPU-hours (target <= 1.2x)" in out
    for swept in ("dynamo-180s", "dynamo-180s+load"):
        assert f"| {swept} @ tandem's attainment |" in table
    assert "planner sweep: dynamo-180s, dynamo-180s+load, TTFT/ITL targets = SLO x 1, 0.5" in out
    derived = json.loads((tmp_path / "planner_at_tandem.json").read_text())[bench.QUICK.name]
    results = {r["policy"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    for swept, row in derived.items():
        assert row["attainment"] == results["tandem"]["summary"]["attainment"]
        assert row["gpu_hours"] is None or row["gpu_hours"] > 0, swept
    peak = results["static peak"]
    assert peak["summary"]["attainment"] >= 0.95
    assert peak["summary"]["scale_actions"] == 0
    for policy in dynamic:
        summary = results[policy]["summary"]
        assert 0.0 <= summary["attainment"] <= 1.0
        assert summary["gpu_hours"] > 0
        assert summary["requests"] == peak["summary"]["requests"]  # the same requests for every policy
    oracle, instant = results["oracle"], results["oracle-instant"]
    assert oracle["summary"]["attainment"] >= 0.95  # the schedule replayed in the full simulator
    assert oracle["summary"]["requests"] == peak["summary"]["requests"]
    assert instant["summary"]["gpu_hours"] <= oracle["summary"]["gpu_hours"]  # load time costs
    assert len(oracle["schedule"]) == 10  # ten 60-s intervals
    # every policy started from static peak's layout
    assert {results[p]["note"] for p in dynamic} == {f"from {peak['note']}"}
    assert (tmp_path / f"{bench.QUICK.name}.png").stat().st_size > 10_000
    # --decisions: tandem's every pass per pool, and the oracle's schedule
    passes = [json.loads(line) for line in (decisions / f"{bench.QUICK.name}-tandem.jsonl").open()]
    times = sorted({p["time"] for p in passes})
    assert len(times) >= 18  # a pass every 30 s over ten minutes
    assert all(b - a == pytest.approx(30.0) for a, b in itertools.pairwise(times))
    for pool in ("prefill", "decode"):
        mine = [p for p in passes if p["pool"] == pool]
        assert [p["time"] for p in mine] == times
        assert all(p["reason"] and "exactReplicas" in p["figures"] for p in mine if not p["held"])
        for before, after in itertools.pairwise(mine):
            assert after["current"] == before["target"], (pool, before["time"])  # each target was applied
    # a run's extra fields are spread into its results.json entry: the passes stay out of it
    assert isinstance(results["tandem"]["decisions"], int)
    assert "decision_lines" not in results["tandem"]
    schedule = [json.loads(line) for line in (decisions / f"{bench.QUICK.name}-oracle.jsonl").open()]
    assert [(s["prefill"], s["decode"]) for s in schedule] == [tuple(x) for x in oracle["schedule"]]
    assert [s["time"] for s in schedule] == [60.0 * k for k in range(10)]
