"""Soak: the Azure conversation trace through the operator-deployed stack for `--minutes`, with a
fault every `--fault-every` seconds, and checks that nothing leaks and no request is lost.

Starts a dev cluster (or uses the one named by TANDEM_KUBECONFIG), the CRD and `tandem operator` as a
local process (`RestartableOperator`, fixed identity), and applies a sim PDDeployment: 2 prefill, 2
decode and 2 router pods, run by the dev cluster's pod runner as local processes on loopback pod IPs.
The trace (e2e/traces/azure-llm-2023, conversation) is replayed from its start at `--rate-scale`
times its arrival rate (0.3: 1.3 requests/s over the first 30 minutes, answers of ~280 tokens),
streamed, all to one Ready router pod until it is deleted, then to another Ready one not being
deleted (the dev cluster has no kube-proxy to spread them). The faults rotate through:

- `operator`: the operator killed -9 and restarted (it renews its own lease and resumes);
- `decode`: a decode pod deleted (the StatefulSet recreates it);
- `prefill`: a prefill pod deleted;
- `router`: a router pod deleted (the Deployment makes a new one; the old one drains).

Every `--report-every` seconds a row: elapsed time, requests sent / ok / failed (by reason) / in
flight, the operator's RSS and asyncio task count (`tandem_operator_asyncio_tasks`), each router pod's
RSS (its process's, from the pod runner's containerID `tandem://<pid>`) and asyncio task count
(`tandem_router_asyncio_tasks`), and each engine pod's `tandem:kv_held_blocks`.

At the end, once the load has stopped and the stack is quiet, the checks (exit 1 if one fails):

- every request accounted for: sent == ok + failed, none in flight, none still pending;
- every failure is one the router's failure rules allow (docs/router.md) and finished within a
  fault's window (from the fault to `--grace` seconds after the stack recovered from it): a decode
  pod's deletion may cut streams it was serving (an error event: `stream_error`); a router pod's
  deletion may fail requests sent to it (connection refused or reset, 503 while it drains). The
  operator's crash and a prefill pod's deletion allow none (the router retries prefill elsewhere);
- zero KV held (`tandem:kv_held_blocks`, `tandem:kv_held_requests`) on every engine pod, and no
  request in flight at the routers (`tandem_router_in_flight_requests`,
  `tandem_router_upstream_in_flight_requests`), within `--quiet-timeout` seconds of the last
  request (a held KV's lease is 30 s);
- asyncio task counts back to their idle baseline (+ `--task-slack`): the operator's and each
  router's, read before the load started and again once quiet;
- RSS: the largest reading under `--max-rss-mb`, and (only for runs of 10 minutes or more) the
  slope over the second half under `--max-rss-slope` MB/hour: a least-squares slope common to all
  processes of a kind with one intercept per process (the faults restart the operator and the
  routers, so a fresh process's lower RSS is not read as a fall), each process's first
  `--warmup` seconds left out.

Settings (stated, compressed for a shared 2-core machine): sim engine at TANDEM_SIM_TIME_SCALE=1
with a 3 s model load, operator resync 20 s, requests time out after 120 s.

    nice -n 15 .venv/bin/python bench/soak.py [--minutes 30] [--fault-every 60] [--report-every 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes import client

from tandem.api import meta
from tandem.demo import trace
from tandem.demo.load import one_request
from tandem.demo.stats import Sample, Tally
from tandem.demo.trace import TraceRequest
from tandem.devcluster import cluster as devcluster
from tandem.devcluster import kube, layout
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import RestartableOperator, eventually, metric_total, pods, scratch_namespace

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "e2e" / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
NAME = "soak"
MODEL = "llama-3.1-8b"
IMAGE = "ghcr.io/tandem-dev/tandem:0.1.0"
MAX_MODEL_LEN = 4096
FAULTS: tuple[str, ...] = ("operator", "decode", "prefill", "router")
# What a client may see from each fault, under the router's failure rules (docs/router.md).
ALLOWED: dict[str, frozenset[str]] = {
    "operator": frozenset(),  # the data plane does not depend on the operator
    "prefill": frozenset(),  # a failed prefill leg is retried on another prefill pod
    "decode": frozenset({"stream_error"}),  # a stream cut after bytes reached the client
    "router": frozenset({"connect", "disconnected", "http_503"}),  # sent to the router that went
}


@dataclasses.dataclass(frozen=True)
class Settings:
    minutes: float = 30.0
    fault_every: float = 60.0
    report_every: float = 30.0
    rate_scale: float = 0.3
    grace: float = 30.0
    quiet_timeout: float = 150.0
    request_timeout: float = 120.0
    task_slack: int = 3
    max_rss_mb: float = 400.0
    max_rss_slope: float | None = 30.0  # MB/hour; None: not checked (runs under 10 minutes)
    warmup: float = 60.0
    last_fault_margin: float = 20.0  # no fault starts later than this before the load ends
    recover_timeout: float = 180.0  # the stack whole again after a fault within this
    prefill_policy: str = ""  # spec.router.prefillPolicy ("": the default, PrefixAware)
    prefill: int = 2
    decode: int = 2
    routers: int = 2


@dataclasses.dataclass(frozen=True)
class Finished:
    sample: Sample
    finished_at: float  # wall clock
    reason: str  # "ok" or the failure's class


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    at: float  # wall clock
    recovered_at: float  # the stack whole again (and a deleted pod gone)


@dataclasses.dataclass(frozen=True)
class Reading:
    """One row: wall-clock time and what the sampler read (None: could not be read)."""

    at: float
    sent: int
    ok: int
    failed: dict[str, int]
    in_flight: int
    operator_pid: int | None
    operator_rss_mb: float | None
    operator_tasks: float | None
    routers: dict[str, tuple[int | None, float | None, float | None]]  # pod -> (pid, RSS MB, tasks)
    kv_held: dict[str, float | None]  # engine pod -> tandem:kv_held_blocks


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclasses.dataclass
class Result:
    settings: Settings
    started_at: float
    readings: list[Reading]
    faults: list[Fault]
    finished: list[Finished]
    sent: int
    baseline_tasks: dict[str, float]
    quiet_tasks: dict[str, float]
    quiet_after_s: float
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks)


# ---------------------------------------------------------------------------------------------------
# Pure parts: failure classes, fault windows, slopes.


def failure_reason(sample: Sample) -> str:
    """The class of a finished request: ok, or why it failed, from the client's error text."""
    if sample.ok:
        return "ok"
    error = sample.error
    if match := re.match(r"HTTP (\d{3})", error):
        return f"http_{match.group(1)}"
    if error.startswith(("ClientConnectorError", "ClientConnectionError", "ClientOSError")):
        return "connect"
    if error.startswith(("ServerDisconnectedError", "ClientPayloadError")):
        return "disconnected"
    if error.startswith("TimeoutError"):
        return "timeout"
    if error == "stream ended without a token":
        return "no_token"
    if error.startswith("{"):
        return "stream_error"  # an {"error": {...}} event in a 200 stream (the inner object's text)
    return "other"


def unexplained(finished: Sequence[Finished], faults: Sequence[Fault], grace: float) -> list[Finished]:
    """Failed requests that no fault explains: finished outside every fault's window, or of a class
    that fault does not allow (ALLOWED)."""
    out = []
    for f in finished:
        if f.reason == "ok":
            continue
        if not any(
            fault.at <= f.finished_at <= fault.recovered_at + grace and f.reason in ALLOWED[fault.kind]
            for fault in faults
        ):
            out.append(f)
    return out


def pooled_slope(points: Sequence[tuple[int, float, float]]) -> float:
    """The least-squares slope of value over time common to all groups, each group with its own
    intercept (points: (group, t, value)); nan with fewer than two distinct times in any group."""
    groups: dict[int, list[tuple[float, float]]] = {}
    for group, t, v in points:
        groups.setdefault(group, []).append((t, v))
    num = den = 0.0
    for pts in groups.values():
        mt = sum(t for t, _ in pts) / len(pts)
        mv = sum(v for _, v in pts) / len(pts)
        num += sum((t - mt) * (v - mv) for t, v in pts)
        den += sum((t - mt) ** 2 for t, _ in pts)
    return num / den if den > 0 else math.nan


def rss_points(
    readings: Sequence[Reading], kind: str, since: float, warmup: float
) -> list[tuple[int, float, float]]:
    """(pid, seconds, MB) of the operator's or the routers' readings at or after `since`, leaving out
    each process's first `warmup` seconds (measured from its first reading)."""
    raw: list[tuple[int, float, float]] = []
    for r in readings:
        if kind == "operator":
            if r.operator_pid is not None and r.operator_rss_mb is not None:
                raw.append((r.operator_pid, r.at, r.operator_rss_mb))
        else:
            raw += [
                (pid, r.at, mb) for pid, mb, _ in r.routers.values() if pid is not None and mb is not None
            ]
    first: dict[int, float] = {}
    for pid, at, _ in raw:
        first.setdefault(pid, at)
    return [(pid, at, mb) for pid, at, mb in raw if at >= since and at >= first[pid] + warmup]


def trace_requests(minutes: float, rate_scale: float) -> list[TraceRequest]:
    """The conversation trace from its start, re-timed to `rate_scale` of its rate, for `minutes`."""
    rows = trace.parse_azure_csv(TRACE.read_text())
    return trace.window(
        rows,
        start_s=0.0,
        length_s=minutes * 60 * rate_scale,
        rate_scale=rate_scale,
        max_model_len=MAX_MODEL_LEN,
    )


# ---------------------------------------------------------------------------------------------------
# The stack: manifest, readers of pods and metrics.


def manifest(s: Settings) -> dict[str, Any]:
    resources = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}
    return {
        "apiVersion": meta.API_VERSION,
        "kind": meta.KIND,
        "metadata": {"name": NAME},
        "spec": {
            "model": {
                "name": MODEL,
                "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
                "maxModelLen": MAX_MODEL_LEN,
            },
            "engine": {
                "type": "sim",
                "image": IMAGE,
                "env": [
                    {"name": "TANDEM_SIM_TIME_SCALE", "value": "1"},
                    {"name": "TANDEM_SIM_LOAD_SECONDS", "value": "3"},
                ],
            },
            "kvTransfer": {"connector": "NixlConnector", "bandwidthGbps": 100},
            "serving": {"mode": "Disaggregated"},
            "prefill": {"replicas": s.prefill, "resources": resources},
            "decode": {"replicas": s.decode, "resources": resources},
            "router": {"replicas": s.routers, "image": IMAGE}
            | ({"prefillPolicy": s.prefill_policy} if s.prefill_policy else {}),
        },
    }


def pid_of(pod: dict[str, Any]) -> int | None:
    """The local process the dev cluster's runner runs for `pod` (containerID `tandem://<pid>`)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if match := re.fullmatch(r"tandem://(\d+)", str(status.get("containerID") or "")):
            return int(match.group(1))
    return None


def rss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) / 1024 if match else None


def scrape(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text: str = response.read().decode()
        return text


class Stack:
    """The soak's PDDeployment in `namespace`: its pods, the router URL to send to, its metrics."""

    def __init__(self, handle: ClusterHandle, namespace: str, operator: RestartableOperator) -> None:
        self.handle, self.namespace, self.operator = handle, namespace, operator
        self.api = handle.api_client()
        self.core = client.CoreV1Api(self.api)
        self._router_url = ""
        self._lock = threading.Lock()

    def close(self) -> None:
        kube.close(self.api)

    def pods(self, role: str) -> list[dict[str, Any]]:
        return pods(self.core, self.namespace, f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}={role}")

    def serving(self, role: str) -> list[dict[str, Any]]:
        """Ready pods of `role` not being deleted."""
        return [
            p
            for p in self.pods(role)
            if kube.is_ready(p) and not p["metadata"].get("deletionTimestamp") and p["status"].get("podIP")
        ]

    def pdd_ready(self) -> bool:
        obj = kube.raw(
            client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                meta.GROUP, meta.VERSION, self.namespace, meta.PLURAL, NAME, _preload_content=False
            )
        )
        conds = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
        return conds.get("Ready") == "True" and obj["status"].get("observedGeneration") == obj[
            "metadata"
        ].get("generation")

    def whole(self, s: Settings) -> bool:
        sizes = {"prefill": s.prefill, "decode": s.decode, "router": s.routers}
        return all(len(self.serving(role)) == n for role, n in sizes.items()) and self.pdd_ready()

    def refresh_router(self) -> None:
        """Points the load at a serving router pod (keeps the current one while it still serves)."""
        ips = sorted(p["status"]["podIP"] for p in self.serving("router"))
        with self._lock:
            current = self._router_url.split("//")[-1].split(":")[0]
            if ips and current not in ips:
                self._router_url = f"http://{ips[0]}:{meta.ROUTER_PORT}"

    def router_url(self) -> str:
        with self._lock:
            return self._router_url

    def operator_reading(self) -> tuple[int | None, float | None, float | None]:
        proc = self.operator.current.proc
        pid = proc.pid if proc.poll() is None else None
        mb = rss_mb(pid) if pid is not None else None
        try:
            tasks: float | None = metric_total(self.operator.metrics(), "tandem_operator_asyncio_tasks")
        except OSError:
            tasks = None
        return pid, mb, tasks

    def router_readings(self) -> dict[str, tuple[int | None, float | None, float | None]]:
        out: dict[str, tuple[int | None, float | None, float | None]] = {}
        for pod in self.pods("router"):
            pid = pid_of(pod)
            ip = (pod.get("status") or {}).get("podIP")
            tasks: float | None = None
            if ip:
                with contextlib.suppress(OSError):
                    tasks = metric_total(
                        scrape(f"http://{ip}:{meta.ROUTER_PORT}/metrics"), "tandem_router_asyncio_tasks"
                    )
            out[pod["metadata"]["name"]] = (pid, rss_mb(pid) if pid else None, tasks)
        return out

    def router_in_flight(self) -> float:
        """Requests and legs in flight at every router pod (raises while one cannot be read)."""
        total = 0.0
        for pod in self.serving("router"):
            text = scrape(f"http://{pod['status']['podIP']}:{meta.ROUTER_PORT}/metrics")
            total += metric_total(text, "tandem_router_in_flight_requests")
            total += metric_total(text, "tandem_router_upstream_in_flight_requests")
        return total

    def engine_metrics(self, *names: str) -> dict[str, dict[str, float | None]]:
        """Each engine pod's value of each metric (None where /metrics could not be read)."""
        out: dict[str, dict[str, float | None]] = {}
        for role in ("prefill", "decode"):
            for pod in self.pods(role):
                ip = (pod.get("status") or {}).get("podIP")
                values: dict[str, float | None] = dict.fromkeys(names)
                if ip:
                    with contextlib.suppress(OSError):
                        text = scrape(f"http://{ip}:{meta.ENGINE_PORT}/metrics")
                        values = {n: metric_total(text, n) for n in names}
                out[pod["metadata"]["name"]] = values
        return out


# ---------------------------------------------------------------------------------------------------
# Load: the trace replayed, each request to the router the stack points at when it is sent.


class TraceLoad:
    """Replays `requests` at their times from a thread of its own; every request sent becomes a
    `Finished` (the sample, when it ended, its class). `url()` is read for each request."""

    def __init__(
        self,
        url: Callable[[], str],
        requests: Sequence[TraceRequest],
        request_timeout: float,
        max_in_flight: int = 64,
    ) -> None:
        self.url, self.requests = url, list(requests)
        self.request_timeout, self.max_in_flight = request_timeout, max_in_flight
        self.tally = Tally()
        self.finished: list[Finished] = []
        self.error: BaseException | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-load", daemon=True)

    def start(self) -> TraceLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        return self.tally.sent - len(self.finished)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by the caller
            self.error = exc

    async def _main(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout, sock_connect=5)
        limit = asyncio.Semaphore(self.max_in_flight)
        connector = aiohttp.TCPConnector(limit=self.max_in_flight)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

            async def run(index: int, req: TraceRequest) -> None:
                async with limit:
                    sample = await one_request(session, self.url(), MODEL, index, req)
                self.tally.add(sample)
                self.finished.append(Finished(sample, time.time(), failure_reason(sample)))

            start = time.monotonic()
            tasks = []
            for index, req in enumerate(self.requests):
                delay = start + req.at - time.monotonic()
                if delay > 0:
                    await asyncio.to_thread(self._stopping.wait, delay)
                if self._stopping.is_set():
                    break
                self.tally.sent += 1
                tasks.append(asyncio.create_task(run(index, req)))
            await asyncio.gather(*tasks)


# ---------------------------------------------------------------------------------------------------
# Faults and the sampler.


class Faults:
    def __init__(
        self, stack: Stack, settings: Settings, started_at: float, say: Callable[[str], None]
    ) -> None:
        self.stack, self.settings, self.started_at, self.say = stack, settings, started_at, say
        self.done: list[Fault] = []
        self._turn = 0

    def next(self) -> Fault:
        kind = FAULTS[self._turn % len(FAULTS)]
        nth = self._turn // len(FAULTS)
        self._turn += 1
        at = time.time()
        if kind == "operator":
            target = f"pid {self.stack.operator.current.proc.pid}"
            self.stack.operator.crash_and_restart(timeout=120)
            gone: Callable[[], bool] = lambda: True  # noqa: E731
        else:
            candidates = sorted(self.stack.serving(kind), key=lambda p: str(p["metadata"]["name"]))
            if not candidates:
                raise AssertionError(f"no serving {kind} pod to delete")
            pod = candidates[nth % len(candidates)]
            target, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
            self.stack.core.delete_namespaced_pod(target, self.stack.namespace)
            gone = lambda: all(p["metadata"]["uid"] != uid for p in self.stack.pods(kind))  # noqa: E731
        try:
            eventually(
                lambda: gone() and self.stack.whole(self.settings),
                timeout=self.settings.recover_timeout,
                interval=1.0,
                what=f"the stack whole again after the {kind} fault",
            )
            fault = Fault(kind, target, at, time.time())
        except AssertionError as exc:
            # Not whole again: a failed check (no more faults are injected), not a crash of the run.
            fault = Fault(kind, target, at, math.nan)
            self.say(f"NOT RECOVERED: {exc}")
        self.done.append(fault)
        self.say(
            f"fault {len(self.done)} at +{(at - self.started_at) / 60:.1f}m: {kind} {target}; "
            f"whole again in {fault.recovered_at - at:.1f}s"
        )
        return fault

    @property
    def stuck(self) -> bool:
        return any(math.isnan(f.recovered_at) for f in self.done)


class Sampler:
    """Reads a row every `period` seconds in a thread and prints it."""

    def __init__(
        self, stack: Stack, load: TraceLoad, started_at: float, period: float, say: Callable[[str], None]
    ) -> None:
        self.stack, self.load, self.started_at, self.period, self.say = stack, load, started_at, period, say
        self.readings: list[Reading] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def read(self) -> Reading:
        finished = list(self.load.finished)
        failed = Counter(f.reason for f in finished if f.reason != "ok")
        pid, mb, tasks = self.stack.operator_reading()
        kv = {
            pod: v["tandem:kv_held_blocks"]
            for pod, v in self.stack.engine_metrics("tandem:kv_held_blocks").items()
        }
        return Reading(
            at=time.time(),
            sent=self.load.tally.sent,
            ok=len(finished) - sum(failed.values()),
            failed=dict(failed),
            in_flight=self.load.tally.sent - len(finished),
            operator_pid=pid,
            operator_rss_mb=mb,
            operator_tasks=tasks,
            routers=self.stack.router_readings(),
            kv_held=kv,
        )

    def sample(self) -> Reading:
        reading = self.read()
        self.readings.append(reading)
        self.say(row(reading, self.started_at))
        return reading

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.sample()
            except Exception as exc:  # a row missed is said, not fatal
                self.say(f"(sampler: {type(exc).__name__}: {exc})")


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None or math.isnan(value) else fmt.format(value)


def row(r: Reading, started_at: float) -> str:
    failed = ",".join(f"{k}={v}" for k, v in sorted(r.failed.items())) or "0"
    routers = " ".join(
        f"{name.rsplit('-', 1)[-1]}:{_num(mb, '{:.0f}')}MB/{_num(tasks)}t"
        for name, (_, mb, tasks) in sorted(r.routers.items())
    )
    kv = " ".join(f"{name.removeprefix(NAME + '-')}={_num(v)}" for name, v in sorted(r.kv_held.items()))
    return (
        f"{(r.at - started_at) / 60:6.1f}m sent {r.sent:5d} ok {r.ok:5d} failed {failed:<12} "
        f"in-flight {r.in_flight:3d} | operator {_num(r.operator_rss_mb, '{:.0f}')}MB "
        f"{_num(r.operator_tasks)}t | routers {routers} | kv held {kv}"
    )


# ---------------------------------------------------------------------------------------------------
# The run.


def baseline_tasks(stack: Stack, reads: int = 5) -> dict[str, float]:
    """The floor (fewest over `reads` reads, a second apart) of the operator's and each router's
    asyncio task count: passes in progress add tasks for a moment; a leak raises the floor."""
    seen: dict[str, list[float]] = {}
    for i in range(reads):
        if i:
            time.sleep(1)
        _, _, op = stack.operator_reading()
        if op is not None and not math.isnan(op):
            seen.setdefault("operator", []).append(op)
        for name, (_, _, tasks) in stack.router_readings().items():
            if tasks is not None and not math.isnan(tasks):
                seen.setdefault(f"router/{name}", []).append(tasks)
    return {k: min(v) for k, v in seen.items()}


def tasks_by_kind(tasks: dict[str, float]) -> dict[str, float]:
    """The operator's count, and the largest count of any router ("router")."""
    out = {k: v for k, v in tasks.items() if k == "operator"}
    routers = [v for k, v in tasks.items() if k.startswith("router/")]
    if routers:
        out["router"] = max(routers)
    return out


def checks(result: Result, load: TraceLoad, quiet: dict[str, Any]) -> list[Check]:
    s = result.settings
    out: list[Check] = []
    finished = result.finished
    ok = sum(1 for f in finished if f.reason == "ok")
    failed = Counter(f.reason for f in finished if f.reason != "ok")
    out.append(
        Check(
            "every request accounted for",
            load.error is None and result.sent == ok + sum(failed.values()) and result.sent > 0,
            f"sent {result.sent} = ok {ok} + failed {sum(failed.values())} {dict(failed)}; "
            f"in flight {result.sent - len(finished)}"
            + (f"; load error {load.error!r}" if load.error else ""),
        )
    )
    unrecovered = [f for f in result.faults if math.isnan(f.recovered_at)]
    recoveries = [f.recovered_at - f.at for f in result.faults if not math.isnan(f.recovered_at)]
    out.append(
        Check(
            "the stack whole again after every fault",
            not unrecovered and len(result.faults) > 0,
            f"{len(result.faults)} faults, whole again in {min(recoveries, default=math.nan):.1f}-"
            f"{max(recoveries, default=math.nan):.1f}s"
            + "".join(
                f"; NOT after {f.kind} {f.target} at +{f.at - result.started_at:.0f}s" for f in unrecovered
            ),
        )
    )
    stray = unexplained(finished, result.faults, s.grace)
    out.append(
        Check(
            "failures only as the router's rules allow around a fault",
            not stray,
            f"{len(stray)} unexplained"
            + "".join(
                f"\n      {f.reason} at +{f.finished_at - result.started_at:.0f}s: {f.sample.error}"
                for f in stray[:10]
            ),
        )
    )
    out.append(
        Check(
            "zero KV held and nothing in flight at the routers once quiet",
            bool(quiet.get("quiet")),
            f"after {result.quiet_after_s:.0f}s: {quiet.get('detail', '')}",
        )
    )
    base, now = tasks_by_kind(result.baseline_tasks), tasks_by_kind(result.quiet_tasks)
    task_ok = set(base) == {"operator", "router"} and all(
        kind in now and now[kind] <= base[kind] + s.task_slack for kind in base
    )
    out.append(
        Check(
            "asyncio task counts back to their idle baseline",
            task_ok,
            f"baseline {base}, once quiet {now} (slack {s.task_slack})",
        )
    )
    peaks: dict[str, float] = {}
    for r in result.readings:
        if r.operator_rss_mb is not None:
            peaks["operator"] = max(peaks.get("operator", 0.0), r.operator_rss_mb)
        for _, mb, _ in r.routers.values():
            if mb is not None:
                peaks["router"] = max(peaks.get("router", 0.0), mb)
    out.append(
        Check(
            f"RSS under {s.max_rss_mb:.0f} MB",
            set(peaks) == {"operator", "router"} and all(v < s.max_rss_mb for v in peaks.values()),
            "peak " + ", ".join(f"{k} {v:.1f} MB" for k, v in sorted(peaks.items())),
        )
    )
    half = result.started_at + s.minutes * 30
    slopes = {
        kind: pooled_slope(rss_points(result.readings, kind, half, s.warmup)) * 3600
        for kind in ("operator", "router")
    }
    text = ", ".join(f"{k} {v:+.1f} MB/hour" for k, v in slopes.items())
    if s.max_rss_slope is None:
        out.append(Check("RSS slope (second half; not checked in a short run)", True, text))
    else:
        out.append(
            Check(
                f"RSS slope over the second half under {s.max_rss_slope:g} MB/hour",
                all(not math.isnan(v) and v < s.max_rss_slope for v in slopes.values()),
                text,
            )
        )
    return out


def wait_quiet(stack: Stack, timeout: float) -> dict[str, Any]:
    """Waits until every engine pod holds no KV and the routers have nothing in flight."""
    last: dict[str, Any] = {}

    def quiet() -> bool:
        engines = stack.engine_metrics("tandem:kv_held_blocks", "tandem:kv_held_requests")
        in_flight = stack.router_in_flight()
        last["detail"] = f"engines {engines}; router in flight {in_flight:g}"
        return (
            bool(engines)
            and all(v is not None and v == 0 for values in engines.values() for v in values.values())
            and in_flight == 0
        )

    try:
        eventually(quiet, timeout=timeout, interval=2.0, what="zero KV held and nothing in flight")
        last["quiet"] = True
    except AssertionError as exc:
        last["quiet"] = False
        last.setdefault("detail", str(exc))
    return last


def soak(
    handle: ClusterHandle,
    namespace: str,
    operator: RestartableOperator,
    s: Settings,
    say: Callable[[str], None] = print,
) -> Result:
    """Applies the PDDeployment in `namespace`, runs the load and the faults for `s.minutes`, waits
    until quiet, and returns the readings and the checks."""
    handle.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest(s)))
    stack = Stack(handle, namespace, operator)
    try:
        eventually(lambda: stack.whole(s), timeout=300, interval=2.0, what="the soak PDDeployment Ready")
        stack.refresh_router()
        base = baseline_tasks(stack)
        requests = trace_requests(s.minutes, s.rate_scale)
        say(
            f"soak: {len(requests)} trace requests over {s.minutes:g} min "
            f"(x{s.rate_scale:g} the trace's rate); "
            f"a fault every {s.fault_every:g}s ({', '.join(FAULTS)}); idle tasks {base}"
        )
        started_at = time.time()
        load = TraceLoad(stack.router_url, requests, s.request_timeout).start()
        sampler = Sampler(stack, load, started_at, s.report_every, say).start()
        faults = Faults(stack, s, started_at, say)
        stop_router_watch = threading.Event()

        def follow_routers() -> None:
            while not stop_router_watch.wait(1.0):
                with contextlib.suppress(Exception):
                    stack.refresh_router()

        watcher = threading.Thread(target=follow_routers, name="soak-routers", daemon=True)
        watcher.start()
        end = started_at + s.minutes * 60
        next_fault = started_at + s.fault_every
        try:
            while time.time() < end:
                if time.time() >= next_fault and next_fault + s.last_fault_margin < end and not faults.stuck:
                    faults.next()
                    next_fault = max(next_fault + s.fault_every, time.time() + 5)
                time.sleep(1.0)
            load.stop()
            if not load.join(timeout=s.request_timeout + 30):
                say("load: requests still pending after the request timeout")
            quiet_from = time.time()
            quiet = wait_quiet(stack, s.quiet_timeout)
            quiet_after = time.time() - quiet_from
            quiet_tasks = baseline_tasks(stack)
            sampler.sample()
        finally:
            stop_router_watch.set()
            sampler.stop()
            load.stop()
        result = Result(
            settings=s,
            started_at=started_at,
            readings=sampler.readings,
            faults=faults.done,
            finished=list(load.finished),
            sent=load.tally.sent,
            baseline_tasks=base,
            quiet_tasks=quiet_tasks,
            quiet_after_s=quiet_after,
            checks=[],
        )
        result.checks = checks(result, load, quiet)
        return result
    finally:
        stack.close()


def report(result: Result, say: Callable[[str], None] = print) -> None:
    kinds = Counter(f.kind for f in result.faults)
    recover = [f.recovered_at - f.at for f in result.faults]
    say(
        f"faults: {len(result.faults)} ({dict(kinds)}), whole again in "
        f"{min(recover, default=math.nan):.1f}-{max(recover, default=math.nan):.1f}s"
    )
    ok = [f.sample for f in result.finished if f.reason == "ok"]
    if ok:
        ttft = sorted(x.ttft_s for x in ok)
        p50, p99 = ttft[len(ttft) // 2], ttft[int(len(ttft) * 0.99)]
        say(f"ok requests: {len(ok)}, TTFT p50 {p50:.3f}s p99 {p99:.3f}s")
    for c in result.checks:
        say(f"{'PASS' if c.ok else 'FAIL'} {c.name}: {c.detail}")


def established(api: client.ApiClient) -> bool:
    ext = client.ApiextensionsV1Api(api)
    obj = kube.raw(ext.read_custom_resource_definition(f"{meta.PLURAL}.{meta.GROUP}", _preload_content=False))
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conds)


@contextlib.contextmanager
def operator_for(handle: ClusterHandle) -> Iterator[RestartableOperator]:
    """The CRD applied and a `RestartableOperator` leading a lease of its own."""
    handle.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds" / "pddeployment.yaml")
    )
    api = handle.api_client()
    try:
        # Not `kubectl wait`: it fails at once while the new CRD has no conditions yet.
        eventually(lambda: established(api), timeout=60, what="the PDDeployment CRD Established")
    finally:
        kube.close(api)
    lease = f"tandem-soak-{uuid.uuid4().hex[:6]}"
    logs = Path(tempfile.mkdtemp(prefix="tandem-soak-"))
    operator = RestartableOperator(
        handle,
        ["--resync-seconds", "20", "--lease-namespace", "default", "--lease-name", lease],
        logs,
        identity="soak",
    )
    try:
        operator.current.wait_leader(timeout=120)
        yield operator
    finally:
        operator.stop()
        handle.kubectl("delete", "lease", lease, "-n", "default", check=False)


def run(handle: ClusterHandle, s: Settings, json_out: Path | None) -> int:
    with (
        operator_for(handle) as operator,
        scratch_namespace(handle, f"soak-{uuid.uuid4().hex[:6]}") as namespace,
    ):
        result = soak(handle, namespace, operator, s)
    report(result)
    if json_out is not None:
        doc = {
            "settings": dataclasses.asdict(s),
            "started_at": result.started_at,
            "readings": [dataclasses.asdict(r) for r in result.readings],
            "faults": [dataclasses.asdict(f) for f in result.faults],
            "failures": [
                {"reason": f.reason, "error": f.sample.error, "at": f.finished_at}
                for f in result.finished
                if f.reason != "ok"
            ],
            "checks": [dataclasses.asdict(c) for c in result.checks],
        }
        json_out.write_text(json.dumps(doc))
    return 0 if result.passed else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--fault-every", type=float, default=60.0)
    parser.add_argument("--report-every", type=float, default=30.0)
    parser.add_argument("--rate-scale", type=float, default=0.3)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--quiet-timeout", type=float, default=150.0)
    parser.add_argument("--task-slack", type=int, default=3)
    parser.add_argument("--max-rss-mb", type=float, default=400.0)
    parser.add_argument(
        "--max-rss-slope", type=float, default=30.0, help="MB/hour; checked from 10 minutes up"
    )
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument(
        "--prefill-policy", default="", help="spec.router.prefillPolicy (default: the CRD's, PrefixAware)"
    )
    parser.add_argument(
        "--recover-timeout", type=float, default=180.0, help="seconds for the stack to be whole"
    )
    parser.add_argument(
        "--json-out", type=Path, help="also write the readings, faults and checks here (JSON)"
    )
    a = parser.parse_args()
    s = Settings(
        minutes=a.minutes,
        fault_every=a.fault_every,
        report_every=a.report_every,
        rate_scale=a.rate_scale,
        grace=a.grace,
        quiet_timeout=a.quiet_timeout,
        task_slack=a.task_slack,
        max_rss_mb=a.max_rss_mb,
        max_rss_slope=a.max_rss_slope if a.minutes >= 10 else None,
        warmup=a.warmup,
        recover_timeout=a.recover_timeout,
        prefill_policy=a.prefill_policy,
    )
    if kubeconfig := os.environ.get("TANDEM_KUBECONFIG"):
        sys.exit(run(ClusterHandle.from_kubeconfig(Path(kubeconfig)), s, a.json_out))
    cdir = layout.ClusterDir(Path(tempfile.mkdtemp(prefix="tandem-soak-cluster-")))
    devcluster.up(cdir, owner_pid=os.getpid())
    try:
        code = run(ClusterHandle.from_dir(cdir.path, owned=True), s, a.json_out)
    finally:
        devcluster.down(cdir)
    sys.exit(code)


if __name__ == "__main__":
    main()
