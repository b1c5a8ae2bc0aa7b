"""Simulator fidelity: one Azure trace window, live on the local cluster and in the simulator, side by side.

Live: starts the local cluster (`tandem.devcluster`), the CRD and `tandem operator` as a local process,
applies a sim P/D PDDeployment (1 prefill + 1 decode by default, sim engines timed by the H100
Llama-3.1-8B TP1 profile, KV over a modelled 100 Gb/s link, one router) and replays a window of the Azure
LLM conversation trace through the router at its pod IP, streaming, with each request's recorded prompt
and output lengths (a prompt of N token ids is N prompt tokens for the sim engine; `ignore_eos` makes the
answer exactly `max_tokens` long). The client measures TTFT and TPOT as `make demo` does.

Simulated: the same requests (same arrival times and lengths) through `tandem.sim.simulate` with the same
layout and profile. Prints TTFT and TPOT p50/p90 live vs simulated, their ratio and PASS/FAIL against
10%, a paired per-request view of the gap and what the live machine was doing (CPU, engine step lag),
and writes everything to `.tandem/bench/sim_fidelity.json`.

Time scale: the engines run with TANDEM_SIM_TIME_SCALE=S (default 8): every modelled step and KV
transfer lasts S times longer on the wall clock, and the client sends the trace's arrivals S times
further apart, so the engines see the same load in modelled time while the machine has S times fewer
tokens per second to push through HTTP and SSE. The simulator is time-homogeneous (a static layout: no
policy, nothing on a wall clock), so "profile and arrivals scaled by S" is exactly "results scaled by S";
the bench simulates the unscaled trace and reports the live figures divided by S, both in H100
milliseconds. Fixed per-request costs of the live path (router, HTTP, SSE, the client) shrink by 1/S in
those figures; `--time-scale 1` shows them whole.

    .venv/bin/python bench/sim_fidelity.py [--quick] [--time-scale 8] [--rate-scale 1.0] [--kv-gbps 100]
        [--window-start 600] [--window-seconds 40] [--decode 1]
    .venv/bin/python bench/sim_fidelity.py --reuse-live    # re-simulate the last live run, no cluster

Needs the control-plane binaries (`make tools`). Loopback only. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tandem.perf.stats import percentile

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "e2e" / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
OUT = ROOT / ".tandem" / "bench" / "sim_fidelity.json"
CLUSTER_DIR = ROOT / ".tandem" / "bench" / "sim_fidelity"
CRD = ROOT / "crds" / "pddeployment.yaml"

MODEL_ID = "meta-llama/Llama-3.1-8B-Instruct"
SERVED_NAME = "llama-3.1-8b"
GPU = "H100"
KV_BANDWIDTH_GBPS = 100.0
MAX_MODEL_LEN = 16384
NAME, NAMESPACE = "fidelity", "default"
TOLERANCE = 0.10
FIGURES = (("ttft", 50), ("ttft", 90), ("tpot", 50), ("tpot", 90))


# --- the comparison (pure) -----------------------------------------------------------------------------
def figures(ttft_s: Sequence[float], tpot_s: Sequence[float]) -> dict[str, float]:
    """{"ttft_p50": ms, ...} for FIGURES from per-request seconds (NaN entries ignored)."""
    columns = {"ttft": ttft_s, "tpot": tpot_s}
    return {f"{what}_p{p}": percentile(columns[what], p) * 1000 for what, p in FIGURES}


@dataclass(frozen=True)
class Row:
    figure: str  # "ttft_p50"
    live_ms: float
    sim_ms: float
    ratio: float  # live / sim; NaN when either is missing or sim is 0
    ok: bool  # |ratio - 1| <= tolerance


def compare(live: Mapping[str, float], sim: Mapping[str, float], tolerance: float = TOLERANCE) -> list[Row]:
    """One row per figure present in both: live vs simulated, their ratio, and whether they agree within
    `tolerance` (relative to the simulated figure). A missing (NaN) or zero simulated figure fails."""
    rows = []
    for key in live:
        if key not in sim:
            continue
        a, b = float(live[key]), float(sim[key])
        ratio = a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan
        ok = not math.isnan(ratio) and abs(ratio - 1) <= tolerance + 1e-12
        rows.append(Row(key, a, b, ratio, ok))
    return rows


def format_table(rows: Sequence[Row], tolerance: float = TOLERANCE) -> str:
    def cell(x: float, digits: int) -> str:
        return "-" if math.isnan(x) else f"{x:.{digits}f}"

    lines = [
        f"{'figure':<10} {'live ms':>9} {'sim ms':>9} {'live/sim':>9}  within {tolerance:.0%}",
    ]
    for r in rows:
        what, _, p = r.figure.partition("_")
        lines.append(
            f"{what.upper() + ' ' + p:<10} {cell(r.live_ms, 2):>9} {cell(r.sim_ms, 2):>9} "
            f"{cell(r.ratio, 3):>9}  {'PASS' if r.ok else 'FAIL'}"
        )
    return "\n".join(lines)


def paired_gap(live: Sequence[float], sim: Sequence[float]) -> dict[str, float]:
    """Per-request live - simulated (ms): median, p10, p90 and mean over requests with both."""
    diffs = [(a - b) * 1000 for a, b in zip(live, sim, strict=True) if not (math.isnan(a) or math.isnan(b))]
    if not diffs:
        return {"n": 0}
    return {
        "n": len(diffs),
        "median_ms": statistics.median(diffs),
        "p10_ms": percentile(diffs, 10),
        "p90_ms": percentile(diffs, 90),
        "mean_ms": statistics.fmean(diffs),
    }


# --- the trace -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Req:
    at: float  # seconds from the window's start, in modelled (H100) time
    prompt: int
    output: int


def load_window(start_s: float, length_s: float, rate_scale: float) -> list[Req]:
    from tandem.demo import trace

    rows = trace.parse_azure_csv(TRACE.read_text())
    window = trace.window(
        rows, start_s=start_s, length_s=length_s, rate_scale=rate_scale, max_model_len=MAX_MODEL_LEN
    )
    return [Req(r.at, r.input_tokens, r.output_tokens) for r in window]


# --- the simulator -------------------------------------------------------------------------------------
def simulate(
    requests: Sequence[Req], decode: int, kv_gbps: float = KV_BANDWIDTH_GBPS
) -> tuple[list[float], list[float]]:
    """(ttft, tpot) seconds per request from the simulator; NaN where refused or one output token."""
    from tandem.perf import estimate_profile
    from tandem.sim import SLO, Layout, PoolSpec, ReplicaSpec, Request, SimConfig
    from tandem.sim import simulate as run

    # The profile exactly as the sim engine builds it (engine/config.py: estimate + --kv-cache-dtype auto).
    profile = estimate_profile(MODEL_ID, GPU, 1).with_kv_cache_dtype("auto")
    replica = ReplicaSpec.from_profile(profile, kv_bandwidth_gbps=kv_gbps)
    layout = Layout(
        pools={
            "prefill": PoolSpec(replica=replica, replicas=1),
            "decode": PoolSpec(replica=replica, replicas=decode),
        }
    )
    result = run(
        [Request(r.at, r.prompt, r.output) for r in requests],
        layout,
        SimConfig(slo=SLO(ttft_ms=500, tpot_ms=50)),
    )
    records = result.records
    ttft = [math.nan if (x := records.ttft(i)) is None else x for i in range(len(records))]
    tpot = [math.nan if (x := records.tpot(i)) is None else x for i in range(len(records))]
    return ttft, tpot


# --- the live cluster ----------------------------------------------------------------------------------
def pdd_manifest(
    decode: int,
    time_scale: float,
    kv_gbps: float = KV_BANDWIDTH_GBPS,
    extra_env: Sequence[str] = (),
) -> dict[str, Any]:
    """examples/sim-pd.yaml with `decode` decode replicas, TANDEM_SIM_TIME_SCALE and the KV link speed
    (also set as TANDEM_SIM_KV_BANDWIDTH_GBPS: the API caps `bandwidthGbps` at 3200), and `extra_env`
    (NAME=VALUE) for the engines."""
    pool = {
        "tensorParallelSize": 1,
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
    }
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": SERVED_NAME, "uri": f"hf://{MODEL_ID}", "maxModelLen": MAX_MODEL_LEN},
            "engine": {
                "type": "sim",
                "image": "ghcr.io/tandem-dev/tandem:0.1.0",
                "env": [
                    {"name": "TANDEM_SIM_TIME_SCALE", "value": f"{time_scale:g}"},
                    {"name": "TANDEM_SIM_KV_BANDWIDTH_GBPS", "value": f"{kv_gbps:g}"},
                    *({"name": n, "value": v} for n, _, v in (e.partition("=") for e in extra_env)),
                ],
            },
            "kvTransfer": {"connector": "NixlConnector", "bandwidthGbps": int(min(3200, max(1, kv_gbps)))},
            "prefill": {"replicas": 1, **pool},
            "decode": {"replicas": decode, **pool},
            "router": {"replicas": 1, "image": "ghcr.io/tandem-dev/tandem:0.1.0"},
            "serving": {"mode": "Disaggregated"},
        },
    }


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


@dataclass
class ProcStat:
    """CPU seconds and run-queue wait (runnable but not running: CPU starvation) of one process."""

    cpu_s: float
    wait_s: float


def proc_stat(pid: int) -> ProcStat | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        schedstat = Path(f"/proc/{pid}/schedstat").read_text().split()
        return ProcStat(cpu, int(schedstat[1]) / 1e9)
    except (OSError, IndexError, ValueError):
        return None


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def cluster_processes(marker: str) -> dict[str, int]:
    """{"router" | "prefill" | "decode-N": pid} of the pod processes the runner started."""
    from tandem.devcluster import procs

    found: dict[str, int] = {}
    for pid in procs.marked_pids(marker):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "router" in words and "--pddeployment" in words:
            found["router"] = pid
        elif "engine" in words and "serve" in words:
            config = next((w for w in words if w.startswith("{") and "kv_role" in w), "")
            role = "prefill" if "kv_producer" in config else "decode"
            key = role if role not in found else f"{role}-{sum(k.startswith(role) for k in found)}"
            found[key] = pid
    return found


def metric_sums(text: str, names: Sequence[str]) -> dict[str, float]:
    """`<name>_sum` and `<name>_count` of histograms in Prometheus text (summed over label sets)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in names:
            for suffix in ("_sum", "_count"):
                if line.startswith(f"{name}{suffix}{{") or line.startswith(f"{name}{suffix} "):
                    key = f"{name}{suffix}"
                    out[key] = out.get(key, 0.0) + float(line.rpartition(" ")[2])
    return out


HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",  # engine-side: arrival at the engine to its first token
    "vllm:request_queue_time_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:nixl_xfer_time_seconds",  # decode: the KV pull
    "tandem_router_time_to_first_token_seconds",
    "tandem_router_prefill_leg_seconds",
    "tandem_router_time_per_output_token_seconds",
)


async def scrape(targets: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """For each pod (name -> base URL): histogram sums and counts from /metrics, and an engine's
    /debug/state (its step lag)."""
    import aiohttp

    out: dict[str, dict[str, Any]] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for name, url in targets.items():
            entry: dict[str, Any] = {}
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError, ValueError):
                async with session.get(f"{url}/metrics") as r:
                    entry["sums"] = metric_sums(await r.text(), HISTOGRAMS)
                if name != "router":
                    async with session.get(f"{url}/debug/state") as r:
                        entry["state"] = await r.json()
            out[name] = entry
    return out


def pod_means(before: Mapping[str, Any], after: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """Per pod, each histogram's mean over the replay (after - before) in H100 ms, and step lag."""
    report: dict[str, Any] = {}
    for name, entry in after.items():
        sums_a, sums_b = entry.get("sums", {}), before.get(name, {}).get("sums", {})
        row: dict[str, Any] = {}
        for metric in HISTOGRAMS:
            count = sums_a.get(f"{metric}_count", 0.0) - sums_b.get(f"{metric}_count", 0.0)
            if count > 0:
                total = sums_a[f"{metric}_sum"] - sums_b.get(f"{metric}_sum", 0.0)
                short = metric.removeprefix("vllm:").removeprefix("tandem_router_").removesuffix("_seconds")
                row[f"{short}_mean_ms"] = total / count * 1000 / scale
                row[f"{short}_count"] = int(count)
        state = entry.get("state")
        if state:
            row["steps"] = state.get("steps")
            row["mean_step_lag_ms_wall"] = 1000 * float(state.get("mean_step_lag_seconds") or 0.0)
            row["max_step_lag_ms_wall"] = 1000 * float(state.get("max_step_lag_seconds") or 0.0)
        report[name] = row
    return report


async def replay(router: str, requests: Sequence[Req], scale: float) -> list[tuple[float, float, str]]:
    """(ttft_s, tpot_s, error) per request in trace order, wall-clock seconds; arrivals stretched by
    `scale`. Each request goes out at its time whatever is in flight (open loop)."""
    import aiohttp

    from tandem.demo.load import one_request
    from tandem.demo.trace import TraceRequest

    out: list[tuple[float, float, str]] = [(math.nan, math.nan, "not sent")] * len(requests)
    timeout = aiohttp.ClientTimeout(total=600, sock_connect=5)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(i: int, r: Req) -> None:
            sample = await one_request(
                session, router, SERVED_NAME, i, TraceRequest(r.at, r.prompt, r.output)
            )
            out[i] = (sample.ttft_s, sample.tpot_s, "" if sample.ok else sample.error)

        start = time.monotonic()
        tasks = []
        for i, r in enumerate(requests):
            delay = start + r.at * scale - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, r)))
        await asyncio.gather(*tasks)
    return out


async def warm_up(router: str) -> None:
    """A few requests before the measured replay: first connections, first KV read (not measured)."""
    import aiohttp

    from tandem.demo.load import one_request
    from tandem.demo.trace import TraceRequest

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for i in range(4):
            sample = await one_request(session, router, SERVED_NAME, 10**6 + i, TraceRequest(0, 64, 8))
            if not sample.ok:
                raise SystemExit(f"warm-up request failed: {sample.error}")
    await asyncio.sleep(1.0)


def pod_ips(api: Any, role: str) -> list[str]:
    from kubernetes import client

    from tandem.api import meta
    from tandem.devcluster import kube

    pods = kube.raw(
        client.CoreV1Api(api).list_namespaced_pod(
            NAMESPACE,
            label_selector=f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}={role}",
            _preload_content=False,
        )
    )["items"]
    return sorted(p["status"]["podIP"] for p in pods if kube.is_ready(p) and p["status"].get("podIP"))


def run_live(args: argparse.Namespace, requests: Sequence[Req]) -> dict[str, Any]:
    """Starts everything, replays, measures, stops everything (whatever happens)."""
    import yaml

    from tandem.demo.cluster import Reader
    from tandem.devcluster import cluster as devcluster
    from tandem.devcluster import kube, layout
    from tandem.devcluster.handle import ClusterHandle
    from tandem.devcluster.testing import OperatorProcess, eventually

    bins = layout.bin_dir()
    missing = layout.missing_binaries(bins, (*layout.CONTROL_PLANE_BINARIES, "kubectl"))
    if missing:
        raise SystemExit(f"missing binaries in {bins}: {', '.join(missing)}; run `make tools` first")
    cdir = layout.ClusterDir(CLUSTER_DIR)
    cdir.path.mkdir(parents=True, exist_ok=True)
    if cdir.state.exists():
        say(f"stopping a cluster left in {cdir.path}")
        devcluster.down(cdir, quiet=True)
    began = time.monotonic()
    say(f"starting the local cluster in {cdir.path}")
    devcluster.up(cdir, owner_pid=os.getpid())
    operator: OperatorProcess | None = None
    api = None
    try:
        handle = ClusterHandle.from_dir(cdir.path, owned=True)
        handle.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
        established = "{.status.conditions[?(@.type=='Established')].status}"
        eventually(
            lambda: (
                handle.kubectl(
                    "get", "crd/pddeployments.tandem.dev", "-o", f"jsonpath={established}", check=False
                ).stdout.strip()
                == "True"
            ),
            timeout=60,
            what="the PDDeployment CRD to be Established",
        )
        operator = OperatorProcess(
            handle, ["--lease-namespace", NAMESPACE, "--resync-seconds", "30"], cdir.path / "operator.log"
        )
        operator.wait_leader(timeout=90)
        say(f"operator leads ({time.monotonic() - began:.0f}s); applying {NAMESPACE}/{NAME}")
        handle.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(pdd_manifest(args.decode, args.time_scale, args.kv_gbps, args.engine_env)),
        )
        api = handle.api_client()
        reader = Reader(api, NAMESPACE, NAME)
        deadline = time.monotonic() + 240
        while True:
            pdd = reader.pdd()
            conditions = {c["type"]: c for c in (pdd.get("status") or {}).get("conditions") or []}
            ready = conditions.get("Ready", {}).get("status") == "True"
            if ready and reader.router_ips() and len(pod_ips(api, "decode")) == args.decode:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{NAME} not Ready in 240 s: {pdd.get('status')}")
            time.sleep(1)
        router = f"http://{reader.router_ips()[0]}:8080"
        engines = {"prefill": pod_ips(api, "prefill"), "decode": pod_ips(api, "decode")}
        targets = {"router": router} | {
            f"{role}-{n}": f"http://{ip}:8000" for role, ips in engines.items() for n, ip in enumerate(ips)
        }
        say(f"Ready ({time.monotonic() - began:.0f}s): router {router}, engines {engines}")
        asyncio.run(warm_up(router))
        pids = cluster_processes(cdir.marker)
        before = {k: proc_stat(p) for k, p in pids.items()}
        scraped = asyncio.run(scrape(targets))
        client_before = time.process_time()
        busy0, total0 = machine_busy()
        wall = requests[-1].at * args.time_scale if requests else 0.0
        say(
            f"replaying {len(requests)} requests over ~{wall:.0f} s "
            f"(TANDEM_SIM_TIME_SCALE={args.time_scale:g})"
        )
        t0 = time.monotonic()
        samples = asyncio.run(replay(router, requests, args.time_scale))
        replay_s = time.monotonic() - t0
        busy1, total1 = machine_busy()
        cpu: dict[str, Any] = {
            "machine_cpus": os.cpu_count(),
            "machine_busy_fraction": (busy1 - busy0) / (total1 - total0) if total1 > total0 else math.nan,
            "load_average_1m": os.getloadavg()[0],
            "client_cpu_s": time.process_time() - client_before,
        }
        for key, pid in pids.items():
            a, b = before.get(key), proc_stat(pid)
            if a and b:
                cpu[f"{key}_cpu_s"] = b.cpu_s - a.cpu_s
                cpu[f"{key}_runqueue_wait_s"] = b.wait_s - a.wait_s
        pods = pod_means(scraped, asyncio.run(scrape(targets)), args.time_scale)
        return {
            "samples": samples,
            "replay_wall_s": replay_s,
            "cpu": cpu,
            "pods": pods,
            "router": router,
        }
    finally:
        if api is not None:
            kube.close(api)
        if operator is not None:
            operator.stop()
        say("stopping the cluster")
        devcluster.down(cdir, quiet=True)


# --- the report ----------------------------------------------------------------------------------------
def report(args: argparse.Namespace, requests: Sequence[Req], live: dict[str, Any]) -> dict[str, Any]:
    scale = float(live["time_scale"])
    samples = live["samples"]
    kv_gbps = float(live["kv_gbps"])
    sim_ttft, sim_tpot = simulate(requests, live["decode"], kv_gbps)
    # Figures over the requests that succeeded live (the simulator serves all of them).
    keep = [i for i, s in enumerate(samples) if not s[2]]
    live_ttft = [samples[i][0] / scale for i in keep]
    live_tpot = [samples[i][1] / scale for i in keep]
    s_ttft = [sim_ttft[i] for i in keep]
    s_tpot = [sim_tpot[i] for i in keep]
    live_fig, sim_fig = figures(live_ttft, live_tpot), figures(s_ttft, s_tpot)
    rows = compare(live_fig, sim_fig)
    errors = [s[2] for s in samples if s[2]]
    return {
        "settings": {
            "trace": str(TRACE.relative_to(ROOT)),
            "window_start_s": live["window_start_s"],
            "window_seconds": live["window_seconds"],
            "rate_scale": live["rate_scale"],
            "requests": len(requests),
            "arrival_rate_per_s": len(requests) / requests[-1].at if len(requests) > 1 else math.nan,
            "mean_prompt_tokens": statistics.fmean(r.prompt for r in requests),
            "mean_output_tokens": statistics.fmean(r.output for r in requests),
            "time_scale": scale,
            "layout": f"1 prefill + {live['decode']} decode, TP1, {GPU} {MODEL_ID}, router 1 replica",
            "kv_bandwidth_gbps": kv_gbps,
            "engine_env": list(live.get("engine_env") or []),
            "units": "H100 ms (live wall-clock figures divided by the time scale)",
        },
        "live_ok": len(keep),
        "live_failed": len(errors),
        "live_errors": sorted(set(errors))[:5],
        "table": [asdict(r) for r in rows],
        "pass": all(r.ok for r in rows) and not errors,
        "gap": {"ttft": paired_gap(live_ttft, s_ttft), "tpot": paired_gap(live_tpot, s_tpot)},
        "means": {
            "live_ttft_ms": _mean_ms(live_ttft),
            "sim_ttft_ms": _mean_ms(s_ttft),
            "live_tpot_ms": _mean_ms(live_tpot),
            "sim_tpot_ms": _mean_ms(s_tpot),
        },
        "ttft_breakdown": ttft_breakdown(
            _mean_ms(live_ttft), live["pods"], modelled_kv_ms([requests[i] for i in keep], kv_gbps), scale
        ),
        "machine": live["cpu"],
        "pods": live["pods"],
        "replay_wall_s": live["replay_wall_s"],
        "live_samples": samples,
    }


def modelled_kv_ms(requests: Sequence[Req], kv_gbps: float) -> float:
    """Mean modelled KV transfer (H100 ms) of these requests' prompts at `kv_gbps`, TP1."""
    from tandem.perf import kv_transfer_seconds, model_arch

    per_token = model_arch(MODEL_ID).kv_bytes_per_token_per_gpu(1)
    seconds = [kv_transfer_seconds(r.prompt, per_token, kv_gbps) for r in requests]
    return statistics.fmean(seconds) * 1000 if seconds else math.nan


def ttft_breakdown(
    client_ttft_ms: float, pods: Mapping[str, Mapping[str, Any]], kv_modelled_ms: float, scale: float
) -> dict[str, float]:
    """Where the mean live TTFT goes (H100 ms; `*_wall_ms` on the wall clock), from the pods' own
    histograms over the replay: the engines' TTFT (arrival at the engine to its first token) and three
    hops outside them (client <-> router; router -> prefill -> router; router -> decode -> router)."""

    def mean(pod: Mapping[str, Any], key: str) -> float:
        return float(pod.get(f"{key}_mean_ms", math.nan))

    def weighted(prefix: str, key: str) -> float:
        rows = [(mean(v, key), v.get(f"{key}_count", 0)) for k, v in pods.items() if k.startswith(prefix)]
        total = sum(c for _, c in rows)
        return sum(m * c for m, c in rows) / total if total else math.nan

    router = pods.get("router", {})
    r_ttft, r_prefill = mean(router, "time_to_first_token"), mean(router, "prefill_leg")
    p_ttft, d_ttft = weighted("prefill", "time_to_first_token"), weighted("decode", "time_to_first_token")
    hops = {
        "client_router_ms": client_ttft_ms - r_ttft,
        "router_prefill_hop_ms": r_prefill - p_ttft,
        "router_decode_hop_ms": (r_ttft - r_prefill) - d_ttft,
    }
    out = {
        "client_ttft_ms": client_ttft_ms,
        "prefill_engine_ttft_ms": p_ttft,
        "decode_engine_ttft_ms": d_ttft,
        "engines_ms": p_ttft + d_ttft,
        **hops,
        "hops_ms": sum(hops.values()),
        "kv_pull_measured_ms": weighted("decode", "nixl_xfer_time"),
        "kv_pull_modelled_ms": kv_modelled_ms,
    }
    out.update({f"{k[:-3]}_wall_ms": v * scale for k, v in hops.items()})
    out["hops_wall_ms"] = out["hops_ms"] * scale
    return out


def _mean_ms(values: Sequence[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return statistics.fmean(clean) * 1000 if clean else math.nan


def _finite(obj: Any) -> Any:
    """The result with NaN as null (strict JSON)."""
    if isinstance(obj, float):
        return None if math.isnan(obj) else obj
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def print_report(result: dict[str, Any]) -> None:
    s = result["settings"]
    print()
    print(
        f"Azure conversation trace t={s['window_start_s']:g}s+{s['window_seconds']:g}s, "
        f"rate x{s['rate_scale']:g}: {s['requests']} requests ({s['arrival_rate_per_s']:.2f}/s modelled), "
        f"mean {s['mean_prompt_tokens']:.0f} prompt / {s['mean_output_tokens']:.0f} output tokens"
    )
    print(
        f"{s['layout']}; KV {s['kv_bandwidth_gbps']:g} Gb/s; TANDEM_SIM_TIME_SCALE={s['time_scale']:g}"
        + (f"; engine env {' '.join(s['engine_env'])}" if s.get("engine_env") else "")
    )
    print(f"live: {result['live_ok']} ok, {result['live_failed']} failed {result['live_errors'] or ''}")
    print(f"figures in {s['units']}")
    print(format_table([Row(**r) for r in result["table"]]))
    for what in ("ttft", "tpot"):
        g = result["gap"][what]
        if g.get("n"):
            print(
                f"paired {what.upper()} live - sim per request: median {g['median_ms']:+.2f} ms "
                f"(p10 {g['p10_ms']:+.2f}, p90 {g['p90_ms']:+.2f}, mean {g['mean_ms']:+.2f}; n={g['n']})"
            )
    m = result["machine"]
    cpu = ", ".join(f"{k} {v:.2f}" for k, v in m.items() if isinstance(v, float))
    print(f"machine during the replay ({result['replay_wall_s']:.0f} s): {cpu}")
    b = result["ttft_breakdown"]
    print(
        f"mean TTFT {b['client_ttft_ms']:.2f} = engines {b['engines_ms']:.2f} (prefill "
        f"{b['prefill_engine_ttft_ms']:.2f} + decode {b['decode_engine_ttft_ms']:.2f}, whose KV pull took "
        f"{b['kv_pull_measured_ms']:.2f}, modelled {b['kv_pull_modelled_ms']:.2f}) + hops {b['hops_ms']:.2f} "
        f"(client-router {b['client_router_ms']:.2f}, prefill hop {b['router_prefill_hop_ms']:.2f}, "
        f"decode hop {b['router_decode_hop_ms']:.2f}; {b['hops_wall_ms']:.1f} ms on the wall clock)"
    )
    means = result["means"]
    print(
        f"means: TTFT live {means['live_ttft_ms']:.2f} sim {means['sim_ttft_ms']:.2f}, "
        f"TPOT live {means['live_tpot_ms']:.3f} sim {means['sim_tpot_ms']:.3f} (H100 ms); "
        "the pods' own histograms over the replay (means, H100 ms) and step lag (wall ms):"
    )
    for name, e in result["pods"].items():
        print(
            f"  {name}: "
            + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in e.items())
        )
    print("PASS" if result["pass"] else "FAIL", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a 15 s window (about 70 requests)")
    p.add_argument("--window-start", type=float, default=600.0, help="trace second to start at")
    p.add_argument("--window-seconds", type=float, default=None, help="seconds of trace (default 40)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="arrival-rate factor on the trace")
    p.add_argument("--time-scale", type=float, default=8.0, help="TANDEM_SIM_TIME_SCALE of the engines")
    p.add_argument(
        "--decode", type=int, default=1, help="decode replicas (1 removes the router's random pick)"
    )
    p.add_argument(
        "--kv-gbps",
        type=float,
        default=KV_BANDWIDTH_GBPS,
        help="P->D KV link speed, live and simulated (a huge value takes KV transfer out of both)",
    )
    p.add_argument(
        "--engine-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra environment variable for the engines (repeatable), e.g. TANDEM_SIM_* settings",
    )
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--reuse-live", action="store_true", help="re-simulate the live run saved in --out")
    args = p.parse_args(argv)
    if args.window_seconds is None:
        args.window_seconds = 15.0 if args.quick else 40.0
    if args.time_scale <= 0:
        p.error("--time-scale must be positive")
    if any("=" not in e or not e.partition("=")[0] for e in args.engine_env):
        p.error("--engine-env takes NAME=VALUE")

    if args.reuse_live:
        previous = json.loads(args.out.read_text())
        s = previous["settings"]
        requests = load_window(s["window_start_s"], s["window_seconds"], s["rate_scale"])
        decode = int(re.search(r"(\d+) decode", s["layout"]).group(1))  # type: ignore[union-attr]
        live = {
            "samples": [(_nan(a), _nan(b), e) for a, b, e in previous["live_samples"]],
            "time_scale": s["time_scale"],
            "decode": decode,
            "window_start_s": s["window_start_s"],
            "window_seconds": s["window_seconds"],
            "rate_scale": s["rate_scale"],
            "kv_gbps": s["kv_bandwidth_gbps"],
            "engine_env": s.get("engine_env", []),
            "cpu": previous["machine"],
            "pods": previous["pods"],
            "replay_wall_s": previous["replay_wall_s"],
        }
    else:
        requests = load_window(args.window_start, args.window_seconds, args.rate_scale)
        if not requests:
            raise SystemExit("no requests in that trace window")
        live = run_live(args, requests)
        live.update(
            time_scale=args.time_scale,
            decode=args.decode,
            window_start_s=args.window_start,
            window_seconds=args.window_seconds,
            rate_scale=args.rate_scale,
            kv_gbps=args.kv_gbps,
            engine_env=args.engine_env,
        )
    result = report(args, requests, live)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_finite(result), indent=1))
    print_report(result)
    say(f"written to {args.out}")
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
