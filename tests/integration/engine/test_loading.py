"""TANDEM_SIM_LOAD_SECONDS: the engine listens at once but is unready while it "loads weights"."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from .harness import LOOPBACK, MODEL, NAME, Engine, free_port

LOAD_SECONDS = 6.0


def test_unready_while_loading_then_serves() -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_SIM_", "VLLM_"))}
    env |= {"TANDEM_SIM_TIME_SCALE": "0", "TANDEM_SIM_LOAD_SECONDS": str(LOAD_SECONDS)}
    cmd = [sys.executable, "-m", "tandem.cli", "engine", "serve", MODEL, "--host", LOOPBACK]
    cmd += ["--port", str(port), "--served-model-name", NAME]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    engine = Engine(proc, port, None)
    try:
        deadline = started + 60
        health: int | None = None
        while health is None and time.monotonic() < deadline:
            try:
                health = engine.request("GET", "/health", timeout=2)[0]
            except OSError:
                time.sleep(0.2)
        listening = time.monotonic()
        assert listening - started < LOAD_SECONDS, "start-up took longer than the load: nothing to test"
        assert health == 503
        body = {"model": NAME, "prompt": "hello", "max_tokens": 2}
        status, answer = engine.post("/v1/completions", body)
        assert status == 503
        assert "loading" in answer["error"]["message"]
        assert engine.request("GET", "/metrics")[0] == 503
        assert engine.request("GET", "/v1/models")[0] == 503
        assert engine.get("/version")[0] == 200
        assert engine.get("/debug/state")[1]["loading"] is True
        while engine.request("GET", "/health")[0] != 200:
            assert time.monotonic() < deadline, "never became healthy"
            time.sleep(0.2)
        assert time.monotonic() - started >= LOAD_SECONDS
        status, answer = engine.post("/v1/completions", body)
        assert status == 200
        assert answer["usage"]["completion_tokens"] == 2
        assert engine.request("GET", "/metrics")[0] == 200
    finally:
        engine.stop()
