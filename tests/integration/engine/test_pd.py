"""The NIXL two-phase flow between two engine processes, as vLLM's toy proxy runs it (reference 2.1)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .harness import NAME, Engine, kv_config, start_engine

PROMPT = " ".join(f"w{i}" for i in range(600))


def prefill_leg(prefill: Engine, body: dict[str, Any], request_id: str) -> dict[str, Any]:
    leg = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True,
           "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
           "remote_host": None, "remote_port": None}}  # fmt: skip
    leg.pop("stream_options", None)
    status, reply = prefill.post("/v1/completions", leg, headers={"X-Request-Id": request_id})
    assert status == 200, reply
    params = reply["kv_transfer_params"]
    assert isinstance(params, dict)
    return params


def test_disaggregated_answer_equals_colocated(prefill: Engine, decode: Engine, colocated: Engine) -> None:
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 12, "seed": 3}
    params = prefill_leg(prefill, body, "req-pd-1")
    assert params["do_remote_prefill"] is True
    assert params["do_remote_decode"] is False
    assert params["remote_host"] == "127.0.0.1"
    assert params["remote_port"] == prefill.side_port
    assert params["tp_size"] == 1
    assert params["remote_request_id"].startswith("cmpl-req-pd-1-0-")
    assert len(params["remote_block_ids"]) == 600 // 16 + 1
    assert prefill.get("/debug/kv")[1]["held_blocks"] == len(params["remote_block_ids"])

    status, events = decode.stream(
        "/v1/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}, "kv_transfer_params": params},
        headers={"X-Request-Id": "req-pd-1"},
    )
    assert status == 200
    chunks = [json.loads(e) for e in events[:-1]]
    disaggregated = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert chunks[-1]["usage"] == {"prompt_tokens": 600, "completion_tokens": 12, "total_tokens": 612}
    _, local = colocated.post("/v1/completions", body)
    assert disaggregated == local["choices"][0]["text"]

    kv = prefill.get("/debug/kv")[1]
    assert kv["held"] == []  # freed once pulled
    assert kv["pool"]["used"] == 0
    assert decode.metric("vllm:nixl_xfer_time_seconds_count") >= 1
    assert decode.metric("vllm:nixl_bytes_transferred_sum") >= 600 * 131072


def test_chat_two_phase(prefill: Engine, decode: Engine, colocated: Engine) -> None:
    body = {"model": NAME, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5}
    leg = {**body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    status, reply = prefill.post("/v1/chat/completions", leg)
    assert status == 200
    params = reply["kv_transfer_params"]
    status, answer = decode.post("/v1/chat/completions", {**body, "kv_transfer_params": params})
    assert status == 200
    _, local = colocated.post("/v1/chat/completions", body)
    assert answer["choices"][0]["message"]["content"] == local["choices"][0]["message"]["content"]


def test_a_handle_can_be_pulled_once_then_policy_fail_gives_500(prefill: Engine, decode: Engine) -> None:
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 3}
    params = prefill_leg(prefill, body, "req-pd-twice")
    assert decode.post("/v1/completions", {**body, "kv_transfer_params": params})[0] == 200
    failed_before = decode.metric("vllm:nixl_num_failed_transfers_total")
    status, reply = decode.post("/v1/completions", {**body, "kv_transfer_params": params})
    assert status == 500
    assert "unknown or expired KV handle" in reply["error"]["message"]
    assert decode.metric("vllm:nixl_num_failed_transfers_total") == failed_before + 1


def test_prompt_mismatch_is_refused(prefill: Engine, decode: Engine) -> None:
    params = prefill_leg(prefill, {"model": NAME, "prompt": PROMPT, "max_tokens": 1}, "req-pd-mismatch")
    status, reply = decode.post(
        "/v1/completions",
        {"model": NAME, "prompt": "a different prompt", "max_tokens": 2, "kv_transfer_params": params},
    )
    assert status == 500
    assert "mismatch" in reply["error"]["message"]
    params = prefill_leg(prefill, {"model": NAME, "prompt": PROMPT, "max_tokens": 1}, "req-pd-same-length")
    same_length = PROMPT.replace("w1 ", "v1 ", 1)
    body = {"model": NAME, "prompt": same_length, "max_tokens": 2, "kv_transfer_params": params}
    status, reply = decode.post("/v1/completions", body)
    assert status == 500
    assert "prompts differ" in reply["error"]["message"]


@pytest.fixture(scope="module")
def short_lease_prefill() -> Iterator[Engine]:
    # Long enough that the held blocks are still there when the test looks right after the prefill
    # leg, on a busy machine (0.5 s was a race); the test then waits for the expiry.
    extra = {"kv_connector_extra_config": {"kv_lease_duration": 3.0}}
    engine = start_engine("--kv-transfer-config", kv_config("kv_producer", **extra), side_channel=True)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def recompute_decode() -> Iterator[Engine]:
    config = kv_config("kv_consumer", kv_load_failure_policy="recompute")
    engine = start_engine("--kv-transfer-config", config, side_channel=True)
    yield engine
    engine.stop()


def wait_for(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def test_lease_expiry_frees_blocks_and_decode_recomputes(
    short_lease_prefill: Engine, recompute_decode: Engine, colocated: Engine
) -> None:
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 4}
    params = prefill_leg(short_lease_prefill, body, "req-pd-lease")
    assert short_lease_prefill.get("/debug/kv")[1]["held_blocks"] > 0
    wait_for(lambda: short_lease_prefill.get("/debug/kv")[1]["expired_total"] == 1)
    kv = short_lease_prefill.get("/debug/kv")[1]
    assert kv["held"] == []
    assert kv["pool"]["used"] == 0
    assert params["remote_request_id"] in kv["recently_expired"]
    assert short_lease_prefill.metric("vllm:nixl_num_kv_expired_reqs_total") == 1

    status, answer = recompute_decode.post("/v1/completions", {**body, "kv_transfer_params": params})
    assert status == 200  # policy recompute: the decode engine prefills locally
    _, local = colocated.post("/v1/completions", body)
    assert answer["choices"][0]["text"] == local["choices"][0]["text"]


def test_unreachable_prefill_follows_policy(decode: Engine, recompute_decode: Engine) -> None:
    from .harness import free_port

    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [0],
        "remote_engine_id": "x",
        "remote_request_id": "gone",
        "remote_host": "127.0.0.1",
        "remote_port": free_port(),
        "tp_size": 1,
    }
    body = {"model": NAME, "prompt": "a b c", "max_tokens": 2, "kv_transfer_params": params}
    assert decode.post("/v1/completions", body)[0] == 500
    assert decode.post("/v1/completions", {**body, "stream": True})[0] == 500  # before the first byte
    assert recompute_decode.post("/v1/completions", body)[0] == 200


def test_heartbeats_keep_the_lease_while_decode_waits_for_blocks(colocated: Engine) -> None:
    # The gap between the prefill leg and the decode engine's first heartbeat must fit in a lease on a
    # busy machine: 3 s (1 s was a race), with the blocker holding the blocks three times as long.
    lease = {"kv_connector_extra_config": {"kv_lease_duration": 3.0}}
    prefill = start_engine("--kv-transfer-config", kv_config("kv_producer", **lease), side_channel=True)
    small_decode = start_engine(
        "--kv-transfer-config",
        kv_config("kv_consumer", **lease),
        "--num-gpu-blocks-override",
        "40",
        "--max-model-len",
        "640",
        side_channel=True,
        env={"TANDEM_SIM_TIME_SCALE": "1", "TANDEM_SIM_FAULTS": json.dumps({"slowdown": 45})},
    )
    try:
        import threading

        # 600 prompt tokens take 38 of the 40 blocks; 30 steps slowed down 45x keep them ~9 s.
        blocker_body = {"model": NAME, "prompt": " ".join(["x"] * 600), "max_tokens": 30}
        blocker = threading.Thread(target=small_decode.post, args=("/v1/completions", blocker_body))
        blocker.start()
        wait_for(lambda: small_decode.get("/debug/state")[1]["kv_cache_usage"] >= 0.95)
        body = {"model": NAME, "prompt": " ".join(f"h{i}" for i in range(100)), "max_tokens": 3}
        params = prefill_leg(prefill, body, "req-heartbeat")
        started = time.monotonic()
        status, answer = small_decode.post(
            "/v1/completions", {**body, "kv_transfer_params": params}, timeout=60
        )
        waited = time.monotonic() - started
        assert waited > 4.5, f"decode waited {waited:.1f} s: not long enough to need a heartbeat"
        blocker.join(timeout=60)
        assert status == 200, answer  # without heartbeats the 3 s lease would have lapsed
        assert prefill.get("/debug/kv")[1]["expired_total"] == 0
        _, local = colocated.post("/v1/completions", body)
        assert answer["choices"][0]["text"] == local["choices"][0]["text"]
    finally:
        prefill.stop()
        small_decode.stop()


def test_decode_refuses_kv_of_another_serving_revision(prefill: Engine, decode: Engine) -> None:
    """A decode engine of revision r2 refuses KV from a prefill of another revision (a mixed pair, which
    the router must never make) with a 500 naming both, counted; the same revision is served."""
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 4, "seed": 5}
    params = prefill_leg(prefill, body, "req-rev-1")
    assert params["tandem_serving_revision"] == ""  # no TANDEM_SERVING_REVISION: the legacy revision
    other = start_engine(
        "--kv-transfer-config",
        kv_config("kv_consumer"),
        env={"TANDEM_SERVING_REVISION": "r2"},
        side_channel=True,
    )
    try:
        status, reply = other.post("/v1/completions", {**body, "kv_transfer_params": params})
        assert status == 500, reply
        assert "serving revision mismatch" in reply["error"]["message"]
        assert "revision legacy" in reply["error"]["message"]
        assert "revision r2" in reply["error"]["message"]
        assert other.metric("tandem:kv_revision_mismatch_refusals_total") == 1.0
        assert other.metric("vllm:nixl_num_failed_transfers_total") == 0.0  # no pull was tried
    finally:
        other.stop()
    # The legacy decode engine serves the same handle: it is the prefill's revision.
    status, reply = decode.post("/v1/completions", {**body, "kv_transfer_params": params})
    assert status == 200, reply
    assert decode.metric("tandem:kv_revision_mismatch_refusals_total") == 0.0
