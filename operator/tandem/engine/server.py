"""The HTTP shell: vLLM's OpenAI-compatible routes, /metrics, /health, and the sim's /debug and /admin.

Routes: GET /health, GET|POST /ping, GET /version, GET /v1/models, POST /v1/completions,
POST /v1/chat/completions, GET /metrics, GET /debug/kv, GET /debug/state, GET|POST|DELETE /admin/faults.
Until TANDEM_SIM_LOAD_SECONDS have passed since start the engine is "loading weights": /health,
/ping, /v1/* and /metrics answer 503 (vLLM serves nothing then; a readiness probe sees "not yet").
A member of a multi-node group (`group.py`) answers /health 503 until the group has formed; its
leader sends each generation request of a data-parallel group to the least busy rank.
Streaming responses start (status 200) when the first token is ready, so failures before it, such
as a failed KV pull under policy `fail`, are plain HTTP 500s; later failures are an error event
inside the 200 stream followed by `data: [DONE]`, as in vLLM.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
import uuid
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, web

from tandem import __version__
from tandem.engine.config import EngineConfig
from tandem.engine.core import EngineCore, Job, RemotePrefill, revision_mismatch
from tandem.engine.group import Group, merge_expositions
from tandem.engine.ingress import IngressQueue
from tandem.engine.openai import (
    ChunkWriter,
    GenerationRequest,
    RequestError,
    error_body,
    full_response,
    parse_generation,
)
from tandem.engine.scheduler import Sequence
from tandem.engine.settings import Faults
from tandem.engine.streaming import SSEStream
from tandem.engine.tokens import output_text, output_token_word

SIM_VERSION = f"0.11.0+tandem.sim.{__version__}"
_JSON = "application/json"


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(data, separators=(",", ":")).encode(),
        status=status,
        content_type=_JSON,
        headers=headers,
    )


def _error(message: str, status: int, kind: str) -> web.Response:
    return _json(error_body(message, kind, status), status)


# Forwarded generation requests: the headers the rank's engine reads (auth, ids, body type).
_FORWARDED_HEADERS = ("Authorization", "Content-Type", "X-Request-Id", "Accept")


class EngineServer:
    def __init__(self, config: EngineConfig, core: EngineCore, group: Group | None = None) -> None:
        self.config = config
        self.core = core
        self.group = group
        self._client: ClientSession | None = None  # the leader's, to its workers' engines
        self.draining = False
        self.requests_seen = 0
        self._ingress = IngressQueue()  # the request latency's serving process
        self._started = time.time()
        load = config.sim.load_seconds
        self._loading_until: float | None = time.monotonic() + load if load > 0 else None

    @property
    def loading(self) -> bool:
        """True while the simulated model load lasts (TANDEM_SIM_LOAD_SECONDS from start)."""
        if self._loading_until is None:
            return False
        if time.monotonic() < self._loading_until:
            return True
        self._loading_until = None  # loaded for good: later calls skip the clock
        return False

    def _loading_answer(self) -> web.Response | None:
        if not self.loading:
            return None
        return _error("The model is still loading.", 503, "ServiceUnavailableError")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_route("*", "/ping", self.health)
        r.add_get("/version", self.version)
        r.add_get("/v1/models", self.models)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/metrics", self.metrics)
        r.add_post("/abort_requests", self.abort_requests)
        r.add_get("/debug/kv", self.debug_kv)
        r.add_get("/debug/state", self.debug_state)
        r.add_get("/admin/faults", self.get_faults)
        r.add_post("/admin/faults", self.post_faults)
        r.add_delete("/admin/faults", self.delete_faults)
        return app

    async def _hang_if_asked(self) -> None:
        await self.core.wait_while_hung()

    # --- plain routes ---------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        await self._hang_if_asked()
        if (loading := self._loading_answer()) is not None:
            return loading
        if self.group is not None and not self.group.formed:
            return _error(
                "The engine's group has not formed: a rank has not joined.", 503, "ServiceUnavailableError"
            )
        return web.Response(status=503 if self.draining else 200)

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": SIM_VERSION})

    async def models(self, request: web.Request) -> web.Response:
        await self._hang_if_asked()
        if (loading := self._loading_answer()) is not None:
            return loading
        if (denied := self._check_key(request)) is not None:
            return denied
        created = int(self._started)
        data: list[dict[str, Any]] = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.config.model,
                "parent": None,
                "max_model_len": self.config.max_model_len,
                "permission": [],
            }
            for name in self.config.served_model_names
        ]
        return _json({"object": "list", "data": data})

    async def metrics(self, request: web.Request) -> web.Response:
        await self._hang_if_asked()
        if (loading := self._loading_answer()) is not None:
            return loading
        if self.core.faults.metrics_error:
            return _error("injected fault: metrics unavailable", 500, "InternalServerError")
        body, content_type = self.core.metrics.exposition()
        ranks = self.group.rank_urls() if self.group is not None else {}
        if ranks:  # a data-parallel leader reports every rank of its group (group.py)
            texts = await asyncio.gather(*(self._rank_metrics(url) for url in ranks.values()))
            found = {rank: text for rank, text in zip(ranks, texts, strict=True) if text is not None}
            body = merge_expositions(body.decode(), found).encode()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _rank_metrics(self, url: str) -> str | None:
        """A worker rank's own exposition (None when it does not answer: its group is breaking)."""
        if self._client is None:
            self._client = ClientSession(timeout=ClientTimeout(total=None, sock_connect=5))
        try:
            async with self._client.get(url + "/metrics", timeout=ClientTimeout(total=5)) as answer:
                return await answer.text() if answer.status == 200 else None
        except (ClientError, OSError, TimeoutError):
            return None

    async def debug_kv(self, request: web.Request) -> web.Response:
        return _json(self.core.debug_kv())

    async def debug_state(self, request: web.Request) -> web.Response:
        core = self.core
        return _json(
            {
                "model": self.config.model,
                "served_model_names": list(self.config.served_model_names),
                "perf_model": self.config.arch.model_id,
                "profile": self.config.profile.model_dump(),
                "time_scale": self.config.sim.time_scale,
                "running": core.scheduler.num_running,
                "waiting": core.scheduler.num_waiting,
                "kv_cache_usage": core.pool.usage,
                "num_gpu_blocks": core.pool.num_blocks,
                "steps": core.steps,
                "modelled_busy_seconds": core.step_seconds_total,
                "mean_step_lag_seconds": core.lag_seconds_total / core.steps if core.steps else 0.0,
                "max_step_lag_seconds": core.lag_seconds_max,
                "draining": self.draining,
                "loading": self.loading,
                "faults": core.faults.model_dump(),
                "requests_seen": self.requests_seen,
                "group": None
                if self.group is None
                else {
                    "node_rank": self.group.spec.node_rank,
                    "formed": self.group.formed,
                    "in_flight": self.group.in_flight,
                },
            }
        )

    async def get_faults(self, request: web.Request) -> web.Response:
        return _json(self.core.faults.model_dump())

    async def post_faults(self, request: web.Request) -> web.Response:
        try:
            patch = await request.json()
            if not isinstance(patch, dict):
                raise ValueError("body must be a JSON object")
            faults = self.core.faults.merged(patch)
        except ValueError as exc:  # includes JSON and pydantic validation errors
            return _error(str(exc), 400, "BadRequestError")
        self.core.set_faults(faults)
        if faults.crash:
            asyncio.get_running_loop().call_later(0.05, os._exit, 1)
        return _json(faults.model_dump())

    async def delete_faults(self, request: web.Request) -> web.Response:
        self.core.set_faults(Faults())
        return _json(self.core.faults.model_dump())

    async def abort_requests(self, request: web.Request) -> web.Response:
        """`{"request_ids": [...]}`: frees the KV held for those remote_request_ids (the router's
        release of an abandoned request). The name is vLLM's (`--tokens-only`); freeing the KV of a
        finished prefill this way is the sim's, real vLLM holds it until its lease lapses."""
        if (denied := self._check_key(request)) is not None:
            return denied
        try:
            body = await request.json()
            ids = body.get("request_ids") if isinstance(body, dict) else None
            if not isinstance(ids, list) or not all(isinstance(rid, str) for rid in ids):
                raise ValueError("'request_ids' must be a list of strings")
        except ValueError as exc:
            return _error(str(exc), 400, "BadRequestError")
        return _json({"released_blocks": self.core.release_held(ids)})

    def _check_key(self, request: web.Request) -> web.Response | None:
        key = self.config.args.api_key or os.environ.get("VLLM_API_KEY")
        if key and request.headers.get("Authorization") != f"Bearer {key}":
            return _json({"error": "Unauthorized"}, 401)
        return None

    # --- generation ----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        await self._hang_if_asked()
        faults = self.core.faults
        self.requests_seen += 1
        if faults.crash_after_requests is not None and self.requests_seen >= faults.crash_after_requests:
            os._exit(1)
        if (denied := self._check_key(request)) is not None:
            return denied
        if self.draining:
            return _error("The server is shutting down.", 503, "ServiceUnavailableError")
        if (loading := self._loading_answer()) is not None:
            return loading
        group = self.group
        if group is None:
            return await self._generate_here(request, chat)
        if not group.formed:
            return _error(
                "The engine's group has not formed: a rank has not joined.", 503, "ServiceUnavailableError"
            )
        if group.spec.external:  # each rank serves its own API (External, MultiPortExternal)
            return await self._generate_here(request, chat)
        rank, url = group.pick()
        group.in_flight[rank] += 1
        try:
            if url is None:
                return await self._generate_here(request, chat)
            return await self._forward(request, url)
        finally:
            group.in_flight[rank] -= 1

    async def _forward(self, request: web.Request, url: str) -> web.StreamResponse:
        """The request as the rank at `url` answers it, streamed through (the leader's API server
        handing a request to another rank's engine)."""
        if self._client is None:
            self._client = ClientSession(timeout=ClientTimeout(total=None, sock_connect=5))
        headers = {h: request.headers[h] for h in _FORWARDED_HEADERS if h in request.headers}
        try:
            async with self._client.post(
                url + request.path, data=await request.read(), headers=headers
            ) as answer:
                response = web.StreamResponse(status=answer.status)
                for name in ("Content-Type", "X-Request-Id", "Cache-Control"):
                    if name in answer.headers:
                        response.headers[name] = answer.headers[name]
                await response.prepare(request)
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (ClientError, OSError) as exc:
            # The rank is gone: the group is about to break (its connection ends), as vLLM's would.
            return _error(f"the data-parallel rank at {url} failed: {exc}", 500, "InternalServerError")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def _generate_here(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """A generation request served by this pod's own engine."""
        faults = self.core.faults
        try:
            body = await request.json()
        except ValueError:
            return _error("request body is not valid JSON", 400, "BadRequestError")
        cfg = self.config
        try:
            req = parse_generation(
                body,
                chat,
                cfg.served_model_names,
                cfg.max_model_len,
                cfg.args.seed,
                cfg.args.enable_force_include_usage,
            )
        except RequestError as exc:
            return _error(str(exc), exc.status, exc.kind)
        if faults.error_rate and self.core.rng.random() < faults.error_rate:
            return _error("injected fault", faults.error_status, "InternalServerError")

        kv_cfg, params = cfg.kv_transfer, req.kv_transfer_params or {}
        local = kv_cfg is not None and kv_cfg.is_consumer and not params.get("do_remote_prefill")
        if (
            local
            and faults.local_prefill_error_rate
            and self.core.rng.random() < faults.local_prefill_error_rate
        ):
            return _error("injected fault: local prefill refused", faults.error_status, "InternalServerError")
        if kv_cfg and kv_cfg.is_consumer and params.get("do_remote_prefill"):
            refused = revision_mismatch(params, cfg.sim.serving_revision)
            if refused is not None:
                self.core.metrics.revision_refusals.inc()
                return _error(refused, 500, "InternalServerError")
        work = cfg.sim.request_latency_seconds * cfg.sim.time_scale
        if work > 0:
            await asyncio.sleep(self._ingress.admit(self.core.now(), work))
        base_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{base_id}"
        internal_id = f"{response_id}{'' if chat else '-0'}-{secrets.token_hex(4)}"
        headers = {"X-Request-Id": base_id} if cfg.args.enable_request_id_headers else None
        job = self._make_job(req, internal_id)
        job.caller_id = base_id
        self.core.submit(job)
        try:
            if req.stream:
                return await self._stream(request, req, job, response_id, headers)
            answer = await self._complete(req, job, response_id, headers)
            if request.transport is None or request.transport.is_closing():
                # The caller left as the prefill finished: nobody will read its KV handle.
                self.core.release_unclaimed(job)
            return answer
        except asyncio.CancelledError:
            # The caller left (handler cancellation) after the prefill finished and held its KV:
            # the handle never reached it, so no decode pull or release would come before the lease.
            self.core.release_unclaimed(job)
            raise
        finally:
            if not job.seq.finished:
                self.core.abort(job)

    def _make_job(self, req: GenerationRequest, internal_id: str) -> Job:
        kv_cfg = self.config.kv_transfer
        params = req.kv_transfer_params or {}
        hold = bool(kv_cfg and kv_cfg.is_producer and params.get("do_remote_decode"))
        remote: RemotePrefill | None = None
        if kv_cfg and kv_cfg.is_consumer and params.get("do_remote_prefill") and params.get("remote_host"):
            try:
                remote = RemotePrefill(
                    remote_request_id=str(params.get("remote_request_id") or ""),
                    remote_block_ids=[int(b) for b in params.get("remote_block_ids") or []],
                    remote_engine_id=str(params.get("remote_engine_id") or ""),
                    remote_host=str(params["remote_host"]),
                    remote_port=int(params["remote_port"]),
                    tp_size=int(params.get("tp_size") or 1),
                )
            except (KeyError, TypeError, ValueError):
                # A malformed handle: the pull fails at once and kv_load_failure_policy decides.
                remote = RemotePrefill("", [], "", "", 0, 1)
        seq = Sequence(
            request_id=internal_id,
            prompt_tokens=req.prompt_tokens,
            max_tokens=req.max_tokens,
            arrival=self.core.now(),
            remote_kv=remote is not None,
            hold_blocks_on_finish=hold,
            reason_at_max_tokens="stop" if req.stops_at_eos else "length",
        )
        if self.config.prefix_caching:
            key, seed = req.prompt_key, req.seed
            seq.tokens = req.prompt_token_list
            seq.output_token = lambda i: output_token_word(key, seed, i)
        return Job(
            seq=seq,
            internal_id=internal_id,
            max_tokens_param=req.max_tokens_param,
            prompt_key=req.prompt_key,
            remote=remote,
        )

    async def _complete(
        self, req: GenerationRequest, job: Job, response_id: str, headers: dict[str, str] | None
    ) -> web.Response:
        seq = job.seq
        while not seq.finished:
            await self.core.wait_progress(job, seq.num_output)
        if seq.finish_reason == "error":
            return _error(seq.error or "request failed", 500, "InternalServerError")
        if seq.finish_reason == "abort":
            return _error("request aborted", 500, "InternalServerError")
        text = output_text(req.prompt_key, req.seed, 0, seq.num_output)
        data = full_response(
            req,
            response_id,
            int(time.time()),
            text,
            seq.finish_reason or "length",
            seq.num_output,
            job.kv_transfer_params,
        )
        return _json(data, headers=headers)

    async def _stream(
        self,
        request: web.Request,
        req: GenerationRequest,
        job: Job,
        response_id: str,
        headers: dict[str, str] | None,
    ) -> web.StreamResponse:
        seq = job.seq
        await self.core.wait_progress(job, 0)
        if seq.finished and seq.finish_reason in ("error", "abort"):
            return _error(seq.error or "request failed", 500, "InternalServerError")
        faults = self.core.faults
        fail_after: int | None = None
        if faults.stream_error_rate and self.core.rng.random() < faults.stream_error_rate:
            fail_after = faults.stream_error_after_tokens
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **(headers or {})})
        await response.prepare(request)
        chunks = ChunkWriter(req, response_id, int(time.time()))
        stream = SSEStream(req, job, chunks, fail_after)
        first = stream.render()
        await response.write(chunks.role_chunk() + first if req.chat else first)  # sends the head too
        chunked = response.headers.get("Transfer-Encoding") == "chunked"
        while not stream.done:
            transport = request.transport
            if stream.can_write_directly(transport) and not response.compression:
                assert transport is not None
                await stream.deliver(transport, chunked)  # the step loop writes; back when over or slow
            else:
                await self.core.wait_progress(job, stream.sent)
            data = stream.render()
            if data:
                await response.write(data)
        if stream.failed:
            self.core.abort(job)
        await response.write_eof()
        return response
