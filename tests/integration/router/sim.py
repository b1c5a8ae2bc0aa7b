"""Sim engine processes (`tandem engine serve`) for router tests, on 127.0.0.1 with free ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from tandem.devcluster.procs import free_port

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NAME = "llama-8b"
MAX_MODEL_LEN = 4096
LOOPBACK = "127.0.0.1"


@dataclass
class SimEngine:
    proc: subprocess.Popen[bytes]
    port: int
    log: str

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def set_faults(self, **faults: Any) -> None:
        request = urllib.request.Request(
            self.url + "/admin/faults", data=json.dumps(faults).encode(), method="POST"
        )
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def clear_faults(self) -> None:
        request = urllib.request.Request(self.url + "/admin/faults", method="DELETE")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def start_sim(role: str | None, *, time_scale: float = 0.0, start_timeout_s: float = 90.0) -> SimEngine:
    """A sim engine: role prefill (kv_producer), decode (kv_consumer) or None (colocated)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_SIM_", "VLLM_"))}
    env.update(
        TANDEM_SIM_TIME_SCALE=str(time_scale),
        VLLM_NIXL_SIDE_CHANNEL_HOST=LOOPBACK,
        VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()),
    )
    command = [sys.executable, "-m", "tandem.cli", "engine", "serve", MODEL, "--host", LOOPBACK]
    command += ["--port", str(port), "--served-model-name", NAME, "--max-model-len", str(MAX_MODEL_LEN)]
    if role is not None:
        kv_role = {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
        command += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role})]
    with tempfile.NamedTemporaryFile(prefix=f"sim-{role}-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    engine = SimEngine(proc, port, log.name)
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log.name) as text:
                raise RuntimeError(f"sim engine exited {proc.returncode}: {text.read()[-2000:]}")
        try:
            with urllib.request.urlopen(engine.url + "/health", timeout=2) as response:
                if response.status == 200:
                    return engine
        except OSError:
            pass
        time.sleep(0.2)
    engine.kill()
    raise RuntimeError(f"sim engine on port {port} not ready in {start_timeout_s}s")
