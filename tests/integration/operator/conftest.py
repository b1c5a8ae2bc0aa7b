"""Fixtures for operator tests: the CRD installed once, and one `tandem operator` process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.devcluster.handle import ClusterHandle

REPO = Path(__file__).parents[3]
CRD = REPO / "crds" / "pddeployment.yaml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def crd(cluster: ClusterHandle) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/pddeployments.tandem.dev", "--timeout=60s")


class OperatorProcess:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text: str = response.read().decode()
            return text

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def operator(
    cluster: ClusterHandle, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """`tandem operator` watching all namespaces, with a short resync so tests see several."""
    port = free_port()
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    env = {**cluster.env(), "PYTHONUNBUFFERED": "1"}
    tandem = str(Path(sys.executable).with_name("tandem"))
    args = [
        tandem,
        "operator",
        "--probe-port",
        str(port),
        "--resync-seconds",
        "20",
        "--lease-namespace",
        "default",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    handle = OperatorProcess(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if "tandem_operator_leader 1.0" in handle.metrics():
                break
        except OSError:
            pass
        if proc.poll() is not None:
            pytest.fail(f"operator exited with {proc.returncode}:\n{handle.log_text()[-3000:]}")
        time.sleep(0.5)
    else:
        pytest.fail(f"operator did not become leader in 60s:\n{handle.log_text()[-3000:]}")
    yield handle
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if os.environ.get("TANDEM_SHOW_OPERATOR_LOG"):
        print(handle.log_text())
