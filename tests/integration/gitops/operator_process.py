"""One `tandem operator` process watching only the test's namespace, with its lease there too,
so it never touches other tests' PDDeployments."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tandem.devcluster.handle import ClusterHandle


class OperatorProcess:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_operator(cluster: ClusterHandle, namespace: str, log: Path) -> OperatorProcess:
    port = _free_port()
    tandem = str(Path(sys.executable).with_name("tandem"))
    argv = [
        tandem, "operator", "--namespace", namespace, "--lease-namespace", namespace,
        "--probe-port", str(port), "--resync-seconds", "20",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env={**cluster.env(), "PYTHONUNBUFFERED": "1"}, stdout=out, stderr=out)
    handle = OperatorProcess(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"operator exited {proc.returncode}:\n{handle.log_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{handle.url}/metrics", timeout=5) as r:
                if "tandem_operator_leader 1.0" in r.read().decode():
                    return handle
        except OSError:
            pass
        time.sleep(0.5)
    handle.stop()
    pytest.fail(f"operator not leader in 60s:\n{handle.log_text()[-3000:]}")
