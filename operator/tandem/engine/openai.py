"""OpenAI/vLLM request parsing and response formatting for completions and chat. Pure.

Streaming chunks are built from prefixes precomputed per request: the body of each SSE event is
`prefix + json.dumps(text) + suffix`, which keeps per-token cost low at hundreds of streams.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from tandem.engine.tokens import natural_length, prompt_key, prompt_tokens_of, render_chat

DONE = b"data: [DONE]\n\n"


class RequestError(ValueError):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def error_body(message: str, kind: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


@dataclass(frozen=True)
class GenerationRequest:
    chat: bool
    model: str
    prompt_tokens: int
    prompt_key: int
    max_tokens: int
    max_tokens_param: int  # what the client asked (or the default), for the metric
    stops_at_eos: bool  # no limit given: generation ends at a deterministic EOS (finish_reason "stop")
    seed: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    kv_transfer_params: dict[str, Any] | None
    # The prompt's tokens (words, or the ids of a token-id prompt), for the prefix cache.
    prompt_token_list: tuple[Hashable, ...] = field(default=(), repr=False, compare=False)


def parse_generation(
    body: Any,
    chat: bool,
    served_names: tuple[str, ...],
    max_model_len: int,
    default_seed: int,
    force_usage: bool,
) -> GenerationRequest:
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    model = body.get("model") or served_names[0]
    if model not in served_names:
        raise RequestError(f"The model `{model}` does not exist.", 404, "NotFoundError")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("messages must be a non-empty list of objects")
        text = render_chat(messages)
        tokens: tuple[Hashable, ...] = tuple(prompt_tokens_of(text))
        n_prompt, key = len(tokens), prompt_key(text)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            tokens = tuple(prompt_tokens_of(prompt))
            n_prompt, key = len(tokens), prompt_key(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            tokens = tuple(prompt)
            n_prompt, key = len(prompt), prompt_key(prompt)
        else:
            raise RequestError("prompt must be a string, a list of token ids, or a list with one of those")
    if n_prompt < 1:
        raise RequestError("The prompt is empty; at least one token is required.")
    n = body.get("n", 1)
    if n != 1:
        raise RequestError("the tandem sim engine supports n=1 only")
    limit = body.get("max_completion_tokens") if chat else None
    if limit is None:
        limit = body.get("max_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise RequestError(f"max_tokens must be at least 1, got {limit}.")
    if n_prompt >= max_model_len or (limit is not None and n_prompt + limit > max_model_len):
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{n_prompt + (limit or 0)} tokens ({n_prompt} in the messages, {limit or 0} in the completion). "
            "Please reduce the length of the messages or completion."
        )
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise RequestError("seed must be an integer")
    seed = default_seed if seed is None else seed
    default_limit = max_model_len - n_prompt  # vLLM's default: the rest of the context
    stops_at_eos = limit is None and not body.get("ignore_eos", False)
    if limit is not None:
        max_tokens = limit
    elif stops_at_eos:
        max_tokens = min(natural_length(key, seed), default_limit)
    else:
        max_tokens = default_limit
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("stream_options must be an object")
    if options and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.")
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise RequestError("kv_transfer_params must be an object")
    return GenerationRequest(
        chat=chat,
        model=model,
        prompt_tokens=n_prompt,
        prompt_key=key,
        max_tokens=max_tokens,
        max_tokens_param=limit if limit is not None else default_limit,
        stops_at_eos=stops_at_eos,
        seed=seed,
        stream=stream,
        include_usage=bool(options.get("include_usage")) or force_usage,
        continuous_usage=bool(options.get("continuous_usage_stats")),
        kv_transfer_params=kv,
        prompt_token_list=tokens,
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def full_response(
    req: GenerationRequest,
    response_id: str,
    created: int,
    text: str,
    finish_reason: str,
    completion_tokens: int,
    kv_transfer_params: dict[str, Any] | None,
) -> dict[str, Any]:
    choice: dict[str, Any]
    if req.chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
    return {
        "id": response_id,
        "object": "chat.completion" if req.chat else "text_completion",
        "created": created,
        "model": req.model,
        "choices": [choice],
        "usage": usage(req.prompt_tokens, completion_tokens),
        "kv_transfer_params": kv_transfer_params,
    }


class ChunkWriter:
    """Formats the SSE events of one streaming response."""

    def __init__(self, req: GenerationRequest, response_id: str, created: int) -> None:
        self.req = req
        obj = "chat.completion.chunk" if req.chat else "text_completion"
        rid, model = json.dumps(response_id), json.dumps(req.model)
        head = f'{{"id":{rid},"object":"{obj}","created":{created},"model":{model}'
        self._head = head
        if req.chat:
            self._prefix = ("data: " + head + ',"choices":[{"index":0,"delta":{"content":').encode()
            self._suffix_open = ',"logprobs":null,"finish_reason":null}]'
            self._suffix_final = ',"logprobs":null,"finish_reason":"{reason}","stop_reason":null}}]'
        else:
            self._prefix = ("data: " + head + ',"choices":[{"index":0,"text":').encode()
            self._suffix_open = ',"logprobs":null,"finish_reason":null,"stop_reason":null}]'
            self._suffix_final = ',"logprobs":null,"finish_reason":"{reason}","stop_reason":null}}]'
        # Everything after the text of a token that is not the last, when no usage rides along.
        self._open_tail = (("}" if req.chat else "") + self._suffix_open + "}\n\n").encode()

    def role_chunk(self) -> bytes:
        """Chat streams open with an empty assistant delta, as vLLM's do."""
        body = (
            self._head
            + ',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            + '"logprobs":null,"finish_reason":null}]}'
        )
        return b"data: " + body.encode() + b"\n\n"

    def token_chunk(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        return self.token_chunk_json(json.dumps(text).encode(), finish_reason, completion_tokens)

    def open_affixes(self) -> tuple[bytes, bytes] | None:
        """(before, after) the JSON-encoded text in the event of a token that is not the stream's
        last, when nothing else varies between such events (no per-chunk usage); else None."""
        return None if self.req.continuous_usage else (self._prefix, self._open_tail)

    def token_chunk_json(self, text_json: bytes, finish_reason: str | None, completion_tokens: int) -> bytes:
        """`token_chunk` for text already JSON-encoded (`tokens.token_json`)."""
        if finish_reason is None and not self.req.continuous_usage:
            return self._prefix + text_json + self._open_tail
        suffix = (
            self._suffix_open if finish_reason is None else self._suffix_final.format(reason=finish_reason)
        )
        if self.req.chat:
            suffix = "}" + suffix
        if self.req.continuous_usage:
            suffix += ',"usage":' + json.dumps(
                usage(self.req.prompt_tokens, completion_tokens), separators=(",", ":")
            )
        return self._prefix + text_json + suffix.encode() + b"}\n\n"

    def usage_chunk(self, completion_tokens: int) -> bytes:
        body = (
            self._head
            + ',"choices":[],"usage":'
            + json.dumps(usage(self.req.prompt_tokens, completion_tokens), separators=(",", ":"))
            + "}"
        )
        return b"data: " + body.encode() + b"\n\n"

    @staticmethod
    def error_chunk(message: str, kind: str = "InternalServerError", status: int = 500) -> bytes:
        return b"data: " + json.dumps(error_body(message, kind, status)).encode() + b"\n\n"
