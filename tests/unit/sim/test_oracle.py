"""The hindsight oracle (`tandem.sim.oracle`): its pieces table by table, the resumable simulation it
stands on, and the greedy schedule against exhaustive search on a small trace.

What the exhaustive test checks, and why not more: the greedy picks, interval by interval, the cheapest
layout meeting the target from the state its own earlier picks left. Given that, within one interval,
"meets the target" is monotone in each pool's size on the grid (checked here on every state the greedy
visits), its pick is the cheapest in that interval (`cheapest` only skips layouts below a pool's least
size, which monotonicity makes infeasible): that is exact and asserted. Across intervals greedy is not
optimal in general (a cheaper layout now can leave a backlog that costs more later, or make a later
interval infeasible), so the whole schedule is compared with the cheapest feasible schedule found by
enumerating every schedule on the grid: greedy >= that optimum by definition, and on this trace equal
(asserted; a future change of the simulator that breaks it shows here, and is not necessarily a bug).
"""

from __future__ import annotations

import itertools
import random
from typing import TYPE_CHECKING

import pytest

from tandem.sim import Request, simulate
from tandem.sim.cluster import Cluster
from tandem.sim.layout import Layout, SimConfig
from tandem.sim.oracle import (
    IntervalSearch,
    OracleGrid,
    SchedulePolicy,
    empty_cluster,
    hindsight_schedule,
    interval_starts,
    min_size,
    order_time,
    replay_layout,
    schedule_sizes,
    within_share,
)
from tandem.sim.report import beats_oracle, oracle_cost_verdict

if TYPE_CHECKING:
    from conftest import SimKit


@pytest.mark.parametrize(
    ("answer", "low", "high", "hint"),
    [
        (1, 1, 10, None),
        (10, 1, 10, None),
        (4, 1, 10, 4),
        (4, 1, 10, 9),
        (4, 1, 10, 1),
        (7, 1, 24, 3),
        (1, 1, 24, 20),
        (24, 1, 24, 1),
        (5, 5, 5, 3),
        (None, 1, 10, 5),  # not even the cap
        (None, 1, 1, None),
    ],
)
def test_min_size_is_the_least_true_of_a_monotone_predicate_from_any_hint(
    answer: int | None, low: int, high: int, hint: int | None
) -> None:
    threshold = 10**9 if answer is None else answer
    calls: list[int] = []

    def ok(n: int) -> bool:
        calls.append(n)
        return n >= threshold

    assert min_size(ok, low, high, hint) == answer
    assert all(low <= n <= high for n in calls)
    assert len(calls) <= 2 * (high - low + 1).bit_length() + 2


@pytest.mark.parametrize(
    ("arrivals", "interval", "bounds"),
    [
        ([0.0, 1.0, 59.9, 60.0, 61.0], 60.0, [0, 3, 5]),
        ([0.0, 130.0], 60.0, [0, 1, 1, 2]),  # an interval without arrivals
        ([5.0], 60.0, [0, 1]),
        ([0.0, 10.0, 20.0], 10.0, [0, 1, 2, 3]),
    ],
)
def test_interval_starts(arrivals: list[float], interval: float, bounds: list[int]) -> None:
    requests = [Request(t, 10, 2) for t in arrivals]
    assert interval_starts(requests, interval) == bounds


@pytest.mark.parametrize(
    ("start", "load", "ordered"),
    [(600.0, 120.0, 480.0), (600.0, 90.0, 480.0), (600.0, 0.0, 600.0), (60.0, 120.0, -60.0)],
)
def test_a_replica_is_ordered_at_the_last_tick_one_load_time_ahead(
    start: float, load: float, ordered: float
) -> None:
    assert order_time(start, 60.0, load) == ordered


SIZES = [(2, 1), (2, 1), (2, 1), (5, 1), (1, 3), (1, 1)]


@pytest.mark.parametrize(
    ("load", "now", "want"),
    [
        (120.0, 0.0, (2, 1)),  # interval 0; intervals 1-2 are ordered at -60 and 0: all (2, 1)
        (120.0, 60.0, (5, 1)),  # interval 3 (needs 5 prefill at 180) ordered at 60
        (120.0, 120.0, (5, 3)),  # and interval 4's decode at 120
        (120.0, 180.0, (5, 3)),  # interval 3 itself, interval 4 already ordered
        (120.0, 240.0, (1, 3)),  # interval 4; interval 5 needs less
        (120.0, 300.0, (1, 1)),
        (120.0, 900.0, (1, 1)),  # past the schedule: its last layout
        (0.0, 120.0, (2, 1)),  # no load time: each interval's own layout at its start
        (0.0, 180.0, (5, 1)),
        (90.0, 60.0, (5, 1)),  # 90 s: interval 3 ordered at tick 60 (180 - 90 = 90 -> 60)
        (90.0, 120.0, (5, 3)),
    ],
)
def test_the_replay_asks_for_the_largest_layout_already_ordered(
    load: float, now: float, want: tuple[int, int]
) -> None:
    policy = SchedulePolicy([{"prefill": p, "decode": d} for p, d in SIZES], 60.0, load)
    assert policy.decide(None, now) == {"prefill": want[0], "decode": want[1]}


def _trace(rates: list[float], interval: float, prompt: int, out: int, seed: int = 1) -> list[Request]:
    rng = random.Random(seed)
    requests: list[Request] = []
    for k, rate in enumerate(rates):
        t = k * interval
        while True:
            t += rng.expovariate(rate)
            if t >= (k + 1) * interval:
                break
            requests.append(
                Request(t, rng.randint(prompt // 2, prompt * 3 // 2), rng.randint(out // 2, out * 3 // 2))
            )
    return requests


@pytest.fixture
def small(kit: SimKit) -> tuple[list[Request], Layout, SimConfig]:
    """Three 20-s intervals, quiet, busy, middling; a small KV cache so decode needs replicas too."""
    requests = _trace([3.0, 9.0, 5.0], 20.0, prompt=3000, out=300)
    return requests, kit.pd(kit.spec(cap=40_000), 1, 1), kit.config(ttft_ms=1000, tpot_ms=50)


def test_a_resumed_and_forked_simulation_ends_as_one_run(
    kit: SimKit, small: tuple[list[Request], Layout, SimConfig]
) -> None:
    requests, layout, config = small
    whole = simulate(requests, layout, config).summary
    cluster = Cluster(requests, layout, config, None)
    cluster.begin()
    cluster.advance(25.0, len(requests))
    fork = cluster.fork()
    spare = cluster.fork()
    spare.release()  # a search's fork done with frees its records; the others must not notice
    assert (len(spare.first), len(spare.finished), len(spare.path), len(spare.preempts)) == (0, 0, 0, 0)
    fork.advance(40.0, len(requests))  # the fork moves on; the original must not notice
    assert fork.next_arrival > cluster.next_arrival
    cluster.advance(float("inf"), len(requests))
    assert cluster._result().summary == whole
    fork.advance(float("inf"), len(requests))
    assert fork._result().summary == whole


def test_until_idle_stops_when_the_admitted_requests_are_done(
    small: tuple[list[Request], Layout, SimConfig],
) -> None:
    requests, layout, config = small
    cluster = Cluster(requests, layout, config, None)
    cluster.begin()
    cluster.advance(float("inf"), 30, until_idle=True)
    assert cluster.next_arrival == 30
    assert cluster.outstanding == 0
    assert within_share(cluster, range(30)) > 0.9


def test_the_greedy_oracle_against_every_schedule_on_the_grid(
    small: tuple[list[Request], Layout, SimConfig],
) -> None:
    requests, layout, config = small
    grid = OracleGrid(max_prefill=3, max_decode=3, max_gpus=6, interval_seconds=20.0)
    schedule = hindsight_schedule(requests, layout, config, grid)
    greedy = [(c.prefill, c.decode) for c in schedule.choices]
    assert len(greedy) == 3
    assert schedule.infeasible == 0
    assert all(c.attainment >= grid.target for c in schedule.choices)
    assert len({sum(pd) for pd in greedy}) > 1, "the trace should need different layouts"

    bounds = interval_starts(requests, grid.interval_seconds)
    layouts = list(itertools.product(range(1, 4), range(1, 4)))
    costs: list[tuple[int, list[tuple[int, int]]]] = []

    def enumerate_from(k: int, state: Cluster, low: int, cost: int, path: list[tuple[int, int]]) -> None:
        if k == len(bounds) - 1:
            costs.append((cost, path))
            return
        search, next_low = IntervalSearch.open(state, bounds, k, grid.interval_seconds, low)
        meets = {pd: search.share(*pd) >= grid.target for pd in layouts}
        if path == greedy[:k]:  # the greedy's own state: monotone predicate, and its pick the cheapest
            for (p, d), ok in meets.items():
                assert not ok or meets.get((p + 1, d), True), (k, p, d)
                assert not ok or meets.get((p, d + 1), True), (k, p, d)
            assert sum(greedy[k]) == min(sum(pd) for pd, ok in meets.items() if ok)
        for pd, ok in meets.items():
            if ok:
                enumerate_from(k + 1, search.run(*pd, drain=False), next_low, cost + sum(pd), [*path, pd])

    enumerate_from(0, empty_cluster(requests, layout, config), 0, 0, [])
    optimum = min(cost for cost, _ in costs)
    assert sum(sum(pd) for pd in greedy) == optimum

    # the replay in the full simulator: the target holds, and the load time costs GPU-hours
    replays = {}
    for load in (120.0, 0.0):
        policy = SchedulePolicy(schedule_sizes(schedule), grid.interval_seconds, load)
        replays[load] = simulate(requests, replay_layout(layout, policy), config, policy).summary
    assert replays[120.0].attainment >= grid.target
    assert replays[0.0].attainment >= grid.target
    assert replays[120.0].gpu_hours > replays[0.0].gpu_hours


@pytest.mark.parametrize(
    ("hours", "attainment", "oracle", "flagged"),
    [
        (9.0, 0.96, 10.0, True),  # 10% under the oracle at the target: flagged
        (9.9, 0.96, 10.0, False),  # 1% under: within the tolerance
        (9.0, 0.90, 10.0, False),  # cheaper but missing the target: not a contradiction
        (11.0, 0.99, 10.0, False),
        (9.79, 0.95, 10.0, True),  # exactly at the target counts as meeting it
    ],
)
def test_a_policy_beating_the_oracle_beyond_noise_is_flagged(
    hours: float, attainment: float, oracle: float, flagged: bool
) -> None:
    assert beats_oracle(hours, attainment, oracle, 0.95) is flagged


@pytest.mark.parametrize(
    ("hours", "oracle", "verdict"),
    [
        (10.0, 10.0, "1.00x the oracle's GPU-hours (target <= 1.2x): met"),
        (12.0, 10.0, "1.20x the oracle's GPU-hours (target <= 1.2x): met"),
        (15.0, 10.0, "1.50x the oracle's GPU-hours (target <= 1.2x): missed by 25%"),
    ],
)
def test_the_cost_target_says_by_how_much_it_is_missed(hours: float, oracle: float, verdict: str) -> None:
    assert oracle_cost_verdict(hours, oracle) == verdict


def test_a_replica_added_by_the_replay_is_paid_from_its_order(kit: SimKit) -> None:
    """Interval 3 (180-240 s) needs a second prefill replica: ordered at 60 s (one 120-s load ahead), so
    the replay pays 180 GPU-seconds for it (60 to 240 s, its drain at 240 s immediate on this light
    load), and with no load time 60 (180 to 240 s)."""
    requests = [Request(0.5 * i, 200, 4) for i in range(600)]  # 300 s, 2 short requests per second
    sizes = [{"prefill": p, "decode": 1} for p in (1, 1, 1, 2, 1)]
    layout = kit.pd()
    config = kit.config()
    for load, extra in ((120.0, 180.0), (0.0, 60.0)):
        policy = SchedulePolicy(sizes, 60.0, load)
        summary = simulate(requests, replay_layout(layout, policy), config, policy).summary
        base = 2 * summary.duration_seconds  # one prefill and one decode replica throughout
        assert summary.gpu_hours * 3600 == pytest.approx(base + extra, abs=1.0), load
        assert summary.peak_gpus == 3
        assert summary.attainment == 1.0


class _Known(IntervalSearch):
    """An interval search over a table of shares instead of simulations, counting what it simulates."""

    def __init__(self, shares: dict[tuple[int, int], float], table: dict[tuple[int, int], float]) -> None:
        super().__init__(None, 0.0, 60.0, 0, [], dict(shares))  # type: ignore[arg-type]
        self.table = table
        self.simulated: list[tuple[int, int]] = []

    def share(self, p: int, d: int) -> float:
        if (p, d) not in self.shares:
            self.simulated.append((p, d))
            self.shares[(p, d)] = self.table[(p, d)]
        return self.shares[(p, d)]


@pytest.mark.parametrize(
    ("known", "layout", "meets", "simulated"),
    [
        ({(2, 2): 0.97}, (3, 2), True, False),  # a smaller layout meets: so does this one
        ({(2, 2): 0.97}, (2, 5), True, False),
        ({(4, 4): 0.90}, (3, 4), False, False),  # a larger one misses: so does this one
        ({(4, 4): 0.90}, (1, 1), False, False),
        ({(2, 2): 0.97}, (1, 5), False, True),  # neither settles it: simulated (the table says 0.5)
        ({(4, 1): 0.90, (1, 4): 0.99}, (2, 3), False, True),
        ({}, (2, 2), True, True),
    ],
)
def test_a_layout_settled_by_one_already_simulated_is_not_simulated(
    known: dict[tuple[int, int], float], layout: tuple[int, int], meets: bool, simulated: bool
) -> None:
    table = {(p, d): 0.5 if p == 1 else 0.96 for p in range(1, 6) for d in range(1, 6)}
    table[(2, 3)] = 0.94
    search = _Known(known, table)
    assert search.meets(*layout, 0.95) is meets
    assert (search.simulated == [layout]) is simulated
