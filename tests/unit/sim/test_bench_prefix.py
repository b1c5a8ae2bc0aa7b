"""The prefix-routing bench's quick run (`bench/prefix_routing.py --quick`): two-minute windows of the
Mooncake trace, multi-turn sessions and the hot prefix, every routing policy. The whole bench is not part
of `make test`; this run is, so the bench cannot rot."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

from tandem.devcluster.testing import load_file

ROOT = Path(__file__).resolve().parents[3]


def _bench() -> ModuleType:
    return load_file("bench_prefix_routing", ROOT / "bench" / "prefix_routing.py")


@pytest.mark.timeout(120)
def test_quick_bench_prints_a_table_per_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    tables = out.split("### ")[1:]
    assert [t.split(":")[0] for t in tables] == [
        "Mooncake conversation",
        "Multi-turn sessions (Azure conversation x4)",
        "Hot prefix (sessions x6, one system prompt on 50% of sessions)",
    ]
    for table in tables:
        rows = {}
        for line in table.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 10 and cells[1].endswith("%"):
                rows[cells[0]] = cells
        assert list(rows) == ["prefix-aware", "load-only", "round-robin", "oracle", "oracle, bounded"]
        assert rows["load-only"][2] == "+0.0 pts"
        assert rows["load-only"][5] == "1.00x / 1.00x"
        for cells in rows.values():
            assert 0.0 <= float(cells[1].rstrip("%")) <= 100.0
            assert float(cells[6]) > 0  # prefill busy GPU-hours
    # multi-turn sessions resend their conversation: the prefix-aware pod choice finds more of it cached
    sessions = tables[1]
    hits = dict(re.findall(r"^\| ([a-z, -]+) \| ([0-9.]+)%", sessions, re.MULTILINE))
    assert float(hits["prefix-aware"]) > float(hits["load-only"]) + 3
    verdicts = [line for line in out.splitlines() if ": PASS " in line or ": MISS " in line]
    assert len(verdicts) == 4  # the hit-rate target per scenario, the hot prefix's TTFT p90
    assert "whole bench:" in out
