"""TANDEM_SIM_LOAD_SECONDS: the engine listens at once but is unready while it "loads weights"."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tandem.devcluster.testing import eventually

from .harness import LOOPBACK, MODEL, NAME, Engine, free_port

LOAD_SECONDS = 10.0  # well above the engine's start-up on a busy 2-core machine, so the loading phase is seen


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
        health = eventually(lambda: _health(engine), timeout=60, what="the engine to listen")
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
        eventually(
            lambda: _health(engine) == 200, timeout=max(1.0, deadline - time.monotonic()), what="/health 200"
        )
        assert time.monotonic() - started >= LOAD_SECONDS
        status, answer = engine.post("/v1/completions", body)
        assert status == 200
        assert answer["usage"]["completion_tokens"] == 2
        assert engine.request("GET", "/metrics")[0] == 200
    finally:
        engine.stop()


def _health(engine: Engine) -> int | None:
    """The status of GET /health, or None while nothing listens yet."""
    try:
        return engine.request("GET", "/health", timeout=2)[0]
    except OSError:
        return None
