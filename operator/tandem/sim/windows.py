"""What an autoscaler would read from Prometheus, in virtual time: counters, histograms and gauges,
snapshotted at every scrape and differenced over a sliding window.

Counters and histograms are cumulative (`Totals`, incremented by the cluster as requests progress);
the cluster calls `Windows.scrape(now, gauges)` every scrape interval, which keeps the samples of the
last window. `Windows.view(now)` gives the increase of every counter since the sample one window back
(like PromQL's `increase(...[60s])`, without extrapolation), the latest gauges, and quantiles computed
like `histogram_quantile` (linear interpolation inside the bucket). The buckets are the router's.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.routing.buckets import ITL_BUCKETS, TTFT_BUCKETS, token_buckets
from tandem.sim.layout import ROLES, Role

PATH_NAMES: tuple[str, str] = ("disaggregated", "colocated")  # index 0 and 1 everywhere in the sim
ROLE_INDEX: dict[Role, int] = {role: i for i, role in enumerate(ROLES)}
# vLLM's vllm:request_prompt_tokens buckets: the 1-2-5 series up to max_model_len (Llama-3.1's 131072,
# the bench's model; its top finite bound is 100000, a longer prompt goes to +Inf).
PROMPT_BUCKETS: tuple[float, ...] = token_buckets(131072)


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """PromQL's `histogram_quantile` over one histogram: `counts[i]` observations in bucket `le=bounds[i]`
    (not cumulative), `counts[-1]` in `+Inf`. NaN without observations."""
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    total = sum(counts)
    if total <= 0:
        return math.nan
    rank = q * total
    below = 0.0
    for i, bound in enumerate(bounds):
        count = counts[i]
        if below + count >= rank:
            if i == 0 and bound <= 0:
                return bound
            start = bounds[i - 1] if i else 0.0
            if count == 0:
                return math.nan  # PromQL divides 0 by 0 here (only reachable with q == 0)
            return start + (bound - start) * (rank - below) / count
        below += count
    return bounds[-1]  # the rank is in +Inf: the highest finite bound


class Totals:
    """Cumulative counters. Paths index 0 (disaggregated) and 1 (colocated); pools by `ROLE_INDEX`."""

    __slots__ = (
        "arrival_prompt",
        "arrivals",
        "path_finished",
        "path_generation",
        "path_local",
        "path_prompt",
        "path_refused",
        "path_within",
        "pd_decode_first",
        "pd_kv_read",
        "pd_prefill_leg",
        "pd_prefill_queue",
        "pd_remote",
        "pd_timed",
        "pd_ttft",
        "pool_finished",
        "pool_finished_output",
        "pool_finished_prompt",
        "pool_generation",
        "pool_local_prompt",
        "pool_output_hist",
        "pool_preemptions",
        "pool_prefix_hits",
        "pool_prefix_queries",
        "pool_prompt",
        "pool_prompt_hist",
        "pool_routed",
        "tpot",
        "ttft",
    )

    def __init__(self) -> None:
        self.arrivals = 0  # requests that reached a router (refused ones included)
        self.arrival_prompt = 0  # their prompt tokens
        self.path_finished = [0, 0]
        self.path_within = [0, 0]
        self.path_prompt = [0, 0]
        self.path_generation = [0, 0]
        self.path_refused = [0, 0]
        self.ttft = [[0] * (len(TTFT_BUCKETS) + 1) for _ in PATH_NAMES]
        self.tpot = [[0] * (len(ITL_BUCKETS) + 1) for _ in PATH_NAMES]
        n = len(ROLES)
        self.pool_routed = [0] * n  # legs sent to the pool
        self.pool_finished = [0] * n  # legs finished (vllm:request_success_total)
        self.pool_prompt = [0] * n  # prompt tokens at each leg's first token (vllm:prompt_tokens_total)
        self.pool_generation = [0] * n  # tokens sampled, counted when the leg ends
        self.pool_finished_prompt = [0] * n
        self.pool_finished_output = [0] * n
        # prompt tokens each pool computed itself (vllm:prompt_tokens_by_source{source="local_compute"})
        self.pool_local_prompt = [0] * n
        self.path_local = 0  # P/D requests finished that were prefilled on their decode replica
        # prompt tokens looked up in the replicas' prefix caches and found there, as vLLM's
        # vllm:prefix_cache_queries and vllm:prefix_cache_hits (summed over the pool)
        self.pool_prefix_queries = [0] * n
        self.pool_prefix_hits = [0] * n
        # finished legs by prompt length, vLLM's vllm:request_prompt_tokens (PROMPT_BUCKETS, then +Inf)
        self.pool_prompt_hist = [[0] * (len(PROMPT_BUCKETS) + 1) for _ in range(n)]
        # ... and by output length, vLLM's vllm:request_generation_tokens (the same buckets)
        self.pool_output_hist = [[0] * (len(PROMPT_BUCKETS) + 1) for _ in range(n)]
        self.pool_preemptions = [0] * n  # running sequences preempted (vllm:num_preemptions_total)
        # P/D requests' TTFT and its parts, summed (the routers' and engines' histograms' _sum and
        # _count, as `metrics.queries` reads them for the TTFT breakdown); the router never queues here
        self.pd_timed = 0
        self.pd_remote = 0  # ... of which prefilled on a prefill replica (the others on their decode one)
        self.pd_ttft = 0.0
        self.pd_prefill_leg = 0.0
        self.pd_prefill_queue = 0.0
        self.pd_kv_read = 0.0
        self.pd_decode_first = 0.0

    def observe_prompt(self, role_index: int, prompt: int) -> None:
        self.pool_prompt_hist[role_index][bisect_left(PROMPT_BUCKETS, prompt)] += 1

    def observe_output(self, role_index: int, output: int) -> None:
        self.pool_output_hist[role_index][bisect_left(PROMPT_BUCKETS, output)] += 1

    def observe_latency(self, path: int, ttft: float, tpot: float | None) -> None:
        self.ttft[path][bisect_left(TTFT_BUCKETS, ttft)] += 1
        if tpot is not None:
            self.tpot[path][bisect_left(ITL_BUCKETS, tpot)] += 1

    def observe_pd_parts(
        self,
        ttft: float,
        *,
        prefill_leg: float,
        prefill_queue: float,
        kv_read: float,
        decode_first: float,
        local: bool = False,
    ) -> None:
        """A P/D request's TTFT parts; `local`: prefilled on its decode replica (no leg, no read)."""
        self.pd_timed += 1
        self.pd_remote += not local
        self.pd_ttft += ttft
        self.pd_prefill_leg += prefill_leg
        self.pd_prefill_queue += prefill_queue
        self.pd_kv_read += kv_read
        self.pd_decode_first += decode_first

    def copy(self) -> Totals:
        c = Totals()
        for name in Totals.__slots__:
            value = getattr(self, name)
            if isinstance(value, int | float):
                setattr(c, name, value)
            elif value and isinstance(value[0], list):
                setattr(c, name, [list(v) for v in value])
            else:
                setattr(c, name, list(value))
        return c

    def minus(self, earlier: Totals) -> Totals:
        d = Totals()
        for name in Totals.__slots__:
            now, then = getattr(self, name), getattr(earlier, name)
            if isinstance(now, int | float):
                setattr(d, name, now - then)
            elif now and isinstance(now[0], list):
                setattr(
                    d,
                    name,
                    [[x - y for x, y in zip(a, b, strict=True)] for a, b in zip(now, then, strict=True)],
                )
            else:
                setattr(d, name, [x - y for x, y in zip(now, then, strict=True)])
        return d


@dataclass(frozen=True, slots=True)
class PoolGauges:
    """One pool at a scrape: replicas by state, and the engine gauges summed over serving replicas."""

    ready: int  # routable
    starting: int  # requested, loading the model
    draining: int  # removed, finishing their work (their GPUs still count)
    running: int  # vllm:num_requests_running, summed
    waiting: int  # vllm:num_requests_waiting, summed (KV pulls waiting for blocks included)
    queued_prompt_tokens: int  # prompt tokens not yet computed, waiting or partly prefilled
    kv_usage_mean: float  # over serving replicas, 0..1
    kv_usage_max: float
    gpus: int  # held by the pool's replicas in any state
    scraped_targets: int  # scrape targets of serving replicas (`Shape.metrics_targets` each)


@dataclass(frozen=True, slots=True)
class Sample:
    time: float
    totals: Totals
    gauges: dict[Role, PoolGauges]


@dataclass(frozen=True, slots=True)
class WindowView:
    """The window ending at `now`: counter increases over `seconds`, the gauges of the last scrape and
    those of the scrape one window earlier (`gauges_before`, as PromQL's `offset`)."""

    now: float
    seconds: float  # the span the increases cover (shorter than the window at the start of a trace)
    increase: Totals
    gauges: dict[Role, PoolGauges]
    gauges_before: dict[Role, PoolGauges] | None = None

    def rate(self, count: float) -> float:
        return count / self.seconds if self.seconds > 0 else 0.0

    def ttft_quantile(self, q: float, path: int | None = None) -> float:
        return histogram_quantile(q, TTFT_BUCKETS, _counts(self.increase.ttft, path))

    def tpot_quantile(self, q: float, path: int | None = None) -> float:
        return histogram_quantile(q, ITL_BUCKETS, _counts(self.increase.tpot, path))


def _counts(hists: list[list[int]], path: int | None) -> list[int]:
    if path is not None:
        return hists[path]
    return [sum(col) for col in zip(*hists, strict=True)]


class Windows:
    def __init__(self, window_seconds: float) -> None:
        self.window_seconds = window_seconds
        self.totals = Totals()
        self.samples: deque[Sample] = deque()

    def scrape(self, now: float, gauges: dict[Role, PoolGauges]) -> None:
        self.samples.append(Sample(now, self.totals.copy(), gauges))
        horizon = now - self.window_seconds
        while len(self.samples) > 1 and self.samples[1].time <= horizon:
            self.samples.popleft()

    @property
    def last_scrape(self) -> float:
        return self.samples[-1].time if self.samples else -math.inf

    def view(self, now: float) -> WindowView:
        """The window ending at the last scrape at or before `now` (call `scrape` first for a fresh one)."""
        if not self.samples:
            return WindowView(now, 0.0, Totals(), {})
        last = self.samples[-1]
        first = self.samples[0]
        return WindowView(
            now, last.time - first.time, last.totals.minus(first.totals), last.gauges, first.gauges
        )
