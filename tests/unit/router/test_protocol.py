"""Leg bodies of the two-phase protocol and the checks on a client's request."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.router.protocol import (
    BadRequest,
    check_fits,
    decode_body,
    dump_body,
    kv_transfer_params_of,
    parse_body,
    prefill_body,
    request_facts,
)

CLIENT = {
    "model": "m",
    "prompt": "hello there",
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 50,
    "min_tokens": 5,
    "temperature": 0.0,
}


def test_prefill_body_is_one_unstreamed_token_that_keeps_kv_for_a_remote_decode() -> None:
    leg = prefill_body(CLIENT)
    assert leg["max_tokens"] == 1
    assert leg["stream"] is False
    assert "stream_options" not in leg
    assert "min_tokens" not in leg
    assert leg["kv_transfer_params"]["do_remote_decode"] is True
    assert leg["kv_transfer_params"]["do_remote_prefill"] is False
    assert leg["prompt"] == CLIENT["prompt"]
    assert leg["temperature"] == 0.0
    assert CLIENT["max_tokens"] == 50  # the client's body is not touched


def test_prefill_body_caps_max_completion_tokens_too() -> None:
    leg = prefill_body({"model": "m", "messages": [], "max_completion_tokens": 9})
    assert leg["max_completion_tokens"] == 1


def test_decode_body_is_the_client_body_plus_params_verbatim() -> None:
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_host": "127.0.0.1"}
    leg = decode_body(CLIENT, params)
    assert {k: v for k, v in leg.items() if k != "kv_transfer_params"} == CLIENT
    assert leg["kv_transfer_params"] == params


def test_decode_body_without_params_is_a_plain_request() -> None:
    assert decode_body({**CLIENT, "kv_transfer_params": {"x": 1}}, None) == CLIENT


@pytest.mark.parametrize(
    ("answer", "params"),
    [
        ({"kv_transfer_params": {"remote_engine_id": "p"}}, {"remote_engine_id": "p"}),
        ({"kv_transfer_params": None}, None),
        ({}, None),
        ([], None),
    ],
)
def test_kv_transfer_params_of(answer: Any, params: Any) -> None:
    assert kv_transfer_params_of(answer) == params


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("completions", [], None),
        ("completions", {"model": 3, "prompt": "x"}, "model"),
        ("completions", {"model": "m"}, "prompt"),
        ("completions", {"model": "m", "prompt": {"a": 1}}, "prompt"),
        ("completions", {"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
        ("completions", {"model": "m", "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ("chat", {"model": "m", "messages": []}, "messages"),
        ("chat", {"model": "m", "messages": ["hi"]}, "messages"),
        # A batch is strings or token-id lists, one level deep: deeper nesting is refused, not recursed.
        ("completions", {"model": "m", "prompt": [["a"]]}, "prompt"),
        ("completions", {"model": "m", "prompt": [[[1, 2]]]}, "prompt"),
        ("completions", {"model": "m", "prompt": [[]]}, "prompt"),
        ("completions", {"model": "m", "prompt": ["a", 1]}, "prompt"),
    ],
)
def test_bad_requests_name_the_field(endpoint: Any, body: Any, param: str | None) -> None:
    with pytest.raises(BadRequest) as raised:
        request_facts(endpoint, body)
    assert raised.value.status == 400
    assert raised.value.param == param


def test_a_batch_of_prompts_counts_as_its_longest_member() -> None:
    facts = request_facts("completions", {"model": "m", "prompt": ["a b", [1, 2, 3, 4], "c"]})
    assert (facts.prompt_token_ids, facts.prompt_texts) == (4, ())


def test_facts_of_a_chat_request() -> None:
    facts = request_facts(
        "chat",
        {"model": "m", "messages": [{"role": "user", "content": "a b c"}], "max_completion_tokens": 7},
    )
    assert (facts.model, facts.stream, facts.max_tokens) == ("m", False, 7)
    assert facts.count_prompt_tokens() == 3 + 10  # words + template around one message


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "limit", "fits"),
    [
        ("one two three", 5, 100, True),
        ("one two three", 97, 100, True),
        ("one two three", 98, 100, False),
        ("w " * 100, None, 100, False),  # 100 tokens: no room for one output token
        ("w " * 99, None, 100, True),
        ([1] * 200, 1, 100, False),
        ("a,b,c,d", 94, 100, False),  # punctuation counts: 7 tokens
        ("w " * 5000, None, None, True),  # no limit known: the engine decides
    ],
)
def test_check_fits(prompt: Any, max_tokens: int | None, limit: int | None, fits: bool) -> None:
    facts = request_facts("completions", {"model": "m", "prompt": prompt, "max_tokens": max_tokens})
    if fits:
        check_fits(facts, limit)
    else:
        with pytest.raises(BadRequest, match="maximum context length"):
            check_fits(facts, limit)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"temperature": NaN}', "NaN is not a JSON number"),
        (b'{"temperature": Infinity}', "Infinity is not a JSON number"),
        (b'{"temperature": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"temperature": 1e400}', "1e400 is out of range"),
        (b"{not json", "Expecting property name"),
    ],
)
def test_parse_body_refuses_what_json_has_not(raw: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_body(raw)


@pytest.mark.parametrize(
    "body",
    [
        {"seed": 2**70, "logit_bias": {"50256": -100}},  # beyond orjson's 64 bits: json.dumps writes it
        {"prompt": "lone \ud800 surrogate"},  # parse_body lets it through; orjson refuses to write it
        {"prompt": "plain", "temperature": 0.7, "top_p": 1e-7, "n": 1, "stop": ["\n"]},
        {"messages": [{"role": "user", "content": "héllo \u2028 wörld 🙂"}]},
    ],
)
def test_dump_body_writes_back_what_parse_body_read(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    assert parse_body(dump_body(parse_body(raw))) == parse_body(raw)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_dump_body_round_trips_any_json(value: Any) -> None:
    assert parse_body(dump_body(value)) == value
    assert parse_body(dump_body(value)) == json.loads(json.dumps(value))
