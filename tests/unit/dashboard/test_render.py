"""`tandem dashboard render` with a scripted reader: every panel drawn, empty queries reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem.dashboard.model import Dashboard
from tandem.dashboard.panels import dashboard
from tandem.dashboard.render import legend, panel_series, render


class ScriptedReader:
    """Answers every range query with one series, except queries naming `empty_for`."""

    def __init__(self, empty_for: str) -> None:
        self.empty_for = empty_for
        self.seen: list[str] = []

    def run_range(
        self, queries: dict[str, str], start: float, end: float, step: float
    ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
        self.seen += queries.values()
        points = [[start + i * step, str(0.1 * i)] for i in range(5)] + [[end, "NaN"]]
        series = {"metric": {"path": "colocated", "input_length": "0-1024"}, "values": points}
        return {name: [] if self.empty_for in q else [series] for name, q in queries.items()}, {}


VALUES = {"namespace": "ns", "pddeployment": "a|b", "__rate_interval": "1m"}


def test_every_panel_is_queried_and_empty_ones_are_named() -> None:
    reader = ScriptedReader(empty_for="tandem_router_refusals_total")
    panels = Dashboard.model_validate(dashboard()).query_panels()
    problems, drawn = [], 0
    for panel in panels:
        series, found = panel_series(reader, panel, VALUES, 1000.0, 1900.0, 5.0)
        problems += found
        drawn += len(series)
        assert all(len(xs) == 5 for _, xs, _ in series)  # the NaN point is left out
    targets = sum(len(p.targets) for p in panels)
    assert len(reader.seen) == targets
    assert drawn == targets - 1
    assert all("$" not in q for q in reader.seen)
    assert all('pddeployment=~"a|b"' in q for q in reader.seen if "tandem_router_" in q)
    assert problems == ["Refusals by reason [A]: no data"]


def test_render_writes_a_png_and_reports_empty_panels(tmp_path: Path) -> None:
    out = tmp_path / "dash.png"
    reader = ScriptedReader(empty_for="tandem_router_refusals_total")
    only = ("Refusals by reason", "Pool sizes")
    problems = render(reader, VALUES, 1000.0, 1900.0, out, title="t", dpi=20, only=only)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert problems == ["Refusals by reason [A]: no data"]


def test_legend_fills_labels() -> None:
    assert legend("p95 {{input_length}} {{ path }}", {"input_length": "0-1024", "path": "colocated"}) == (
        "p95 0-1024 colocated"
    )
    assert legend("", {}) == "value"
