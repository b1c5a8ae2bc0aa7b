"""The engine core: runs the scheduler in real time, paced by the perf model, and does KV transfer.

One asyncio task steps the scheduler: plan a step, sleep until the step's modelled end, apply it,
wake the requests that got tokens (or, for a job with a `listener`, call it in the same pass: a
streaming response writes its new events from there, so a token costs no task wake-up). While
busy, step ends are chained (`end = previous end + d`), so the time spent delivering tokens
overlaps the next step, as a GPU's next forward overlaps the host's work, and a late wake-up does
not accumulate into drift. Durations are scaled by TANDEM_SIM_TIME_SCALE and the `slowdown`
fault.

KV transfer: as a producer the core keeps finished remote-decode prefills in a `HeldKVTable` and
serves reads on the NIXL side channel; as a consumer it reads from the prefill engine named in the
request's `kv_transfer_params` and applies `kv_load_failure_policy` when the read fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem.engine.blocks import BlockPool
from tandem.engine.config import EngineConfig
from tandem.engine.kvheld import HeldKVError, HeldKVTable
from tandem.engine.metrics import EngineMetrics
from tandem.engine.prefixcache import CachingBlockPool
from tandem.engine.scheduler import Scheduler, Sequence, Status, Step
from tandem.engine.settings import Faults
from tandem.engine.sidechannel import SideChannelServer, link_factor, read_remote_kv, send_simple
from tandem.perf import kv_transfer_seconds

# The prefill engine's serving revision in its kv_transfer_params (a sim-only key; vLLM ignores it).
REVISION_PARAM = "tandem_serving_revision"


def revision_mismatch(params: Mapping[str, Any], own: str) -> str | None:
    """Why a decode engine of revision `own` refuses KV described by `params`, or None.

    A prefill that sent no revision is the legacy revision (""), as is a decode engine without one."""
    theirs = params.get(REVISION_PARAM) or ""
    if not isinstance(theirs, str) or theirs == own:
        return None
    return (
        f"serving revision mismatch: the KV is held by a prefill engine of revision {theirs or 'legacy'}, "
        f"this decode engine is revision {own or 'legacy'}; refusing the KV pull"
    )


@dataclass(frozen=True)
class RemotePrefill:
    """Where a decode request's KV lives: the `kv_transfer_params` returned by the prefill engine."""

    remote_request_id: str
    remote_block_ids: list[int]
    remote_engine_id: str
    remote_host: str
    remote_port: int
    tp_size: int


@dataclass(eq=False)
class Job:
    seq: Sequence
    internal_id: str
    max_tokens_param: int
    caller_id: str | None = None  # the X-Request-Id it came with: a router's release may name it
    released: bool = False  # released before its prefill finished: its KV is not held
    prompt_key: int | None = None
    remote: RemotePrefill | None = None
    waiter: asyncio.Future[None] | None = None
    # Called synchronously, instead of waking `waiter`, whenever the job gets tokens or finishes:
    # a streaming response writes its events from the step loop itself (see `streaming`).
    listener: Callable[[], None] | None = None
    last_emit: float | None = None
    kv_transfer_params: dict[str, Any] | None = None
    recomputed_after_kv_failure: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class EngineCore:
    def __init__(self, config: EngineConfig, faults: Faults) -> None:
        self.config = config
        self.faults = faults
        self.engine_id = (config.kv_transfer.engine_id if config.kv_transfer else None) or str(uuid.uuid4())
        self.pool: BlockPool | CachingBlockPool = (
            CachingBlockPool(config.num_gpu_blocks)
            if config.prefix_caching
            else BlockPool(config.num_gpu_blocks)
        )
        kv = config.kv_transfer
        self.scheduler = Scheduler(
            self.pool,
            config.block_size,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.chunked_prefill,
            recompute_on_kv_failure=kv is not None and kv.kv_load_failure_policy == "recompute",
        )
        self.metrics = EngineMetrics(
            config.model_name,
            config.max_model_len,
            with_nixl=kv is not None,
            engine=str(config.engine_index),
            cache_info={
                "block_size": str(config.block_size),
                "cache_dtype": config.args.kv_cache_dtype,
                "gpu_memory_utilization": str(config.args.gpu_memory_utilization),
                "enable_prefix_caching": str(config.prefix_caching),
                "num_gpu_blocks": str(config.num_gpu_blocks),
            },
        )
        self.held = HeldKVTable(config.kv_lease_seconds)
        self.side_channel: SideChannelServer | None = None
        self.side_channel_port: int | None = None
        self.rng = random.Random(config.sim.random_seed)
        self.jobs: dict[Sequence, Job] = {}
        self._handshaken: set[str] = set()  # remote engine ids this engine has read from
        self.steps = 0
        self.kv_tokens_pulled = 0  # prompt tokens' KV read from prefill engines (past local hits)
        self.step_seconds_total = 0.0
        self.lag_seconds_total = 0.0  # how late step completions ran against the modelled clock
        self.lag_seconds_max = 0.0
        self._wake = asyncio.Event()
        self.idle = asyncio.Event()  # set while no request is in flight
        self.idle.set()
        self._unhang = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop = asyncio.get_running_loop()

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        kv = self.config.kv_transfer
        if kv is not None:
            self.side_channel = SideChannelServer(self._serve_read, self._serve_simple)
            self.side_channel_port = await self.side_channel.start(
                self.config.sim.nixl_side_channel_host, self.config.sim.nixl_side_channel_port
            )
            self._tasks.append(asyncio.create_task(self._expire_leases()))
            if kv.is_consumer:
                self._tasks.append(asyncio.create_task(self._heartbeat_leases()))
        self._tasks.append(asyncio.create_task(self._run()))

    async def stop(self) -> None:
        for job in list(self.jobs.values()):
            self.abort(job)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.side_channel is not None:
            await self.side_channel.close()

    def now(self) -> float:
        return self._loop.time()

    async def wait_while_hung(self) -> bool:
        """Blocks while the `hang` fault is on; True if it had to wait."""
        waited = False
        while self.faults.hang:
            waited = True
            self._unhang.clear()
            await self._unhang.wait()
        return waited

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        if not faults.hang:
            self._unhang.set()
        self._wake.set()

    # --- requests -----------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        self.jobs[job.seq] = job
        self.idle.clear()
        self.scheduler.add(job.seq)
        self._refresh_gauges()
        self._wake.set()

    async def wait_progress(self, job: Job, seen_tokens: int) -> None:
        """Returns once the job has more than `seen_tokens` output tokens or has finished."""
        if job.seq.num_output > seen_tokens or job.seq.finished:
            return
        job.waiter = self._loop.create_future()
        await job.waiter

    def abort(self, job: Job) -> None:
        seq = job.seq
        if seq.finished:
            return
        if seq.remote_kv and seq.status is Status.WAITING_FOR_REMOTE_KVS and job.remote is not None:
            self._spawn(self._release_remote(job.remote))
        self.scheduler.abort(seq, self.now())
        self._finished(job)

    def _finished(self, job: Job) -> None:
        seq = job.seq
        self.jobs.pop(seq, None)
        if not self.jobs:
            self.idle.set()
        # vLLM's NIXL connector only hands out KV of prefills that finished length-capped.
        if seq.finish_reason == "length" and seq.hold_blocks_on_finish and seq.blocks:
            self.held.hold(
                job.internal_id, seq.blocks, seq.prompt_tokens, self.now(), job.prompt_key, job.caller_id
            )
            job.kv_transfer_params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": list(seq.blocks),
                "remote_engine_id": self.engine_id,
                "remote_request_id": job.internal_id,
                "remote_host": self.config.sim.nixl_side_channel_host,
                "remote_port": self.side_channel_port,
                "tp_size": self.config.tensor_parallel_size,
                REVISION_PARAM: self.config.sim.serving_revision,
            }
            seq.blocks = []
            if job.released:  # its caller left before it finished: nobody will read the KV
                self.pool.free(self.held.release(job.internal_id))
        self.metrics.observe_finished(seq, job.max_tokens_param)
        self._notify(job)
        self._refresh_gauges()

    def _notify(self, job: Job) -> None:
        if job.listener is not None:
            job.listener()
            return
        waiter, job.waiter = job.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- the step loop ------------------------------------------------------------------------
    async def _run(self) -> None:
        step_end = self.now()
        while True:
            if await self.wait_while_hung():
                step_end = self.now()
            step = self.scheduler.schedule(self.now())
            if step.cache_queries:
                self.metrics.prefix_cache_queries.inc(step.cache_queries)
                self.metrics.prefix_cache_hits.inc(step.cache_hits)
            for seq in step.pulls:
                self._spawn(self._pull(self.jobs[seq]))
            if step.preempted:
                self.metrics.num_preemptions.inc(step.preempted)
            if not step.has_compute:
                self._refresh_gauges()
                self._wake.clear()
                await self._wake.wait()
                step_end = self.now()  # idle: the next step starts when work arrives
                continue
            # While busy, steps are chained on the modelled clock, not on when this task got the
            # CPU back: a late wake-up is made up by the next steps instead of accumulating.
            step_end += self._step_duration(step)
            delay = step_end - self.now()
            await asyncio.sleep(delay if delay > 0 else 0)
            now = self.now()
            lag = max(0.0, now - step_end)
            self.lag_seconds_total += lag
            self.lag_seconds_max = max(self.lag_seconds_max, lag)
            self._apply(step, now)

    def _step_duration(self, step: Step) -> float:
        chunks, batch, context = step.perf_inputs()
        seconds = self.config.profile.step_seconds(chunks, batch, context)
        self.step_seconds_total += seconds
        return seconds * self.config.sim.time_scale * self.faults.slowdown

    def _apply(self, step: Step, now: float) -> None:
        self.steps += 1
        result = self.scheduler.complete(step, now)
        m = self.metrics
        m.iteration_tokens.observe(step.num_tokens)
        m.generation_tokens.inc(len(result.new_tokens))
        since: dict[float, int] = {}  # previous emit time -> streams: one ITL value each
        for seq in result.new_tokens:
            job = self.jobs.get(seq)
            if job is None:
                continue
            last = job.last_emit
            if last is None:
                m.ttft.observe(now - seq.arrival)
                m.prompt_tokens.inc(seq.prompt_tokens)
                remote = seq.prompt_tokens_from_remote
                cached = min(seq.num_cached_tokens, seq.prompt_tokens - remote)
                m.prompt_tokens_external.inc(remote)
                m.prompt_tokens_cached.inc(cached)
                m.prompt_tokens_local.inc(seq.prompt_tokens - remote - cached)
            else:
                since[last] = since.get(last, 0) + 1
            job.last_emit = now
            if seq.finished:
                self._finished(job)
            else:
                self._notify(job)
        for last, count in since.items():
            m.itl.observe_many(now - last, count)
        self._refresh_gauges()

    def _refresh_gauges(self) -> None:
        m = self.metrics
        m.num_requests_running.set(self.scheduler.num_running)
        m.num_requests_waiting.set(self.scheduler.num_waiting)
        m.kv_cache_usage_perc.set(self.pool.usage)
        if m.with_nixl:
            m.held_requests.set(len(self.held))
            m.held_blocks.set(self.held.num_blocks)

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)

    # --- consumer side: pull KV from the prefill engine ---------------------------------------
    async def _pull(self, job: Job) -> None:
        remote = job.remote
        assert remote is not None
        error = self._precheck_pull(remote)
        ok = False
        m = self.metrics
        # Blocks this engine's prefix cache already holds are not read (the NIXL connector reads
        # only the remote blocks past the local hit); a full hit reads nothing and frees P's blocks.
        seq = job.seq
        skip_blocks = seq.num_cached_tokens // self.config.block_size
        if error is None and seq.num_cached_tokens and seq.num_cached_tokens >= seq.prompt_tokens - 1:
            self._spawn(self._release_remote(remote))
            if not self.scheduler.remote_kv_done(seq, True, self.now()):
                self._finished(job)
            self._wake.set()
            return
        if error is None and remote.remote_engine_id not in self._handshaken:
            # First contact with a prefill engine: NIXL fetches and registers its agent metadata.
            delay = self.config.sim.nixl_handshake_seconds * self.config.sim.time_scale
            if delay > 0:
                await asyncio.sleep(delay)
            self._handshaken.add(remote.remote_engine_id)
        if error is None:
            request = {
                "remote_request_id": remote.remote_request_id,
                "remote_block_ids": remote.remote_block_ids,
                "prompt_tokens": job.seq.prompt_tokens,
                "prompt_key": job.prompt_key,
                "engine_id": self.engine_id,
                "kv_bandwidth_factor": self.faults.kv_bandwidth_factor,
                "skip_blocks": skip_blocks,
            }
            outcome = await read_remote_kv(remote.remote_host, remote.remote_port, request, read_timeout=60.0)
            ok, error = outcome.ok, outcome.error
            if ok:
                moved = max(0, seq.prompt_tokens - skip_blocks * self.config.block_size)
                m.nixl_xfer_time.observe(outcome.seconds)
                m.nixl_post_time.observe(outcome.post_seconds)
                m.nixl_bytes.observe(moved * self.config.kv_bytes_per_token)
                read_blocks = max(0, len(remote.remote_block_ids) - skip_blocks)
                m.nixl_descriptors.observe(read_blocks * self.config.arch.layers * 2)
                self.kv_tokens_pulled += moved
        if not ok:
            m.nixl_failed_transfers.inc()
        if job.seq.finished:  # aborted while reading
            return
        if not ok and self.scheduler.recompute_on_kv_failure:
            job.recomputed_after_kv_failure = True
        if not self.scheduler.remote_kv_done(job.seq, ok, self.now(), error=f"KV transfer failed: {error}"):
            self._finished(job)
        self._wake.set()

    def _precheck_pull(self, remote: RemotePrefill) -> str | None:
        if not remote.remote_host or not remote.remote_request_id:
            return "malformed kv_transfer_params (need remote_host, remote_port, remote_request_id)"
        if self.faults.kv_pull_failure_rate and self.rng.random() < self.faults.kv_pull_failure_rate:
            return "NIXL_ERR_BACKEND (injected fault)"
        own_tp = self.config.tensor_parallel_size
        if not self.config.arch.mla and (remote.tp_size > own_tp or own_tp % remote.tp_size):
            return f"Decode TP ({own_tp}) must be a multiple of prefill TP ({remote.tp_size})"
        return None

    def release_held(self, remote_request_ids: list[str]) -> int:
        """Frees the KV held for these requests now (a router's release for a request whose client
        left before its decode leg); returns the blocks freed (0 for unknown ids). An id is a
        remote_request_id or the X-Request-Id a prefill came with; a prefill of that X-Request-Id
        still running holds nothing when it finishes."""
        freed = 0
        for rid in remote_request_ids:
            blocks = self.held.release(rid)
            self.pool.free(blocks)
            freed += len(blocks)
            for job in self.jobs.values():
                if job.caller_id == rid:
                    job.released = True
        if freed:
            self._refresh_gauges()
            self._wake.set()
        return freed

    def release_unclaimed(self, job: Job) -> int:
        """Frees the KV a finished prefill holds when its handle never reached the caller (the
        client left as the prefill finished); returns the blocks freed (0: nothing held)."""
        if job.kv_transfer_params is None or not job.seq.finished:
            return 0
        return self.release_held([job.internal_id])

    async def _release_remote(self, remote: RemotePrefill) -> None:
        answer = await send_simple(
            remote.remote_host,
            remote.remote_port,
            {"op": "release", "remote_request_id": remote.remote_request_id},
        )
        if answer is None:
            self.metrics.nixl_failed_notifications.inc()

    # --- producer side: serve reads of held KV -------------------------------------------------
    async def _serve_read(self, request: dict[str, Any]) -> tuple[dict[str, Any], int, float, Any]:
        def nothing(ok: bool) -> None:
            return None

        rid = str(request.get("remote_request_id"))
        if self.faults.kv_pull_failure_rate and self.rng.random() < self.faults.kv_pull_failure_rate:
            return {"ok": False, "error": "NIXL_ERR_BACKEND (injected fault)"}, 0, 0.0, nothing
        try:
            blocks = [int(b) for b in request.get("remote_block_ids") or []]
            tokens, key = request.get("prompt_tokens"), request.get("prompt_key")
            entry = self.held.begin_read(
                rid,
                blocks,
                int(tokens) if tokens is not None else None,
                int(key) if key is not None else None,
            )
        except (HeldKVError, TypeError, ValueError) as exc:
            return {"ok": False, "error": str(exc)}, 0, 0.0, nothing
        # The reader's prefix cache holds the first `skip_blocks` blocks: only the rest moves.
        skip = request.get("skip_blocks")
        skip_blocks = skip if isinstance(skip, int) and skip > 0 else 0
        moved = max(0, entry.prompt_tokens - skip_blocks * self.config.block_size)
        per_gpu = self.config.arch.kv_bytes_per_token_per_gpu(self.config.tensor_parallel_size)
        per_gpu = per_gpu * self.config.kv_bytes_per_token // self.config.arch.kv_bytes_per_token
        # Every TP rank reads its own KV slice over its own NIC, in parallel.
        bandwidth = self.config.sim.kv_bandwidth_gbps * link_factor(
            self.faults.kv_bandwidth_factor, request.get("kv_bandwidth_factor")
        )
        seconds = kv_transfer_seconds(moved, per_gpu, bandwidth)
        seconds *= self.config.sim.time_scale * self.faults.slowdown
        size = max(1, math.ceil(moved * self.config.kv_bytes_per_token / self.config.sim.kv_scale))

        def done(ok: bool) -> None:
            self.pool.free(self.held.end_read(rid, ok))
            self._refresh_gauges()
            self._wake.set()

        return {"ok": True, "bytes": size, "modelled_seconds": seconds}, size, seconds, done

    def _serve_simple(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "release":
            self.pool.free(self.held.release(str(request.get("remote_request_id"))))
            self._refresh_gauges()
            self._wake.set()
            return {"ok": True}
        if op == "heartbeat":
            now = self.now()
            ids = request.get("remote_request_ids") or []
            return {"ok": True, "extended": [rid for rid in ids if self.held.extend(str(rid), now)]}
        return {"ok": False, "error": f"unknown op {op!r}"}

    async def _heartbeat_leases(self) -> None:
        """vLLM >= 0.22: keep the prefill engine's lease alive for requests still waiting here.

        Pulls start as soon as blocks are free, so only requests queued for blocks need it; one
        message per prefill engine every lease/6 seconds, each extending to 2/3 of a lease.
        """
        while True:
            await asyncio.sleep(self.config.kv_lease_seconds / 6)
            by_peer: dict[tuple[str, int], list[str]] = {}
            for job in self.jobs.values():
                remote = job.remote
                if (
                    remote is not None
                    and remote.remote_host
                    and not job.seq.pull_started
                    and not job.seq.finished
                ):
                    by_peer.setdefault((remote.remote_host, remote.remote_port), []).append(
                        remote.remote_request_id
                    )
            for (host, port), ids in by_peer.items():
                self._spawn(self._send_heartbeat(host, port, ids))

    async def _send_heartbeat(self, host: str, port: int, ids: list[str]) -> None:
        if await send_simple(host, port, {"op": "heartbeat", "remote_request_ids": ids}) is None:
            self.metrics.nixl_failed_notifications.inc()

    async def _expire_leases(self) -> None:
        period = min(1.0, self.held.lease_seconds / 4)
        while True:
            await asyncio.sleep(period)
            lapsed = self.held.expire(self.now())
            if lapsed:
                for entry in lapsed:
                    self.pool.free(entry.blocks)
                self.metrics.nixl_expired.inc(len(lapsed))
                self._refresh_gauges()
                self._wake.set()

    def prefix_cache_state(self) -> dict[str, Any]:
        pool = self.pool
        if not isinstance(pool, CachingBlockPool):
            return {"enabled": False}
        return {"enabled": True, "cached_blocks": pool.num_cached, "evictions": pool.evictions}

    def debug_kv(self) -> dict[str, Any]:
        now = self.now()
        return {
            "engine_id": self.engine_id,
            "role": self.config.kv_transfer.kv_role if self.config.kv_transfer else None,
            "side_channel": {"host": self.config.sim.nixl_side_channel_host, "port": self.side_channel_port},
            "lease_seconds": self.held.lease_seconds,
            "pool": {
                "num_blocks": self.pool.num_blocks,
                "free": self.pool.num_free,
                "used": self.pool.num_used,
                "block_size": self.config.block_size,
            },
            "held": [
                {
                    "remote_request_id": h.remote_request_id,
                    "blocks": len(h.blocks),
                    "prompt_tokens": h.prompt_tokens,
                    "age_s": round(now - h.held_at, 3),
                    "expires_in_s": round(h.expires_at - now, 3),
                    "reading": h.reading,
                }
                for h in self.held.entries()
            ],
            "held_blocks": self.held.num_blocks,
            "prefix_cache": self.prefix_cache_state(),
            "kv_tokens_pulled": self.kv_tokens_pulled,
            "expired_total": self.held.expired_total,
            "recently_expired": list(self.held.expired_ids[-20:]),
        }
