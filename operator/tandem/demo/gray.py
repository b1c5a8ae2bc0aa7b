"""The rollout scenario's pure parts: its manifest, which path a request took, the panel and the report.

`make demo SCENARIO=rollout` (`python -m tandem.demo --scenario rollout`, run by `demo.rollout`)
applies `examples/sim-gray-rollout.yaml` with compressed settings (`rollout_manifest`), serving
colocated, switches `serving.mode` to Disaggregated and watches the gray rollout promote P/D step by
step, then slows the decode engines down and watches the steady P/D deployment fall back to colocated
by itself (weight first, then P/D scaled down).

Per-path latency at the client: the router picks a request's path from `draw_for(X-Request-Id)`
against the P/D share it holds (`status.rollout`, `status.mode`; the pool that has no ready pod
yields to the other). The demo sends its own request ids, so it knows each request's draw; it knows
the share only as it polled it, so a request whose draw lies between the shares seen around its
sending (`ATTRIBUTION_SLACK_S`) is counted as `unattributed` rather than guessed. The router's own
per-path request counters are shown beside the client's attribution as a check.
"""

from __future__ import annotations

import copy
import math
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.demo.manifest import set_sim_pacing
from tandem.demo.stats import Sample, Tally
from tandem.demo.view import Snapshot, pools_lines
from tandem.rollout.arms import pd_share
from tandem.routing.paths import draw_for

PATHS = ("colocated", "disaggregated", "unattributed")
TIME_SCALE = 1
LOAD_SECONDS = 5
SLO: dict[str, int] = {"ttftMs": 1000, "tpotMs": 50, "attainmentPercent": 90}
POOLS: dict[str, int] = {"colocated": 1, "prefill": 1, "decode": 1}
STEPS: list[dict[str, int]] = [
    {"weight": 20, "pauseSeconds": 10},
    {"weight": 50, "pauseSeconds": 10},
    {"weight": 100, "pauseSeconds": 0},
]
ANALYSIS: dict[str, Any] = {
    "windowSeconds": 10,
    "minSamples": 4,
    # A window of a few requests moves in steps of 20-25%: one slow request of five must not fail a
    # step, two must (a slowed decode misses every request).
    "attainmentFloor": 0.8,
    "maxAttainmentDrop": 0.25,
    "inconclusivePauseSeconds": 300,
}
SCALE_DOWN_DELAY_S = 5
SLOWDOWN = 10.0  # the fault: every decode step takes this many times longer
# The demo polls status every second and a router follows it within a second or two: a request sent
# within this many seconds of a change of the P/D share may have met either share.
ATTRIBUTION_SLACK_S = 3.0

_REQUESTS = re.compile(r"^tandem_router_requests_total\{([^}]*)\} ([0-9.e+-]+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def rollout_manifest(example: dict[str, Any], mode: str = "Colocated") -> dict[str, Any]:
    """`example` (examples/sim-gray-rollout.yaml, parsed) with the demo's settings and `serving.mode`."""
    doc = copy.deepcopy(example)
    spec = doc["spec"]
    set_sim_pacing(spec, TIME_SCALE, LOAD_SECONDS)
    for role, replicas in POOLS.items():
        spec[role]["replicas"] = replicas
    spec["slo"] = dict(SLO)
    spec["serving"] = {**spec.get("serving", {}), "mode": mode}
    rollout = spec.setdefault("rollout", {})
    rollout["steps"] = copy.deepcopy(STEPS)
    rollout["analysis"] = {**rollout.get("analysis", {}), **copy.deepcopy(ANALYSIS)}
    rollout["autoRollback"] = True
    rollout["scaleDownDelaySeconds"] = SCALE_DOWN_DELAY_S
    return doc


def describe() -> str:
    """One line for the panel and the log: what the demo changed in the example."""
    steps = " -> ".join(
        f"{s['weight']}%" + (f" ({s['pauseSeconds']}s)" if s.get("pauseSeconds") else "") for s in STEPS
    )
    return (
        f"steps {steps}; {ANALYSIS['windowSeconds']}s analysis windows of at least"
        f" {ANALYSIS['minSamples']} requests on P/D, at least {ANALYSIS['attainmentFloor']:.0%}"
        f" within the SLO and at most {ANALYSIS['maxAttainmentDrop']:.0%} below colocated;"
        f" scale-down delay {SCALE_DOWN_DELAY_S}s;"
        f" SLO TTFT {SLO['ttftMs']} ms, TPOT {SLO['tpotMs']} ms, {SLO['attainmentPercent']}% within both;"
        f" pools colocated {POOLS['colocated']}, prefill {POOLS['prefill']}, decode {POOLS['decode']};"
        f" sim at the H100 profile (x{TIME_SCALE}) with a {LOAD_SECONDS}s model load"
    )


# --- which path a request took ----------------------------------------------------------------------


def _ready(pdd: dict[str, Any], role: str) -> int:
    pool = ((pdd.get("status") or {}).get("pools") or {}).get(role) or {}
    return int(pool.get("readyReplicas", 0) or 0)


def routed_pd_share(pdd: dict[str, Any]) -> int | None:
    """Percent of requests the routers send to P/D now, as status says (None before any status):
    the rollout's weight toward its target, else the mode in effect; a path with no ready pod
    yields to the other, as the router does (`routing.paths.choose_path`)."""
    status = pdd.get("status") or {}
    rollout = status.get("rollout") or {}
    if rollout:
        share = pd_share(str(rollout.get("target", "Disaggregated")), int(rollout.get("weight", 0)))
    elif status.get("mode"):
        share = 0 if status["mode"] == "Colocated" else 100
    else:
        return None
    pd_ready = _ready(pdd, "prefill") > 0 and _ready(pdd, "decode") > 0
    colocated_ready = _ready(pdd, "colocated") > 0
    if share > 0 and not pd_ready and colocated_ready:
        return 0
    if share < 100 and not colocated_ready and pd_ready:
        return 100
    return share


@dataclass
class ShareTimeline:
    """The P/D share as the demo saw it: (wall-clock time first seen, percent), in time order."""

    points: list[tuple[float, int]] = field(default_factory=list)

    def see(self, at: float, share: int | None) -> bool:
        """Records `share` if it changed; True when it did."""
        if share is None or (self.points and self.points[-1][1] == share):
            return False
        self.points.append((at, share))
        return True

    def around(self, at: float, slack: float) -> list[int]:
        """Every share in effect at some moment of [at - slack, at + slack]."""
        out = [share for t, share in self.points if at - slack <= t <= at + slack]
        before = [share for t, share in self.points if t < at - slack]
        if before:
            out.append(before[-1])
        return out


def path_of(sample: Sample, timeline: ShareTimeline, slack: float = ATTRIBUTION_SLACK_S) -> str:
    """`disaggregated` or `colocated` when every share the router may have held when the request was
    sent gives the same answer for its draw; `unattributed` otherwise (or without a request id)."""
    if not sample.request_id or math.isnan(sample.sent_at):
        return "unattributed"
    shares = timeline.around(sample.sent_at, slack)
    if not shares:
        return "unattributed"
    point = draw_for(sample.request_id) * 100
    if all(point < s for s in shares):
        return "disaggregated"
    if all(point >= s for s in shares):
        return "colocated"
    return "unattributed"


def by_path(samples: Sequence[Sample], timeline: ShareTimeline) -> dict[str, Tally]:
    out = {p: Tally() for p in PATHS}
    for s in samples:
        out[path_of(s, timeline)].add(s)
    return out


def router_requests_by_path(text: str) -> dict[str, float]:
    """Requests each path finished, from a router's Prometheus text (`tandem_router_requests_total`)."""
    out: dict[str, float] = {}
    for labels, value in _REQUESTS.findall(text):
        path = dict(_LABEL.findall(labels)).get("path", "?")
        out[path] = out.get(path, 0.0) + float(value)
    return out


# --- the panel ------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    return f"{seconds * 1000:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 100:.1f}%"


def verdict_line(v: dict[str, Any], started: float) -> str:
    """One verdict: when its window ended (seconds from `started`), the step, the result, the reason."""
    at = float(v.get("windowEnd", math.nan)) - started if started else math.nan
    when = "   ?" if math.isnan(at) else f"{at:+4.0f}s"
    return f"{when} step {v.get('step', '?')} {v.get('result', '?')}: {v.get('reason', '')}"


def verdict_figures(v: dict[str, Any]) -> list[str]:
    """A verdict's figures, one line per arm (the routers' measurements over the window)."""
    f = v.get("figures") or {}
    out = []
    for prefix in ("target", "baseline"):
        if f"{prefix}Requests" not in f:
            continue
        out.append(
            f"{prefix:<8} {f[f'{prefix}Requests']:.0f} req, TTFT {_ms(f.get(f'{prefix}TtftSeconds'))} ms,"
            f" TPOT {_ms(f.get(f'{prefix}TpotSeconds'))} ms, within SLO {_pct(f.get(f'{prefix}Attainment'))}"
        )
    return out


def rollout_lines(pdd: dict[str, Any], now: float, started: float, width: int = 110) -> list[str]:
    """status.mode, status.rollout (phase, step, weight, reason) and its last verdicts."""
    status = pdd.get("status") or {}
    spec = pdd.get("spec") or {}
    mode_line = (
        f"serving: spec.serving.mode {(spec.get('serving') or {}).get('mode', '-')},"
        f" mode in effect (status.mode) {status.get('mode', '-')}"
    )
    rollout = status.get("rollout") or {}
    if not rollout:
        return [mode_line, "rollout: none (the P/D pools hold no pods while colocated serves)"]
    steps = (spec.get("rollout") or {}).get("steps") or []
    share = pd_share(str(rollout.get("target", "")), int(rollout.get("weight", 0)))
    bar = "#" * (share // 5) + "." * (20 - share // 5)
    since = float(rollout.get("phaseSince", 0) or 0)
    phase = str(rollout.get("phase", "?"))
    extra = []
    if rollout.get("pauseCause"):
        extra.append(str(rollout["pauseCause"]))
    if rollout.get("rollbackStage"):
        extra.append(str(rollout["rollbackStage"]))
    out = [
        mode_line,
        f"rollout to {rollout.get('target', '?')}: {phase}"
        + (f" ({', '.join(extra)})" if extra else "")
        + f", step {int(rollout.get('step', 0)) + 1}/{len(steps) or '?'},"
        f" weight {rollout.get('weight', 0)}%, attempt {rollout.get('attempt', 1)}"
        + (f", {max(0.0, now - since):.0f}s in the phase" if since and now else ""),
        f"  P/D share [{bar}] {share}%   colocated {100 - share}%",
    ]
    reason = textwrap.wrap(str(rollout.get("reason", "")), width=width - 10)
    if reason:
        out.append("  reason: " + reason[0])
        out += ["          " + line for line in reason[1:3]]
    verdicts = rollout.get("verdicts") or []
    if verdicts:
        out.append("  verdicts (newest last; seconds from the mode change; figures per arm over the window):")
        for v in verdicts[-3:]:
            wrapped = textwrap.wrap(verdict_line(v, started), width=width - 4)
            out += ["    " + wrapped[0], *["          " + line for line in wrapped[1:2]]]
            out += ["          " + line for line in verdict_figures(v)]
    return out


def path_rows(paths: dict[str, Tally], ttft_slo_ms: float, tpot_slo_ms: float) -> list[str]:
    """Client TTFT/TPOT p90 and SLO attainment per path."""
    rows = [
        f"  {'path':<14} {'requests':>8} {'failed':>6} {'TTFT p90':>9} {'TPOT p90':>9} {'within SLO':>10}"
    ]
    for path, t in paths.items():
        if not t.samples and path == "unattributed":
            continue
        ttft, tpot = t.ttft(90), t.tpot(90)
        marks = ""
        if not math.isnan(ttft):
            marks = "  TTFT " + ("ok" if ttft * 1000 <= ttft_slo_ms else "MISS")
            marks += ", TPOT " + ("ok" if math.isnan(tpot) or tpot * 1000 <= tpot_slo_ms else "MISS")
        rows.append(
            f"  {path:<14} {len(t.samples):>8} {len(t.failed):>6} {_ms(ttft):>6} ms {_ms(tpot):>6} ms"
            f" {_pct(t.attainment(ttft_slo_ms / 1000, tpot_slo_ms / 1000)):>10}{marks}"
        )
    return rows


@dataclass
class GrayView:
    """What the rollout panel adds to the demo's Snapshot."""

    switched_at: float = 0.0  # wall clock of the `kubectl apply` that changed serving.mode
    fault: str = ""  # the injected fault, in words ("" before)
    fault_at: float = 0.0
    timeline: ShareTimeline = field(default_factory=ShareTimeline)
    router_paths: dict[str, float] = field(default_factory=dict)


def panel(snap: Snapshot, tally: Tally, gv: GrayView) -> str:
    status = snap.pdd.get("status") or {}
    meta = snap.pdd.get("metadata") or {}
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    out = [
        f"tandem demo: gray rollout  {snap.elapsed_s:5.0f}s  -  {snap.stage}"
        + (f"  [{snap.phase}]" if snap.phase else ""),
        "",
        f"PDDeployment {meta.get('namespace', '?')}/{meta.get('name', '?')}:"
        f" phase {status.get('phase', '-')}, Ready={ready.get('status', '-')} ({ready.get('reason', '')})",
        *pools_lines(snap.pdd, snap.router_endpoints),
        *rollout_lines(snap.pdd, snap.now, gv.switched_at),
    ]
    if gv.fault:
        out.append(f"FAULT at {gv.fault_at - gv.switched_at:+.0f}s: {gv.fault}")
    out += [
        "",
        f"requests: sent {tally.sent}  served {len(tally.ok)}  failed {len(tally.failed)}"
        f"  in flight {tally.in_flight}"
        + (
            "  (router counted " + ", ".join(f"{p} {n:.0f}" for p, n in sorted(gv.router_paths.items())) + ")"
            if gv.router_paths
            else ""
        ),
        f"client latency by path (ms), last {snap.recent_seconds:.0f}s, against the SLO"
        f" TTFT {snap.ttft_slo_ms:.0f} ms, TPOT {snap.tpot_slo_ms:.0f} ms at p90:",
    ]
    recent = [
        s for s in tally.samples if not math.isnan(s.sent_at) and snap.now - s.sent_at <= snap.recent_seconds
    ]
    out += path_rows(by_path(recent, gv.timeline), snap.ttft_slo_ms, snap.tpot_slo_ms)
    out += ["", "operator events (newest last):"]
    out += [f"  {e}" for e in list(snap.events)[-6:]] or ["  (none yet)"]
    if snap.notes:
        out += ["", *[f"* {n}" for n in snap.notes[-3:]]]
    return "\n".join(out)


# --- the report -----------------------------------------------------------------------------------


def phase_history(readings: Sequence[tuple[float, dict[str, Any]]]) -> list[dict[str, Any]]:
    """(time, status.rollout) readings -> the distinct (phase, step, weight, target) in order, each with
    the time first seen and the reason then."""
    out: list[dict[str, Any]] = []
    for at, r in readings:
        if not r:
            continue
        key = (r.get("target"), r.get("phase"), int(r.get("step", 0)), int(r.get("weight", 0)))
        if out and (out[-1]["target"], out[-1]["phase"], out[-1]["step"], out[-1]["weight"]) == key:
            continue
        out.append(
            {
                "at": at,
                "target": key[0],
                "phase": key[1],
                "step": key[2],
                "weight": key[3],
                "reason": str(r.get("reason", "")),
            }
        )
    return out


def first_at(history: Sequence[dict[str, Any]], after: float, **match: Any) -> float | None:
    """Time of the first history entry at or after `after` whose fields equal `match`."""
    for h in history:
        if h["at"] >= after and all(h.get(k) == v for k, v in match.items()):
            return float(h["at"])
    return None


def report(summary: dict[str, Any]) -> str:
    """The final report from the summary `demo.rollout` writes to report.json."""
    slo = summary.get("slo_ms") or {}
    lines = [
        "=" * 78,
        "tandem demo report: gray rollout colocated -> P/D, then an automatic rollback",
        f"  settings      {summary.get('settings', '')}",
        f"  requests      {summary.get('requests', 0)} sent, {summary.get('ok', 0)} ok,"
        f" {summary.get('failed', 0)} failed"
        + (f" (e.g. {'; '.join(summary['errors'])})" if summary.get("errors") else ""),
        "  router        requests by path: "
        + (", ".join(f"{p} {n:.0f}" for p, n in sorted((summary.get("router_paths") or {}).items())) or "-"),
    ]
    lines.append("  rollout       (seconds from the kubectl apply that set serving.mode Disaggregated)")
    for h in summary.get("history") or []:
        lines.append(
            f"    {h['rel']:+6.1f}s  {h['phase']:<11} step {h['step']} weight {h['weight']:>3}%"
            f" -> {h['target']}: {textwrap.shorten(h['reason'], 100)}"
        )
    promote = summary.get("promote_s")
    lines.append(
        "  promoted      "
        + ("never" if promote is None else f"100% P/D {promote:.1f}s after the mode change")
        + (
            f", colocated scaled to 0 at {summary['colocated_zero_s']:+.1f}s"
            if summary.get("colocated_zero_s") is not None
            else ""
        )
    )
    fault = summary.get("fault") or {}
    if fault:
        lines.append(f"  fault         {fault.get('what', '')} at {fault.get('rel', 0):+.1f}s")
        cause = fault.get("cause") or ""
        lines.append(f"  cause         {textwrap.shorten(cause, 200) if cause else '-'}")
        if fault.get("verdict"):
            lines += [f"                {line}" for line in verdict_figures(fault["verdict"])]
        pd = fault.get("pd_client") or {}
        if pd.get("requests"):
            lines.append(
                f"  P/D at the client from the fault to weight 0: {pd['requests']} requests,"
                f" TTFT p90 {pd['ttft_ms_p90']} ms (SLO {slo.get('ttft', 0):.0f}),"
                f" TPOT p90 {pd['tpot_ms_p90']} ms (SLO {slo.get('tpot', 0):.0f}),"
                f" within SLO {_pct(pd['within_slo'])}"
            )
        for key, label in (
            ("to_weight_0_s", "weight 0 (status.rollout, the operator's time)"),
            ("to_colocated_ready_s", "colocated ready again (the routers move to it)"),
            ("to_last_pd_request_s", "the last request sent that P/D served"),
            ("to_pd_zero_s", "P/D scaled to 0"),
            ("to_rolled_back_s", "RolledBack"),
        ):
            v = fault.get(key)
            lines.append(f"  fault ->      {label}: " + ("not seen" if v is None else f"{v:.1f}s"))
    lines.append(
        f"  client by path (SLO TTFT {slo.get('ttft', 0):.0f} ms, TPOT {slo.get('tpot', 0):.0f} ms at p90),"
        " per stage:"
    )
    for stage in summary.get("stages") or []:
        for path, fig in stage["paths"].items():
            if not fig["requests"]:
                continue
            lines.append(
                f"    {stage['label']:<22} {path:<14} {fig['requests']:>4} req, {fig['failed']} failed,"
                f" TTFT p90 {fig['ttft_ms_p90'] if fig['ttft_ms_p90'] is not None else '-'} ms,"
                f" TPOT p90 {fig['tpot_ms_p90'] if fig['tpot_ms_p90'] is not None else '-'} ms,"
                f" within SLO {_pct(fig['within_slo'])}"
            )
    durations = summary.get("stage_seconds") or {}
    lines.append("  stages        " + ", ".join(f"{k} {v:.0f}s" for k, v in durations.items()))
    lines.append("=" * 78)
    return "\n".join(lines)


def path_figures(tally: Tally, ttft_slo_ms: float, tpot_slo_ms: float) -> dict[str, Any]:
    def num(x: float) -> float | None:
        return None if math.isnan(x) else round(x * 1000, 1)

    attain = tally.attainment(ttft_slo_ms / 1000, tpot_slo_ms / 1000)
    return {
        "requests": len(tally.samples),
        "failed": len(tally.failed),
        "ttft_ms_p90": num(tally.ttft(90)),
        "tpot_ms_p90": num(tally.tpot(90)),
        "within_slo": None if math.isnan(attain) else round(attain, 3),
    }
