"""Leg bodies of the two-phase protocol and the checks on a client's request."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.router.protocol import (
    BadRequest,
    check_fits,
    decode_body,
    kv_transfer_params_of,
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
