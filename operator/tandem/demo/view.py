"""The live panel and the final report, as plain text (pure: every number comes in a Snapshot)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.api.times import parse_rfc3339
from tandem.demo.stats import Sample, Tally

POOLS = ("prefill", "decode", "colocated", "router")


@dataclass
class Snapshot:
    """What the panel shows at one moment."""

    elapsed_s: float
    stage: str
    pdd: dict[str, Any] = field(default_factory=dict)  # the PDDeployment as read from the API
    events: Sequence[str] = ()  # "age reason: message", newest last
    router_endpoints: dict[str, int] = field(default_factory=dict)
    router_requests: float = math.nan
    replay_total: int = 0
    replay_elapsed_s: float = 0.0
    ttft_slo_ms: float = 500.0
    tpot_slo_ms: float = 50.0
    slo_source: str = ""
    attainment_target: float = math.nan  # percent, spec.slo.attainmentPercent
    notes: Sequence[str] = ()
    now: float = 0.0  # wall clock (epoch seconds) of the snapshot, for ages and the recent window
    recent_seconds: float = 30.0  # the panel's "recent" column: requests sent this long ago or less
    phase: str = ""  # the replay's current segment, e.g. "surge (x0.40)"


def pdd_quantile(pdd: dict[str, Any]) -> str:
    slo = (pdd.get("spec") or {}).get("slo") or {}
    return f"p{float(slo.get('attainmentPercent', 95)):g}"


def _ms(seconds: float) -> str:
    return "   -  " if math.isnan(seconds) else f"{seconds * 1000:6.0f}"


def _mark(seconds: float, slo_ms: float) -> str:
    if math.isnan(seconds):
        return " "
    return "ok" if seconds * 1000 <= slo_ms else "MISS"


def _condition(pdd: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (pdd.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def pools_lines(pdd: dict[str, Any], endpoints: dict[str, int]) -> list[str]:
    pools = (pdd.get("status") or {}).get("pools") or {}
    spec = pdd.get("spec") or {}
    lines = []
    for role in POOLS:
        pool = pools.get(role) or {}
        want = int(pool.get("desiredReplicas", (spec.get(role) or {}).get("replicas", 0)) or 0)
        if want == 0 and not pool.get("replicas"):
            continue
        ready = int(pool.get("readyReplicas", 0) or 0)
        bar = "#" * ready + "." * max(0, want - ready)
        seen = f"   router sees {endpoints[role]}" if role in endpoints else ""
        gpus = f"  {pool.get('gpus', 0)} GPU" if role != "router" else ""
        lines.append(f"  {role:<9} {ready}/{want} ready  [{bar:<8}]{gpus}{seen}")
    return lines


def rfc3339_seconds(text: str) -> float:
    """Epoch seconds of an RFC 3339 time; nan if it does not parse."""
    try:
        return parse_rfc3339(text)
    except ValueError:
        return math.nan


def _age(now: float, rfc3339: str) -> str:
    at = rfc3339_seconds(rfc3339)
    if math.isnan(at):
        return "?"
    return f"{max(0.0, now - at):.0f}s ago" if now else rfc3339


def autoscaler_lines(pdd: dict[str, Any], now: float, width: int = 100) -> list[str]:
    """The autoscaler's mode and condition, and each pool's last decision with its reason."""
    status = pdd.get("status") or {}
    auto = status.get("autoscaling") or {}
    if not auto and not (pdd.get("spec") or {}).get("autoscaling"):
        return []
    spec = (pdd.get("spec") or {}).get("autoscaling") or {}
    cond = _condition(pdd, "AutoscalingActive")
    out = [
        f"autoscaler: {auto.get('mode', '-')}, a decision every {spec.get('intervalSeconds', 30)}s;"
        f" AutoscalingActive={cond.get('status', '-')} ({cond.get('reason', '')}): {cond.get('message', '')}"[
            : width + 20
        ]
    ]
    for role, pool in (auto.get("pools") or {}).items():
        decision = pool.get("lastDecision") or {}
        if not decision:
            continue
        if decision.get("from") == decision.get("to"):  # the first pass records one: no change yet
            out.append(
                f"  {role:<8} no size change yet: holding {pool.get('desiredReplicas', decision.get('to'))}"
            )
            continue
        head = (
            f"  {role:<8} {_age(now, str(decision.get('time', '')))}: "
            f"{decision.get('from', '?')} -> {decision.get('to', '?')}: "
        )
        body = textwrap.wrap(str(decision.get("reason", "")), width=width - len(head)) or [""]
        out.append(head + body[0])
        out += [" " * len(head) + line for line in body[1:3]]
        if draining := pool.get("draining"):
            out.append(f"  {' ' * 8} draining {', '.join(draining.get('pods') or [draining.get('pod', '')])}")
    return out


def slo_status_line(pdd: dict[str, Any], attainment_target: float) -> str:
    """status.slo: what the routers measured over the autoscaler's window."""
    slo = (pdd.get("status") or {}).get("slo") or {}
    if not slo:
        return "  routers (status.slo): -"
    q = pdd_quantile(pdd)

    def val(key: str, unit: str) -> str:
        v = slo.get(key)
        return "-" if v is None else f"{v:.0f}{unit}" if unit == " ms" else f"{v:.1f}{unit}"

    target = "" if math.isnan(attainment_target) else f" (target {attainment_target:g}%)"
    return (
        f"  routers (status.slo, {slo.get('windowSeconds', '?')}s window): TTFT {q} {val('ttftMs', ' ms')}, "
        f"TPOT {q} {val('tpotMs', ' ms')}, within both {val('attainmentPercent', '%')}{target}, "
        f"{slo.get('requestsPerSecond') or 0:.2f} req/s"
    )


def recent(tally: Tally, now: float, seconds: float) -> list[Sample]:
    """Finished requests sent in the last `seconds` (by `sent_at`)."""
    return [s for s in tally.samples if not math.isnan(s.sent_at) and now - s.sent_at <= seconds]


def panel(snap: Snapshot, tally: Tally) -> str:
    status = snap.pdd.get("status") or {}
    meta = snap.pdd.get("metadata") or {}
    ready = _condition(snap.pdd, "Ready")
    out = [
        f"tandem demo  {snap.elapsed_s:5.0f}s  -  {snap.stage}" + (f"  [{snap.phase}]" if snap.phase else ""),
        "",
        f"PDDeployment {meta.get('namespace', '?')}/{meta.get('name', '?')}: "
        f"phase {status.get('phase', '-')}, "
        f"Ready={ready.get('status', '-')} ({ready.get('reason', '')}), "
        f"generation {meta.get('generation', '-')} observed {status.get('observedGeneration', '-')}",
        *pools_lines(snap.pdd, snap.router_endpoints),
        *autoscaler_lines(snap.pdd, snap.now),
        "",
    ]
    done = len(tally.samples)
    out.append(
        f"requests: sent {tally.sent}/{snap.replay_total}  served {len(tally.ok)}  failed {len(tally.failed)}"
        f"  in flight {tally.in_flight}"
        + ("" if math.isnan(snap.router_requests) else f"  (router counted {snap.router_requests:.0f})")
    )
    if done:
        inp, outp = tally.tokens()
        rate = done / snap.replay_elapsed_s if snap.replay_elapsed_s > 0 else 0.0
        out.append(f"          {rate:.2f} req/s finished, {inp} prompt + {outp} generated tokens")
    ttft_slo, tpot_slo = snap.ttft_slo_ms, snap.tpot_slo_ms
    last = Tally(samples=recent(tally, snap.now, snap.recent_seconds))
    window = f"last {snap.recent_seconds:.0f}s"
    out += [
        f"latency (ms)        p50     p90     p99   {window} p90   SLO {snap.slo_source}",
        f"  TTFT           {_ms(tally.ttft(50))}  {_ms(tally.ttft(90))}  {_ms(tally.ttft(99))}"
        f"      {_ms(last.ttft(90))}      {ttft_slo:.0f} at p90: {_mark(last.ttft(90), ttft_slo)}",
        f"  TPOT           {_ms(tally.tpot(50))}  {_ms(tally.tpot(90))}  {_ms(tally.tpot(99))}"
        f"      {_ms(last.tpot(90))}      {tpot_slo:.0f} at p90: {_mark(last.tpot(90), tpot_slo)}",
    ]
    attain = tally.attainment(ttft_slo / 1000, tpot_slo / 1000)
    if not math.isnan(attain):
        recent_attain = last.attainment(ttft_slo / 1000, tpot_slo / 1000)
        recent_text = "" if math.isnan(recent_attain) else f", {window} {recent_attain * 100:.1f}%"
        out.append(f"  within both SLOs, at the client: {attain * 100:.1f}% of all{recent_text}")
    if status.get("slo") or (snap.pdd.get("spec") or {}).get("slo"):
        out.append(slo_status_line(snap.pdd, snap.attainment_target))
    out += ["", "operator events (newest last):"]
    out += [f"  {e}" for e in list(snap.events)[-6:]] or ["  (none yet)"]
    if snap.notes:
        out += ["", *[f"* {n}" for n in snap.notes[-4:]]]
    return "\n".join(out)


def decision_line(d: dict[str, Any]) -> str:
    """One recorded decision: `+12s prefill 1 -> 3 [prefillQueue]: reason` (the bracket: what the
    pool's own SLO miss was charged to, or `load` when the capacity model alone decided)."""
    sizes = f"{d.get('from', '?')} -> {d.get('to', '?')}"
    cause = f" [{d['cause']}]" if d.get("cause") else ""
    return f"{d.get('at', 0):+5.0f}s {d.get('pool', '?'):<8} {sizes}{cause}: {d.get('reason', '')}"


def verdict(last: dict[str, Any] | None, target_percent: float, settled: bool) -> str:
    """The demo's outcome in one line: did the surge end within the SLO (the share of the requests sent
    in its last seconds within both targets, against the attainment target), and did the pools go back
    to their minimum. `last` is a segment's figures (`label`, `requests`, `within_slo`)."""
    back = "pools back at their minimum" if settled else "pools NOT back at their minimum"
    if not last or last.get("within_slo") is None or not last.get("requests"):
        return f"no verdict: no request in the surge's last seconds; {back}"
    within = float(last["within_slo"]) * 100
    held = within >= target_percent
    word = "SLO held" if held else "SLO MISS"
    return (
        f"{word}: {last['label']}: {within:.1f}% of {last['requests']} requests within both targets"
        f" (target {target_percent:g}%); {back}"
    )


def report(
    snap: Snapshot,
    tally: Tally,
    durations: dict[str, float],
    decisions: Sequence[dict[str, Any]] = (),
    segments: Sequence[dict[str, Any]] = (),
    outcome: str = "",
) -> str:
    """The final report; `segments` are the replay's parts with their client figures (label,
    requests, rate_scale, failed, ttft_ms_p90, tpot_ms_p90, within_slo); `outcome` the `verdict`."""
    inp, outp = tally.tokens()
    attain = tally.attainment(snap.ttft_slo_ms / 1000, snap.tpot_slo_ms / 1000)
    errors = sorted({s.error for s in tally.failed})[:3]
    lines = [
        "=" * 72,
        "tandem demo report",
        f"  trace         {snap.replay_total} requests replayed in {snap.replay_elapsed_s:.0f}s",
        f"  served        {len(tally.ok)} ok, {len(tally.failed)} failed"
        + (f" (e.g. {'; '.join(errors)})" if errors else ""),
        f"  tokens        {inp} prompt, {outp} generated",
        f"  TTFT ms       p50 {_ms(tally.ttft(50)).strip()}  p90 {_ms(tally.ttft(90)).strip()}"
        f"  p99 {_ms(tally.ttft(99)).strip()}   (SLO {snap.ttft_slo_ms:.0f} at p90 over the whole replay,"
        f" the surge's first seconds included: {_mark(tally.ttft(90), snap.ttft_slo_ms)})",
        f"  TPOT ms       p50 {_ms(tally.tpot(50)).strip()}  p90 {_ms(tally.tpot(90)).strip()}"
        f"  p99 {_ms(tally.tpot(99)).strip()}   (SLO {snap.tpot_slo_ms:.0f} at p90:"
        f" {_mark(tally.tpot(90), snap.tpot_slo_ms)})",
        "  within SLOs   " + ("-" if math.isnan(attain) else f"{attain * 100:.1f}% of requests"),
        "  " + slo_status_line(snap.pdd, snap.attainment_target).strip(),
        "  pools         "
        + ", ".join(line.split("[")[0].strip() for line in pools_lines(snap.pdd, snap.router_endpoints)),
        f"  operator      {len(snap.events)} events on the PDDeployment",
        "  stages        " + ", ".join(f"{k} {v:.0f}s" for k, v in durations.items()),
    ]
    for seg in segments:
        within = seg.get("within_slo")
        lines.append(
            f"  {seg['label']:<13} {seg['requests']} requests at x{seg['rate_scale']:g},"
            f" {seg['failed']} failed,"
            f" TTFT p90 {seg['ttft_ms_p90'] or 0:.0f} ms, TPOT p90 {seg['tpot_ms_p90'] or 0:.0f} ms, "
            + ("-" if within is None else f"{within * 100:.1f}% within both")
        )
    if decisions:
        lines.append(f"  decisions     {len(decisions)} size changes (seconds from the start of the replay):")
        lines += [f"    {textwrap.shorten(decision_line(d), 160)}" for d in decisions]
    if outcome:
        lines.append(f"  verdict       {outcome}")
    lines.append("=" * 72)
    return "\n".join(lines)
