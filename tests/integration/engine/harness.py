"""Starts sim engine processes on 127.0.0.1 with free ports, and talks to them over real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tandem.devcluster.procs import free_port, free_ports

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NAME = "llama-8b"
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 60.0  # generous: the machine is shared


def kv_config(role: str, **extra: Any) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, **extra})


@dataclass
class Engine:
    proc: subprocess.Popen[str]
    port: int
    side_port: int | None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> tuple[int, dict[str, str], bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def post(self, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
        status, _, raw = self.request("POST", path, body, **kw)
        return status, json.loads(raw) if raw else None

    def get(self, path: str) -> tuple[int, Any]:
        status, _, raw = self.request("GET", path)
        return status, json.loads(raw) if raw else None

    def stream(self, path: str, body: Any, **kw: Any) -> tuple[int, list[str]]:
        """The `data:` payloads of an SSE response, in order."""
        status, _, raw = self.request("POST", path, body, **kw)
        events = [line[len("data: ") :] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
        return status, events

    def metric(self, name: str) -> float:
        """The value of the first sample called `name` on /metrics, read by Prometheus' own parser."""
        raw = self.request("GET", "/metrics")[2].decode()
        for family in text_string_to_metric_families(raw):
            for sample in family.samples:
                if sample.name == name:
                    return float(sample.value)
        raise AssertionError(f"{name} not exported")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_engine(
    *args: str,
    env: dict[str, str] | None = None,
    side_channel: bool = False,
    healthy: bool = True,
    ports: int = 1,
) -> Engine:
    """A sim engine with `args`; `healthy`: once its /health answers 200 (else: once started).
    `ports`: consecutive free API ports from its `--port` (a multi-port pod's ranks)."""
    port = free_ports(ports)
    side_port = free_port() if side_channel else None
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_SIM_", "VLLM_"))}
    full_env.setdefault("TANDEM_SIM_TIME_SCALE", "0")
    full_env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = LOOPBACK
    full_env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_port or 0)
    full_env.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "tandem.cli",
        "engine",
        "serve",
        MODEL,
        "--host",
        LOOPBACK,
        "--port",
        str(port),
    ]
    cmd += ["--served-model-name", NAME, "--max-model-len", "16384", *args]
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    engine = Engine(proc, port, side_port)
    if not healthy:
        return engine
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"engine exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}"
            )
        try:
            if engine.request("GET", "/health", timeout=2)[0] == 200:
                return engine
        except OSError:
            pass
        time.sleep(0.1)
    engine.stop()
    raise RuntimeError("engine did not become healthy")
