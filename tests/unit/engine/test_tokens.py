"""The stand-in tokenizer and the deterministic sampler."""

from __future__ import annotations

import json

from tandem.engine.tokens import (
    VOCAB_SIZE,
    count_prompt_tokens,
    natural_length,
    output_text,
    output_token_id,
    prompt_key,
    render_chat,
    sampler_base,
    token_id_at,
    token_json,
    token_text,
)


def test_prompt_tokens_are_words_and_punctuation() -> None:
    assert count_prompt_tokens("Hello, world!") == 4
    assert count_prompt_tokens("") == 0


def test_output_is_a_function_of_prompt_seed_and_index() -> None:
    key = prompt_key("a prompt")
    assert output_text(key, 0, 0, 10) == output_text(key, 0, 0, 10)
    assert output_text(key, 0, 0, 10) == output_text(key, 0, 0, 1) + output_text(key, 0, 1, 10)
    assert output_text(key, 0, 0, 10) != output_text(key, 1, 0, 10)
    assert output_text(key, 0, 0, 10) != output_text(prompt_key("another"), 0, 0, 10)
    assert all(0 <= output_token_id(key, 0, i) < VOCAB_SIZE for i in range(100))


def test_token_id_prompts_have_their_own_identity() -> None:
    assert prompt_key([1, 2, 3]) == prompt_key([1, 2, 3])
    assert prompt_key([1, 2, 3]) != prompt_key([1, 2, 4])


def test_chat_rendering_is_stable_and_reads_content_parts() -> None:
    plain = render_chat([{"role": "user", "content": "hi there"}])
    parts = render_chat([{"role": "user", "content": [{"type": "text", "text": "hi there"}]}])
    assert plain == parts
    assert plain.endswith("<|assistant|>\n")


def test_natural_length_is_deterministic_and_bounded() -> None:
    lengths = {natural_length(prompt_key(f"p{i}"), 0) for i in range(200)}
    assert min(lengths) >= 64
    assert max(lengths) <= 511
    assert len(lengths) > 50
    assert natural_length(prompt_key("p"), 1) == natural_length(prompt_key("p"), 1)


def test_streaming_helpers_agree_with_the_reference_functions() -> None:
    key = prompt_key("a prompt")
    for seed in (0, 7, -3, 2**70):
        base = sampler_base(key, seed)
        for i in (0, 1, 2, 63, 10_000):
            token = output_token_id(key, seed, i)
            assert token_id_at(base, i) == token
            assert token_json(token) == json.dumps(token_text(token)).encode()
