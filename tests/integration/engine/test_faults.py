"""Each injected fault, set through POST /admin/faults or TANDEM_SIM_FAULTS, over real HTTP."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import urllib.error
from collections.abc import Iterator

import pytest

from .harness import NAME, Engine, kv_config, start_engine

BODY = {"model": NAME, "prompt": "fault injection prompt", "max_tokens": 4}


@pytest.fixture
def engine() -> Iterator[Engine]:
    started = start_engine()
    yield started
    started.stop()


def set_faults(engine: Engine, **faults: object) -> None:
    status, current = engine.post("/admin/faults", faults)
    assert status == 200, current
    for key, value in faults.items():
        assert current[key] == value


def test_faults_are_off_by_default_and_can_be_cleared(engine: Engine) -> None:
    status, faults = engine.get("/admin/faults")
    assert status == 200
    assert faults["error_rate"] == 0
    assert faults["hang"] is False
    set_faults(engine, error_rate=1.0)
    assert engine.request("DELETE", "/admin/faults")[0] == 200
    assert engine.post("/v1/completions", BODY)[0] == 200


def test_invalid_fault_is_refused(engine: Engine) -> None:
    assert engine.post("/admin/faults", {"error_rate": 2})[0] == 400
    assert engine.post("/admin/faults", {"no_such_fault": 1})[0] == 400


def test_error_rate_answers_5xx(engine: Engine) -> None:
    set_faults(engine, error_rate=1.0, error_status=503)
    status, body = engine.post("/v1/completions", BODY)
    assert status == 503
    assert body["error"]["message"] == "injected fault"


def test_error_inside_a_200_stream(engine: Engine) -> None:
    set_faults(engine, stream_error_rate=1.0, stream_error_after_tokens=2)
    status, events = engine.stream("/v1/completions", {**BODY, "max_tokens": 10, "stream": True})
    assert status == 200
    assert events[-1] == "[DONE]"
    assert "error" in json.loads(events[-2])
    assert len(events) == 4  # two tokens, the error, [DONE]


def test_slowdown_is_applied(engine: Engine) -> None:
    set_faults(engine, slowdown=2.5)
    assert engine.get("/debug/state")[1]["faults"]["slowdown"] == 2.5
    assert engine.post("/v1/completions", BODY)[0] == 200


def test_metrics_error_fails_the_scrape_only(engine: Engine) -> None:
    assert engine.request("GET", "/metrics")[0] == 200
    set_faults(engine, metrics_error=True)
    status, _, body = engine.request("GET", "/metrics")
    assert status == 500
    assert b"metrics unavailable" in body
    assert engine.request("GET", "/health")[0] == 200  # Ready, and serving
    assert engine.post("/v1/completions", BODY)[0] == 200
    set_faults(engine, metrics_error=False)
    status, _, body = engine.request("GET", "/metrics")
    assert status == 200
    assert b"vllm:num_requests_running" in body


def test_hang_stops_answering_until_released(engine: Engine) -> None:
    set_faults(engine, hang=True)
    with pytest.raises((TimeoutError, socket.timeout, OSError)):
        engine.request("GET", "/health", timeout=1.0)
    set_faults(engine, hang=False)
    assert engine.request("GET", "/health")[0] == 200
    assert engine.post("/v1/completions", BODY)[0] == 200


def test_crash_exits_the_process(engine: Engine) -> None:
    with contextlib.suppress(OSError):  # the reply may or may not make it out before exit
        engine.post("/admin/faults", {"crash": True})
    assert engine.proc.wait(timeout=20) == 1


def test_crash_after_requests_from_the_environment() -> None:
    engine = start_engine(env={"TANDEM_SIM_FAULTS": json.dumps({"crash_after_requests": 2})})
    try:
        assert engine.post("/v1/completions", BODY)[0] == 200
        with pytest.raises((ConnectionError, urllib.error.URLError, http.client.HTTPException)):
            engine.post("/v1/completions", BODY)
        assert engine.proc.wait(timeout=20) == 1
    finally:
        engine.stop()


def test_kv_pull_failure_rate_on_the_decode_engine() -> None:
    prefill = start_engine("--kv-transfer-config", kv_config("kv_producer"), side_channel=True)
    decode = start_engine(
        "--kv-transfer-config",
        kv_config("kv_consumer"),
        side_channel=True,
        env={"TANDEM_SIM_FAULTS": json.dumps({"kv_pull_failure_rate": 1.0})},
    )
    try:
        leg = {**BODY, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        params = prefill.post("/v1/completions", leg)[1]["kv_transfer_params"]
        status, reply = decode.post("/v1/completions", {**BODY, "kv_transfer_params": params})
        assert status == 500
        assert "NIXL_ERR_BACKEND" in reply["error"]["message"]
        assert prefill.get("/debug/kv")[1]["held_blocks"] > 0  # not read: held until the lease lapses
    finally:
        prefill.stop()
        decode.stop()


def test_local_prefill_error_rate_refuses_only_what_the_decode_engine_would_prefill() -> None:
    prefill = start_engine("--kv-transfer-config", kv_config("kv_producer"), side_channel=True)
    decode = start_engine(
        "--kv-transfer-config",
        kv_config("kv_consumer"),
        side_channel=True,
        env={"TANDEM_SIM_FAULTS": json.dumps({"local_prefill_error_rate": 1.0})},
    )
    try:
        status, reply = decode.post("/v1/completions", BODY)  # no KV to pull: a local prefill
        assert status == 500
        assert reply["error"]["message"] == "injected fault: local prefill refused"
        leg = {**BODY, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        params = prefill.post("/v1/completions", leg)[1]["kv_transfer_params"]
        status, reply = decode.post("/v1/completions", {**BODY, "kv_transfer_params": params})
        assert status == 200, reply  # remote KV: served
        assert prefill.post("/v1/completions", BODY)[0] == 200, "a producer is not refused"
        assert decode.request("DELETE", "/admin/faults")[0] == 200
        assert decode.post("/v1/completions", BODY)[0] == 200
    finally:
        prefill.stop()
        decode.stop()
