"""`tandem dashboard render`: every panel's queries over a time range from a Prometheus, drawn with
matplotlib into one PNG laid out like the dashboard (for docs/observability.md, where Grafana is not
at hand). `tandem dashboard json` rewrites the chart's dashboard JSON from `panels`.

Queries go through `tandem.metrics.prometheus.PrometheusReader.run_range` (metrics/ is the only code
that talks to Prometheus). A panel whose queries return nothing is drawn empty, titled "no data",
and listed on stderr; the exit status is 1 when any query failed or returned nothing.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from tandem.dashboard.model import Dashboard, Panel, substitute
from tandem.dashboard.panels import dashboard
from tandem.dashboard.panels import main as write_json
from tandem.metrics.prometheus import PrometheusReader


class RangeReader(Protocol):
    """What the renderer needs of a Prometheus reader (`PrometheusReader.run_range`)."""

    def run_range(
        self, queries: dict[str, str], start: float, end: float, step: float
    ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]: ...


_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_SCALE = {"s": (1000.0, "ms"), "percent": (1.0, "%"), "reqps": (1.0, "req/s"), "short": (1.0, "")}


def legend(template: str, labels: dict[str, str]) -> str:
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), template).strip() or "value"


def panel_series(
    reader: RangeReader, panel: Panel, values: dict[str, str], start: float, end: float, step: float
) -> tuple[list[tuple[str, list[float], list[float]]], list[str]]:
    """(legend, times, values) per series of the panel's targets, and what went wrong."""
    queries = {t.ref_id: substitute(t.expr, values) for t in panel.targets}
    results, errors = reader.run_range(queries, start, end, step)
    problems = [f"{panel.title} [{ref}]: {why}" for ref, why in errors.items()]
    series: list[tuple[str, list[float], list[float]]] = []
    for target in panel.targets:
        found = results.get(target.ref_id)
        if found is None:
            continue
        if not found:
            problems.append(f"{panel.title} [{target.ref_id}]: no data")
        for item in found:
            points = [(float(t), float(v)) for t, v in item.get("values", []) if math.isfinite(float(v))]
            if points:
                xs, ys = zip(*points, strict=True)
                series.append((legend(target.legend_format, item.get("metric", {})), list(xs), list(ys)))
    return series, problems


def render(
    reader: RangeReader,
    values: dict[str, str],
    start: float,
    end: float,
    out: Path,
    *,
    title: str,
    dpi: int = 80,
    only: Sequence[str] = (),
) -> list[str]:
    """Draws the panels (those titled in `only`, when given) into `out`; returns what went wrong."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = Dashboard.model_validate(dashboard())
    panels = [p for p in model.query_panels() if not only or p.title in only]
    step = max(2.0, (end - start) / 240)
    columns = 3
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.2 * columns, 3.4 * rows), squeeze=False)
    problems: list[str] = []
    for index, panel in enumerate(panels):
        ax: Any = axes[index // columns][index % columns]
        series, found = panel_series(reader, panel, values, start, end, step)
        problems += found
        factor, unit = _SCALE.get(panel.field_config.defaults.unit, (1.0, panel.field_config.defaults.unit))
        for name, xs, ys in sorted(series, key=lambda s: s[0])[:12]:
            ax.plot([(x - start) / 60 for x in xs], [y * factor for y in ys], label=name, linewidth=1.2)
        ax.set_xlim(0, (end - start) / 60)
        ax.set_title(panel.title + ("" if series else " (no data)"), fontsize=10)
        ax.set_xlabel("minutes", fontsize=8)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=6, loc="upper left", ncol=2)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].axis("off")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return problems


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tandem dashboard", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("json", help="rewrite charts/tandem/dashboards/tandem.json")
    r = sub.add_parser("render", help="draw every panel's queries from a Prometheus into a PNG")
    r.add_argument("--prometheus", required=True, help="Prometheus base URL")
    r.add_argument("--namespace", default=".*", help="the dashboard's $namespace (a regex)")
    r.add_argument("--pddeployment", default=".*", help="the dashboard's $pddeployment (a regex)")
    r.add_argument("--minutes", type=float, default=15.0, help="range, ending now (or at --end)")
    r.add_argument("--end", type=float, help="Unix time the range ends (default: now)")
    r.add_argument("--rate-interval", default="1m", help="$__rate_interval")
    r.add_argument("--out", type=Path, default=Path("docs/img/dashboard.png"))
    r.add_argument("--title", default="tandem dashboard, local cluster")
    r.add_argument("--panel", action="append", default=[], help="draw only this panel (repeatable)")
    args = parser.parse_args(list(argv))
    if args.action == "json":
        return write_json()
    end = args.end if args.end is not None else time.time()
    values = {
        "namespace": args.namespace,
        "pddeployment": args.pddeployment,
        "__rate_interval": args.rate_interval,
    }
    reader = PrometheusReader(args.prometheus, timeout=30)
    try:
        start = end - args.minutes * 60
        problems = render(reader, values, start, end, args.out, title=args.title, only=args.panel)
    finally:
        reader.close()
    print(f"wrote {args.out}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0
