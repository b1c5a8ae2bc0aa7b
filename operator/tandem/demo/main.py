"""`make demo` / `python -m tandem.demo`: everything from a cold machine to a report, then stops it.

Stages: the local cluster (binaries from `make tools`), `helm install` of charts/tandem with the
cluster's Prometheus as the autoscaler's (`prometheus.url`), the sim P/D example under the SLO
autoscaler (examples/sim-pd-autoscaling.yaml with compressed settings, `tandem.demo.manifest`), and
the Azure conversation trace replayed through the router at its pod IP in three segments: quiet, a
surge (the same trace at a higher rate), quiet again. A live panel shows each pool's desired vs
ready replicas, the autoscaler's decisions with their reasons, TTFT/TPOT and attainment against the
SLO at the client and at the routers (status.slo), and the operator's Events; after the replay the
demo waits for the pools to scale back in.

`--scenario rollout` (or `SCENARIO=rollout` in the environment, as `make demo SCENARIO=rollout` sets
it) runs `tandem.demo.rollout` instead: a gray rollout colocated -> P/D and an automatic rollback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tandem.demo import load, manifest, trace, view
from tandem.demo.cluster import Reader, parse_router_metrics
from tandem.demo.stats import Tally
from tandem.devcluster import cluster as devcluster
from tandem.devcluster import kube, layout
from tandem.devcluster.handle import ClusterHandle

REPO = layout.REPO_ROOT
CHART = REPO / "charts" / "tandem"
EXAMPLE = REPO / "examples" / "sim-pd-autoscaling.yaml"
TRACE = REPO / "e2e" / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
RELEASE, OPERATOR_NS = "tandem", "tandem-system"
SURGE_END_SECONDS = 30.0  # the surge's last seconds the verdict judges
DEFAULT_SLO_MS = (500.0, 50.0)  # DESIGN.md's example SLO, used while spec.slo is not set
SCENARIOS = ("autoscale", "rollout")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tandem.demo", description=__doc__)
    p.add_argument("--dir", type=Path, default=REPO / ".tandem" / "demo", help="demo cluster directory")
    p.add_argument("--window-start", type=float, default=600.0, help="trace second to start at")
    p.add_argument("--quiet-scale", type=float, default=0.08, help="arrival-rate factor while quiet")
    p.add_argument("--surge-scale", type=float, default=0.35, help="arrival-rate factor of the surge")
    p.add_argument("--quiet-seconds", type=float, default=35.0, help="seconds of quiet before the surge")
    p.add_argument("--surge-seconds", type=float, default=70.0, help="seconds of surge")
    p.add_argument("--after-seconds", type=float, default=55.0, help="seconds of quiet after the surge")
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=90.0,
        help="most seconds to wait for the scale-in after the replay",
    )
    p.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    p.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default=os.environ.get("SCENARIO") or "autoscale",
        help="autoscale (the default): the SLO autoscaler and a trace surge; rollout: a gray rollout"
        " colocated -> P/D and an automatic rollback (`make demo SCENARIO=rollout`, docs/demo.md)",
    )
    rollout = p.add_argument_group("the rollout scenario")
    rollout.add_argument(
        "--colocated-seconds", type=float, default=15.0, help="seconds of colocated serving before the switch"
    )
    rollout.add_argument(
        "--steady-seconds", type=float, default=10.0, help="seconds of steady P/D before the fault"
    )
    rollout.add_argument(
        "--rolled-back-seconds", type=float, default=5.0, help="seconds of load after the rollback"
    )
    args = p.parse_args(list(argv))
    if args.scenario not in SCENARIOS:  # from $SCENARIO, which argparse does not check
        p.error(f"unknown scenario {args.scenario!r} (choose from {', '.join(SCENARIOS)})")
    return args


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.tty = sys.stdout.isatty()
        self.durations: dict[str, float] = {}
        self.tally = Tally()
        self.doc: dict[str, Any] = manifest.demo_manifest(yaml.safe_load(EXAMPLE.read_text()))
        self.name: str = self.doc["metadata"]["name"]
        self.namespace: str = self.doc["metadata"].get("namespace", "default")
        self.snap = view.Snapshot(elapsed_s=0.0, stage="starting")
        self.notes: list[str] = []
        self._last_print = 0.0
        self.decisions: list[dict[str, Any]] = []
        self._decided: set[tuple[str, str, int, int]] = set()
        self.replay_started = 0.0  # wall clock
        self.peaks: dict[str, int] = {}
        self.timeline: list[dict[str, Any]] = []
        self.segments = [
            trace.Segment("quiet", args.quiet_seconds, args.quiet_scale),
            trace.Segment("surge", args.surge_seconds, args.surge_scale),
            trace.Segment("quiet after", args.after_seconds, args.quiet_scale),
        ]

    # --- output ---------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.0f}s] {text}", flush=True)

    def show(self, *, force: bool = False) -> None:
        self.snap.elapsed_s = time.monotonic() - self.started
        self.snap.now = time.time()
        self.snap.notes = self.notes
        text = view.panel(self.snap, self.tally)
        if self.tty:
            print("\x1b[H\x1b[2J" + text, flush=True)
        elif force or time.monotonic() - self._last_print >= 15:
            print(text + "\n", flush=True)
            self._last_print = time.monotonic()

    def stage(self, name: str, began: float) -> None:
        self.durations[name] = time.monotonic() - began

    # --- the stages -----------------------------------------------------------------------------
    def start_cluster(self) -> ClusterHandle:
        began = time.monotonic()
        bins = layout.bin_dir()
        missing = layout.missing_binaries(bins, (*layout.CONTROL_PLANE_BINARIES, "kubectl", "helm"))
        if missing:
            raise SystemExit(f"missing binaries in {bins}: {', '.join(missing)}; run `make tools` first")
        cdir = layout.ClusterDir(self.args.dir.resolve())
        if cdir.state.exists():
            self.say(f"stopping a demo cluster left in {cdir.path}")
            devcluster.down(cdir, quiet=True)
        self.say(
            "starting the local cluster (etcd, kube-apiserver, controller-manager, scheduler, KWOK, ...)"
        )
        devcluster.up(cdir)
        self.stage("cluster", began)
        return ClusterHandle.from_dir(cdir.path, owned=True)

    def install_chart(self, handle: ClusterHandle) -> None:
        began = time.monotonic()
        self.say(f"helm install {RELEASE} charts/tandem -n {OPERATOR_NS} --wait")
        self.say(
            f"  --set prometheus.url={handle.prometheus_url} (the cluster's Prometheus, for the autoscaler)"
        )
        handle.helm(
            "install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace",
            "--set", "operator.resyncSeconds=30", "--set", f"prometheus.url={handle.prometheus_url}",
            "--wait", "--timeout", "3m",
        )  # fmt: skip
        pods = json.loads(
            handle.kubectl("get", "pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/component=operator",
                           "-o", "json").stdout
        )["items"]  # fmt: skip
        where = ", ".join(f"{p['metadata']['name']} at {p['status'].get('podIP')}" for p in pods)
        self.say(f"operator Ready: {where}")
        self.stage("helm install", began)

    async def apply_and_wait(self, handle: ClusterHandle, reader: Reader) -> None:
        began = time.monotonic()
        self.say(f"kubectl apply -f examples/sim-pd-autoscaling.yaml  ({self.namespace}/{self.name}), with")
        self.say(f"  the demo's settings: {manifest.describe()}")
        self.notes.append(f"demo settings: {manifest.describe()}")
        handle.kubectl("apply", "-f", "-", input=yaml.safe_dump(self.doc, sort_keys=False))
        self.snap.stage = "waiting for the PDDeployment to be Ready"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            await self.refresh(reader)
            self.show()
            status = self.snap.pdd.get("status") or {}
            ready = view._condition(self.snap.pdd, "Ready")
            if ready.get("status") == "True" and status.get("observedGeneration") == self.snap.pdd.get(
                "metadata", {}
            ).get("generation"):
                break
            await asyncio.sleep(1)
        else:
            raise SystemExit(f"{self.name} not Ready in 240s: {self.snap.pdd.get('status')}")
        self.show(force=True)
        self.stage("model ready", began)

    async def refresh(self, reader: Reader, router: str = "") -> None:
        self.snap.pdd = await asyncio.to_thread(reader.pdd)
        self.snap.events = await asyncio.to_thread(reader.events)
        self.record(self.snap.pdd)
        if router:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                timeout = aiohttp.ClientTimeout(total=3)
                async with (
                    aiohttp.ClientSession(timeout=timeout) as session,
                    session.get(f"{router}/metrics") as r,
                ):
                    endpoints, served = parse_router_metrics(await r.text())
                    self.snap.router_endpoints, self.snap.router_requests = endpoints, served

    def record(self, pdd: dict[str, Any]) -> None:
        """Keeps every new decision the status shows, each pool's peak and a timeline of sizes."""
        status = pdd.get("status") or {}
        pools = (status.get("autoscaling") or {}).get("pools") or {}
        now = time.time()
        since = now - self.replay_started if self.replay_started else 0.0
        for role, pool in pools.items():
            d = pool.get("lastDecision") or {}
            key = (role, str(d.get("time", "")), int(d.get("from", -1)), int(d.get("to", -1)))
            if d and key not in self._decided and d.get("from") != d.get("to"):
                self._decided.add(key)
                at = view.rfc3339_seconds(str(d.get("time", "")))
                self.decisions.append(
                    {
                        "pool": role,
                        "time": d.get("time"),
                        "at": round(at - self.replay_started, 1) if self.replay_started else None,
                        "from": d.get("from"),
                        "to": d.get("to"),
                        "reason": d.get("reason", ""),
                        "cause": d.get("cause"),
                        "figures": d.get("figures", {}),
                    }
                )
        sizes = {}
        for role, pool in (status.get("pools") or {}).items():
            if role == "router":
                continue
            ready, want = int(pool.get("readyReplicas", 0) or 0), int(pool.get("desiredReplicas", 0) or 0)
            if want or ready:
                sizes[role] = {"ready": ready, "desired": want}
                self.peaks[role] = max(self.peaks.get(role, 0), want)
        if self.replay_started and sizes and (not self.timeline or self.timeline[-1]["pools"] != sizes):
            self.timeline.append({"at": round(since, 1), "pools": sizes, "slo": status.get("slo")})

    async def replay(self, handle: ClusterHandle, reader: Reader) -> None:
        began = time.monotonic()
        rows = trace.parse_azure_csv(TRACE.read_text())
        max_len = int(self.doc["spec"]["model"].get("maxModelLen", 16384))
        requests = trace.surge(
            rows, start_s=self.args.window_start, segments=self.segments, max_model_len=max_len
        )
        ips = await asyncio.to_thread(reader.router_ips)
        if not ips:
            raise SystemExit("no Ready router pod")
        router = f"http://{ips[0]}:8080"
        model = self.doc["spec"]["model"]["name"]
        length = sum(seg.wall_seconds for seg in self.segments)
        plan = ", then ".join(
            f"{seg.label} {seg.wall_seconds:.0f}s at x{seg.rate_scale:g} "
            f"({sum(1 for r in requests if r.phase == seg.label)} requests)"
            for seg in self.segments
        )
        self.say(
            f"replaying {len(requests)} requests of the Azure conversation trace "
            f"from t={self.args.window_start:.0f}s "
            f"through the router at {router} over ~{length:.0f}s: {plan}"
        )
        self.notes.append(f"load: {plan}")
        self.snap.replay_total = len(requests)
        self.snap.stage = f"replaying the trace through {router}"
        self.replay_started = time.time()
        task = asyncio.create_task(load.replay(router, model, requests, self.tally))
        t0 = time.monotonic()
        while not task.done():
            self.snap.replay_elapsed_s = elapsed = time.monotonic() - t0
            self.snap.phase = self.phase_at(elapsed)
            await self.refresh(reader, router)
            self.show()
            await asyncio.sleep(1)
        await task
        self.snap.replay_elapsed_s = time.monotonic() - t0
        self.snap.phase = ""
        await self.refresh(reader, router)
        self.snap.stage = "replay finished"
        self.show(force=True)
        self.stage("replay", began)
        await self.settle(reader, router)

    def phase_at(self, elapsed: float) -> str:
        start = 0.0
        for seg in self.segments:
            if elapsed < start + seg.wall_seconds:
                return f"{seg.label} x{seg.rate_scale:g}, {start + seg.wall_seconds - elapsed:.0f}s left"
            start += seg.wall_seconds
        return "last requests finishing"

    def settled(self) -> bool:
        spec = self.doc["spec"]
        pools = (self.snap.pdd.get("status") or {}).get("pools") or {}
        for role in ("prefill", "decode"):
            bounds = (spec.get(role) or {}).get("autoscaling") or {}
            pool = pools.get(role) or {}
            floor = int(bounds.get("minReplicas", spec.get(role, {}).get("replicas", 0)))
            if int(pool.get("desiredReplicas", -1)) != floor or int(pool.get("replicas", -1)) != floor:
                return False
        return True

    async def settle(self, reader: Reader, router: str) -> None:
        """Waits (at most --settle-seconds) for the pools to be back at their minimum."""
        began = time.monotonic()
        self.snap.stage = "load is quiet: waiting for the autoscaler to scale back in"
        while not self.settled() and time.monotonic() - began < self.args.settle_seconds:
            await self.refresh(reader, router)
            self.show()
            await asyncio.sleep(1)
        await self.refresh(reader, router)
        self.snap.stage = "pools back at their minimum" if self.settled() else "scale-in still under way"
        self.show(force=True)
        self.stage("scale-in", began)

    def slo(self) -> None:
        slo = (self.doc.get("spec") or {}).get("slo") or {}
        if "ttftMs" in slo and "tpotMs" in slo:
            self.snap.ttft_slo_ms, self.snap.tpot_slo_ms = float(slo["ttftMs"]), float(slo["tpotMs"])
            self.snap.attainment_target = float(slo.get("attainmentPercent", 95))
            self.snap.slo_source = "(spec.slo)"
        else:
            self.snap.ttft_slo_ms, self.snap.tpot_slo_ms = DEFAULT_SLO_MS
            self.snap.slo_source = "(demo default)"

    async def run(self) -> int:
        handle = self.start_cluster()
        api = handle.api_client()
        try:
            self.install_chart(handle)
            reader = Reader(api, self.namespace, self.name)
            self.slo()
            await self.apply_and_wait(handle, reader)
            await self.replay(handle, reader)
            summary = self.summary()
            report = view.report(
                self.snap, self.tally, self.durations, self.decisions, summary["segments"], summary["verdict"]
            )
            print(report, flush=True)
            out = self.args.dir / "report.json"
            out.write_text(json.dumps(summary, indent=2))
            self.say(f"report written to {out}")
            # A demo that served (nearly) everything, saw the autoscaler act and ended its surge within
            # the SLO succeeded; the exit code says so too.
            served = len(self.tally.ok)
            if not any(d["to"] > d["from"] for d in self.decisions):
                self.say("the autoscaler never scaled out: see the decisions' reasons above")
                return 1
            if not summary["verdict"].startswith("SLO held"):
                self.say(f"the surge did not end within the SLO: {summary['verdict']}")
                return 1
            return 0 if served and len(self.tally.failed) <= 0.05 * self.snap.replay_total else 1
        finally:
            kube.close(api)
            if self.args.keep:
                self.say(f"cluster left running: export KUBECONFIG={handle.kubeconfig}")
            else:
                self.say("stopping the cluster and every process it started")
                devcluster.down(layout.ClusterDir(handle.dir), quiet=True)
            self.say(f"done in {time.monotonic() - self.started:.0f}s")

    def summary(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else round(x * 1000, 1)

        inp, outp = self.tally.tokens()
        segments = [
            {
                "label": seg.label,
                "wall_seconds": seg.wall_seconds,
                "rate_scale": seg.rate_scale,
                **self.segment_stats(seg.label),
            }
            for seg in self.segments
        ]
        surge_end = self.surge_end_stats()
        if surge_end is not None:
            segments.insert(2, surge_end)
        return {
            "requests": self.snap.replay_total,
            "ok": len(self.tally.ok),
            "failed": len(self.tally.failed),
            "prompt_tokens": inp,
            "generated_tokens": outp,
            "ttft_ms": {f"p{p}": num(self.tally.ttft(p)) for p in (50, 90, 99)},
            "tpot_ms": {f"p{p}": num(self.tally.tpot(p)) for p in (50, 90, 99)},
            "slo_ms": {"ttft": self.snap.ttft_slo_ms, "tpot": self.snap.tpot_slo_ms},
            "within_slo": self.tally.attainment(self.snap.ttft_slo_ms / 1000, self.snap.tpot_slo_ms / 1000),
            "events": list(self.snap.events),
            "stage_seconds": {k: round(v, 1) for k, v in self.durations.items()},
            "settings": manifest.describe(),
            "segments": segments,
            "surge_end": surge_end,
            "verdict": view.verdict(surge_end, self.snap.attainment_target, self.settled()),
            "decisions": self.decisions,
            "peak_replicas": self.peaks,
            "pool_timeline": self.timeline,
            "status_slo": (self.snap.pdd.get("status") or {}).get("slo"),
            "settled": self.settled(),
        }

    def surge_end_stats(self) -> dict[str, Any] | None:
        """The requests sent in the surge's last `SURGE_END_SECONDS`: did the autoscaler bring it within
        the SLO (the demo's verdict)."""
        start = 0.0
        for seg in self.segments:
            if seg.label == "surge":
                end = self.replay_started + start + seg.wall_seconds
                window = min(SURGE_END_SECONDS, seg.wall_seconds)
                label = f"surge, last {window:.0f} s"
                return {
                    "label": label,
                    "wall_seconds": window,
                    "rate_scale": seg.rate_scale,
                    **self.segment_stats("surge", since=end - window),
                }
            start += seg.wall_seconds
        return None

    def segment_stats(self, label: str, since: float = -math.inf) -> dict[str, Any]:
        """Client-measured figures of the requests one segment sent (at or after `since`, wall clock)."""
        part = Tally(samples=[s for s in self.tally.samples if s.label == label and s.sent_at >= since])

        def num(x: float) -> float | None:
            return None if math.isnan(x) else round(x * 1000, 1)

        attain = part.attainment(self.snap.ttft_slo_ms / 1000, self.snap.tpot_slo_ms / 1000)
        return {
            "requests": len(part.samples),
            "failed": len(part.failed),
            "ttft_ms_p90": num(part.ttft(90)),
            "tpot_ms_p90": num(part.tpot(90)),
            "within_slo": None if math.isnan(attain) else round(attain, 3),
        }
