"""`make demo` / `python -m tandem.demo`: everything from a cold machine to a report, then stops it.

Stages: the local cluster (binaries from `make tools`), `helm install` of charts/tandem, the sim P/D
example, a window of the Azure conversation trace replayed through the router at its pod IP while
a live panel shows pools, requests, TTFT/TPOT against the SLO and the operator's Events; halfway a
spec change (one more decode replica, as a Git commit would make it) shows the operator at work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tandem.demo import load, trace, view
from tandem.demo.cluster import Reader, parse_router_metrics
from tandem.demo.stats import Tally
from tandem.devcluster import cluster as devcluster
from tandem.devcluster import kube, layout
from tandem.devcluster.handle import ClusterHandle

REPO = layout.REPO_ROOT
CHART = REPO / "charts" / "tandem"
EXAMPLE = REPO / "examples" / "sim-pd.yaml"
TRACE = REPO / "e2e" / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
RELEASE, OPERATOR_NS = "tandem", "tandem-system"
DEFAULT_SLO_MS = (500.0, 50.0)  # DESIGN.md's example SLO, used while spec.slo is not set


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tandem.demo", description=__doc__)
    p.add_argument("--dir", type=Path, default=REPO / ".tandem" / "demo", help="demo cluster directory")
    p.add_argument("--window-start", type=float, default=600.0, help="trace second to start at")
    p.add_argument("--window-seconds", type=float, default=40.0, help="seconds of trace to replay")
    p.add_argument("--rate-scale", type=float, default=0.25, help="arrival-rate factor (0.25: 4x slower)")
    p.add_argument("--no-scale-up", action="store_true", help="skip the mid-replay spec change")
    p.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    return p.parse_args(list(argv))


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.tty = sys.stdout.isatty()
        self.durations: dict[str, float] = {}
        self.tally = Tally()
        self.doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
        self.name: str = self.doc["metadata"]["name"]
        self.namespace: str = self.doc["metadata"].get("namespace", "default")
        self.snap = view.Snapshot(elapsed_s=0.0, stage="starting")
        self.notes: list[str] = []
        self._last_print = 0.0

    # --- output ---------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.0f}s] {text}", flush=True)

    def show(self, *, force: bool = False) -> None:
        self.snap.elapsed_s = time.monotonic() - self.started
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
        handle.helm(
            "install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace",
            "--set", "operator.resyncSeconds=30", "--wait", "--timeout", "3m",
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
        self.say(f"kubectl apply -f examples/sim-pd.yaml  ({self.namespace}/{self.name})")
        handle.kubectl("apply", "-f", str(EXAMPLE))
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
        if router:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                timeout = aiohttp.ClientTimeout(total=3)
                async with (
                    aiohttp.ClientSession(timeout=timeout) as session,
                    session.get(f"{router}/metrics") as r,
                ):
                    endpoints, served = parse_router_metrics(await r.text())
                    self.snap.router_endpoints, self.snap.router_requests = endpoints, served

    async def replay(self, handle: ClusterHandle, reader: Reader) -> None:
        began = time.monotonic()
        rows = trace.parse_azure_csv(TRACE.read_text())
        max_len = int(self.doc["spec"]["model"].get("maxModelLen", 16384))
        requests = trace.window(
            rows, start_s=self.args.window_start, length_s=self.args.window_seconds,
            rate_scale=self.args.rate_scale, max_model_len=max_len,
        )  # fmt: skip
        ips = await asyncio.to_thread(reader.router_ips)
        if not ips:
            raise SystemExit("no Ready router pod")
        router = f"http://{ips[0]}:8080"
        model = self.doc["spec"]["model"]["name"]
        length = requests[-1].at if requests else 0.0
        self.say(
            f"replaying {len(requests)} requests of the Azure conversation trace "
            f"(t={self.args.window_start:.0f}s+{self.args.window_seconds:.0f}s, "
            f"rate x{self.args.rate_scale}) "
            f"through the router at {router} over ~{length:.0f}s"
        )
        self.snap.replay_total = len(requests)
        self.snap.stage = f"replaying the trace through {router}"
        task = asyncio.create_task(load.replay(router, model, requests, self.tally))
        scaled = self.args.no_scale_up
        t0 = time.monotonic()
        while not task.done():
            self.snap.replay_elapsed_s = time.monotonic() - t0
            if not scaled and self.snap.replay_elapsed_s >= 0.4 * length:
                scaled = True
                await asyncio.to_thread(self.scale_decode, handle)
            await self.refresh(reader, router)
            self.show()
            await asyncio.sleep(1)
        await task
        self.snap.replay_elapsed_s = time.monotonic() - t0
        await self.refresh(reader, router)
        self.snap.stage = "replay finished"
        self.show(force=True)
        self.stage("replay", began)

    def scale_decode(self, handle: ClusterHandle) -> None:
        decode = int(self.doc["spec"]["decode"]["replicas"])
        patch = json.dumps({"spec": {"decode": {"replicas": decode + 1}}})
        handle.kubectl("patch", "-n", self.namespace, f"pdd/{self.name}", "--type=merge", "-p", patch)
        self.notes.append(
            f"at {time.monotonic() - self.started:.0f}s: spec.decode.replicas {decode} -> {decode + 1} "
            "(kubectl patch, as a Git commit would): watch the operator apply it and the router pick it up"
        )

    def slo(self) -> None:
        slo = (self.doc.get("spec") or {}).get("slo") or {}
        if "ttftMs" in slo and "tpotMs" in slo:
            self.snap.ttft_slo_ms, self.snap.tpot_slo_ms = float(slo["ttftMs"]), float(slo["tpotMs"])
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
            print(view.report(self.snap, self.tally, self.durations), flush=True)
            out = self.args.dir / "report.json"
            out.write_text(json.dumps(self.summary(), indent=2))
            self.say(f"report written to {out}")
            # A demo that served (nearly) everything succeeded; say so in the exit code too.
            served = len(self.tally.ok)
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
        }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(Demo(args).run())
    except KeyboardInterrupt:
        return 130
