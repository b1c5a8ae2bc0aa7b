"""The comparison table of bench/sim_fidelity.py, on hand-made numbers."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import pytest

from tandem.devcluster.testing import load_file

BENCH = Path(__file__).resolve().parents[3] / "bench" / "sim_fidelity.py"


def _load() -> ModuleType:
    return load_file("sim_fidelity_bench", BENCH)


fid = _load()


def test_ratio_is_live_over_sim_and_pass_within_ten_percent() -> None:
    live = {"ttft_p50": 55.0, "ttft_p90": 120.0, "tpot_p50": 7.7, "tpot_p90": 6.0}
    sim = {"ttft_p50": 50.0, "ttft_p90": 100.0, "tpot_p50": 7.0, "tpot_p90": 7.0}
    rows = {r.figure: r for r in fid.compare(live, sim)}
    assert rows["ttft_p50"].ratio == pytest.approx(1.1)
    assert rows["ttft_p50"].ok  # exactly 10% above: within
    assert rows["ttft_p90"].ratio == pytest.approx(1.2)
    assert not rows["ttft_p90"].ok
    assert rows["tpot_p50"].ratio == pytest.approx(1.1)
    assert rows["tpot_p50"].ok
    assert rows["tpot_p90"].ratio == pytest.approx(6 / 7)  # 14% below
    assert not rows["tpot_p90"].ok
    assert [r.figure for r in fid.compare(live, sim)] == ["ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"]


def test_below_by_ten_percent_passes_and_tolerance_is_a_parameter() -> None:
    [row] = fid.compare({"ttft_p50": 90.0}, {"ttft_p50": 100.0})
    assert row.ok
    assert row.ratio == pytest.approx(0.9)
    [row] = fid.compare({"ttft_p50": 90.0}, {"ttft_p50": 100.0}, tolerance=0.05)
    assert not row.ok


def test_missing_or_zero_figures_fail_and_unpaired_keys_are_skipped() -> None:
    rows = fid.compare(
        {"ttft_p50": math.nan, "tpot_p50": 7.0, "tpot_p90": 7.0, "extra": 1.0},
        {"ttft_p50": 50.0, "tpot_p50": 0.0, "tpot_p90": math.nan},
    )
    assert [r.figure for r in rows] == ["ttft_p50", "tpot_p50", "tpot_p90"]
    assert all(math.isnan(r.ratio) and not r.ok for r in rows)


def test_figures_are_nearest_rank_percentiles_in_ms() -> None:
    ttft = [0.010 * k for k in range(1, 11)]  # 10 .. 100 ms
    tpot = [0.007, math.nan, 0.008, 0.009]  # a one-token answer has no TPOT
    got = fid.figures(ttft, tpot)
    assert got["ttft_p50"] == pytest.approx(50.0)  # rank ceil(0.5 * 10) = 5
    assert got["ttft_p90"] == pytest.approx(90.0)
    assert got["tpot_p50"] == pytest.approx(8.0)  # ranks over the 3 values: ceil(1.5) = 2
    assert got["tpot_p90"] == pytest.approx(9.0)
    assert math.isnan(fid.figures([], [])["ttft_p50"])


def test_paired_gap_is_per_request_live_minus_sim() -> None:
    live = [0.055, 0.060, math.nan, 0.070]
    sim = [0.050, 0.050, 0.050, 0.050]
    gap = fid.paired_gap(live, sim)
    assert gap["n"] == 3
    assert gap["median_ms"] == pytest.approx(10.0)
    assert gap["mean_ms"] == pytest.approx(35 / 3)
    assert gap["p10_ms"] == pytest.approx(5.0)
    assert gap["p90_ms"] == pytest.approx(20.0)
    assert fid.paired_gap([math.nan], [0.1]) == {"n": 0}


def test_table_text_has_both_columns_the_ratio_and_the_verdict() -> None:
    rows = fid.compare({"ttft_p50": 55.0, "tpot_p90": 9.0}, {"ttft_p50": 50.0, "tpot_p90": 7.0})
    text = fid.format_table(rows)
    lines = text.splitlines()
    assert lines[0].split()[:7] == ["figure", "live", "ms", "sim", "ms", "live/sim", "within"]
    assert lines[1].split() == ["TTFT", "p50", "55.00", "50.00", "1.100", "PASS"]
    assert lines[2].split() == ["TPOT", "p90", "9.00", "7.00", "1.286", "FAIL"]
