"""The hindsight oracle: a P/D schedule chosen knowing every request in advance, the yardstick the
autoscaler bench divides each policy's GPU-hours by (issue 25).

**What it is.** Time is cut into decision intervals of `interval_seconds` (60 s by default: the
simulator's window and tandem's default interval). For interval k, `[k*I, (k+1)*I)`, the oracle picks
the layout (prefill, decode replicas) with the fewest GPUs on the grid (`1..max_prefill` x
`1..max_decode`, at most `max_gpus`) such that, simulated from the state the previous intervals left
(queues, running and half-pulled requests, draining replicas), the interval's **judged requests** reach
the attainment target: the requests arriving in it plus those inherited unfinished at its start, each
followed to its end with the layout held and no later arrivals (`Cluster.advance(..., until_idle)`).
Greedy forward: the chosen layout's state at the end of the interval (not drained) is what interval
k+1 inherits. Ties in GPUs go to the layout nearest the previous one (fewest replicas changed).

**Load time.** In the search a replica added at k is ready at k's start (`Cluster.resize_now`): the
oracle knows the future, so it ordered it one model load time earlier. The replay (`SchedulePolicy`)
does exactly that in the full simulator: at each policy tick it asks for the largest layout of the
current interval and of every later interval whose order time (the latest tick at or before its start
minus the load time) has come, so the replica holds its GPUs, and is paid, from its order. Layouts
needed before the first tick (order time <= 0) are the initial, ready, layout, as every dynamic policy
of the bench starts ready. The "instant" oracle replays the same schedule with no load time.

**Where it is not a lower bound.** It is greedy (a cheaper layout now can leave a backlog that costs
more later; `tests/unit/sim/test_oracle.py` compares it with exhaustive search on a small trace); it
holds the target in *every* interval, which is stricter than the trace-wide attainment the policies
are judged on (a policy may miss a burst and make it up elsewhere); the grid has whole replicas; and the
search assumes more replicas never lower an interval's attainment (`min_size` bisects on it), which the
router's random choices can break by a request or two. The schedule is replayed end to end in the same
simulator the policies run in, and the replay's attainment, not the search's, is what is reported.

**Search cost.** Per interval: per pool its least size reaching the target with the other pool at its
cap (galloping from the previous interval's size, then bisecting; a layout meeting the target needs at
least both, if more replicas never lower the share), then layouts by increasing GPUs from those minima
until one meets the target. Shares are cached per interval, and a layout is not simulated where one
already simulated settles it by that assumption (a smaller one meets the target, a larger one misses);
the previous interval's layout is simulated first, as it usually settles most of them. An interval no
grid layout saves (the cap misses the target: an inherited backlog, a prompt too long to meet the TTFT
alone) gets the cheapest layout within `BEST_EFFORT_SLACK` of the cap's share, and is counted
(`OracleSchedule.infeasible`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tandem.sim.cluster import Cluster
from tandem.sim.layout import Layout, SimConfig
from tandem.sim.requests import Request
from tandem.sim.results import REFUSED

BEST_EFFORT_SLACK = 0.005  # an interval no layout within the grid saves: within this of the cap's share


@dataclass(frozen=True, slots=True)
class OracleGrid:
    """The layouts the oracle may pick, and its target."""

    max_prefill: int
    max_decode: int
    max_gpus: int
    target: float = 0.95
    interval_seconds: float = 60.0
    margin: float = 0.0  # the search asks target + margin of each interval (the replay is judged on target)

    def __post_init__(self) -> None:
        if self.max_prefill < 1 or self.max_decode < 1:
            raise ValueError("the grid needs at least one replica per pool")
        if not 0 < self.target <= 1 or self.margin < 0:
            raise ValueError("the target is a share in (0, 1], the margin >= 0")
        if self.interval_seconds <= 0:
            raise ValueError("the interval must be positive")


@dataclass(frozen=True, slots=True)
class IntervalChoice:
    """The oracle's layout for one interval, and what its search saw."""

    start: float
    prefill: int
    decode: int
    judged: int  # requests judged: arrived in the interval, or inherited unfinished
    attainment: float  # the judged requests' share within SLO in the search (held layout, drained)
    goal: float  # the share asked: target + margin, or the cap's share less the slack (best effort)
    feasible: bool  # the goal is the target (some layout in the grid reaches it)
    evaluated: int  # layouts simulated for this interval


@dataclass(frozen=True, slots=True)
class OracleSchedule:
    interval_seconds: float
    choices: tuple[IntervalChoice, ...]
    simulations: int  # interval simulations the search ran

    @property
    def infeasible(self) -> int:
        return sum(not c.feasible for c in self.choices)


def interval_starts(requests: Sequence[Request], interval: float) -> list[int]:
    """`bounds[k]`: the index of the first request arriving at or after `k * interval`; one more than
    the number of intervals (the last is `len(requests)`)."""
    if not requests:
        return [0]
    count = max(1, math.floor(requests[-1].arrival / interval) + 1)
    bounds: list[int] = []
    i = 0
    for k in range(count + 1):
        edge = k * interval
        while i < len(requests) and requests[i].arrival < edge:
            i += 1
        bounds.append(i)
    bounds[-1] = len(requests)
    return bounds


def within_share(cluster: Cluster, judged: Sequence[int]) -> float:
    """Share of `judged` request indices within the SLO in `cluster` (refused or unfinished: not)."""
    if not judged:
        return 1.0
    ttft_slo, tpot_slo = cluster.ttft_slo, cluster.tpot_slo
    first, finished, path, requests = cluster.first, cluster.finished, cluster.path, cluster.requests
    within = 0
    for i in judged:
        if path[i] == REFUSED or math.isnan(finished[i]):
            continue
        request = requests[i]
        if first[i] - request.arrival > ttft_slo:
            continue
        out = request.output_tokens
        if out > 1 and (finished[i] - first[i]) / (out - 1) > tpot_slo:
            continue
        within += 1
    return within / len(judged)


def unfinished(cluster: Cluster, low: int, stop: int) -> list[int]:
    """Requests in [low, stop) still in flight. With a ready replica in each pool (the oracle's grid
    starts at one) the router refuses only a request longer than the model length the pools hold,
    whose record stays NaN forever: it is judged in its own interval, as a miss, and not again."""
    finished, requests, longest = cluster.finished, cluster.requests, cluster.longest_pd
    return [
        i
        for i in range(low, stop)
        if math.isnan(finished[i]) and requests[i].prompt_tokens + requests[i].output_tokens <= longest
    ]


def min_size(ok: Callable[[int], bool], low: int, high: int, hint: int | None = None) -> int | None:
    """The least n in [low, high] with ok(n), ok assumed monotone (False then True); None if not even
    ok(high). From `hint` (the previous interval's size) it gallops (steps 1, 2, 4... down while ok, up
    while not), then bisects the bracket: a few calls when the answer is near the hint."""
    if low > high:
        return None
    hint = high if hint is None else min(high, max(low, hint))
    step = 1
    if ok(hint):  # the answer is in [low, hint]
        yes = hint
        no = low - 1
        while yes > low:
            probe = max(low, yes - step)
            if ok(probe):
                yes = probe
                step *= 2
            else:
                no = probe
                break
    else:  # in (hint, high], or none
        no = hint
        yes = high + 1
        while no < high:
            probe = min(high, no + step)
            if ok(probe):
                yes = probe
                break
            no = probe
            step *= 2
        if yes > high:
            return None
    while yes - no > 1:
        mid = (yes + no) // 2
        if ok(mid):
            yes = mid
        else:
            no = mid
    return yes


def cheapest(
    meets: Callable[[int, int], bool],
    grid: OracleGrid,
    gpus: Callable[[int, int], int],
    previous: tuple[int, int],
) -> tuple[int, int] | None:
    """The layout with the fewest GPUs that `meets` the goal, searched from each pool's least size (the
    other at its cap; a layout meeting the goal needs at least both, if more replicas never turn a layout
    that meets it into one that misses); among equal GPUs, the nearest to `previous`. None: not even
    the cap meets it. With `meets` inferring from layouts already simulated (`IntervalSearch.meets`),
    the layout returned was simulated itself: a smaller one that settled it would come first."""
    p_min = min_size(lambda p: meets(p, grid.max_decode), 1, grid.max_prefill, previous[0])
    if p_min is None:
        return None
    d_min = min_size(lambda d: meets(grid.max_prefill, d), 1, grid.max_decode, previous[1])
    if d_min is None:
        return None
    candidates = [
        (p, d)
        for p in range(p_min, grid.max_prefill + 1)
        for d in range(d_min, grid.max_decode + 1)
        if gpus(p, d) <= grid.max_gpus
    ]
    candidates.sort(key=lambda pd: (gpus(*pd), abs(pd[0] - previous[0]) + abs(pd[1] - previous[1]), pd))
    for p, d in candidates:
        if meets(p, d):
            return p, d
    return None


@dataclass
class IntervalSearch:
    """One interval's search: its inherited state, judged requests and cache of shares by layout."""

    state: Cluster
    start: float
    end: float
    stop: int
    judged: list[int]
    shares: dict[tuple[int, int], float] = field(default_factory=dict)

    def run(self, p: int, d: int, *, drain: bool) -> Cluster:
        cluster = self.state.fork()
        cluster.resize_now({"prefill": p, "decode": d}, self.start)
        cluster.advance(self.end, self.stop)
        if drain:
            cluster.advance(math.inf, self.stop, until_idle=True)
        return cluster

    @classmethod
    def open(
        cls, state: Cluster, bounds: Sequence[int], k: int, interval: float, low: int
    ) -> tuple[IntervalSearch, int]:
        """Interval k from `state` (the simulation at its start): judged are its arrivals and the
        requests from `low` on still in flight; also the new `low` (every request below it is done)."""
        lo, hi = bounds[k], bounds[k + 1]
        inherited = unfinished(state, low, lo)
        search = cls(state, k * interval, (k + 1) * interval, hi, [*inherited, *range(lo, hi)])
        return search, inherited[0] if inherited else lo

    def share(self, p: int, d: int) -> float:
        key = (p, d)
        if key not in self.shares:
            cluster = self.run(p, d, drain=True)
            self.shares[key] = within_share(cluster, self.judged)
            cluster.release()
        return self.shares[key]

    def meets(self, p: int, d: int, goal: float) -> bool:
        """share(p, d) >= goal, inferred without a simulation where a layout already simulated settles it
        (one no larger in both pools meets the goal, or one no smaller in both misses it: the search's
        monotonicity assumption)."""
        for (q, e), value in self.shares.items():
            if q <= p and e <= d and value >= goal:
                return True
            if q >= p and e >= d and value < goal:
                return False
        return self.share(p, d) >= goal

    def meeting(self, goal: float) -> Callable[[int, int], bool]:
        return lambda p, d: self.meets(p, d, goal)


def search_layout(base: Layout, prefill: int, decode: int) -> Layout:
    """`base` with its P/D pools at these sizes (ready at the start)."""
    pools = dict(base.pools)
    pools["prefill"] = base.pools["prefill"].model_copy(update={"replicas": prefill})
    pools["decode"] = base.pools["decode"].model_copy(update={"replicas": decode})
    return base.model_copy(update={"pools": pools})


def empty_cluster(requests: Sequence[Request], layout: Layout, config: SimConfig) -> Cluster:
    """The oracle's simulation before its first interval: `layout`'s pools, no replica yet."""
    state = Cluster(requests, search_layout(layout, 0, 0), config, None)
    state.begin()
    return state


def hindsight_schedule(
    requests: Sequence[Request], layout: Layout, config: SimConfig, grid: OracleGrid
) -> OracleSchedule:
    """The greedy hindsight schedule (module docstring) for a P/D `layout` (its pools' specs; sizes
    ignored) over `requests`."""
    if "prefill" not in layout.pools or "decode" not in layout.pools:
        raise ValueError("the oracle schedules P/D layouts")
    tp_p = layout.pools["prefill"].gpus_per_replica
    tp_d = layout.pools["decode"].gpus_per_replica

    def gpus(p: int, d: int) -> int:
        return p * tp_p + d * tp_d

    interval = grid.interval_seconds
    bounds = interval_starts(requests, interval)
    state = empty_cluster(requests, layout, config)
    choices: list[IntervalChoice] = []
    simulations = 0
    previous = (1, 1)
    low = 0  # every request below it is finished (or refused)
    for k in range(len(bounds) - 1):
        current, low = IntervalSearch.open(state, bounds, k, interval, low)
        goal = min(1.0, grid.target + grid.margin)
        current.share(*previous)  # usually the answer or next to it: it settles many layouts unsimulated
        picked = cheapest(current.meeting(goal), grid, gpus, previous)
        feasible = picked is not None
        if picked is None:  # no layout on the grid reaches it: the best the cap does, less the slack
            goal = current.share(grid.max_prefill, grid.max_decode) - BEST_EFFORT_SLACK
            picked = cheapest(current.meeting(goal), grid, gpus, previous)
        if picked is None:  # the share is not monotone near the cap: the cap itself
            picked = (grid.max_prefill, grid.max_decode)
        assert picked in current.shares  # the pick is simulated, never only inferred (see `cheapest`)
        choices.append(
            IntervalChoice(
                start=current.start,
                prefill=picked[0],
                decode=picked[1],
                judged=len(current.judged),
                attainment=current.share(*picked),
                goal=goal,
                feasible=feasible,
                evaluated=len(current.shares),
            )
        )
        simulations += len(current.shares) + 1
        state = current.run(*picked, drain=False)
        current.state.release()
        previous = picked
    return OracleSchedule(interval, tuple(choices), simulations)


def order_time(start: float, interval: float, load_seconds: float) -> float:
    """When a replica needed at `start` is ordered: the latest policy tick (a multiple of `interval`)
    at or before `start - load_seconds`; <= 0 means it is in the initial layout."""
    return math.floor((start - load_seconds) / interval + 1e-9) * interval


@dataclass
class SchedulePolicy:
    """Replays a schedule of per-interval sizes in the simulator, each replica ordered one model load
    time ahead of the interval that needs it (module docstring). `sizes[k]` is interval k's layout."""

    sizes: Sequence[Mapping[str, int]]
    interval_seconds: float
    load_seconds: float

    def needed(self, now: float) -> dict[str, int]:
        """The largest size per pool over the current interval and those already ordered."""
        current = min(len(self.sizes) - 1, max(0, math.floor(now / self.interval_seconds + 1e-9)))
        want = dict(self.sizes[current])
        for k in range(current + 1, len(self.sizes)):
            if order_time(k * self.interval_seconds, self.interval_seconds, self.load_seconds) > now + 1e-9:
                break
            for role, n in self.sizes[k].items():
                want[role] = max(want.get(role, 0), n)
        return want

    def initial(self) -> dict[str, int]:
        return self.needed(0.0)

    def decide(self, snapshot: object, now: float) -> dict[str, int]:
        return self.needed(now)


def schedule_sizes(schedule: OracleSchedule) -> list[dict[str, int]]:
    return [{"prefill": c.prefill, "decode": c.decode} for c in schedule.choices]


def replay_layout(layout: Layout, policy: SchedulePolicy) -> Layout:
    """`layout` with the schedule's initial sizes and the policy's load time."""
    first = policy.initial()
    sized = search_layout(layout, first["prefill"], first["decode"])
    return sized.model_copy(update={"model_load_seconds": policy.load_seconds})
