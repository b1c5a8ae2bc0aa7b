"""Continuous batching decisions, with time passed in (no clock, no sockets)."""

from __future__ import annotations

import pytest

from tandem.engine.blocks import BlockPool
from tandem.engine.scheduler import Scheduler, Sequence, Status
from tandem.perf import load_profile


def make(
    blocks: int = 1000,
    block_size: int = 16,
    seqs: int = 256,
    batched: int = 2048,
    chunked: bool = True,
    **kw: bool,
) -> Scheduler:
    return Scheduler(BlockPool(blocks), block_size, seqs, batched, chunked, **kw)


def run_to_end(sched: Scheduler, limit: int = 10_000) -> int:
    steps = 0
    while sched.has_work and steps < limit:
        step = sched.schedule(float(steps))
        assert step.has_compute
        sched.complete(step, float(steps + 1))
        steps += 1
    return steps


def test_one_request_prefills_then_decodes_one_token_per_step() -> None:
    sched = make()
    seq = Sequence("a", prompt_tokens=100, max_tokens=3, arrival=0.0)
    sched.add(seq)
    step = sched.schedule(0.0)
    assert [(e.tokens, e.offset) for e in step.entries] == [(100, 0)]
    result = sched.complete(step, 1.0)
    assert result.new_tokens == [seq]
    assert seq.num_output == 1
    assert seq.first_token == 1.0
    assert run_to_end(sched) == 2
    assert seq.finish_reason == "length"
    assert seq.num_output == 3
    assert sched.pool.num_used == 0


def test_chunked_prefill_shares_steps_with_decodes() -> None:
    sched = make(batched=512)
    short = Sequence("short", 10, 50, 0.0)
    sched.add(short)
    sched.complete(sched.schedule(0.0), 1.0)
    long = Sequence("long", 2000, 5, 1.0)
    sched.add(long)
    step = sched.schedule(1.0)
    kinds = sorted((e.seq.request_id, e.tokens, e.is_decode) for e in step.entries)
    assert kinds == [("long", 511, False), ("short", 1, True)]
    chunks, batch, context = step.perf_inputs()
    assert batch == 1
    assert context == 11
    profile = load_profile("meta-llama/Llama-3.1-8B-Instruct", "H100", 1)
    # The decode's step takes as long as the prefill chunk it shares the step with.
    assert profile.step_seconds(chunks, batch, context) > 1.5 * profile.decode_step_seconds(1, 11)


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget() -> None:
    sched = make(batched=1000, chunked=False)
    first = Sequence("a", 600, 2, 0.0)
    second = Sequence("b", 600, 2, 0.0)
    sched.add(first)
    sched.add(second)
    step = sched.schedule(0.0)
    assert [e.seq for e in step.entries] == [first]
    assert second.status is Status.WAITING


def test_full_kv_pool_queues_requests() -> None:
    sched = make(blocks=10, block_size=16)
    first = Sequence("a", 150, 2, 0.0)  # 10 blocks
    second = Sequence("b", 20, 2, 0.0)
    sched.add(first)
    sched.add(second)
    step = sched.schedule(0.0)
    assert [e.seq for e in step.entries] == [first]
    assert sched.num_waiting == 1
    run_to_end(sched)
    assert second.finish_reason == "length"


def test_running_out_of_blocks_preempts_the_newest() -> None:
    sched = make(blocks=4, block_size=4, batched=64)
    old = Sequence("old", 8, 8, 0.0)
    new = Sequence("new", 8, 8, 0.0)
    sched.add(old)
    sched.add(new)
    sched.complete(sched.schedule(0.0), 1.0)  # both prefilled: 2 blocks each, pool full
    step = sched.schedule(1.0)  # both need a third block at token 9
    assert step.preempted == 1
    assert [e.seq for e in step.entries] == [old]
    assert new.status is Status.WAITING
    assert new.num_computed == 0
    assert sched.num_preemptions == 1
    run_to_end(sched)
    assert old.num_output == 8
    assert new.num_output == 8


def test_max_num_seqs_caps_the_batch() -> None:
    sched = make(seqs=2)
    for i in range(3):
        sched.add(Sequence(str(i), 5, 2, 0.0))
    assert len(sched.schedule(0.0).entries) == 2


def test_remote_kv_pull_then_only_the_last_prompt_token_is_computed() -> None:
    sched = make()
    seq = Sequence("d", 100, 3, 0.0, remote_kv=True)
    sched.add(seq)
    step = sched.schedule(0.0)
    assert step.pulls == [seq]
    assert not step.has_compute
    assert seq.status is Status.WAITING_FOR_REMOTE_KVS
    assert sched.num_waiting == 1
    assert len(seq.blocks) == 7
    assert sched.schedule(0.1).pulls == []  # started once
    assert sched.remote_kv_done(seq, ok=True, now=0.5)
    step = sched.schedule(0.5)
    assert [(e.tokens, e.offset) for e in step.entries] == [(1, 99)]
    sched.complete(step, 0.6)
    assert seq.num_output == 1
    assert seq.prompt_tokens_from_remote == 99


@pytest.mark.parametrize("recompute", [True, False])
def test_kv_load_failure_policy(recompute: bool) -> None:
    sched = make(recompute_on_kv_failure=recompute)
    seq = Sequence("d", 100, 3, 0.0, remote_kv=True)
    sched.add(seq)
    sched.schedule(0.0)
    assert sched.remote_kv_done(seq, ok=False, now=0.5, error="boom") is recompute
    if recompute:
        step = sched.schedule(0.5)
        assert [(e.tokens, e.offset) for e in step.entries] == [(100, 0)]
    else:
        assert seq.finish_reason == "error"
        assert seq.error == "boom"
        assert sched.pool.num_used == 0
        assert not sched.has_work


def test_a_remote_prefill_keeps_its_blocks_when_it_finishes() -> None:
    sched = make()
    seq = Sequence("p", 100, 1, 0.0, hold_blocks_on_finish=True)
    sched.add(seq)
    result = sched.complete(sched.schedule(0.0), 1.0)
    assert result.finished == [seq]
    assert len(seq.blocks) == 7
    assert sched.pool.num_used == 7


def test_abort_frees_blocks_and_leaves_the_queues() -> None:
    sched = make()
    seq = Sequence("x", 100, 10, 0.0)
    sched.add(seq)
    sched.complete(sched.schedule(0.0), 1.0)
    sched.abort(seq, 1.5)
    assert seq.finish_reason == "abort"
    assert sched.pool.num_used == 0
    assert not sched.has_work


def test_block_pool_refuses_what_it_cannot_give() -> None:
    pool = BlockPool(3)
    assert pool.allocate(4) is None
    got = pool.allocate(2)
    assert got == [0, 1]
    assert pool.usage == pytest.approx(2 / 3)
    pool.free(got)
    assert pool.num_free == 3


def test_a_natural_end_finishes_with_stop() -> None:
    sched = make()
    seq = Sequence("eos", 10, 2, 0.0, reason_at_max_tokens="stop")
    sched.add(seq)
    run_to_end(sched)
    assert seq.finish_reason == "stop"


def drive_decode_engine(sched: Scheduler, arrivals: list[Sequence], limit: int = 500) -> dict[str, list[int]]:
    """Steps a decode-role scheduler on a step clock: `arrivals[t]` arrives at step t, every pull
    started in a step lands before the next one. Returns, per request, the steps at which it was
    given blocks for its pull ("pull") and admitted to run ("run"), and fails on a wedge: a step
    with nothing to compute and no pull in flight to wake the engine again."""
    events: dict[str, list[int]] = {}
    in_flight: list[Sequence] = []
    was_running: set[Sequence] = set()
    t = 0
    while t < len(arrivals) or sched.has_work:
        assert t < limit, "the scheduler did not drain"
        if t < len(arrivals):
            sched.add(arrivals[t])
        for seq in in_flight:
            assert sched.remote_kv_done(seq, ok=True, now=float(t))
        in_flight = []
        step = sched.schedule(float(t))
        for seq in step.pulls:
            events.setdefault(f"{seq.request_id}:pull", []).append(t)
        in_flight = list(step.pulls)
        running = set(sched.running)
        for seq in running - was_running:
            events.setdefault(f"{seq.request_id}:run", []).append(t)
        was_running = running
        if step.has_compute:
            sched.complete(step, float(t + 1))
            was_running = set(sched.running)
        else:
            assert in_flight or t + 1 < len(arrivals), (
                f"wedged at step {t}: running {sched.num_running}, waiting "
                f"{[(s.request_id, s.status.value, len(s.blocks)) for s in sched.waiting]}, "
                f"free blocks {sched.pool.num_free}"
            )
        t += 1
    return events


def test_a_preempted_sequence_is_rescheduled_before_later_remote_kv_pulls() -> None:
    """Decode role, KV nearly full: the newest running sequence is preempted while remote-KV pulls
    keep arriving. It heads the waiting queue, so it gets blocks before any pull that arrived after
    it (vLLM V1: one in-order pass over waiting), and nobody waits unboundedly."""
    sched = make(blocks=6, block_size=4, batched=64)
    old = Sequence("old", 8, 8, 0.0, remote_kv=True)
    new = Sequence("new", 8, 8, 0.0, remote_kv=True)
    # Both pulled at step 0 (2 blocks each); then one 3-block pull arrives every step.
    pulls = [Sequence(f"p{t}", 12, 4, float(t), remote_kv=True) for t in range(1, 30)]
    sched.add(old)
    events = drive_decode_engine(sched, [new, *pulls])
    assert sched.num_preemptions >= 1
    runs = events["new:run"]
    assert len(runs) >= 2, "the test needs `new` preempted and rescheduled"
    preempted_at, rescheduled_at = runs[0] + 1, runs[1]
    for seq in pulls:
        if seq.arrival >= preempted_at:
            assert events[f"{seq.request_id}:pull"][0] >= rescheduled_at, seq.request_id
    for seq in [old, new, *pulls]:
        assert seq.finish_reason == "length", seq.request_id
    assert sched.pool.num_used == 0


def test_pulled_kv_behind_a_head_that_cannot_fit_runs_when_nothing_else_can() -> None:
    """The only running sequence preempts itself because pulled KV holds the blocks it needs. Strict
    FCFS would wedge (the head waits for blocks that only the queued sequences behind it can free);
    the pulled sequence goes first, in the same step, as vLLM schedules again at once."""
    sched = make(blocks=4, block_size=4, batched=64)
    alone = Sequence("alone", 4, 8, 0.0)  # up to 11 KV tokens: 3 blocks
    pulled = Sequence("pulled", 8, 2, 0.0, remote_kv=True)  # 2 blocks for its prompt
    sched.add(alone)
    sched.add(pulled)
    step = sched.schedule(0.0)
    assert step.pulls == [pulled]
    for t in range(1, 5):  # `alone` fills its second block; the pull is still in flight
        sched.complete(step, float(t))
        step = sched.schedule(float(t))
    assert sched.pool.num_free == 0
    sched.complete(step, 5.0)
    assert alone.num_computed == 8
    assert sched.remote_kv_done(pulled, ok=True, now=5.0)
    step = sched.schedule(5.0)  # `alone` needs a third block: none free
    assert step.preempted == 1
    assert [(e.seq, e.tokens) for e in step.entries] == [(pulled, 1)]
    assert list(sched.waiting) == [alone]
    assert run_to_end(sched, limit=100) < 100
    assert alone.finish_reason == pulled.finish_reason == "length"


def test_pulls_in_flight_count_against_max_num_seqs() -> None:
    sched = make(seqs=2)
    local = Sequence("local", 10, 50, 0.0)
    sched.add(local)
    sched.complete(sched.schedule(0.0), 1.0)
    remotes = [Sequence(f"r{i}", 100, 3, 1.0, remote_kv=True) for i in range(3)]
    for seq in remotes:
        sched.add(seq)
    step = sched.schedule(1.0)
    assert step.pulls == [remotes[0]]  # one running + one pull in flight: the cap
    assert [len(s.blocks) for s in remotes] == [7, 0, 0]
    sched.complete(step, 2.0)
    assert sched.schedule(2.0).pulls == []
    assert sched.remote_kv_done(remotes[0], ok=True, now=2.5)
    step = sched.schedule(2.5)
    assert {e.seq for e in step.entries} == {local, remotes[0]}
    assert step.pulls == []  # both slots run
    t = 3.0
    while sched.has_work:  # the rest pull one at a time, as slots free up
        sched.complete(step, t)
        step = sched.schedule(t)
        assert sched.num_running + len(step.pulls) <= 2
        for seq in step.pulls:
            assert sched.remote_kv_done(seq, ok=True, now=t)
        t += 1.0
    assert all(s.finish_reason == "length" for s in [local, *remotes])
