"""The load-time cliff (issue 25, item 5): on one day-long curve, each policy's GPU-hours and attainment
as the model load time and the decision interval change.

The curve is `bench/autoscale.py`'s realistic-scale day (`servegen-70b-day`: ServeGen m-mid day 1 at its real
pace, Llama-3.1-70B on H100 at TP4, rate `SCALE_RATE`: static peak 5P+2D, 28 GPUs, at x0.045) unless `--trace`
names another of its cases. Per decision interval (tandem's `intervalSeconds`, the HPA's sync period and the
oracle's interval, `Case.interval_seconds`; the Dynamo-style planners keep their own, so they run once per
load time) and model load time, every policy runs from the same initial layout (static peak's, searched once:
a static layout does not depend on either); the hindsight oracle's search is run once per interval (it does
not depend on the load time: in the search a replica is ready when its interval starts) and its schedule
replayed at each load time (each replica ordered one load time ahead), with its instant replay beside. Prints
one table (attainment, GPU-hours, and GPU-hours as a ratio to static peak and to the oracle at the same load
and interval), writes it with a JSON of every run under `--out`, and one plot (GPU-hours and attainment
against the load time, a line per policy and interval); `--docs` copies the plot to `docs/img/load-cliff.png`.

    .venv/bin/python bench/load_cliff.py                      # 4 load times x 3 intervals, the whole day
    .venv/bin/python bench/load_cliff.py --intervals 30 --loads 10,120,300 --policies tandem,hpa
    .venv/bin/python bench/load_cliff.py --quick              # one hour of the day, 2 x 1 grid (tests)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "bench"))

from tandem.devcluster.testing import load_file  # noqa: E402
from tandem.sim import simulate  # noqa: E402
from tandem.sim.oracle import SchedulePolicy, hindsight_schedule, replay_layout, schedule_sizes  # noqa: E402
from tandem.sim.report import ORACLE, ORACLE_INSTANT, STATIC_PEAK  # noqa: E402
from tandem.sim.results import Summary  # noqa: E402

# bench/autoscale.py by path under a name of its own: `import autoscale` would take whatever module of
# that name is already imported (a test package under pytest).
bench = load_file("tandem_bench_autoscale", ROOT / "bench" / "autoscale.py")

LOADS = (10.0, 30.0, 120.0, 300.0)
INTERVALS = (15, 30, 60)
POLICIES = (bench.TANDEM, bench.HPA, bench.DYNAMO_BOTH, ORACLE)
QUICK_LOADS = (10.0, 300.0)
QUICK_INTERVALS = (30,)
OUT = ROOT / ".tandem" / "bench" / "load_cliff"
DOCS_PLOT = ROOT / "docs" / "img" / "load-cliff.png"


@dataclass
class Point:
    """One run: a policy at one decision interval and model load time."""

    policy: str
    interval: int
    load: float
    summary: Summary | None
    note: str = ""
    wall_seconds: float = 0.0


def _job(
    case: bench.Case,
    policy: str,
    initial: dict[str, int],
    loads: Sequence[float] = (),
    schedule: Sequence[tuple[int, int]] | None = None,
) -> list[Point]:
    """One policy at the case's interval and load time; for the oracle, its search at the case's
    interval (or `schedule`, a search already run at that interval) replayed at each of `loads` and
    with no load time."""
    started = time.perf_counter()
    interval = OWN_INTERVAL if policy in OWN_INTERVAL_POLICIES else case.interval_seconds or 0
    if policy != ORACLE:
        outcome = bench.run_job(case, policy, initial)
        return [
            Point(policy, interval, case.load_seconds, outcome.summary, outcome.note, outcome.wall_seconds)
        ]
    setup = bench.setup_of(case, initial)
    requests = bench.requests_of(case)
    grid = bench.oracle_grid(case)
    if schedule is None:
        found = hindsight_schedule(requests, setup.layout_pd, setup.config, grid)
        sizes = schedule_sizes(found)
        note = f"{found.simulations} interval sims, {found.infeasible} intervals beyond the grid"
    else:
        sizes = [{"prefill": p, "decode": d} for p, d in schedule]
        note = f"schedule of {len(sizes)} intervals given (--schedule)"

    def replay(load: float) -> Summary:
        policy = SchedulePolicy(sizes, grid.interval_seconds, load)
        return simulate(requests, replay_layout(setup.layout_pd, policy), setup.config, policy).summary

    points = [Point(ORACLE_INSTANT, interval, 0.0, replay(0.0), note, time.perf_counter() - started)]
    for load in loads:
        points.append(Point(ORACLE, interval, load, replay(load), note, time.perf_counter() - started))
    return points


# Policies that keep their own decision interval (the Dynamo-style planners: 180 s, and 5 s for the load
# loop), run once per load time rather than once per swept interval; their points carry OWN_INTERVAL.
OWN_INTERVAL_POLICIES = (bench.DYNAMO_180, "dynamo-180s-trend", bench.DYNAMO_LOAD, bench.DYNAMO_BOTH)
OWN_INTERVAL = 0


def work_list(
    case: bench.Case,
    policies: Sequence[str],
    loads: Sequence[float],
    intervals: Sequence[int],
    initial: dict[str, int],
    schedule: Sequence[tuple[int, int]] | None = None,
) -> list[tuple[Any, ...]]:
    """`_job`'s arguments for every run, the oracle's searches first: each takes far longer than any other
    run (30 minutes of a core for the 70B day), so a pool that starts them last waits on them alone."""
    searches: list[tuple[Any, ...]] = []
    runs: list[tuple[Any, ...]] = []
    for policy in policies:
        if policy in OWN_INTERVAL_POLICIES:
            runs += [(replace(case, load_seconds=load), policy, initial) for load in loads]
            continue
        for interval in intervals:
            if policy == ORACLE:
                given = schedule if interval == bench.ORACLE_INTERVAL else None
                searched = replace(case, interval_seconds=interval)
                searches.append((searched, policy, initial, list(loads), given))
                continue
            for load in loads:
                runs.append((replace(case, interval_seconds=interval, load_seconds=load), policy, initial))
    return searches + runs


def run(
    case: bench.Case,
    policies: Sequence[str],
    loads: Sequence[float],
    intervals: Sequence[int],
    initial: dict[str, int],
    jobs: int,
    schedule: Sequence[tuple[int, int]] | None = None,
) -> list[Point]:
    """Every (interval, policy, load) run, `jobs` at a time; `schedule` is the oracle's at 60-s intervals
    when given (its search is then not repeated there)."""
    work = work_list(case, policies, loads, intervals, initial, schedule)
    points: list[Point] = []
    if jobs <= 1:
        for w in work:
            points += _progress(_job(*w))
        return points
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_job, *w) for w in work]
        for future in futures:
            points += _progress(future.result())
    return points


def _progress(points: list[Point]) -> list[Point]:
    for p in points:
        s = p.summary
        figures = "no result" if s is None else f"{s.attainment:.1%}, {s.gpu_hours:.1f} GPU-h"
        print(
            f"  {p.policy:<18} interval {_interval_text(p.interval):>3} s, load {p.load:>5g} s: {figures} "
            f"({p.wall_seconds:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return points


def _interval_text(interval: int) -> str:
    return "own" if interval == OWN_INTERVAL else str(interval)


def table(points: Sequence[Point], peak: Summary) -> str:
    """The sweep as a markdown table; a planner with its own interval is compared with the oracle at the
    bench's oracle interval (60 s)."""
    oracle = {(p.interval, p.load): p.summary for p in points if p.policy == ORACLE and p.summary}
    lines = [
        "| policy | interval s | model load s | attainment | GPU-hours | vs static peak | vs oracle | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
        f"| static peak | - | any | {peak.attainment:.1%} | {peak.gpu_hours:.1f} | 1.00 | - | |",
    ]
    for p in sorted(points, key=lambda p: (p.policy, p.interval, p.load)):
        s = p.summary
        interval = _interval_text(p.interval)
        if s is None:
            lines.append(f"| {p.policy} | {interval} | {p.load:g} | - | - | - | - | {p.note} |")
            continue
        o = oracle.get((bench.ORACLE_INTERVAL if p.interval == OWN_INTERVAL else p.interval, p.load))
        vs_oracle = (
            f"{s.gpu_hours / o.gpu_hours:.2f}" if o is not None and p.policy != ORACLE_INSTANT else "-"
        )
        lines.append(
            f"| {p.policy} | {interval} | {p.load:g} | {s.attainment:.1%} | {s.gpu_hours:.1f} | "
            f"{s.gpu_hours / peak.gpu_hours:.2f} | {vs_oracle} | {p.note} |"
        )
    return "\n".join(lines)


def plot(path: Path, title: str, points: Sequence[Point], peak: Summary) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (hours, share) = plt.subplots(1, 2, figsize=(13, 5))
    series: dict[tuple[str, int], list[Point]] = {}
    for p in points:
        if p.summary is not None and p.policy != ORACLE_INSTANT:
            series.setdefault((p.policy, p.interval), []).append(p)
    for (policy, interval), pts in sorted(series.items()):
        pts.sort(key=lambda p: p.load)
        xs = [p.load for p in pts]
        label = f"{policy}, own interval" if interval == OWN_INTERVAL else f"{policy}, {interval} s"
        hours.plot(
            xs, [p.summary.gpu_hours / peak.gpu_hours for p in pts if p.summary], marker="o", label=label
        )
        share.plot(xs, [p.summary.attainment * 100 for p in pts if p.summary], marker="o", label=label)
    for p in points:
        if p.policy == ORACLE_INSTANT and p.summary is not None:
            hours.axhline(p.summary.gpu_hours / peak.gpu_hours, color="gray", lw=0.8, ls=":")
    hours.axhline(1.0, color="black", lw=1, ls="--", label="static peak")
    share.axhline(bench.ATTAINMENT * 100, color="black", lw=1, ls="--", label="target")
    for ax in (hours, share):
        ax.set_xscale("log")
        ax.set_xlabel("model load time (s)")
        ax.set_xticks(sorted({p.load for p in points if p.load > 0}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.grid(alpha=0.3)
    hours.set_ylabel("GPU-hours / static peak's (dotted: oracle-instant)")
    share.set_ylabel("attainment (%)")
    share.legend(fontsize=7, loc="lower left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _given_initial(
    parser: argparse.ArgumentParser, text: str | None, case: bench.Case
) -> dict[str, int] | None:
    if text is None:
        return None
    if text == "guess":
        return dict(bench.guess_size(case))
    p_text, _, d_text = text.partition(":")
    try:
        return {"prefill": int(p_text), "decode": int(d_text)}
    except ValueError:
        parser.error("--initial is P:D (e.g. 6:3) or guess")


def _row(parser: argparse.ArgumentParser, path: str, policy: str, trace: str) -> dict[str, Any]:
    """`policy`'s row for `trace` in a bench/autoscale.py results.json."""
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    for row in rows:
        if row.get("policy") == policy and row.get("trace") == trace and row.get("summary"):
            return dict(row)
    parser.error(f"{path}: no {policy} row for {trace}")


def _static_run(case: bench.Case, layout: dict[str, int]) -> Summary:
    setup = bench.setup_of(case, layout)
    return simulate(bench.requests_of(case), setup.layout_pd, setup.config).summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one hour of the scale day, loads 10 and 300 s")
    parser.add_argument("--trace", default=bench.SCALE_CASES[0].name, help="a bench case (default: the day)")
    parser.add_argument("--loads", default=None, help="model load times, s (default 10,30,120,300)")
    parser.add_argument("--intervals", default=None, help="decision intervals, s (default 15,30,60)")
    parser.add_argument("--policies", default=None, help=f"default {','.join(POLICIES)}")
    parser.add_argument(
        "--initial",
        default=None,
        metavar="P:D|guess",
        help="every policy's initial layout: P:D, or guess (the planner's arithmetic on the busiest minute, "
        "bench/autoscale.py's start without static peak); default: static peak's",
    )
    parser.add_argument(
        "--peak",
        default=None,
        metavar="RESULTS.json",
        help="static peak from a bench/autoscale.py results.json of the same trace instead of its search",
    )
    parser.add_argument(
        "--schedule",
        default=None,
        metavar="RESULTS.json",
        help="the oracle's 60-s schedule from a bench/autoscale.py results.json of the same trace (its "
        "search is not repeated at the 60-s interval)",
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--docs", action="store_true", help=f"copy the plot to {DOCS_PLOT.relative_to(ROOT)}")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    started = time.perf_counter()
    known = {c.name: c for c in (*bench.CASES, *bench.EXTRA_CASES, *bench.SCALE_CASES, bench.SCALE_QUICK)}
    case = bench.SCALE_QUICK if args.quick else known.get(args.trace)
    if case is None:
        parser.error(f"unknown trace {args.trace!r}; known: {', '.join(known)}")
    try:
        loads = [
            float(x)
            for x in (args.loads or ",".join(map(str, QUICK_LOADS if args.quick else LOADS))).split(",")
        ]
        intervals = [
            int(x)
            for x in (
                args.intervals or ",".join(map(str, QUICK_INTERVALS if args.quick else INTERVALS))
            ).split(",")
        ]
    except ValueError:
        parser.error("--loads and --intervals are comma-separated numbers")
    if any(x < 0 for x in loads) or any(x < 1 for x in intervals):
        parser.error("load times >= 0 s, intervals >= 1 s")
    policies = [p for p in (args.policies or ",".join(POLICIES)).split(",") if p]
    unknown = [p for p in policies if p not in (*bench.DYNAMIC, ORACLE)]
    if unknown:
        parser.error(f"unknown policy {unknown}; known: {', '.join((*bench.DYNAMIC, ORACLE))}")
    n = len(bench.requests_of(case))
    held = "tuned on" if case.tuned else "NOT tuned on (held out)"
    print(
        f"seed {bench.SEED}; {case.name}: {case.title}; {n:,} requests; SLO TTFT {case.ttft_ms} ms / TPOT "
        f"{case.tpot_ms} ms; budget {case.max_gpus} GPUs; policies {held}"
    )
    print(
        f"  model load times {', '.join(f'{x:g}' for x in loads)} s; "
        f"decision intervals {', '.join(map(str, intervals))} s"
    )
    given = _given_initial(parser, args.initial, case)
    if args.peak:
        row = _row(parser, args.peak, STATIC_PEAK, case.name)
        peak_summary = Summary.model_validate(row["summary"])
        peak_note = f"{row['note']} (from {args.peak})"
        initial = given or row["layout"]
    elif given is not None:
        peak_summary = _static_run(case, given)
        peak_note = f"{given['prefill']}P+{given['decode']}D (given)"
        initial = given
    else:
        peak = bench.run_job(case, STATIC_PEAK, None)
        if peak.summary is None or "layout" not in peak.extra:
            print(f"error: no static peak: {peak.note}", file=sys.stderr)
            return 1
        initial, peak_summary, peak_note = peak.extra["layout"], peak.summary, peak.note
    schedule = None
    if args.schedule:
        schedule = [
            (int(x[0]), int(x[1])) for x in _row(parser, args.schedule, ORACLE, case.name)["schedule"]
        ]
    print(f"  every policy starts from {initial['prefill']}P+{initial['decode']}D", flush=True)
    print(
        f"  static peak {peak_note}: {peak_summary.attainment:.1%}, {peak_summary.gpu_hours:.1f} GPU-h, "
        f"{peak_summary.peak_gpus} GPUs",
        flush=True,
    )
    points = run(case, policies, loads, intervals, initial, args.jobs, schedule)
    text = table(points, peak_summary)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text + "\n", encoding="utf-8")
    record: list[dict[str, Any]] = [
        {"policy": "static peak", "note": peak_note, "summary": peak_summary.model_dump()},
        *(
            {
                "policy": p.policy,
                "interval_seconds": p.interval,
                "load_seconds": p.load,
                "summary": p.summary.model_dump() if p.summary else None,
                "note": p.note,
                "wall_seconds": p.wall_seconds,
            }
            for p in points
        ),
    ]
    (out / "results.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    title = f"{case.title}: rate x{case.rate_scale:g}, {n:,} requests; static peak {peak_note}"
    path = plot(out / "load-cliff.png", title, points, peak_summary)
    if args.docs:
        DOCS_PLOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOCS_PLOT)
    print(f"table, results and plot: {out}")
    print(f"whole sweep: {time.perf_counter() - started:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
