"""Streaming responses: the SSE events of one stream, written by the engine's step loop itself.

At hundreds of streams the cost per token is what matters. The handler task sends the response
head and the events ready at that point, then hands the stream to the step loop (`Job.listener`):
each step calls `SSEStream.on_progress` for the streams that got a token, which formats the new
events and writes them, as one HTTP chunk, straight to the connection's transport. The handler only
wakes up again for the stream's last events (it writes them and ends the response at once, before
a client that has seen `[DONE]` hangs up), when the client disconnects, or when the client reads
slower than tokens arrive: above `HIGH_WATER` bytes unsent in the
transport, the stream goes back to the handler writing through aiohttp, which waits for the
transport to drain, until the transport has caught up.

The bytes on the wire are the same either way: `data: {...}\\n\\n` events in HTTP/1.1 chunks (raw
for an HTTP/1.0 client), the same events per token as vLLM's.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tandem.engine.openai import DONE, ChunkWriter
from tandem.engine.tokens import sampler_base, token_id_at, token_json

if TYPE_CHECKING:
    from tandem.engine.core import Job
    from tandem.engine.openai import GenerationRequest

# Bytes unsent in a transport above which a stream stops writing from the step loop.
HIGH_WATER = 64 * 1024


class SSEStream:
    """Renders one stream's events, and writes them directly while its client keeps up."""

    def __init__(self, req: GenerationRequest, job: Job, chunks: ChunkWriter, fail_after: int | None) -> None:
        self.req = req
        self.job = job
        self.chunks = chunks
        self.fail_after = fail_after  # injected stream error after this many tokens
        self.base = sampler_base(req.prompt_key, req.seed)
        self.sent = 0  # tokens rendered so far
        self.done = False  # the closing events ([DONE]) are rendered
        self.failed = False  # closed by an injected error: the request is to be aborted
        self._transport: asyncio.Transport | None = None
        self._chunked = False
        self._wake: asyncio.Future[None] | None = None
        self._affixes = chunks.open_affixes()

    def render(self) -> bytes:
        """The events not rendered yet: new tokens and, once the stream is over, its closing events."""
        if self.done:
            return b""
        seq = self.job.seq
        produced = seq.num_output
        failing = self.fail_after is not None and produced >= self.fail_after
        if failing and self.fail_after is not None:
            produced = self.fail_after
        out: list[bytes] = []
        last = seq.num_output - 1 if seq.finished else -1
        chunks, base = self.chunks, self.base
        for i in range(self.sent, produced):
            out.append(
                chunks.token_chunk_json(
                    token_json(token_id_at(base, i)), seq.finish_reason if i == last else None, i + 1
                )
            )
        self.sent = produced
        if failing:
            out.append(ChunkWriter.error_chunk("injected fault: error inside the stream"))
            out.append(DONE)
            self.done = self.failed = True
        elif seq.finished:
            if seq.finish_reason in ("error", "abort"):
                out.append(ChunkWriter.error_chunk(seq.error or f"request {seq.finish_reason}"))
            elif self.req.include_usage:
                out.append(self.chunks.usage_chunk(seq.num_output))
            out.append(DONE)
            self.done = True
        return out[0] if len(out) == 1 else b"".join(out)

    def can_write_directly(self, transport: asyncio.Transport | None) -> bool:
        return (
            transport is not None
            and not transport.is_closing()
            and transport.get_write_buffer_size() <= HIGH_WATER
        )

    async def deliver(self, transport: asyncio.Transport, chunked: bool) -> None:
        """Lets the step loop write this stream's events until it is over or must slow down."""
        self._transport, self._chunked = transport, chunked
        self._wake = asyncio.get_running_loop().create_future()
        self.job.listener = self.on_progress
        seq = self.job.seq
        if seq.num_output > self.sent or seq.finished:  # progress while the handler was writing
            self.on_progress()
        try:
            await self._wake
        finally:
            self.job.listener = None
            self._transport = self._wake = None

    def on_progress(self) -> None:
        """Called by the step loop when the job got tokens or finished."""
        wake = self._wake
        if wake is None or wake.done():
            return
        try:
            transport = self._transport
            if self._ending() or transport is None or not self.can_write_directly(transport):
                # The handler writes the rest: the last events together with the end of the
                # response (as one write, before the client can hang up), or waiting for a slow client.
                wake.set_result(None)
                return
            seq = self.job.seq
            if seq.num_output == self.sent + 1 and self._affixes is not None:  # the usual: one token
                before, after = self._affixes
                data = before + token_json(token_id_at(self.base, self.sent)) + after
                self.sent += 1
            else:
                data = self.render()
            if data:
                transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        except Exception as exc:  # never let one stream break the step loop
            wake.set_exception(exc)

    def _ending(self) -> bool:
        seq = self.job.seq
        return seq.finished or (self.fail_after is not None and seq.num_output >= self.fail_after)
