"""OpenAI-compatible routes of the sim engine over real HTTP: formats, usage, ids and errors."""

from __future__ import annotations

import json

from .harness import NAME, Engine

PROMPT = "The quick brown fox jumps over the lazy dog."


def test_health_models_and_version(colocated: Engine) -> None:
    assert colocated.request("GET", "/health")[0] == 200
    status, models = colocated.get("/v1/models")
    assert status == 200
    assert models["data"][0]["id"] == NAME
    assert models["data"][0]["max_model_len"] == 16384
    assert colocated.get("/version")[1]["version"]


def test_non_streaming_completion_has_usage_and_length_finish(colocated: Engine) -> None:
    status, body = colocated.post("/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 7})
    assert status == 200
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}
    assert len(body["choices"][0]["text"].split()) == 7


def test_streaming_completion_format_and_usage(colocated: Engine) -> None:
    body = {
        "model": NAME,
        "prompt": PROMPT,
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, events = colocated.stream("/v1/completions", body)
    assert status == 200
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    token_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert len(token_chunks) == 5
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 4 + ["length"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 5
    streamed = "".join(c["choices"][0]["text"] for c in token_chunks)
    _, whole = colocated.post("/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 5})
    assert streamed == whole["choices"][0]["text"]


def test_streaming_chat_opens_with_role_and_has_no_usage_unless_asked(colocated: Engine) -> None:
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    status, events = colocated.stream("/v1/chat/completions", body)
    assert status == 200
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(c["choices"] for c in chunks)  # no usage chunk
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_non_streaming(colocated: Engine) -> None:
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4}
    status, reply = colocated.post("/v1/chat/completions", body)
    assert status == 200
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["usage"]["completion_tokens"] == 4


def test_output_is_deterministic_per_prompt_and_seed(colocated: Engine) -> None:
    def text(seed: int | None) -> str:
        body = {
            "model": NAME,
            "prompt": PROMPT,
            "max_tokens": 6,
            **({"seed": seed} if seed is not None else {}),
        }
        return str(colocated.post("/v1/completions", body)[1]["choices"][0]["text"])

    assert text(7) == text(7)
    assert text(7) != text(8)
    assert text(None) == text(0)  # the engine's --seed (default 0)


def test_request_id_header_sets_the_response_id(colocated: Engine) -> None:
    status, body = colocated.post(
        "/v1/completions",
        {"model": NAME, "prompt": PROMPT, "max_tokens": 1},
        headers={"X-Request-Id": "req-42"},
    )
    assert status == 200
    assert body["id"] == "cmpl-req-42"


def test_unknown_model_and_oversized_requests_are_refused(colocated: Engine) -> None:
    status, body = colocated.post("/v1/completions", {"model": "nope", "prompt": PROMPT, "max_tokens": 1})
    assert status == 404
    assert "does not exist" in body["error"]["message"]
    status, body = colocated.post("/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 16384})
    assert status == 400
    assert "maximum context length is 16384" in body["error"]["message"]
    status, _, _ = colocated.request("POST", "/v1/completions", None)
    assert status == 400


def test_client_disconnect_aborts_the_request() -> None:
    import http.client
    import time

    from prometheus_client.parser import text_string_to_metric_families

    from .harness import start_engine

    engine = start_engine(env={"TANDEM_SIM_TIME_SCALE": "1"})
    try:
        conn = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=30)
        body = json.dumps({"model": NAME, "prompt": PROMPT, "max_tokens": 5000, "stream": True})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        response.read1(100)  # some tokens arrived
        conn.close()

        def aborted() -> float:
            raw = engine.request("GET", "/metrics")[2].decode()
            samples = [s for f in text_string_to_metric_families(raw) for s in f.samples]
            hits = [
                s.value
                for s in samples
                if s.name == "vllm:request_success_total" and s.labels["finished_reason"] == "abort"
            ]
            return float(hits[0]) if hits else 0.0

        deadline = time.monotonic() + 60  # generous: a busy machine
        while aborted() < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert aborted() == 1
        state = engine.get("/debug/state")[1]
        assert state["running"] == 0
        assert state["kv_cache_usage"] == 0
    finally:
        engine.stop()


def test_without_a_limit_the_model_stops_by_itself(colocated: Engine) -> None:
    body = {"model": NAME, "prompt": PROMPT}
    status, reply = colocated.post("/v1/completions", body)
    assert status == 200
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert 64 <= reply["usage"]["completion_tokens"] <= 511
    assert colocated.post("/v1/completions", body)[1]["choices"][0]["text"] == reply["choices"][0]["text"]


def test_api_key_and_request_id_echo() -> None:
    from .harness import start_engine

    engine = start_engine("--api-key", "s3cret", "--enable-request-id-headers")
    try:
        body = {"model": NAME, "prompt": PROMPT, "max_tokens": 1}
        assert engine.post("/v1/completions", body)[0] == 401
        status, headers, _ = engine.request(
            "POST", "/v1/completions", body, headers={"Authorization": "Bearer s3cret", "X-Request-Id": "abc"}
        )
        assert status == 200
        assert headers["X-Request-Id"] == "abc"
        assert engine.request("GET", "/health")[0] == 200  # probes need no key
    finally:
        engine.stop()
