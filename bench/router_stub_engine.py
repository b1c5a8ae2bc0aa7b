"""A zero-cost engine for the router benchmark: canned answers from a raw asyncio protocol.

It speaks just enough of vLLM's API for the router's two legs (prefill JSON with
`kv_transfer_params`, a streamed SSE decode) while spending as little CPU as possible, so a
benchmark on a small machine measures the router and not the engine. With `--itl-ms` a streamed
answer sends one token event every ITL milliseconds (zero compute, but streams last, so many are
in flight at once, as in a decode pool); without it the whole stream leaves in one write. Usage:
`python bench/router_stub_engine.py --port 8001 [--tokens 16] [--itl-ms 20]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json

_KV = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "stub",
    "remote_block_ids": [1, 2, 3, 4],
    "remote_host": "127.0.0.1",
    "remote_port": 5600,
}


_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _http(status: str, body: bytes, content_type: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + content_type
    return head + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body


def _chunked_sse(events: list[bytes]) -> bytes:
    parts = [_SSE_HEAD]
    for event in events:
        parts.append(f"{len(event):x}\r\n".encode() + event + b"\r\n")
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


class Canned:
    def __init__(self, model: str, tokens: int) -> None:
        usage = {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}
        choice = {"index": 0, "text": " a", "finish_reason": "length"}
        prefill = {"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": usage}
        self.prefill = _http("200 OK", json.dumps({**prefill, "kv_transfer_params": _KV}).encode())
        events = []
        for i in range(tokens):
            chunk = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": f" t{i}"}]}
            events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        # The final usage chunk vLLM sends with stream_options.include_usage (the router always asks).
        final = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}
        usage_chunk = {"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": final}
        events.append(b"data: " + json.dumps(usage_chunk).encode() + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        self.stream = _chunked_sse(events)
        self.stream_head = _SSE_HEAD
        self.stream_chunks = [f"{len(event):x}\r\n".encode() + event + b"\r\n" for event in events]
        self.stream_end = b"0\r\n\r\n"
        whole = {**prefill, "choices": [{"index": 0, "text": " t" * tokens, "finish_reason": "length"}]}
        self.whole = _http("200 OK", json.dumps(whole).encode())
        models = {"object": "list", "data": [{"id": model, "object": "model", "max_model_len": 8192}]}
        self.models = _http("200 OK", json.dumps(models).encode())
        self.health = _http("200 OK", b"{}")
        self.not_found = _http("404 Not Found", b'{"error": {"message": "not found", "code": 404}}')


class EngineProtocol(asyncio.Protocol):
    def __init__(self, canned: Canned, itl_s: float) -> None:
        self.canned = canned
        self.itl_s = itl_s
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end]
            length = 0
            lower = head.lower()
            at = lower.find(b"content-length:")
            if at >= 0:
                length = int(
                    lower[at + 15 : lower.find(b"\r\n", at) if lower.find(b"\r\n", at) > 0 else None]
                )
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            assert self.transport is not None
            answer = self.answer(head, body)
            if answer is self.canned.stream and self.itl_s > 0:
                self._paced(0)
            else:
                self.transport.write(answer)

    def _paced(self, index: int) -> None:
        """Writes the paced stream's head and first token now, then one token per ITL."""
        transport, canned = self.transport, self.canned
        if transport is None or transport.is_closing():
            return
        chunks = canned.stream_chunks  # token events, then usage and [DONE]
        data = canned.stream_head + chunks[0] if index == 0 else chunks[index]
        if index >= len(chunks) - 3:  # the last token leaves with usage, [DONE] and the end of the body
            transport.write(data + chunks[-2] + chunks[-1] + canned.stream_end)
            return
        transport.write(data)
        asyncio.get_running_loop().call_later(self.itl_s, self._paced, index + 1)

    def answer(self, head: bytes, body: bytes) -> bytes:
        line = head.split(b"\r\n", 1)[0]
        if line.startswith(b"GET /v1/models"):
            return self.canned.models
        if line.startswith(b"GET /health"):
            return self.canned.health
        if not line.startswith(b"POST /v1/"):
            return self.canned.not_found
        if b'"do_remote_decode": true' in body or b'"do_remote_decode":true' in body:
            return self.canned.prefill
        if b'"stream": true' in body or b'"stream":true' in body:
            return self.canned.stream
        return self.canned.whole


async def serve(host: str, port: int, model: str, tokens: int, itl_s: float) -> None:
    canned = Canned(model, tokens)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: EngineProtocol(canned, itl_s), host, port, backlog=2048)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="bench-model")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--itl-ms", type=float, default=0.0, help="gap between streamed token events")
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, args.model, args.tokens, args.itl_ms / 1000))


if __name__ == "__main__":
    main()
