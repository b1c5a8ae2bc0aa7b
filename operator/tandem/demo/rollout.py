"""`make demo SCENARIO=rollout` / `python -m tandem.demo --scenario rollout`: a gray rollout and an
automatic rollback, live.

Stages: the local cluster and `helm install` as the autoscaler demo does (`demo.main.Demo`), then
`examples/sim-gray-rollout.yaml` with the demo's settings (`demo.gray.rollout_manifest`) serving
colocated; the Azure conversation trace replayed through the operator's router at its pod IP, each
request with its own `X-Request-Id`; `kubectl apply` of the same manifest with `serving.mode:
Disaggregated`, as a user would; the operator starts P/D, shifts traffic step by step, judging each
step over an analysis window, and promotes it; once P/D serves everything, every decode engine is
slowed down (`POST /admin/faults`), the steady P/D deployment's analysis fails, the weight goes back
to colocated first and P/D is scaled down. The panel shows the rollout's phase, step, weight and
verdicts with their figures, pool sizes, and the client's TTFT/TPOT per path against the SLO; the
report gives the phases with their times, the cause of the rollback with its figures and the time
from the fault to weight 0. Everything it started is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tandem.api import meta
from tandem.demo import gray, load, trace
from tandem.demo.cluster import Reader, parse_router_metrics
from tandem.demo.main import REPO, TRACE, Demo
from tandem.devcluster import cluster as devcluster
from tandem.devcluster import kube, layout
from tandem.devcluster.handle import ClusterHandle

EXAMPLE = REPO / "examples" / "sim-gray-rollout.yaml"
RATE_SCALE = 0.5  # of the trace's arrival rate (~5 requests/s at second 600): ~2.5 requests/s
TRACE_WALL_SECONDS = 400.0  # more than the scenario needs; sending stops when it ends


class RolloutDemo(Demo):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.example = yaml.safe_load(EXAMPLE.read_text())
        self.doc = gray.rollout_manifest(self.example, "Colocated")
        self.name = self.doc["metadata"]["name"]
        self.namespace = self.doc["metadata"].get("namespace", "default")
        self.gv = gray.GrayView()
        self.readings: list[tuple[float, dict[str, Any]]] = []  # (wall clock, status.rollout)
        self.pool_readings: list[tuple[float, dict[str, Any]]] = []  # (wall clock, status.pools)
        self.router = ""
        self.run_id = uuid.uuid4().hex[:8]
        self.stop_sending = asyncio.Event()

    # --- output ---------------------------------------------------------------------------------
    def show(self, *, force: bool = False) -> None:
        self.snap.elapsed_s = time.monotonic() - self.started
        self.snap.now = time.time()
        self.snap.notes = self.notes
        text = gray.panel(self.snap, self.tally, self.gv)
        if self.tty:
            print("\x1b[H\x1b[2J" + text, flush=True)
        elif force or time.monotonic() - self._last_print >= 15:
            print(text + "\n", flush=True)
            self._last_print = time.monotonic()

    # --- reading the cluster --------------------------------------------------------------------
    async def refresh(self, reader: Reader, router: str = "") -> None:
        self.snap.pdd = await asyncio.to_thread(reader.pdd)
        self.snap.events = await asyncio.to_thread(reader.events)
        now = time.time()
        status = self.snap.pdd.get("status") or {}
        self.readings.append((now, dict(status.get("rollout") or {})))
        self.pool_readings.append((now, dict(status.get("pools") or {})))
        self.gv.timeline.see(now, gray.routed_pd_share(self.snap.pdd))
        if router:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                timeout = aiohttp.ClientTimeout(total=3)
                async with (
                    aiohttp.ClientSession(timeout=timeout) as session,
                    session.get(f"{router}/metrics") as r,
                ):
                    text = await r.text()
                    self.snap.router_endpoints, self.snap.router_requests = parse_router_metrics(text)
                    self.gv.router_paths = gray.router_requests_by_path(text)

    async def watch_until(
        self, reader: Reader, what: str, done: Callable[[dict[str, Any]], bool], seconds: float
    ) -> bool:
        """Refreshes and redraws every second until `done(pdd)` or for `seconds`; True if done."""
        self.snap.stage = what
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await self.refresh(reader, self.router)
            self.show()
            if done(self.snap.pdd):
                self.show(force=True)
                return True
            await asyncio.sleep(1)
        self.say(f"gave up after {seconds:.0f}s: {what}")
        self.show(force=True)
        return False

    def pod_ips(self, role: str) -> list[str]:
        return kube.ready_pod_ips(self.api, self.namespace, self.name, role)

    # --- the stages -----------------------------------------------------------------------------
    async def apply_colocated(self, handle: ClusterHandle, reader: Reader) -> None:
        began = time.monotonic()
        self.say(f"kubectl apply -f examples/sim-gray-rollout.yaml  ({self.namespace}/{self.name}), with")
        self.say(f"  the demo's settings: {gray.describe()}")
        self.notes.append(f"demo settings: {gray.describe()}")
        handle.kubectl("apply", "-f", "-", input=yaml.safe_dump(self.doc, sort_keys=False))

        def ready(pdd: dict[str, Any]) -> bool:
            status = pdd.get("status") or {}
            cond: dict[str, Any] = next(
                (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
            )
            return (
                cond.get("status") == "True"
                and status.get("observedGeneration") == (pdd.get("metadata") or {}).get("generation")
                and gray._ready(pdd, "colocated") >= 1
            )

        if not await self.watch_until(reader, "waiting for the colocated deployment to be Ready", ready, 240):
            raise SystemExit(f"{self.name} not Ready in 240s: {self.snap.pdd.get('status')}")
        self.stage("model ready", began)

    async def send(self, requests: list[trace.TraceRequest]) -> None:
        """The trace through the router, each request at its time with its own X-Request-Id, until
        `stop_sending`; then waits (at most the request timeout) for those in flight."""
        timeout = aiohttp.ClientTimeout(total=load.REQUEST_TIMEOUT_S, sock_connect=load.CONNECT_TIMEOUT_S)
        limit = asyncio.Semaphore(load.MAX_IN_FLIGHT)
        connector = aiohttp.TCPConnector(limit=load.MAX_IN_FLIGHT)
        model = self.doc["spec"]["model"]["name"]
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

            async def run(index: int, req: trace.TraceRequest) -> None:
                async with limit:
                    self.tally.in_flight += 1
                    try:
                        rid = f"demo-{self.run_id}-{index}"
                        self.tally.add(
                            await load.one_request(session, self.router, model, index, req, req.phase, rid)
                        )
                    finally:
                        self.tally.in_flight -= 1

            start = time.monotonic()
            tasks = []
            for index, req in enumerate(requests):
                delay = start + req.at - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stop_sending.wait(), delay)
                if self.stop_sending.is_set():
                    break
                self.tally.sent += 1
                tasks.append(asyncio.create_task(run(index, req)))
            await asyncio.gather(*tasks)

    async def fault(self, role: str, faults: dict[str, Any]) -> list[str]:
        ips = await asyncio.to_thread(self.pod_ips, role)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            for ip in ips:
                async with session.post(f"http://{ip}:{meta.ENGINE_PORT}/admin/faults", json=faults) as r:
                    if r.status != 200:
                        raise SystemExit(f"POST /admin/faults to {ip}: HTTP {r.status}")
        return ips

    async def scenario(self, handle: ClusterHandle, reader: Reader) -> bool:
        rows = trace.parse_azure_csv(TRACE.read_text())
        max_len = int(self.doc["spec"]["model"].get("maxModelLen", 16384))
        segment = trace.Segment("trace", TRACE_WALL_SECONDS, RATE_SCALE)
        requests = trace.surge(
            rows, start_s=self.args.window_start, segments=[segment], max_model_len=max_len
        )
        ips = await asyncio.to_thread(reader.router_ips)
        if not ips:
            raise SystemExit("no Ready router pod")
        self.router = f"http://{ips[0]}:8080"
        self.say(
            f"replaying the Azure conversation trace from t={self.args.window_start:.0f}s at x{RATE_SCALE:g}"
            f" its rate (~{len(requests) / TRACE_WALL_SECONDS:.1f} requests/s) through the router at"
            f" {self.router}, each request with its own X-Request-Id"
        )
        self.notes.append(f"load: the Azure conversation trace at x{RATE_SCALE:g} through {self.router}")
        self.replay_started = time.time()
        sender = asyncio.create_task(self.send(requests))
        try:
            completed = await self.story(handle, reader, sender)
        except BaseException:  # Ctrl-C or a failed stage: drop the load at once, then clean up
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender
            raise
        self.stop_sending.set()
        self.snap.stage = "waiting for the requests in flight"
        while not sender.done():
            await self.refresh(reader, self.router)
            self.show()
            await asyncio.wait({sender}, timeout=1)
        await sender
        await self.refresh(reader, self.router)
        self.show(force=True)
        return completed

    async def story(self, handle: ClusterHandle, reader: Reader, sender: asyncio.Task[None]) -> bool:
        began = time.monotonic()
        await self.watch_until(
            reader, "colocated serves every request", lambda _: sender.done(), self.args.colocated_seconds
        )
        self.stage("colocated", began)

        # The user's change: the same manifest with serving.mode Disaggregated, applied.
        began = time.monotonic()
        switched = gray.rollout_manifest(self.example, "Disaggregated")
        self.say(
            "kubectl apply -f - (the same manifest, spec.serving.mode: Disaggregated): the rollout starts"
        )
        handle.kubectl("apply", "-f", "-", input=yaml.safe_dump(switched, sort_keys=False))
        self.gv.switched_at = time.time()

        def promoted(pdd: dict[str, Any]) -> bool:
            status = pdd.get("status") or {}
            r = status.get("rollout") or {}
            colocated = (status.get("pools") or {}).get("colocated") or {}
            return (
                r.get("phase") == "Promoted"
                and r.get("target") == "Disaggregated"
                and int(colocated.get("replicas", 0) or 0) == 0
                and int(colocated.get("readyReplicas", 0) or 0) == 0
            )

        if not await self.watch_until(reader, "gray rollout colocated -> P/D", promoted, 200):
            return False
        self.stage("rollout", began)
        began = time.monotonic()
        await self.watch_until(
            reader, "P/D serves every request (steady, watched for a fall-back)", lambda _: False,
            self.args.steady_seconds,
        )  # fmt: skip
        self.stage("P/D steady", began)

        began = time.monotonic()
        ips = await self.fault("decode", {"slowdown": gray.SLOWDOWN})
        self.gv.fault_at = time.time()
        self.gv.fault = (
            f"every decode engine slowed x{gray.SLOWDOWN:g} (POST /admin/faults"
            f' {{"slowdown": {gray.SLOWDOWN:g}}} to {", ".join(ips)})'
        )
        self.say(f"FAULT: {self.gv.fault}")
        self.notes.append(f"fault: {self.gv.fault}")

        def rolled_back(pdd: dict[str, Any]) -> bool:
            status = pdd.get("status") or {}
            r = status.get("rollout") or {}
            pools = status.get("pools") or {}
            pd_gone = all(
                int((pools.get(role) or {}).get(key, 0) or 0) == 0
                for role in ("prefill", "decode")
                for key in ("replicas", "readyReplicas")
            )
            return r.get("phase") == "RolledBack" and pd_gone

        ok = await self.watch_until(
            reader, "the fault: P/D's analysis fails, colocated takes the traffic back", rolled_back, 180
        )
        self.stage("rollback", began)
        began = time.monotonic()
        await self.watch_until(
            reader, "colocated serves again", lambda _: False, self.args.rolled_back_seconds
        )
        self.stage("after", began)
        return ok

    # --- the report -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        t0 = self.gv.switched_at
        history = gray.phase_history(self.readings)
        for h in history:
            h["rel"] = round(h["at"] - t0, 1) if t0 else 0.0
        promoted_at = gray.first_at(history, t0, phase="Promoted", target="Disaggregated") if t0 else None
        fault_at = self.gv.fault_at
        fault: dict[str, Any] = {}
        if fault_at:
            back = next(
                (r for at, r in self.readings if at >= fault_at and r.get("phase") == "RollingBack"), {}
            )
            # The operator's own time of the phase change (phaseSince), not the demo's poll.
            weight0 = float(back["phaseSince"]) if back.get("phaseSince") else None
            rolled = gray.first_at(history, fault_at, phase="RolledBack")
            fault = {
                "what": self.gv.fault,
                "rel": round(fault_at - t0, 1),
                "cause": back.get("reason", ""),
                "verdict": next(
                    (v for v in reversed(back.get("verdicts") or []) if v.get("result") == "Fail"), None
                ),
                "to_weight_0_s": None if weight0 is None else round(weight0 - fault_at, 1),
                "to_colocated_ready_s": self._first_pools(
                    fault_at, lambda p: int((p.get("colocated") or {}).get("readyReplicas", 0) or 0) >= 1
                ),
                "to_pd_zero_s": self._first_pools(
                    fault_at,
                    lambda p: all(
                        int((p.get(r) or {}).get(k, 0) or 0) == 0
                        for r in ("prefill", "decode")
                        for k in ("replicas", "readyReplicas")
                    ),
                ),
                "to_rolled_back_s": None if rolled is None else round(rolled - fault_at, 1),
            }
        colocated_zero = (
            self._first_pools(
                promoted_at, lambda p: int((p.get("colocated") or {}).get("readyReplicas", 0) or 0) == 0
            )
            if promoted_at
            else None
        )
        ttft_slo, tpot_slo = self.snap.ttft_slo_ms, self.snap.tpot_slo_ms
        bounds = [
            ("colocated only", 0.0, t0 or math.inf),
            ("rollout", t0 or math.inf, promoted_at or fault_at or math.inf),
            ("P/D steady", promoted_at or math.inf, fault_at or math.inf),
            ("fault -> weight 0", fault_at or math.inf, (fault_at + fault["to_weight_0_s"])
             if fault.get("to_weight_0_s") is not None else math.inf),
            ("after weight 0", (fault_at + fault["to_weight_0_s"])
             if fault.get("to_weight_0_s") is not None else math.inf, math.inf),
        ]  # fmt: skip
        stages = []
        if fault:
            # The cause in the client's figures: what P/D requests met between the fault and weight 0.
            lo, hi = bounds[3][1], bounds[3][2]
            part = [s for s in self.tally.samples if lo <= s.sent_at < hi]
            pd = gray.by_path(part, self.gv.timeline)["disaggregated"]
            fault["pd_client"] = gray.path_figures(pd, ttft_slo, tpot_slo)
            after = [s for s in self.tally.samples if s.sent_at >= fault_at]
            on_pd = [s.sent_at for s in after if gray.path_of(s, self.gv.timeline) == "disaggregated"]
            fault["to_last_pd_request_s"] = round(max(on_pd) - fault_at, 1) if on_pd else None
        for label, lo, hi in bounds:
            part = [s for s in self.tally.samples if lo <= s.sent_at < hi]
            paths = gray.by_path(part, self.gv.timeline)
            stages.append(
                {
                    "label": label,
                    "paths": {p: gray.path_figures(t, ttft_slo, tpot_slo) for p, t in paths.items()},
                }
            )
        return {
            "settings": gray.describe(),
            "requests": self.tally.sent,
            "ok": len(self.tally.ok),
            "failed": len(self.tally.failed),
            "errors": sorted({s.error for s in self.tally.failed})[:3],
            "router_paths": self.gv.router_paths,
            "slo_ms": {"ttft": ttft_slo, "tpot": tpot_slo},
            "history": history,
            "promote_s": None if promoted_at is None or not t0 else round(promoted_at - t0, 1),
            "colocated_zero_s": None if colocated_zero is None or promoted_at is None
            else round(promoted_at + colocated_zero - t0, 1),
            "fault": fault,
            "stages": stages,
            "slo_misses": [  # every request outside the SLO, for a look at what failed a window
                {
                    "rel": round(s.sent_at - t0, 1) if t0 else None,
                    "path": gray.path_of(s, self.gv.timeline),
                    "ok": s.ok,
                    "ttft_ms": None if math.isnan(s.ttft_s) else round(s.ttft_s * 1000, 1),
                    "tpot_ms": None if math.isnan(s.tpot_s) else round(s.tpot_s * 1000, 1),
                    "input_tokens": s.input_tokens,
                    "output_tokens": s.output_tokens,
                }
                for s in self.tally.samples
                if not s.ok
                or s.ttft_s * 1000 > ttft_slo
                or (not math.isnan(s.tpot_s) and s.tpot_s * 1000 > tpot_slo)
            ],
            "share_timeline": [
                {"rel": round(at - t0, 1) if t0 else 0.0, "pd_share": s} for at, s in self.gv.timeline.points
            ],
            "events": list(self.snap.events),
            "stage_seconds": {k: round(v, 1) for k, v in self.durations.items()},
        }  # fmt: skip

    def _first_pools(self, after: float, check: Callable[[dict[str, Any]], bool]) -> float | None:
        for at, pools in self.pool_readings:
            if at >= after and check(pools):
                return round(at - after, 1)
        return None

    async def run(self) -> int:
        handle = self.start_cluster()
        self.api = handle.api_client()
        try:
            self.install_chart(handle)
            reader = Reader(self.api, self.namespace, self.name)
            self.slo()
            await self.apply_colocated(handle, reader)
            completed = await self.scenario(handle, reader)
            summary = self.summary()
            print(gray.report(summary), flush=True)
            out = Path(self.args.dir) / "report.json"
            out.write_text(json.dumps(summary, indent=2))
            self.say(f"report written to {out}")
            if not completed:
                self.say("the rollout or the rollback did not complete: see the phases above")
                return 1
            return 0 if self.tally.ok and not self.tally.failed else 1
        finally:
            kube.close(self.api)
            if self.args.keep:
                self.say(f"cluster left running: export KUBECONFIG={handle.kubeconfig}")
            else:
                self.say("stopping the cluster and every process it started")
                devcluster.down(layout.ClusterDir(handle.dir), quiet=True)
            self.say(f"done in {time.monotonic() - self.started:.0f}s")
