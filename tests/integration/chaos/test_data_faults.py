"""Data-plane faults under load (issue 14, item 1): a decode worker killed -9 mid-stream, a prefill
worker killed -9 mid-prefill, a router pod deleted with no grace.

One sim PDDeployment for the module (`data`: prefill 2, decode 2, router 2, no autoscaling) and
an open-loop streamed load (`tandem.demo.load.BackgroundLoad`) through each router pod at its pod
IP (127.0.0.0/8; the dev cluster has no Service proxy, so "the Service" is the two router pods'
addresses). After every fault, with the load paused, every request sent is accounted for (it came
back ok or with a failure, none hangs, none vanishes), the failures are only those the router's
rules give a client (docs/router.md: a stream cut when its decode pod dies after the first byte;
for a router that dies, the requests it was serving), the worker is back Ready, every engine pod
holds no KV (`tandem:kv_held_blocks` 0), and each role has exactly its two pods (none left over,
each owned by its StatefulSet or ReplicaSet).

The operator runs as a local process watching the module's namespace (resync 10 s).
Compressed settings: sim engines at time scale 1 with a 1 s model load and a 10 s KV lease
(VLLM_NIXL_ABORT_REQUEST_TIMEOUT; vLLM's is 30 s or 480 s); load 6 requests/s per router pod of
64-token prompts and 48 output tokens (streams of about a second, so a kill finds some mid-way),
2000-token prompts for the prefill kill.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from tandem.api import meta
from tandem.demo import e2e as harness
from tandem.demo.load import BackgroundLoad, Phase
from tandem.demo.stats import Sample
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.layout import ClusterDir
from tandem.devcluster.testing import OperatorProcess, eventually, metric_total, scratch_namespace

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

NAME = "data"
LEASE_S = 10
LOAD = Phase(6.0, 64, 48, "steady")
QUIET = Phase(0.0, 1, 1, "quiet")
STRAGGLER_S = 1.0  # how late a request scheduled before the load went quiet may start
LONG_PROMPTS = Phase(6.0, 2000, 16, "long-prompts")
# What the router writes into a stream it ends because its decode pod died after the first byte.
STREAM_CUT = "engine failed mid-answer"


def manifest() -> dict[str, Any]:
    env = [*harness.engine_env(1, 1), {"name": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "value": str(LEASE_S)}]
    spec: dict[str, Any] = {
        "engine": {"type": "sim", "image": harness.IMAGE, "env": env},
        "prefill": harness.pool(2),
        "decode": harness.pool(2),
        "router": {"replicas": 2, "image": harness.IMAGE},
    }
    doc: dict[str, Any] = harness.pddeployment(NAME, spec)
    return doc


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@dataclass
class Stack:
    cluster: ClusterHandle
    namespace: str
    loads: dict[str, BackgroundLoad] = field(default_factory=dict)  # by router pod IP
    figures: dict[str, Any] = field(default_factory=dict)

    def kubectl(self, *args: str) -> Any:
        out = self.cluster.kubectl(*args, "-n", self.namespace, check=False)
        assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
        return out

    def pods(self, role: str) -> list[dict[str, Any]]:
        selector = f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}={role}"
        items: list[dict[str, Any]] = json.loads(
            self.kubectl("get", "pods", "-l", selector, "-o", "json").stdout
        )["items"]
        return items

    def ready(self, role: str) -> dict[str, dict[str, Any]]:
        """Ready pods of a role by IP."""
        found = {}
        for pod in self.pods(role):
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
            ip = pod["status"].get("podIP")
            if conditions.get("Ready") == "True" and ip and not pod["metadata"].get("deletionTimestamp"):
                assert ip.startswith("127."), ip
                found[ip] = pod
        return found

    def engine_metric(self, ip: str, name: str) -> float:
        return metric_total(_get(f"http://{ip}:{meta.ENGINE_PORT}/metrics"), name)

    def pod_log_excerpt(self, since: float) -> str:
        """What a failed assertion needs to say why: from every pod log of the namespace (the pod
        runner's files; `kubectl logs` needs a kubelet), the lines written since `since` (epoch
        seconds) that report trouble: leg failures and timeouts, errors, tracebacks, restarts."""
        stamp = datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        marks = ("WARNING", "ERROR", "Traceback", "Error", "pod runner")
        out = []
        for path in sorted(ClusterDir(self.cluster.dir).pod_logs.glob(f"{self.namespace}_*.log")):
            pod = path.name.split("_")[1]
            for line in path.read_text(errors="replace").splitlines():
                if line[:19] >= stamp and any(mark in line for mark in marks):
                    out.append(f"{pod}: {line[:300]}")
        return "\n".join(out[-60:])

    def failures(self, samples: list[Sample], killed_at: float) -> str:
        """The failed samples (sent how long after the kill, and why) and the pods' log excerpt."""
        failed = [f"sent at kill{s.sent_at - killed_at:+.2f} s: {s.error}" for s in samples if not s.ok]
        excerpt = self.pod_log_excerpt(killed_at - 5)
        return "\n".join([*failed, "pod logs since 5 s before the kill:", excerpt])

    def kv_held(self) -> dict[str, float]:
        return {
            ip: self.engine_metric(ip, "tandem:kv_held_blocks")
            for role in ("prefill", "decode")
            for ip in self.ready(role)
        }

    def start_load(self, router_ip: str) -> BackgroundLoad:
        url = f"http://{router_ip}:{meta.ROUTER_PORT}"
        # The clients wait longer than the router's leg timeouts (60 s): a leg that hangs ends in the
        # router's 504, whose log line names the leg and the pod, not in a bare client timeout.
        load = BackgroundLoad(url, harness.MODEL, max_requests=3000, max_seconds=600, request_timeout=90)
        self.loads[router_ip] = load.start(LOAD)
        return load

    def pause(self) -> dict[str, list[Sample]]:
        """Pauses every load and waits until each request it sent has come back (none hangs or
        vanishes); returns each load's samples."""
        for load in self.loads.values():
            load.set(QUIET)
        for ip, load in self.loads.items():
            tally = load.tally
            eventually(
                lambda tally=tally: tally.in_flight == 0 and tally.sent == len(tally.samples),  # type: ignore[misc]
                timeout=120,
                what=f"every request through {ip} back (sent {tally.sent}, back {len(tally.samples)})",
            )
            assert load.error is None, load.error
        return {ip: list(load.tally.samples) for ip, load in self.loads.items()}

    def resume(self) -> None:
        for load in self.loads.values():
            load.set(LOAD)

    def pods_as_desired(self, what: str) -> None:
        """Exactly two pods of each role, all Ready, none left over (terminating or orphaned: each
        owned by its StatefulSet or the router's ReplicaSet)."""

        def exact() -> bool:
            for role in ("prefill", "decode", "router"):
                pods = self.pods(role)
                if len(pods) != 2 or len(self.ready(role)) != 2:
                    return False
                for pod in pods:
                    owners = [o["kind"] for o in pod["metadata"].get("ownerReferences") or []]
                    assert owners == ["ReplicaSet" if role == "router" else "StatefulSet"], owners
            return True

        eventually(exact, timeout=60, what=f"{what}: two Ready pods of each role and no other")

    def no_kv_held(self, what: str, timeout: float = 30) -> float:
        started = time.monotonic()
        eventually(
            lambda: len(self.kv_held()) == 4 and not any(self.kv_held().values()),
            timeout=timeout,
            what=f"{what}: zero KV held on all four engine pods once quiet (last: {self.kv_held()})",
        )
        return time.monotonic() - started


def process_ids(pod_ip: str) -> list[int]:
    """The local processes the pod runner started for the pod at `pod_ip` (TANDEM_POD_IP)."""
    marker = f"TANDEM_POD_IP={pod_ip}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if marker in environ.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_9(pod_ip: str) -> None:
    pids = process_ids(pod_ip)
    assert pids, f"no process for the pod at {pod_ip}"
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def restarts(pod: dict[str, Any]) -> int:
    return sum(int(s.get("restartCount") or 0) for s in pod["status"].get("containerStatuses") or [])


@pytest.fixture(scope="module")
def data_namespace(
    cluster: ClusterHandle, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The module's namespace, with `tandem operator` (a local process) watching it alone. (Its
    own fixtures: nothing here depends on another chaos module's conftest.)"""
    with scratch_namespace(cluster, f"chaos-data-{uuid.uuid4().hex[:6]}") as name:
        log = tmp_path_factory.mktemp("data-faults") / "operator.log"
        args = ["--namespace", name, "--resync-seconds", "10", "--lease-namespace", name]
        operator = OperatorProcess(cluster, [*args, "--lease-name", "tandem-data-faults"], log)
        try:
            operator.wait_leader(timeout=90)
            yield name
        finally:
            operator.stop()


@pytest.fixture(scope="module")
def stack(cluster: ClusterHandle, data_namespace: str) -> Iterator[Stack]:
    holder = Stack(cluster, data_namespace)
    cluster.kubectl("apply", "-n", data_namespace, "-f", "-", input=json.dumps(manifest()))
    eventually(
        lambda: all(len(holder.ready(role)) == 2 for role in ("prefill", "decode", "router")),
        timeout=240,
        what="two Ready pods of each role",
    )
    try:
        for ip in holder.ready("router"):
            holder.start_load(ip)
        yield holder
    finally:
        for load in holder.loads.values():
            load.stop(timeout=90)
        print(f"\ndata-plane chaos figures: {json.dumps(holder.figures, indent=1)}")
        cluster.kubectl("delete", "pdd", "--all", "-n", data_namespace, "--wait=false", check=False)


def _since(samples: dict[str, list[Sample]], since: float) -> list[Sample]:
    return [s for batch in samples.values() for s in batch if s.sent_at >= since]


def _kill_busy_worker(stack: Stack, role: str) -> tuple[str, int, float, int]:
    """Kills -9 a worker of `role` while it has requests running; (its IP, the restart count it
    had, when it was killed, the requests it was running just before)."""
    holder: dict[str, Any] = {}

    def busy() -> bool:
        for ip, pod in stack.ready(role).items():
            running = stack.engine_metric(ip, "vllm:num_requests_running")
            if running > 0:
                holder.update(ip=ip, pod=pod, running=running)
                return True
        return False

    eventually(busy, timeout=60, what=f"a {role} pod with requests running")
    killed_at = time.time()
    kill_9(holder["ip"])
    return holder["ip"], restarts(holder["pod"]), killed_at, int(holder["running"])


def _back(stack: Stack, role: str, ip: str, restarts_before: int, killed_at: float) -> float:
    """Seconds from the kill until the killed worker was seen Ready again, restarted (the same
    pod, as a kubelet would)."""

    def again() -> bool:
        pod = stack.ready(role).get(ip)
        return pod is not None and restarts(pod) > restarts_before

    eventually(again, timeout=120, what=f"the {role} pod at {ip} restarted and Ready")
    return time.time() - killed_at


def test_decode_worker_killed_mid_stream(stack: Stack) -> None:
    """The streams on it end with the router's error event (the client sees it; none hangs); the
    others, and the requests after it, are served by the other decode pod or re-prefilled there;
    the pod comes back; no KV is left held on the prefill pods."""
    time.sleep(3)  # the load is flowing on both decode pods
    ip, before, killed_at, running = _kill_busy_worker(stack, "decode")
    back_s = _back(stack, "decode", ip, before, killed_at)
    time.sleep(3)
    samples = _since(stack.pause(), killed_at - 5)
    failed = [s for s in samples if not s.ok]
    assert all(STREAM_CUT in s.error for s in failed), stack.failures(samples, killed_at)
    # Only streams already under way can be cut: a request sent later that meets the dead pod
    # has no byte yet and is re-prefilled elsewhere.
    assert all(s.sent_at <= killed_at for s in failed), [s.sent_at - killed_at for s in failed]
    after = [s for s in samples if s.sent_at > killed_at + 1]
    assert after, "no request sent after the kill"
    assert all(s.ok for s in after), stack.failures(after, killed_at)
    held_s = stack.no_kv_held("after the decode kill")
    stack.pods_as_desired("after the decode kill")
    stack.figures["decode killed"] = {
        "requests": len(samples),
        "running on it": running,
        "failed (stream cut)": len(failed),
        "back ready s": round(back_s, 1),
        "kv held gone s": round(held_s, 1),
    }
    stack.resume()


def test_prefill_worker_killed_mid_prefill(stack: Stack) -> None:
    """A prefill that dies is retried on the other prefill pod (a KV read from it that fails is
    re-prefilled): no client sees it."""
    for load in stack.loads.values():  # prompts long enough that a prefill lasts a while
        load.set(LONG_PROMPTS)
    time.sleep(3)
    ip, before, killed_at, running = _kill_busy_worker(stack, "prefill")
    back_s = _back(stack, "prefill", ip, before, killed_at)
    time.sleep(3)
    samples = _since(stack.pause(), killed_at - 5)
    assert samples
    assert all(s.ok for s in samples), stack.failures(samples, killed_at)
    held_s = stack.no_kv_held("after the prefill kill")
    stack.pods_as_desired("after the prefill kill")
    stack.figures["prefill killed"] = {
        "requests": len(samples),
        "running on it": running,
        "failed": 0,
        "back ready s": round(back_s, 1),
        "kv held gone s": round(held_s, 1),
    }
    stack.resume()


def test_router_pod_deleted_with_no_grace(stack: Stack) -> None:
    """Its clients' requests in flight fail visibly (the connection drops); the other router's
    clients see nothing; the recreated pod serves; every request is accounted for; KV a dead router
    left between the legs is freed by the lease at the latest."""
    stack.resume()
    time.sleep(3)
    routers = stack.ready("router")
    victim, survivor = sorted(routers)
    name = routers[victim]["metadata"]["name"]
    tally = stack.loads[victim].tally
    eventually(lambda: tally.in_flight >= 2, timeout=30, what="requests in flight on the router to kill")
    in_flight, back_before = tally.in_flight, len(tally.samples)
    killed_at = time.time()
    stack.kubectl("delete", "pod", name, "--grace-period=0", "--force")
    # Its clients stop sending to it, as a Service would once the pod is gone (this load's URL is
    # the pod's IP); what it was serving must still come back, each with an error.
    stack.loads[victim].set(QUIET)
    quiet_at = time.time()

    def recreated() -> str | None:
        """The IP of the pod the router's Deployment made in place of the deleted one, once Ready."""
        ready = stack.ready("router")
        fresh = [ip for ip, pod in ready.items() if pod["metadata"]["name"] != name and ip != survivor]
        return fresh[0] if fresh and len(ready) == 2 else None

    new_ip = eventually(recreated, timeout=120, what="the router pod recreated and Ready")
    back_s = time.time() - killed_at
    samples = stack.pause()
    victim_failed = [s for s in samples[victim][back_before:] if not s.ok]
    survivor_samples = [s for s in samples[survivor] if s.sent_at >= killed_at - 5]
    assert survivor_samples
    assert all(s.ok for s in survivor_samples), stack.failures(survivor_samples, killed_at)
    assert victim_failed, "no request through the killed router failed"
    # A request the load's loop had already scheduled when it went quiet starts (and is stamped) a
    # moment later on a busy machine (seen once: sent under the steady phase, stamped after quiet_at).
    late = [s for s in victim_failed if s.sent_at > quiet_at + STRAGGLER_S]
    assert not late, [s.error for s in late]
    stack.loads.pop(victim).stop(timeout=30)
    held_s = stack.no_kv_held("after the router kill", timeout=LEASE_S + 30)
    stack.pods_as_desired("after the router kill")
    load = stack.start_load(new_ip)
    eventually(lambda: len(load.tally.samples) >= 10, timeout=60, what="ten requests through the new router")
    fresh = stack.pause()[new_ip]
    assert all(s.ok for s in fresh), [s.error for s in fresh if not s.ok]
    stack.figures["router deleted"] = {
        "in flight on it": in_flight,
        "failed through it": len(victim_failed),
        "errors": [f"{s.sent_at - killed_at:+.1f}s {s.error[:90]}" for s in victim_failed],
        "other router requests, all ok": len(survivor_samples),
        "recreated ready s": round(back_s, 1),
        "kv held gone s": round(held_s, 1),
    }
