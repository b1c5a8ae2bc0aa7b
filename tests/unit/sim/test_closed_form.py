"""Decode runs in closed form against the step-by-step reference, and the step-time formulas against perf."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from tandem.perf import PrefillChunk
from tandem.sim import Layout, PoolSpec, Request, simulate
from tandem.sim.cluster import Cluster
from tandem.sim.replica import _run_seconds, _steps_within

if TYPE_CHECKING:
    from conftest import SimKit


def random_case(kit: SimKit, seed: int) -> tuple[list[Request], Layout]:
    rng = random.Random(seed)
    t = 0.0
    requests = []
    for _ in range(rng.randint(1, 40)):
        t += rng.expovariate(rng.choice([5.0, 40.0]))
        requests.append(Request(t, rng.randint(1, 3000), rng.randint(1, 300)))
    spec = kit.spec(
        cap=rng.choice([4000, 20_000, 450_000]), seqs=rng.choice([4, 64]), batched=rng.choice([512, 8192])
    )
    shape = seed % 3
    if shape == 0:
        return requests, kit.colocated(spec, replicas=2)
    if shape == 1:
        return requests, kit.pd(spec, prefill=2, decode=2)
    pools = {role: PoolSpec(replica=spec, replicas=1) for role in ("prefill", "decode", "colocated")}
    return requests, Layout(pools=pools, disaggregated_percent=50)


@pytest.mark.parametrize("seed", range(60))
def test_closed_form_matches_step_by_step(kit: SimKit, seed: int) -> None:
    requests, layout = random_case(kit, seed)
    fast = simulate(requests, layout, kit.config(closed_form=True, seed=seed))
    slow = simulate(requests, layout, kit.config(closed_form=False, seed=seed))
    for i in range(len(requests)):
        a, b = fast.records[i], slow.records[i]
        assert (a.path, a.preemptions) == (b.path, b.preemptions), i
        assert a.ttft == pytest.approx(b.ttft, abs=1e-9), i
        assert a.tpot == pytest.approx(b.tpot, abs=1e-9), i
    assert fast.summary.gpu_hours == pytest.approx(slow.summary.gpu_hours, abs=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_run_time_is_the_sum_of_its_steps_and_inverts(seed: int) -> None:
    rng = random.Random(seed)
    a, s = rng.uniform(0.005, 0.02), rng.choice([0.0, rng.uniform(1e-8, 1e-6)])
    b, c0 = rng.randint(1, 300), rng.randint(1, 200_000)
    steps = [a + s * (c0 + i * b) for i in range(200)]
    for k in (0, 1, 2, 17, 199):
        assert _run_seconds(k, a, s, c0, b) == pytest.approx(sum(steps[:k]), rel=1e-12)
    for _ in range(50):
        elapsed = rng.uniform(0, sum(steps))
        done = _steps_within(elapsed, a, s, c0, b, 200)
        assert sum(steps[:done]) <= elapsed + 1e-12
        assert done == 200 or sum(steps[: done + 1]) > elapsed


@pytest.mark.parametrize("seed", range(30))
def test_mixed_step_matches_the_profile(kit: SimKit, seed: int) -> None:
    rng = random.Random(seed)
    replica = Cluster([Request(0.0, 1, 1)], kit.colocated(), kit.config(), None).all_replicas[0]
    chunks = [PrefillChunk(rng.randint(0, 5000), rng.randint(1, 4000)) for _ in range(rng.randint(1, 3))]
    batch = rng.choice([0, 1, 100, 200])
    context = batch * rng.randint(1, 3000)
    tokens = sum(c.tokens for c in chunks) + batch
    attention = sum((c.offset + c.tokens) ** 2 - c.offset**2 for c in chunks)
    expected = kit.profile.step_seconds(chunks, batch, context)
    assert replica.mixed_step_seconds(tokens, attention, batch, context) == pytest.approx(expected, rel=1e-12)
