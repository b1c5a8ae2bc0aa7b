"""What the autoscaler sees: one PDDeployment's signals over one window, as plain frozen records.

Two producers fill a `Snapshot`: `tandem.metrics` from Prometheus (live) and `tandem.sim` from its
virtual-time windows (offline), so `decide()` cannot tell them apart. Rates are per second over
`window_seconds`; gauges are summed (or averaged, where named) over the pool's pods at
`observed_at`. A producer that could not read a signal lists why in `missing` and leaves a zero:
`decide()` holds every size when `missing` is not empty, and treats a fresh zero as "no traffic".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

PATH_DISAGGREGATED: Final = "disaggregated"
PATH_COLOCATED: Final = "colocated"

# A prompt always computes its last token, and a step has fixed costs: the pool is never sized as if
# more than 95% of the prompt tokens were free.
MIN_UNCACHED_FRACTION: Final = 0.05


@dataclass(frozen=True, slots=True)
class PoolSize:
    """A pool's size from the cluster (StatefulSet and pods), not from metrics."""

    replicas: int  # the size in effect (what the operator last asked for)
    ready: int  # pods that pass readiness; replicas - ready are starting (loading the model)


@dataclass(frozen=True, slots=True)
class PoolSignals:
    """One pool's engine metrics (vLLM names in `tandem.metrics.queries`)."""

    # scrape targets (pod and port: each rank's port of a MultiPortExternal pod) with fresh engine
    # metrics in the window
    scraped_targets: int = 0
    waiting_requests: float = 0.0  # sum of vllm:num_requests_waiting
    running_requests: float = 0.0  # sum of vllm:num_requests_running
    kv_usage_mean: float = 0.0  # mean of vllm:kv_cache_usage_perc, 0..1
    kv_usage_max: float = 0.0  # max of vllm:kv_cache_usage_perc, 0..1
    prompt_tokens_rate: float = 0.0  # prompt tokens/s computed (rate of vllm:prompt_tokens_total)
    generation_tokens_rate: float = 0.0  # tokens/s generated (rate of vllm:generation_tokens_total)
    request_rate: float = 0.0  # requests/s finished (rate of vllm:request_success_total)
    queued_prompt_tokens: float = 0.0  # prompt tokens waiting for prefill, summed over pods
    # The same gauge one window earlier (None: not read). With it decide() sees the queue's growth,
    # so a saturated pool's arrival rate = prompt_tokens_rate + growth / window_seconds.
    queued_prompt_tokens_before: float | None = None
    mean_prompt_tokens: float = 0.0  # over the window's finished requests (0 if none)
    # E[n^2] of the same prompts' lengths n, tokens^2 (0: unknown), from vLLM's request_prompt_tokens
    # histogram by `second_moment` (both producers): prefill's attention is quadratic in n, so a busy
    # replica's tokens/s depends on it, not only on the mean.
    prompt_tokens_second_moment: float = 0.0
    mean_output_tokens: float = 0.0  # over the window's finished requests (0 if none)
    # E[n^2] of the same outputs' lengths n, tokens^2 (0: unknown), from vLLM's
    # request_generation_tokens histogram by `second_moment` (both producers): a running sequence's KV
    # grows with its output, and the running sequences are the long ones (a sequence runs as long as its
    # output), so the KV they hold on average depends on the spread of the outputs, not only their mean.
    output_tokens_second_moment: float = 0.0
    # Sequences preempted per second (rate of vllm:num_preemptions_total, summed over the pool; 0: none
    # or not exported): the KV cache ran out and running sequences were dropped to be recomputed.
    preemptions_rate: float = 0.0
    # Prompt tokens looked up in the engines' prefix caches per second, and found there (rates of
    # vllm:prefix_cache_queries and vllm:prefix_cache_hits, summed over the pool; 0: not exported).
    prefix_cache_queries_rate: float = 0.0
    prefix_cache_hits_rate: float = 0.0
    # Prompt tokens/s the pool computed itself (rate of vllm:prompt_tokens_by_source{source=
    # "local_compute"}; 0: not exported). On decode: the prompts spec.router.disaggregation sent there
    # without a remote prefill, plus the one prompt token a decode engine recomputes per pulled request
    # (`local_prefill_tokens_rate` takes those out).
    local_prompt_tokens_rate: float = 0.0

    @property
    def uncached_fraction(self) -> float:
        """Share of the prompt tokens the pool computes (1 - prefix-cache hits / queries), at least
        `MIN_UNCACHED_FRACTION`; 1 when nothing was looked up (no counters, or no traffic)."""
        queries = self.prefix_cache_queries_rate
        if not queries > 0 or not math.isfinite(queries):
            return 1.0
        hits = min(max(self.prefix_cache_hits_rate, 0.0), queries)
        return max(MIN_UNCACHED_FRACTION, 1.0 - hits / queries)


@dataclass(frozen=True, slots=True)
class TtftBreakdown:
    """Where the P/D path's time to first token went over the window: means in seconds.

    The router times the legs (`tandem_router_time_to_first_token_seconds`, `..._prefill_leg_seconds`
    of successful legs, `..._decode_leg_first_token_seconds`); the engines time the prefill queue
    (`vllm:request_queue_time_seconds` on prefill) and each KV read (`vllm:nixl_xfer_time_seconds`, on
    the decode side). What the legs leave of the TTFT is the router's own queue: a request held before
    its prefill leg while every decode pod is near its KV capacity (decode backpressure), and retries.

    With spec.router.disaggregation Auto or Threshold some requests are prefilled on their decode pod
    (`local_share` of them): they have no prefill leg and no KV read, and their decode leg's first
    token includes their prefill. `ttft`, `decode_first_token` and `decode_engine_first_token` are
    means over every P/D request; `prefill_leg`, `prefill_queue` and `kv_transfer` over the remote ones.
    """

    ttft: float  # client-seen TTFT
    prefill_leg: float  # request sent to a prefill pod until its answer: its queue and compute
    decode_first_token: float  # decode leg sent until its first token: its queue, the KV read, a step
    prefill_queue: float | None = None  # in the prefill engines' queue (None: not exported)
    kv_transfer: float | None = None  # one KV read on the decode side (None: no NIXL metrics)
    # The decode engines' own TTFT (`vllm:time_to_first_token_seconds` on decode): the KV read, the
    # wait for room and the first step, timed in the same scrape as the KV read (None: not exported).
    decode_engine_first_token: float | None = None
    local_share: float = 0.0  # share of the P/D requests prefilled on their decode pod (0..1)

    @property
    def remote_share(self) -> float:
        """Share of the P/D requests prefilled on a prefill pod (those with a prefill leg, a KV read)."""
        return 1.0 - min(1.0, max(0.0, self.local_share))

    @property
    def router_queue(self) -> float:
        return max(0.0, self.ttft - self.remote_share * self.prefill_leg - self.decode_first_token)


@dataclass(frozen=True, slots=True)
class PathSignals:
    """What clients saw on one path (the routers' histograms and within-SLO counters)."""

    request_rate: float = 0.0  # requests/s finished at the routers
    within_slo_rate: float = 0.0  # requests/s that met both the TTFT and the TPOT target
    ttft_seconds: float | None = None  # TTFT at the SLO's quantile; None without requests
    tpot_seconds: float | None = None  # TPOT at the SLO's quantile; None without multi-token requests
    ttft_breakdown: TtftBreakdown | None = None  # P/D only, when the routers and engines time the legs
    # P/D only: requests/s finished whose prompt was prefilled on their decode pod (local) or on a
    # prefill pod (remote), by spec.router.disaggregation's choice
    local_prefill_rate: float = 0.0
    remote_prefill_rate: float = 0.0

    @property
    def local_prefill_share(self) -> float | None:
        """Share of P/D requests prefilled on their decode pod (0..1); None without any."""
        total = self.local_prefill_rate + self.remote_prefill_rate
        return self.local_prefill_rate / total if total > 0 else None

    @property
    def attainment(self) -> float | None:
        """Share of finished requests within SLO (0..1), None without requests."""
        if self.request_rate <= 0:
            return None
        return min(1.0, self.within_slo_rate / self.request_rate)


@dataclass(frozen=True, slots=True)
class ArrivalSignals:
    """Requests arriving at the routers over the window, before any is served (refusals included).

    Only the simulator fills it (its windows count arrivals): the live router exports finished
    requests (`tandem_router_requests_total`) and an in-flight gauge, no arrivals counter, so the live
    reader leaves `Snapshot.arrivals` None. `decide()` does not read it; the simulator's Dynamo-style
    planner baseline does, as Dynamo's planner reads its frontend's request count."""

    request_rate: float = 0.0  # requests/s arriving
    mean_prompt_tokens: float = 0.0  # over the window's arrivals (0 if none)


@dataclass(frozen=True, slots=True)
class Snapshot:
    observed_at: float  # unix (or virtual) time, seconds
    window_seconds: float
    sizes: Mapping[str, PoolSize] = field(default_factory=dict)  # by role: prefill, decode, colocated
    pools: Mapping[str, PoolSignals] = field(default_factory=dict)  # by role
    paths: Mapping[str, PathSignals] = field(default_factory=dict)  # by path: disaggregated, colocated
    missing: tuple[str, ...] = ()  # why some signal could not be read; non-empty means "no data"
    arrivals: ArrivalSignals | None = None  # the simulator's only (see ArrivalSignals)
    # For status only: latency (s) at the SLO's quantile per bucket label, by what it is of
    # (`ttft_by_input_length`, `tpot_by_concurrency`, ...; metrics.queries.BUCKET_LATENCIES).
    latency_by_bucket: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def has_data(self) -> bool:
        return not self.missing

    def total(self) -> PathSignals:
        """All paths together (rates add; latencies are the worse of the paths that served)."""
        paths = list(self.paths.values())
        ttfts = [p.ttft_seconds for p in paths if p.ttft_seconds is not None]
        tpots = [p.tpot_seconds for p in paths if p.tpot_seconds is not None]
        return PathSignals(
            request_rate=sum(p.request_rate for p in paths),
            within_slo_rate=sum(p.within_slo_rate for p in paths),
            ttft_seconds=max(ttfts) if ttfts else None,
            tpot_seconds=max(tpots) if tpots else None,
        )


def second_moment(bounds: Sequence[float], counts: Sequence[float], mean: float) -> float:
    """E[n^2] of the observations of a histogram whose exact mean is `mean` (from `_sum / _count`).

    `counts[i]` observations lie in bucket `(bounds[i-1], bounds[i]]` (the first from 0, not cumulative)
    and `counts[-1]` above the last bound (`+Inf`, taken at that bound). Within a bucket the values are
    taken as uniform, which gives the bucketed distribution's `E[n]` and `E[n^2]`; their ratio
    `E[n^2] / E[n]^2` times the exact `mean^2` is the estimate (the ratio is what the coarse buckets
    estimate well: within 3% over the Azure and Mooncake traces, 10-18% per minute on vLLM's 1-2-5
    buckets), never below `mean^2`. 0 without observations or with a mean that is not positive.
    """
    total = m1 = m2 = 0.0
    for i, count in enumerate(counts):
        if count <= 0:
            continue
        if i < len(bounds):
            lo, hi = (bounds[i - 1] if i else 0.0), bounds[i]
        else:
            lo = hi = bounds[-1] if bounds else 0.0
        total += count
        m1 += count * (lo + hi) / 2
        m2 += count * (lo * lo + lo * hi + hi * hi) / 3
    if total <= 0 or m1 <= 0 or not mean > 0 or not math.isfinite(mean):
        return 0.0
    ratio = (m2 / total) / (m1 / total) ** 2
    return max(1.0, ratio) * mean * mean
