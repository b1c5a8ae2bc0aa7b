"""A colocated replica of the simulator against the sim engine's own scheduler (`tandem.engine.scheduler`)
stepped one step at a time with `Profile.step_seconds`: same TTFT and TPOT for every request while the KV
cache has room (the simulator counts KV in tokens and admits whole prompts; the engine uses blocks)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from tandem.engine.blocks import BlockPool
from tandem.engine.scheduler import Scheduler, Sequence
from tandem.perf import Profile
from tandem.sim import Request, simulate

if TYPE_CHECKING:
    from conftest import SimKit


def engine_reference(
    requests: list[Request], profile: Profile, seqs: int, batched: int
) -> list[tuple[float, float | None]]:
    """(TTFT, TPOT) per request from the engine's scheduler on a modelled clock."""
    scheduler = Scheduler(BlockPool(1_000_000), 16, seqs, batched, chunked_prefill=True)
    sequences = [
        Sequence(f"{i}", r.prompt_tokens, r.output_tokens, r.arrival) for i, r in enumerate(requests)
    ]
    now, i = 0.0, 0
    while i < len(requests) or scheduler.has_work:
        while i < len(requests) and requests[i].arrival <= now:
            scheduler.add(sequences[i])
            i += 1
        step = scheduler.schedule(now)
        if not step.has_compute:
            now = requests[i].arrival
            continue
        chunks, batch, context = step.perf_inputs()
        now += profile.step_seconds(chunks, batch, context)
        scheduler.complete(step, now)
    out: list[tuple[float, float | None]] = []
    for seq in sequences:
        assert seq.first_token is not None
        assert seq.last_token is not None
        tpot = (seq.last_token - seq.first_token) / (seq.max_tokens - 1) if seq.max_tokens > 1 else None
        out.append((seq.first_token - seq.arrival, tpot))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_a_colocated_replica_schedules_as_the_engine_does(kit: SimKit, seed: int) -> None:
    rng = random.Random(seed)
    t = 0.0
    requests = []
    for _ in range(rng.randint(1, 60)):
        t += rng.expovariate(rng.choice([10.0, 100.0]))
        requests.append(Request(t, rng.randint(1, 2500), rng.randint(1, 200)))
    seqs, batched = rng.choice([(8, 8192), (256, 8192), (256, 2048)])
    expected = engine_reference(requests, kit.profile, seqs, batched)
    records = simulate(requests, kit.colocated(kit.spec(seqs=seqs, batched=batched)), kit.config()).records
    for i, (ttft, tpot) in enumerate(expected):
        assert records.ttft(i) == pytest.approx(ttft, abs=1e-9), i
        assert records.tpot(i) == pytest.approx(tpot, abs=1e-9), i
