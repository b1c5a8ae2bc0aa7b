"""The live panel and the final report, as plain text (pure: every number comes in a Snapshot)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.demo.stats import Tally

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
    notes: Sequence[str] = ()


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


def panel(snap: Snapshot, tally: Tally) -> str:
    status = snap.pdd.get("status") or {}
    meta = snap.pdd.get("metadata") or {}
    ready = _condition(snap.pdd, "Ready")
    out = [
        f"tandem demo  {snap.elapsed_s:5.0f}s  -  {snap.stage}",
        "",
        f"PDDeployment {meta.get('namespace', '?')}/{meta.get('name', '?')}: "
        f"phase {status.get('phase', '-')}, "
        f"Ready={ready.get('status', '-')} ({ready.get('reason', '')}), "
        f"generation {meta.get('generation', '-')} observed {status.get('observedGeneration', '-')}",
        *pools_lines(snap.pdd, snap.router_endpoints),
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
    out += [
        f"latency (ms)        p50     p90     p99     SLO {snap.slo_source}",
        f"  TTFT           {_ms(tally.ttft(50))}  {_ms(tally.ttft(90))}  {_ms(tally.ttft(99))}"
        f"   {ttft_slo:.0f} at p90: {_mark(tally.ttft(90), ttft_slo)}",
        f"  TPOT           {_ms(tally.tpot(50))}  {_ms(tally.tpot(90))}  {_ms(tally.tpot(99))}"
        f"   {tpot_slo:.0f} at p90: {_mark(tally.tpot(90), tpot_slo)}",
    ]
    attain = tally.attainment(ttft_slo / 1000, tpot_slo / 1000)
    if not math.isnan(attain):
        out.append(f"  requests within both SLOs: {attain * 100:.1f}%")
    out += ["", "operator events (newest last):"]
    out += [f"  {e}" for e in list(snap.events)[-6:]] or ["  (none yet)"]
    if snap.notes:
        out += ["", *[f"* {n}" for n in snap.notes[-4:]]]
    return "\n".join(out)


def report(snap: Snapshot, tally: Tally, durations: dict[str, float]) -> str:
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
        f"  p99 {_ms(tally.ttft(99)).strip()}   (SLO {snap.ttft_slo_ms:.0f} at p90:"
        f" {_mark(tally.ttft(90), snap.ttft_slo_ms)})",
        f"  TPOT ms       p50 {_ms(tally.tpot(50)).strip()}  p90 {_ms(tally.tpot(90)).strip()}"
        f"  p99 {_ms(tally.tpot(99)).strip()}   (SLO {snap.tpot_slo_ms:.0f} at p90:"
        f" {_mark(tally.tpot(90), snap.tpot_slo_ms)})",
        "  within SLOs   " + ("-" if math.isnan(attain) else f"{attain * 100:.1f}% of requests"),
        "  pools         "
        + ", ".join(line.split("[")[0].strip() for line in pools_lines(snap.pdd, snap.router_endpoints)),
        f"  operator      {len(snap.events)} events on the PDDeployment",
        "  stages        " + ", ".join(f"{k} {v:.0f}s" for k, v in durations.items()),
        "=" * 72,
    ]
    return "\n".join(lines)
