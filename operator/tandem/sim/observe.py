"""The simulator's windows as the autoscaler's `Snapshot`, so `decide()` cannot tell sim from live.

Rates are increases over the window divided by its span; gauges are the last scrape's, summed over the
pool's serving replicas (KV usage averaged and maxed), and the queued prompt tokens also one window
earlier (`queued_prompt_tokens_before`, as the live reader's `offset`). The prompts' second moment comes
from a histogram with vLLM's `vllm:request_prompt_tokens` buckets through the same
`signals.second_moment` the live reader uses, the outputs' likewise from the same buckets (vLLM's
`vllm:request_generation_tokens`). Preemptions, prefix-cache queries and hits are rates of the
replicas' counters, as the live reader's of vLLM's (`vllm:num_preemptions_total`, ...). TTFT and
TPOT are PromQL-style quantiles of the router's histograms at the SLO's quantile; `None` where the
window saw no request of that kind. The P/D path's TTFT breakdown (`autoscale.attribution`) is the
means of its parts over the window's finished P/D requests, as the live reader's ratios of the
histograms' `_sum` and `_count`.
"""

from __future__ import annotations

import math

from tandem.signals import (
    ArrivalSignals,
    PathSignals,
    PoolSignals,
    PoolSize,
    Snapshot,
    TtftBreakdown,
    second_moment,
)
from tandem.sim.windows import PATH_NAMES, PROMPT_BUCKETS, ROLE_INDEX, WindowView


def snapshot_of(view: WindowView, quantile: float) -> Snapshot:
    inc = view.increase
    sizes: dict[str, PoolSize] = {}
    pools: dict[str, PoolSignals] = {}
    for role, gauges in view.gauges.items():
        sizes[role] = PoolSize(replicas=gauges.ready + gauges.starting, ready=gauges.ready)
        r = ROLE_INDEX[role]
        finished = inc.pool_finished[r]
        mean_prompt = inc.pool_finished_prompt[r] / finished if finished else 0.0
        mean_output = inc.pool_finished_output[r] / finished if finished else 0.0
        before = view.gauges_before.get(role) if view.gauges_before is not None else None
        pools[role] = PoolSignals(
            scraped_targets=gauges.scraped_targets,
            waiting_requests=float(gauges.waiting),
            running_requests=float(gauges.running),
            kv_usage_mean=gauges.kv_usage_mean,
            kv_usage_max=gauges.kv_usage_max,
            prompt_tokens_rate=view.rate(inc.pool_prompt[r]),
            generation_tokens_rate=view.rate(inc.pool_generation[r]),
            request_rate=view.rate(finished),
            queued_prompt_tokens=float(gauges.queued_prompt_tokens),
            queued_prompt_tokens_before=float(before.queued_prompt_tokens) if before is not None else None,
            mean_prompt_tokens=mean_prompt,
            prompt_tokens_second_moment=second_moment(PROMPT_BUCKETS, inc.pool_prompt_hist[r], mean_prompt),
            mean_output_tokens=mean_output,
            output_tokens_second_moment=second_moment(PROMPT_BUCKETS, inc.pool_output_hist[r], mean_output),
            preemptions_rate=view.rate(inc.pool_preemptions[r]),
            prefix_cache_queries_rate=view.rate(inc.pool_prefix_queries[r]),
            prefix_cache_hits_rate=view.rate(inc.pool_prefix_hits[r]),
            local_prompt_tokens_rate=view.rate(inc.pool_local_prompt[r]),
        )
    paths: dict[str, PathSignals] = {}
    for p, name in enumerate(PATH_NAMES):
        finished = inc.path_finished[p]
        if not finished and not inc.path_refused[p]:
            continue
        paths[name] = PathSignals(
            request_rate=view.rate(finished + inc.path_refused[p]),
            within_slo_rate=view.rate(inc.path_within[p]),
            ttft_seconds=_or_none(view.ttft_quantile(quantile, p)),
            tpot_seconds=_or_none(view.tpot_quantile(quantile, p)),
            ttft_breakdown=_breakdown(view) if p == 0 else None,
            local_prefill_rate=view.rate(inc.path_local) if p == 0 else 0.0,
            remote_prefill_rate=view.rate(finished - inc.path_local) if p == 0 else 0.0,
        )
    missing = () if view.seconds > 0 else ("no scrape window yet",)
    return Snapshot(
        observed_at=view.now,
        window_seconds=view.seconds,
        sizes=sizes,
        pools=pools,
        paths=paths,
        missing=missing,
        arrivals=ArrivalSignals(
            request_rate=view.rate(inc.arrivals),
            mean_prompt_tokens=inc.arrival_prompt / inc.arrivals if inc.arrivals else 0.0,
        ),
    )


def _breakdown(view: WindowView) -> TtftBreakdown | None:
    """The window's P/D TTFT parts, means per request finished in it (None without any); the prefill
    leg's and the KV read's over the remote ones, as the routers' and engines' histograms have them."""
    inc = view.increase
    n, remote = inc.pd_timed, inc.pd_remote
    if n <= 0:
        return None
    per_remote = max(1, remote)
    return TtftBreakdown(
        ttft=inc.pd_ttft / n,
        prefill_leg=inc.pd_prefill_leg / per_remote,
        decode_first_token=inc.pd_decode_first / n,
        prefill_queue=inc.pd_prefill_queue / per_remote,
        kv_transfer=inc.pd_kv_read / per_remote,
        local_share=(n - remote) / n,
    )


def _or_none(value: float) -> float | None:
    return None if math.isnan(value) else value
