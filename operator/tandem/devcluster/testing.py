"""Helpers for tests against the dev cluster: polling, pod listing, a pod the runner can run, and
`tandem operator` as a local process."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import yaml
from kubernetes import client

from tandem.api.meta import ENGINE_PORT
from tandem.devcluster import kube, procs
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.layout import ClusterDir

T = TypeVar("T")


def eventually(
    fn: Callable[[], T | None], *, timeout: float = 90, what: str = "condition", interval: float = 0.5
) -> T:
    """Polls `fn` every `interval` seconds until it returns something truthy, and returns that."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except Exception as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last error: {last!r}")


def metric_total(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus text-format metric's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        series, _, value = line.rpartition(" ")
        found = dict(re.findall(r'(\w+)="([^"]*)"', series))
        if all(found.get(key) == want for key, want in labels.items()):
            total += float(value)
    return total


def managers_of(obj: dict[str, Any], *path: str) -> set[str]:
    """Field managers whose managedFields entry holds the field at `path` (e.g. "spec", "replicas")."""
    owners = set()
    for entry in obj.get("metadata", {}).get("managedFields") or []:
        node: Any = entry.get("fieldsV1") or {}
        for key in path:
            node = node.get(f"f:{key}") if isinstance(node, dict) else None
        if node is not None:
            owners.add(f"{entry['manager']}:{entry['operation']}")
    return owners


def pods(core: client.CoreV1Api, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    """The namespace's pods as plain dicts (camelCase, as the API sends them)."""
    resp = core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    return list(kube.raw(resp)["items"])


def runner_test_pod(name: str, *extra: str, port: int = 9400, **meta: Any) -> dict[str, Any]:
    """A pod the runner runs: `tandem dev testserver` on the pod IP, Ready when /health answers."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": "tandem:dev",
                    "command": ["tandem", "dev", "testserver"],
                    "args": ["--host", "$(POD_IP)", "--port", str(port), *extra],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    "ports": [{"name": "http", "containerPort": port}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
                }
            ],
        },
    }


POD_IP = {"valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}  # an env var's value: the pod's IP


def sim_engine_pod(
    name: str,
    *,
    labels: dict[str, str],
    model: str,
    args: Sequence[str],
    env: Sequence[dict[str, Any]],
    limits: dict[str, str],
) -> dict[str, Any]:
    """A bare pod of the sim engine (`tandem engine serve MODEL ARGS`, `POD_IP` then `env`) on a fake
    RDMA node, Ready when /health answers: engine pods without a PDDeployment behind them."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "nodeSelector": {"network.tandem.dev/rdma": "true"},
            "containers": [
                {
                    "name": "vllm",
                    "image": "tandem/sim:dev",
                    "command": ["tandem", "engine", "serve", model],
                    "args": list(args),
                    "env": [{"name": "POD_IP", **POD_IP}, *env],
                    "resources": {"limits": limits},
                    "readinessProbe": {
                        "httpGet": {"path": "/health", "port": ENGINE_PORT},
                        "periodSeconds": 1,
                    },
                }
            ],
        },
    }


def e2e_operator_args(cluster: ClusterHandle, lease: str) -> list[str]:
    """The flags of an e2e module's operator (the autoscaling and rollout e2e tests): a 20 s resync, its
    own lease `lease` in `default`, and the cluster's Prometheus as the autoscaler's and analysis' source."""
    return [
        "--resync-seconds", "20",
        "--lease-namespace", "default",
        "--lease-name", lease,
        "--prometheus-url", cluster.prometheus_url,
    ]  # fmt: skip


def load_file(name: str, path: Path) -> ModuleType:
    """The Python file at `path` (a bench, a script) imported as module `name`, registered in
    `sys.modules` first (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


free_port = procs.free_port


class OperatorProcess:
    """`tandem operator` started against a dev cluster, its probes on a free loopback port.

    `args` are extra operator flags; `kubeconfig` replaces the cluster's admin kubeconfig (to run
    with a ServiceAccount's token, say). Output goes to `log`.
    """

    def __init__(
        self, cluster: ClusterHandle, args: Sequence[str], log: Path, kubeconfig: Path | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**cluster.env(), "PYTHONUNBUFFERED": "1"}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        tandem = str(Path(sys.executable).with_name("tandem"))
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [tandem, "operator", "--probe-port", str(self.port), *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        # The dev cluster's Prometheus scrapes processes outside the cluster that register here
        # (e2e/prometheus/prometheus.yml, job `local`): the operator's metrics reach dashboards.
        targets = ClusterDir(cluster.dir).scrape_targets
        self.scrape_target: Path | None = targets / f"operator-{self.port}.json" if targets.is_dir() else None
        if self.scrape_target is not None:
            entry = [{"targets": [f"127.0.0.1:{self.port}"], "labels": {"component": "tandem-operator"}}]
            self.scrape_target.write_text(json.dumps(entry))

    def _unregister(self) -> None:
        if self.scrape_target is not None:
            self.scrape_target.unlink(missing_ok=True)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text: str = response.read().decode()
            return text

    def is_leader(self) -> bool | None:
        """None while the probe port does not answer."""
        try:
            return "tandem_operator_leader 1.0" in self.metrics()
        except OSError:
            return None

    def wait_leader(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            if self.is_leader():
                return
            time.sleep(0.5)
        raise AssertionError(f"operator not leader after {timeout:.0f}s:\n{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        self._unregister()
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill: nothing is released (the lease stays taken)."""
        self._unregister()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


class RestartableOperator:
    """One operator at a time under a fixed `--identity`, which a test can crash and restart: the
    new process renews its own lease at once, as a container restarted in the same pod would.

    Logs go to `log_dir/operator-<n>.log`, one per process.
    """

    def __init__(
        self,
        cluster: ClusterHandle,
        args: Sequence[str],
        log_dir: Path,
        identity: str = "operator-under-test",
    ) -> None:
        self.cluster = cluster
        self.args = [*args, "--identity", identity]
        self.log_dir = log_dir
        self.starts = 0
        self.current = self._start()

    def _start(self) -> OperatorProcess:
        self.starts += 1
        return OperatorProcess(self.cluster, self.args, self.log_dir / f"operator-{self.starts}.log")

    def crash_and_restart(self, timeout: float = 90) -> None:
        """kill -9, then a new process with the same identity; returns once it leads."""
        self.current.kill()
        self.current = self._start()
        self.current.wait_leader(timeout=timeout)

    def metrics(self) -> str:
        return self.current.metrics()

    def log_text(self) -> str:
        return "".join(
            f"--- {path.name}\n{path.read_text(errors='replace')}"
            for path in sorted(self.log_dir.glob("*.log"))
        )

    def stop(self) -> None:
        self.current.stop()


Operator = TypeVar("Operator", OperatorProcess, RestartableOperator)


@contextlib.contextmanager
def leading_operator(handle: Operator, timeout: float = 90) -> Iterator[Operator]:
    """A test fixture's operator: waits until it leads (stopping it and raising if it does not),
    yields it, and stops it after, printing its log first when TANDEM_SHOW_OPERATOR_LOG is set."""
    leader = handle.current if isinstance(handle, RestartableOperator) else handle
    try:
        leader.wait_leader(timeout=timeout)
    except AssertionError:
        handle.stop()
        raise
    try:
        yield handle
    finally:
        if os.environ.get("TANDEM_SHOW_OPERATOR_LOG"):
            print(handle.log_text())
        handle.stop()


@contextlib.contextmanager
def scratch_namespace(cluster: ClusterHandle, name: str) -> Iterator[str]:
    """A new namespace `name` (labelled as a test's, with its default ServiceAccount), deleted after."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    try:
        labels = {"tandem.dev/test": "true"}
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
        procs.wait_until(
            lambda: kube.has_service_account(api, name, "default"),
            timeout=60,
            what=f"ServiceAccount default in {name}",
        )
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name, propagation_policy="Background")
        kube.close(api)


def install_crd(cluster: ClusterHandle, crd: Path, timeout: float = 60.0) -> None:
    """Installs the CRD file `crd` on `cluster` (server-side apply) and waits until it is Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    name = f"crd/{yaml.safe_load(crd.read_text())['metadata']['name']}"
    # `kubectl wait` fails at once ("accessor error: <nil>") while the new CRD has no conditions yet;
    # the apiserver sets them within seconds (longer for a larger schema): wait for them to exist.
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.kubectl(
            "wait", "--for=condition=Established", name, f"--timeout={timeout:.0f}s", check=False
        )
        if out.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} was not Established: {out.stderr}")
        time.sleep(1)
