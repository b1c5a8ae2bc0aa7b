"""Two operator replicas: exactly one leads (and reconciles); when it stops, the other takes over."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from tandem.devcluster.handle import ClusterHandle

from .conftest import free_port


def leader_gauge(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("tandem_operator_leader "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def test_one_leader_and_fail_over(cluster: ClusterHandle, crd: None, tmp_path: Path) -> None:
    lease = f"test-leader-{uuid.uuid4().hex[:6]}"
    tandem = str(Path(sys.executable).with_name("tandem"))
    ports = [free_port(), free_port()]
    procs = []
    for i, port in enumerate(ports):
        log = (tmp_path / f"op{i}.log").open("wb")
        identity = f"replica-{i}"
        args = [tandem, "operator", "--probe-port", str(port), "--lease-name", lease, "--lease-namespace",
                "default", "--identity", identity, "--namespace", "kube-public"]  # fmt: skip
        procs.append(subprocess.Popen(args, env=cluster.env(), stdout=log, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 60
        states: list[float | None] = [None, None]
        while time.monotonic() < deadline:
            states = [leader_gauge(port) for port in ports]
            if None not in states and sum(s or 0 for s in states) == 1:
                break
            time.sleep(0.5)
        assert sorted(states) == [0.0, 1.0], states
        for _ in range(6):  # stays that way: never two leaders
            time.sleep(1)
            assert sum(leader_gauge(port) or 0 for port in ports) <= 1
        leader = states.index(1.0)
        procs[leader].terminate()
        procs[leader].wait(timeout=30)
        follower = 1 - leader
        deadline = time.monotonic() + 60  # the lease is handed over on exit; else it lapses in 30 s
        while time.monotonic() < deadline and leader_gauge(ports[follower]) != 1.0:
            time.sleep(0.5)
        assert leader_gauge(ports[follower]) == 1.0
        holder = cluster.kubectl(
            "get", "lease", lease, "-n", "default", "-o", "jsonpath={.spec.holderIdentity}"
        ).stdout
        assert holder == f"replica-{follower}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        cluster.kubectl("delete", "lease", lease, "-n", "default", check=False)
