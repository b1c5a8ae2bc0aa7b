"""A finished prefill whose KV handle never reached its caller frees its KV at once (`EngineCore.
release_unclaimed`, called by the server when the caller left as the prefill finished)."""

from __future__ import annotations

import json

from tandem.engine.args import parse_serve_args
from tandem.engine.config import resolve
from tandem.engine.core import EngineCore, Job
from tandem.engine.scheduler import Sequence, Status
from tandem.engine.settings import SimSettings

NIXL = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})


def prefill_core() -> EngineCore:
    config = resolve(parse_serve_args(["m", "--kv-transfer-config", NIXL]), SimSettings.from_env({}))
    return EngineCore(config, config.sim.faults)


def finished_job(core: EngineCore, *, held: bool) -> Job:
    seq = Sequence(request_id="cmpl-x-0-ab", prompt_tokens=64, max_tokens=1, arrival=0.0)
    seq.status, seq.finish_reason = Status.FINISHED, "length"
    job = Job(seq=seq, internal_id="cmpl-x-0-ab", max_tokens_param=1)
    if held:
        blocks = core.pool.allocate(4)
        assert blocks is not None
        core.held.hold(job.internal_id, blocks, 64, 0.0)
        job.kv_transfer_params = {"remote_request_id": job.internal_id}
    return job


async def test_a_finished_prefill_whose_handle_was_not_delivered_frees_its_kv() -> None:
    core = prefill_core()
    free = core.pool.num_free
    job = finished_job(core, held=True)
    assert core.pool.num_free == free - 4
    assert core.release_unclaimed(job) == 4
    assert core.pool.num_free == free
    assert core.held.num_blocks == 0
    assert core.release_unclaimed(job) == 0  # twice: nothing more


async def test_nothing_is_freed_for_a_job_that_holds_nothing_or_has_not_finished() -> None:
    core = prefill_core()
    assert core.release_unclaimed(finished_job(core, held=False)) == 0
    running = finished_job(core, held=True)
    running.seq.status, running.seq.finish_reason = Status.RUNNING, None
    assert core.release_unclaimed(running) == 0
    assert core.held.num_blocks == 4


async def test_a_release_by_caller_id_frees_held_kv_or_a_running_prefills_kv_when_it_finishes() -> None:
    """The router releases an attempt by the X-Request-Id it sent when the prefill's answer never
    reached it (its client left with the leg in flight): freed at once when held, else at finish."""
    core = prefill_core()
    free = core.pool.num_free
    blocks = core.pool.allocate(4)
    assert blocks is not None
    core.held.hold("cmpl-x-0-ab", blocks, 64, 0.0, caller_id="x")
    assert core.release_held(["x"]) == 4
    assert core.held.num_blocks == 0

    seq = Sequence(request_id="cmpl-y-0-cd", prompt_tokens=64, max_tokens=1, arrival=0.0)
    seq.hold_blocks_on_finish = True
    running = Job(seq=seq, internal_id="cmpl-y-0-cd", max_tokens_param=1, caller_id="y")
    core.submit(running)
    assert core.release_held(["y"]) == 0  # nothing held yet
    assert running.released
    seq.blocks = core.pool.allocate(4) or []
    seq.status, seq.finish_reason = Status.FINISHED, "length"
    core._finished(running)  # the step loop's end of a sequence, without the loop
    assert running.kv_transfer_params is not None  # answered as usual, to nobody
    assert core.held.num_blocks == 0
    assert core.pool.num_free == free
