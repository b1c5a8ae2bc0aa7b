"""The pod runner: the dev cluster's stand-in for a kubelet, for tandem's own pods.

A pod is tandem's own when its first container's `command[0]` is `tandem`. KWOK's
`tandem-pod-start` stage (e2e/kwok/stages.yaml) gives such a pod a loopback IP and phase Running
with Ready=False; the runner then starts the container's command as a local process (the venv's
`tandem`, `$(VAR)`s expanded, the container's env plus KUBECONFIG for the loopback apiserver and
TANDEM_POD_IP, pod DNS names such as LeaderWorkerSet's LWS_LEADER_ADDRESS replaced by the pod's IP:
`poddns`), probes the pod's readinessProbe on the pod IP and writes Ready and
containerStatuses like a kubelet. A process that exits is shown on the pod (restartCount,
lastState, CrashLoopBackOff; a failed container's last log lines as its termination message under
FallbackToLogsOnError) and restarted with backoff per restartPolicy. An image whose
registry host is under `.invalid` is never pulled: the pod shows ErrImagePull, then
ImagePullBackOff. When the pod is deleted the process gets SIGTERM, SIGKILL after the grace period,
and the runner removes the pod.

A cluster started to run real vLLM (`cluster.up(vllm=...)`, tests/real/) also runs pods whose
command is `vllm serve`, with the CPU build of vLLM (`realvllm.command`: the rendered command with
the listed CPU changes only).

One watch over scheduled pods drives everything; each running pod has one thread that sleeps
between probes. Logs: one file per pod under `<cluster dir>/pods/`.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import datetime as dt
import logging
import math
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tandem.api.times import parse_rfc3339, rfc3339
from tandem.devcluster import expand, kube, layout, poddns, procs, realvllm
from tandem.devcluster.layout import ClusterDir
from tandem.status.container_error import FALLBACK_MAX_LINES, fallback_message

log = logging.getLogger("tandem.devcluster.runner")

# Probes run at the pod's periodSeconds, but at least this often, so tests don't wait 10s a step
# (a liveness or startup probe still kills only after a kubelet's time of failures: `_Probe`).
MAX_PROBE_PERIOD = 2.0
BACKOFF_INITIAL = 2.0
BACKOFF_MAX = 60.0
# A process that ran this long before exiting restarts without backoff carried over.
BACKOFF_RESET_AFTER = 60.0
# Grace period used when the runner itself stops (cluster down), capped so `down` stays quick.
SHUTDOWN_GRACE = 5.0


def first_command(pod: dict[str, Any]) -> list[str]:
    containers = pod.get("spec", {}).get("containers") or []
    return list((containers[0].get("command") or []) if containers else [])


def is_tandem_pod(pod: dict[str, Any]) -> bool:
    command = first_command(pod)
    return bool(command) and command[0] == "tandem"


def image_unpullable(image: str) -> bool:
    """Whether the runner treats `image` as one no registry serves: its registry host is under
    `.invalid` (RFC 6761: never resolves), e.g. `registry.invalid/tandem:0.1.0`. Such a pod shows
    ErrImagePull, then ImagePullBackOff, as a kubelet's would; its process never starts."""
    first, sep, _ = image.partition("/")
    host = first.split(":", 1)[0] if sep else ""
    return host == "invalid" or host.endswith(".invalid")


def register_logs(custom: Any, namespace: str, name: str, body: dict[str, Any], attempts: int = 3) -> None:
    """Creates or replaces the KWOK `Logs` object `name` (`custom`: a CustomObjectsApi). Best effort:
    it only serves `kubectl logs`, so a failure is logged, never raised. A StatefulSet's pod comes
    back under the same name while the old pod's Logs object may still exist (409 on create) and
    then vanish, garbage-collected with the old pod, before the replace (404): create again. (A soak
    found it: the exception ended the pod's worker and the new pod stayed ContainerCreating.)"""
    group, version = "kwok.x-k8s.io", "v1alpha1"
    for _ in range(attempts):
        try:
            custom.create_namespaced_custom_object(group, version, namespace, "logs", body)
            return
        except ApiException as e:
            if e.status == 404:  # the cluster has no Logs CRD; `kubectl logs` won't work
                return
            if e.status != 409:
                log.warning("could not register logs of %s/%s: %s", namespace, name, e.reason)
                return
        try:
            custom.replace_namespaced_custom_object(group, version, namespace, "logs", name, body)
            return
        except ApiException as e:
            if e.status != 404:
                log.warning("could not register logs of %s/%s: %s", namespace, name, e.reason)
                return
    log.warning("could not register logs of %s/%s: the old Logs object kept coming back", namespace, name)


def _now() -> str:
    return rfc3339(time.time())


def _parse_time(value: str) -> float:
    return parse_rfc3339(value)


class _Stop(Exception):
    """Raised in the main thread by SIGTERM/SIGINT to leave the watch."""


class _Probe:
    """One probe's schedule and counters."""

    def __init__(self, spec: dict[str, Any], now: float) -> None:
        self.spec = spec
        self.next_at = now + float(spec.get("initialDelaySeconds", 0))
        spec_period = float(spec.get("periodSeconds", 10))
        self.period = min(spec_period, MAX_PROBE_PERIOD)
        self.success_threshold = int(spec.get("successThreshold", 1))
        self.failure_threshold = int(spec.get("failureThreshold", 3))
        # A kubelet kills after failureThreshold failures periodSeconds apart: (threshold - 1) x
        # period seconds of failing. Probed more often here, a liveness or startup probe needs as
        # many seconds of failures, not as many failures (a router still importing 4 s after its
        # start, on a busy machine, was killed where a kubelet gives it 20 s).
        self.kill_threshold = math.ceil((self.failure_threshold - 1) * spec_period / self.period) + 1
        self.successes = 0
        self.failures = 0

    def record(self, ok: bool) -> bool:
        self.successes, self.failures = (self.successes + 1, 0) if ok else (0, self.failures + 1)
        return ok


class PodWorker(threading.Thread):
    """Runs, probes and restarts the first container of one pod; stops it when told to."""

    def __init__(self, runner: Runner, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.runner = runner
        self.pod = pod
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.container: dict[str, Any] = pod["spec"]["containers"][0]
        self.pod_ip: str = pod["status"]["podIP"]
        self.log_path = runner.cdir.pod_logs / f"{self.namespace}_{self.pod_name}_{self.uid[:8]}.log"
        self._stop_event = threading.Event()
        self._log_lock = threading.Lock()
        self._log_file: IO[bytes] | None = None
        # Set on a stop request or when the process exits: wakes the probe loop.
        self._wake = threading.Event()
        self._stop_grace = 30.0
        self._delete_after_stop = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart_count = 0
        self.ready = False
        self._patched_rv = 0  # resourceVersion of this worker's last status write
        # (reason, message, restarts) of the waiting state last written; None after any other write.
        self._waiting_written: tuple[str, str, int] | None = None
        self._last_state: dict[str, Any] | None = None
        # The running process's last lines of output, for FallbackToLogsOnError.
        self._tail: collections.deque[str] = collections.deque(maxlen=FALLBACK_MAX_LINES)
        self._relay: threading.Thread | None = None

    # --- called from the watch thread -----------------------------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod

    def request_stop(self, grace: float, *, delete_pod: bool) -> None:
        self._stop_grace = max(0.0, grace)
        self._delete_after_stop = self._delete_after_stop or delete_pod
        self._stop_event.set()
        self._wake.set()

    # --- the worker thread ----------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._register_logs()
            self._loop()
        except Exception:
            log.exception("worker for %s/%s failed", self.namespace, self.pod_name)
        finally:
            self._terminate()
            if self._delete_after_stop:
                self._delete_pod()
            self.runner.forget(self.uid)
            with self._log_lock:
                if self._log_file is not None:
                    self._log_file.close()
                    self._log_file = None

    def _loop(self) -> None:
        backoff = BACKOFF_INITIAL
        policy = self.pod["spec"].get("restartPolicy", "Always")
        pull_failures = 0
        while not self._stop_event.is_set():
            image = str(self.container.get("image", ""))
            if image_unpullable(image):
                # As a kubelet: ErrImagePull on the first failed pull, ImagePullBackOff while it waits.
                if pull_failures == 0:
                    self._patch_waiting("ErrImagePull", f'failed to pull image "{image}": no such host')
                else:
                    self._patch_waiting("ImagePullBackOff", f'Back-off pulling image "{image}"')
                pull_failures += 1
                if self._stop_event.wait(backoff):
                    return
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            try:
                argv, env = self._prepare()
            except (expand.ConfigError, ApiException) as e:
                self._patch_waiting("CreateContainerConfigError", str(e))
                if self._stop_event.wait(backoff):
                    return
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            started = time.monotonic()
            started_at = _now()
            try:
                self._start(argv, env)
            except OSError as e:  # e.g. the executable does not exist
                self._note(f"cannot start: {e}")
                self._patch_waiting("RunContainerError", str(e))
                if self._stop_event.wait(backoff):
                    return
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            self._patch_running(started_at, ready=False)
            code = self._supervise(started_at)
            if code is None:  # stopped
                return
            ran = time.monotonic() - started
            if ran >= BACKOFF_RESET_AFTER:
                backoff = BACKOFF_INITIAL
            terminated: dict[str, Any] = {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started_at,
                "finishedAt": _now(),
            }
            message = self._termination_message(code)
            if message:
                terminated["message"] = message
            self._last_state = {"terminated": terminated}
            restart = policy == "Always" or (policy == "OnFailure" and code != 0)
            if not restart:
                self._patch_finished(code)
                self._stop_event.wait()
                return
            self.restart_count += 1
            self._patch_waiting(
                "CrashLoopBackOff",
                f"back-off {backoff:.0f}s restarting failed container={self.container['name']} "
                f"pod={self.pod_name}_{self.namespace}({self.uid})",
            )
            if self._stop_event.wait(backoff):
                return
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _prepare(self) -> tuple[list[str], dict[str, str]]:
        r = self.runner
        env = expand.container_env(
            self.pod,
            self.container,
            secret_key=r.secret_key,
            configmap_key=r.configmap_key,
            secret=r.secret,
            configmap=r.configmap,
        )
        # Pod DNS names (LWS_LEADER_ADDRESS and the args it is expanded into) -> pod IPs: `poddns`.
        pods = r.namespace_pods(self.namespace)
        env = dict(zip(env, poddns.resolve(list(env.values()), self.namespace, pods), strict=True))
        argv = poddns.resolve(expand.container_argv(self.container, env), self.namespace, pods)
        if r.vllm is not None and realvllm.is_vllm_command(argv):
            argv = realvllm.command(argv, r.vllm)
            env = realvllm.environment(env, r.vllm)
        argv[0] = layout.tandem_executable() if argv[0] == "tandem" else argv[0]
        venv_bin = str(Path(layout.tandem_executable()).parent)
        base = {
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "PYTHONUNBUFFERED": "1",
            "HOSTNAME": self.pod_name,
        }
        full = {**base, **env}
        full["KUBECONFIG"] = str(r.cdir.kubeconfig)
        full["TANDEM_POD_IP"] = self.pod_ip
        for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
            full.pop(k, None)
        return argv, full

    def _start(self, argv: list[str], env: dict[str, str]) -> None:
        self._note(f"start #{self.restart_count} on {self.pod_ip}: {' '.join(argv)}")
        self._wake.clear()
        if self._stop_event.is_set():
            self._wake.set()
        self.proc = procs.spawn(
            argv, log=None, marker=self.runner.cdir.marker, env=env, cwd=self.runner.cdir.path
        )
        proc = self.proc

        def wake_on_exit() -> None:
            proc.wait()
            self._wake.set()

        tail = self._tail
        tail.clear()

        def relay() -> None:
            assert proc.stdout is not None
            with proc.stdout:
                for line in iter(proc.stdout.readline, b""):
                    self._write_log(line)
                    tail.append(line.decode(errors="replace").rstrip("\n"))

        threading.Thread(target=wake_on_exit, daemon=True).start()
        self._relay = threading.Thread(target=relay, daemon=True)
        self._relay.start()
        log.info("started %s/%s pid %d", self.namespace, self.pod_name, proc.pid)

    def _supervise(self, started_at: str) -> int | None:
        """Probes until the process exits (returns its exit code) or a stop is requested (None).

        As a kubelet: a startupProbe gates the others; readinessProbe sets Ready; a failing
        liveness or startup probe kills the process, which then counts as a crash.
        """
        assert self.proc is not None
        probes: dict[str, _Probe] = {}
        if startup := self.container.get("startupProbe"):
            probes["startup"] = _Probe(startup, time.monotonic())
        else:
            self._begin_probes(probes, started_at)
        while True:
            due = min((p.next_at for p in probes.values()), default=time.monotonic() + 3600.0)
            if self._wait_stop_or_exit(max(0.0, due - time.monotonic())):
                return None
            if self.proc.poll() is not None:
                return self._exited()
            now = time.monotonic()
            for kind, probe in list(probes.items()):
                if probe.next_at > now:
                    continue
                probe.next_at = now + probe.period
                ok = probe.record(self._probe(probe.spec))
                if kind == "readiness":
                    if ok and not self.ready and probe.successes >= probe.success_threshold:
                        self._set_ready(True, started_at)
                    elif not ok and self.ready and probe.failures >= probe.failure_threshold:
                        self._set_ready(False, started_at)
                elif ok and kind == "startup":
                    del probes["startup"]
                    self._begin_probes(probes, started_at)
                elif not ok and probe.failures >= probe.kill_threshold:
                    return self._kill(f"{kind} probe failed {probe.failures} times")
            if self.ready and self._marked_not_ready():
                # As a kubelet's status manager: the pod is ours to report. The node lifecycle
                # controller marks every pod of a node it saw go NotReady (after an apiserver outage
                # KWOK's node leases look stale) Ready=False, and nothing else would set it back.
                self._note("marked not ready by someone else while ready: reporting Ready again")
                self._patch_running(started_at, ready=True)

    def _marked_not_ready(self) -> bool:
        """Whether the pod as last watched says Ready=False in a version newer than our last write."""
        meta = self.pod.get("metadata") or {}
        try:
            newer = int(meta.get("resourceVersion") or 0) > self._patched_rv
        except ValueError:
            newer = True
        ready = next(
            (c for c in (self.pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"),
            None,
        )
        return newer and ready is not None and ready.get("status") == "False"

    def _begin_probes(self, probes: dict[str, _Probe], started_at: str) -> None:
        now = time.monotonic()
        for kind in ("readiness", "liveness"):
            if spec := self.container.get(f"{kind}Probe"):
                probes[kind] = _Probe(spec, now)
        if "readiness" not in probes:
            self._set_ready(True, started_at)

    def _exited(self) -> int:
        assert self.proc is not None
        code = self.proc.returncode
        code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a kubelet shows it
        self._set_ready(False, "", patch=False)
        self._note(f"exited with code {code}")
        return code

    def _kill(self, reason: str) -> int:
        self._note(f"{reason}; killing the process")
        self._terminate(float(self.pod["spec"].get("terminationGracePeriodSeconds", 30)))
        return self._exited()

    def _wait_stop_or_exit(self, timeout: float) -> bool:
        """Sleeps up to `timeout`, waking early when the process exits; True if a stop was requested."""
        self._wake.wait(timeout)
        return self._stop_event.is_set()

    def _probe(self, probe: dict[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        if "httpGet" in probe:
            hg = probe["httpGet"]
            host = hg.get("host") or self.pod_ip
            port = self._port(hg.get("port"))
            scheme = str(hg.get("scheme", "HTTP")).lower()
            url = f"{scheme}://{host}:{port}{hg.get('path', '/')}"
            req = urllib.request.Request(
                url, headers={h["name"]: h["value"] for h in hg.get("httpHeaders") or []}
            )
            ctx = ssl._create_unverified_context() if scheme == "https" else None
            try:
                with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
                    return 200 <= int(resp.status) < 400
            except urllib.error.HTTPError as e:
                return 200 <= e.code < 400
            except (OSError, ValueError):
                return False
        if "tcpSocket" in probe:
            ts = probe["tcpSocket"]
            try:
                with socket.create_connection(
                    (ts.get("host") or self.pod_ip, self._port(ts.get("port"))), timeout
                ):
                    return True
            except OSError:
                return False
        # exec and grpc probes are not run here; the process being alive counts as success.
        return True

    def _port(self, port: Any) -> int:
        if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
            return int(port)
        for p in self.container.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"unknown named port {port!r}")

    def _terminate(self, grace: float | None = None) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=self._stop_grace if grace is None else grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        # Anything the process left in its group goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._note(f"stopped (exit {proc.returncode})")
        log.info("stopped %s/%s pid %d", self.namespace, self.pod_name, proc.pid)

    # --- logs -----------------------------------------------------------------------------------
    def _termination_message(self, code: int) -> str:
        """As a kubelet under `terminationMessagePolicy: FallbackToLogsOnError` (no container here
        writes a termination-log file): the end of the log of a container that failed; nothing else."""
        if code == 0 or self.container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            return ""
        if self._relay is not None:
            self._relay.join(timeout=5.0)  # the output's last lines, still being read after the exit
        return fallback_message(list(self._tail))

    def _write_log(self, line: bytes) -> None:
        """One line of output in the CRI log format, which `kubectl logs` reads through KWOK."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
        with self._log_lock:
            if self._log_file is None:
                self._log_file = self.log_path.open("ab")
            self._log_file.write(stamp + b" stdout F " + line.rstrip(b"\n") + b"\n")
            self._log_file.flush()

    def _note(self, text: str) -> None:
        self._write_log(f"=== [pod runner] {text}".encode())

    def _register_logs(self) -> None:
        """A KWOK `Logs` object naming this pod's log file (garbage-collected with the pod)."""
        body = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {
                "name": self.pod_name,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": self.pod_name, "uid": self.uid}
                ],
            },
            "spec": {
                "logs": [
                    {"containers": [self.container["name"]], "logsFile": str(self.log_path), "follow": True}
                ]
            },
        }
        register_logs(client.CustomObjectsApi(self.runner.api), self.namespace, self.pod_name, body)

    def _delete_pod(self) -> None:
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid)
        )
        with contextlib.suppress(ApiException):
            self.runner.core.delete_namespaced_pod(self.pod_name, self.namespace, body=body)

    # --- status ---------------------------------------------------------------------------------
    def _container_statuses(self, main: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for c in self.pod["spec"]["containers"]:
            if c["name"] == self.container["name"]:
                out.append(main)
            else:  # sidecars are not run; they count as running and ready
                out.append(
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "imageID": "",
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": _now()}},
                    }
                )
        return out

    def _main_status(self, state: dict[str, Any], *, ready: bool, started: bool) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.container["name"],
            "image": self.container.get("image", ""),
            "imageID": "",
            "ready": ready,
            "started": started,
            "restartCount": self.restart_count,
            "state": state,
        }
        if self.proc is not None:
            status["containerID"] = f"tandem://{self.proc.pid}"
        if self._last_state is not None:
            status["lastState"] = self._last_state
        return status

    def _conditions(self, ready: bool) -> list[dict[str, Any]]:
        now = _now()
        reason = {} if ready else {"reason": "ContainersNotReady"}
        return [
            {"type": "Ready", "status": str(ready), "lastTransitionTime": now, **reason},
            {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": now, **reason},
        ]

    def _patch(self, status: dict[str, Any]) -> bool:
        """Writes the pod's status; whether it was written."""
        if self._stop_event.is_set():
            return False
        try:
            patched = self.runner.core.patch_namespaced_pod_status(
                self.pod_name, self.namespace, {"status": status}, _preload_content=False
            )
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self._patched_rv = int(kube.raw(patched)["metadata"]["resourceVersion"])
        except ApiException as e:
            if e.status != 404:
                log.warning("status patch of %s/%s failed: %s", self.namespace, self.pod_name, e.reason)
            return False
        return True

    def _patch_running(self, started_at: str, *, ready: bool) -> None:
        self.ready = ready
        self._waiting_written = None
        main = self._main_status({"running": {"startedAt": started_at}}, ready=ready, started=True)
        self._patch(
            {"conditions": self._conditions(ready), "containerStatuses": self._container_statuses(main)}
        )

    def _set_ready(self, ready: bool, started_at: str, *, patch: bool = True) -> None:
        if ready == self.ready:
            return
        self.ready = ready
        if patch:
            self._patch_running(started_at, ready=ready)

    def _patch_waiting(self, reason: str, message: str) -> None:
        self.ready = False
        written = (reason, message, self.restart_count)
        if written == self._waiting_written:
            # As a kubelet: a retry that ends in the same waiting state writes nothing (a new
            # lastTransitionTime each retry would wake every watcher of the pod for no change).
            return
        main = self._main_status(
            {"waiting": {"reason": reason, "message": message}}, ready=False, started=False
        )
        written_now = self._patch(
            {"conditions": self._conditions(False), "containerStatuses": self._container_statuses(main)}
        )
        self._waiting_written = written if written_now else None

    def _patch_finished(self, code: int) -> None:
        self.ready = False
        self._waiting_written = None
        assert self._last_state is not None
        main = self._main_status(self._last_state, ready=False, started=False)
        main.pop("lastState", None)
        self._patch(
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": self._conditions(False),
                "containerStatuses": self._container_statuses(main),
            }
        )


class Runner:
    """Watches scheduled pods and keeps one PodWorker per running tandem pod."""

    def __init__(self, cdir: ClusterDir) -> None:
        self.cdir = cdir
        self.api = kube.client_from(cdir.kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self._workers: dict[str, PodWorker] = {}
        self._lock = threading.Lock()
        # Set when the cluster was started to run real vLLM pods (tests/real/): their commands too.
        self.vllm = realvllm.EngineSetup.load(cdir.vllm_setup) if cdir.vllm_setup.exists() else None

    def runs(self, pod: dict[str, Any]) -> bool:
        """Whether this runner runs `pod`'s process: tandem's own, and vLLM's with an EngineSetup."""
        if is_tandem_pod(pod):
            return True
        return self.vllm is not None and realvllm.is_vllm_command(first_command(pod))

    # Secret/ConfigMap reads for env resolution.
    def _read(self, kind: str, ns: str, name: str) -> dict[str, str] | None:
        try:
            if kind == "secret":
                obj = self.core.read_namespaced_secret(name, ns)
                return {k: base64.b64decode(v).decode() for k, v in (obj.data or {}).items()}
            cm = self.core.read_namespaced_config_map(name, ns)
            return dict(cm.data or {})
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def secret(self, ns: str, name: str) -> dict[str, str] | None:
        return self._read("secret", ns, name)

    def configmap(self, ns: str, name: str) -> dict[str, str] | None:
        return self._read("configmap", ns, name)

    def secret_key(self, ns: str, name: str, key: str) -> str | None:
        return (self.secret(ns, name) or {}).get(key)

    def configmap_key(self, ns: str, name: str, key: str) -> str | None:
        return (self.configmap(ns, name) or {}).get(key)

    def namespace_pods(self, namespace: str) -> Callable[[], list[dict[str, Any]]]:
        """A reader of `namespace`'s pods (for `poddns.resolve`)."""

        def read() -> list[dict[str, Any]]:
            resp = self.core.list_namespaced_pod(namespace, _preload_content=False)
            return list(kube.raw(resp)["items"])

        return read

    def forget(self, uid: str) -> None:
        with self._lock:
            self._workers.pop(uid, None)

    def on_pod(self, pod: dict[str, Any], *, deleted: bool = False) -> None:
        if not self.runs(pod):
            return
        meta = pod["metadata"]
        uid = meta["uid"]
        with self._lock:
            worker = self._workers.get(uid)
        if deleted or meta.get("deletionTimestamp"):
            if worker is not None:
                worker.request_stop(self._grace_left(pod), delete_pod=not deleted)
            elif not deleted:
                self._delete_now(pod)
            return
        status = pod.get("status") or {}
        if worker is not None:
            worker.update(pod)
            return
        if status.get("podIP") and status.get("phase") == "Running":
            statuses = status.get("containerStatuses") or []
            # A pod the runner finished before (restartPolicy Never) or ran in an earlier life.
            if statuses and "terminated" in (statuses[0].get("state") or {}):
                return
            worker = PodWorker(self, pod)
            with self._lock:
                self._workers[uid] = worker
            worker.start()

    def _grace_left(self, pod: dict[str, Any]) -> float:
        meta = pod["metadata"]
        if ts := meta.get("deletionTimestamp"):
            return max(0.0, _parse_time(ts) - time.time())
        return float(pod["spec"].get("terminationGracePeriodSeconds", 30))

    def _delete_now(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)

    def _relist(self) -> str:
        resp = self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=", _preload_content=False)
        data = kube.raw(resp)
        seen = set()
        for pod in data["items"]:
            seen.add(pod["metadata"]["uid"])
            self.on_pod(pod)
        with self._lock:
            gone = [w for uid, w in self._workers.items() if uid not in seen]
        for w in gone:
            w.request_stop(w._stop_grace, delete_pod=False)
        return str(data["metadata"]["resourceVersion"])

    def run(self) -> None:
        rv = ""
        while True:
            try:
                if not rv:
                    rv = self._relist()
                    self.cdir.runner_ready.touch()
                w = watch.Watch()  # type: ignore[no-untyped-call]
                for event in w.stream(  # type: ignore[no-untyped-call]
                    self.core.list_pod_for_all_namespaces,
                    field_selector="spec.nodeName!=",
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=300,
                    _request_timeout=330,
                    deserialize=False,
                ):
                    obj = event["object"]
                    rv = obj.get("metadata", {}).get("resourceVersion") or rv
                    if event["type"] != "BOOKMARK":
                        self.on_pod(obj, deleted=event["type"] == "DELETED")
            except _Stop:
                raise
            except ApiException as e:
                if e.status != 410:
                    log.warning("watch failed: %s; relisting", e.reason)
                    time.sleep(2)
                rv = ""
            except Exception as e:
                log.warning("watch failed: %r; relisting", e)
                time.sleep(2)
                rv = ""

    def shutdown(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.request_stop(min(w._stop_grace, SHUTDOWN_GRACE), delete_pod=False)
        for w in workers:
            w.join(timeout=SHUTDOWN_GRACE + 15)
        kube.close(self.api)


def main(cdir: ClusterDir) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    runner = Runner(cdir)

    def stop(signum: int, frame: object) -> None:
        raise _Stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("pod runner watching pods of %s", cdir.path)
    try:
        runner.run()
    except _Stop:
        log.info("stopping")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        runner.shutdown()
    return 0
