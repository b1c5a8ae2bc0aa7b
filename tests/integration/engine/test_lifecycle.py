"""Start-up refusals (as vLLM) and SIGTERM drain (`--shutdown-timeout`)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import pytest

from .harness import LOOPBACK, MODEL, NAME, start_engine


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tandem.cli", "engine", "serve", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ((MODEL, "--no-such-flag"), 2, "unrecognized arguments"),
        ((MODEL, "--port", "eighty"), 2, "invalid int value"),
        ((MODEL, "--kv-transfer-config", "{not json"), 2, "not valid JSON"),
        ((MODEL, "--kv-transfer-config", '{"kv_connector":"NixlConnector"}'), 1, "kv_role"),
        ((MODEL, "-tp", "3"), 1, "divisible by tensor parallel size"),
        (
            (MODEL, "--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048"),
            1,
            "smaller than max_model_len",
        ),
        ((MODEL, "--gpu-memory-utilization", "1.5"), 1, "within (0, 1]"),
    ],
)
def test_bad_command_lines_fail_at_start(args: tuple[str, ...], code: int, message: str) -> None:
    result = run_cli("--host", LOOPBACK, *args)
    assert result.returncode == code
    assert message in result.stderr


def test_sigterm_drains_in_flight_streams() -> None:
    engine = start_engine("--shutdown-timeout", "30", env={"TANDEM_SIM_TIME_SCALE": "1"})
    outcome: dict[str, object] = {}

    def stream() -> None:
        body = {"model": NAME, "prompt": "drain me", "max_tokens": 60, "stream": True}
        outcome["result"] = engine.stream("/v1/completions", body)

    reader = threading.Thread(target=stream)
    reader.start()
    deadline_tokens = 0
    while deadline_tokens < 100 and engine.get("/debug/state")[1]["running"] == 0:
        deadline_tokens += 1
        threading.Event().wait(0.02)
    engine.proc.send_signal(signal.SIGTERM)
    reader.join(timeout=60)
    status, events = outcome["result"]  # type: ignore[misc]
    assert status == 200
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert engine.proc.wait(timeout=30) == 0
