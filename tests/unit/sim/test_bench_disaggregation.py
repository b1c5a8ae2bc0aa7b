"""The simulated disaggregation bench's plumbing (`bench/disaggregation_sim.py --quick`, one trace): every
arm on Always's static peak, the ratios against Always, the best threshold and the verdicts. The whole
bench is not part of `make test`; this run is, so the bench cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.devcluster.testing import load_file

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(180)
def test_quick_short_prompt_run_prints_every_arm_and_the_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_file("bench_disaggregation_sim", ROOT / "bench" / "disaggregation_sim.py")
    assert bench.main(["--quick", "--traces", "short"]) == 0
    out = capsys.readouterr().out
    assert out.count("### ") == 1
    assert "### short:" in out
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 9 and cells[1].endswith("%"):
            rows[cells[0]] = cells
    assert list(rows) == [
        "Always",
        "Auto",
        *(f"Threshold {t}" for t in bench.THRESHOLDS),
        "Always, bidirectional",
        "Auto, bidirectional",
    ]
    # the short-prompt mix has no prefix: the bidirectional mode has nothing to read back
    assert "Always, bidirectional 0, Auto, bidirectional 0" in out
    assert rows["Always, bidirectional"][1:5] == rows["Always"][1:5]
    assert rows["Always"][5] == "0%"  # Always never prefills on the decode pod
    assert rows["Always"][7].startswith("1.00x /")
    assert rows["Always"][8].startswith("1.00x /")
    # short prompts: a threshold above every prompt sends all of them to the decode pod
    assert rows[f"Threshold {bench.THRESHOLDS[-1]}"][5] == "100%"
    best = out.split("best threshold: ")[1].split("\n")[0]
    assert rows[best][7].endswith("/ 1.00x")
    verdicts = [line for line in out.splitlines() if line.startswith("short: ")]
    assert len(verdicts) == 3
    assert all(": PASS " in v or ": MISS " in v for v in verdicts)
    assert "Auto's choices by reason: " in out


def test_each_table_says_whether_it_replayed_the_whole_trace() -> None:
    bench = load_file("bench_disaggregation_sim_window", ROOT / "bench" / "disaggregation_sim.py")
    full = [bench.Request(30.0 * i, 100, 10) for i in range(21)]  # 10 minutes
    kept, what = bench.replayed(full, 1800.0)
    assert kept == full
    assert what == "the whole trace, 21 requests over 10.0 min"
    kept, what = bench.replayed(full, 300.0)
    assert len(kept) == 10
    assert what == "its first 5 min of 10.0, 10 of 21 requests"
