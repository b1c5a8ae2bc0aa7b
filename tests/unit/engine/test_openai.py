"""Request validation and the exact shape of streamed chunks."""

from __future__ import annotations

import json

import pytest

from tandem.engine.openai import ChunkWriter, RequestError, full_response, parse_generation
from tandem.engine.tokens import natural_length

NAMES = ("llama-8b",)


def parse(body: object, chat: bool = False):  # type: ignore[no-untyped-def]
    return parse_generation(body, chat, NAMES, max_model_len=100, default_seed=0, force_usage=False)


def test_defaults_and_limits() -> None:
    req = parse({"prompt": "one two three"})
    assert req.model == "llama-8b"
    assert req.prompt_tokens == 3
    assert req.max_tokens_param == 97  # vLLM: the rest of the context
    assert req.stops_at_eos  # ... and the model stops by itself, deterministically
    assert req.max_tokens == min(97, natural_length(req.prompt_key, 0))
    assert parse({"prompt": "one two three", "ignore_eos": True}).max_tokens == 97
    assert not parse({"prompt": "one two three", "max_tokens": 5}).stops_at_eos
    assert not req.stream
    chat = parse({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2}, chat=True)
    assert chat.max_tokens == 2


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "other", "prompt": "x"}, 404, "does not exist"),
        ({"prompt": "x", "max_tokens": 0}, 400, "at least 1"),
        ({"prompt": "x", "max_tokens": 100}, 400, "maximum context length is 100"),
        ({"prompt": ""}, 400, "empty"),
        ({"prompt": "x", "n": 2}, 400, "n=1"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream=True"),
        ([], 400, "JSON object"),
    ],
)
def test_refusals(body: object, status: int, message: str) -> None:
    with pytest.raises(RequestError, match=message) as info:
        parse(body)
    assert info.value.status == status


@pytest.mark.parametrize("chat", [False, True])
def test_chunks_are_valid_json_with_vllm_fields(chat: bool) -> None:
    body = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    body |= {"messages": [{"role": "user", "content": "a b"}]} if chat else {"prompt": "a b"}
    req = parse(body, chat=chat)
    writer = ChunkWriter(req, "id-1", 123)
    token = json.loads(writer.token_chunk(' he said "hi"', None, 1)[len(b"data: ") :])
    final = json.loads(writer.token_chunk(" end", "length", 2)[len(b"data: ") :])
    usage = json.loads(writer.usage_chunk(2)[len(b"data: ") :])
    assert token["id"] == "id-1"
    assert token["created"] == 123
    assert token["usage"]["completion_tokens"] == 1
    choice = token["choices"][0]
    assert (choice["delta"]["content"] if chat else choice["text"]) == ' he said "hi"'
    assert choice["finish_reason"] is None
    assert final["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"]["total_tokens"] == req.prompt_tokens + 2
    if chat:
        role = json.loads(writer.role_chunk()[len(b"data: ") :])
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    error = json.loads(ChunkWriter.error_chunk("boom")[len(b"data: ") :])
    assert error["error"]["message"] == "boom"


def test_full_response_carries_kv_transfer_params() -> None:
    req = parse({"prompt": "a b", "max_tokens": 1})
    data = full_response(req, "cmpl-x", 1, " t", "length", 1, {"remote_request_id": "r"})
    assert data["kv_transfer_params"] == {"remote_request_id": "r"}
    assert data["usage"] == {"prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1}
