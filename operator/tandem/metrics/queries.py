"""The PromQL the autoscaler runs, in one table, and the pure parsing of its answers into a `Snapshot`.

No I/O here: `snapshot_queries` and `pod_load_queries` build query strings, `build_snapshot` and
`build_pod_loads` turn recorded answers (the `data.result` list of Prometheus' instant-query API,
by query name) into records. `tandem.metrics.prometheus` runs the queries.

Series are selected by the labels the scrape configuration copies from the pod
(`e2e/prometheus/prometheus.yml`: `namespace`, `pod`, and every pod label through `labelmap`, so
`tandem.dev/pddeployment` -> `tandem_dev_pddeployment`, `tandem.dev/role` -> `tandem_dev_role`).
Engines are the pods of role prefill, decode or colocated; routers are the pods of role router.

Queued prompt tokens: vLLM has no metric of the prompt tokens waiting for prefill, so they are
estimated as waiting requests x mean prompt tokens (over the window's finished requests, else over
the pool's lifetime: a pool flooded before its first request finished still has a mean). On a prefill
pool every running request is a prompt still being prefilled (it leaves at its first token), and
vLLM admits up to `--max-num-seqs` of them at once, sharing each step's token budget: with many
admitted, the waiting queue alone hides the backlog (make demo's prefill pods ran 32 prompts each with
none waiting while TTFT was twice its target), so half of each running prompt counts as queued
(`PREFILLING_SHARE`). The same estimate one window earlier (`waiting_before`, `running_before`, with
today's mean) is `queued_prompt_tokens_before`. The simulator counts the exact uncomputed tokens.

Prefix caching: the rates of `vllm:prefix_cache_queries_total` and `..._hits_total` (prompt tokens
looked up in the engines' prefix caches and found there), summed over a pool, give the share of prompt
tokens the pool computes (`PoolSignals.uncached_fraction`); engines without them read 0 (all computed).

The prompts' second moment E[n^2] (prefill's attention is quadratic in n) comes from the window's
increase of `vllm:request_prompt_tokens_bucket` by `signals.second_moment`, with the exact
mean from `_sum / _count`: the simulator estimates it from the same buckets the same way. The
outputs' second moment likewise from `vllm:request_generation_tokens_bucket` (decode's KV per running
sequence, `autoscale.capacity.kv_context_tokens`), and preemptions from `vllm:num_preemptions_total`
(a window that preempted teaches decode no TPOT correction).

Freshness: every query is evaluated at the snapshot's `now`. A series whose newest sample is older
than 3 scrape intervals (the interval given to the reader, else estimated per series as the window
over its sample count) is stale: the snapshot lists it in `missing`, and `decide()` holds. So do a
pool with ready pods but no engine series, routers without fresh series, an SLO the routers do not
count (no within-SLO series while requests are counted), and any query that failed. A fresh series
that reads zero is data: no traffic.

Engines report per scrape target, a pod and its `instance` (address:port), not per pod: a
`MultiPortExternal` pod's ranks are scraped each on its own port with its own engine's series, so a
rank whose port fails to scrape (its series go stale at the failed scrape) is one target fewer, and
its pool reads as partly reporting (`PoolSignals.scraped_targets` against `Shape.metrics_targets`),
as a silent pod does. Duplicate targets of one address (two jobs scraping the same port) count once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tandem.api.meta import POOL_ROLES
from tandem.signals import (
    PATH_COLOCATED,
    PATH_DISAGGREGATED,
    PathSignals,
    PoolSignals,
    PoolSize,
    Snapshot,
    TtftBreakdown,
    second_moment,
)

LABEL_PDD: Final = "tandem_dev_pddeployment"  # Prometheus' name of the pod label tandem.dev/pddeployment
LABEL_ROLE: Final = "tandem_dev_role"  # ... of tandem.dev/role
LABEL_REVISION: Final = "tandem_dev_revision"  # ... of tandem.dev/revision (a serving revision's pods)
ROUTER_ROLE: Final = "router"
PATHS: Final = (PATH_DISAGGREGATED, PATH_COLOCATED)
STALE_INTERVALS: Final = 3.0  # a series older than this many scrape intervals is stale
# A prefill pod's running requests are prompts not yet prefilled (a request leaves at its first token);
# chunked prefill shares each step's budget among them, so on average half of each is still to compute.
PREFILLING_SHARE: Final = 0.5
DEFAULT_QUANTILE: Final = 0.95  # the latency quantile without an SLO
POD_LOAD_WINDOW_SECONDS: Final = 60  # the window pod_load estimates scrape intervals over

Result = list[dict[str, Any]]  # `data.result` of an instant query: [{"metric": {...}, "value": [t, "v"]}]


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL template: `SEL` is replaced by a label selector (with its braces), `WINDOW` by the
    window as a range (`120s`), `QUANTILE` by the latency quantile."""

    name: str
    template: str
    meaning: str

    def render(self, sel: str, window: str = "", quantile: float = DEFAULT_QUANTILE) -> str:
        text = self.template.replace("WINDOW", window).replace("QUANTILE", f"{quantile:g}")
        return text.replace("SEL", sel)  # last: a label value never meets the other placeholders


# Every query a snapshot runs. Engine queries select
# {namespace="NS", tandem_dev_pddeployment="NAME", tandem_dev_role=~"prefill|decode|colocated"};
# router queries the same with tandem_dev_role="router".
ENGINE_QUERIES: Final[tuple[Query, ...]] = (
    Query(
        "engine_age",
        "max by (pod, instance, tandem_dev_role) (time() - timestamp(vllm:num_requests_running SEL))",
        "seconds since each engine scrape target's newest sample (freshness)",
    ),
    Query(
        "engine_samples",
        "min by (pod, instance, tandem_dev_role) (count_over_time(vllm:num_requests_running SEL [WINDOW]))",
        "samples per engine scrape target in the window (its scrape interval is about window / samples)",
    ),
    Query(
        "waiting",
        "sum by (tandem_dev_role) (vllm:num_requests_waiting SEL)",
        "requests waiting, summed over the pool",
    ),
    Query(
        "waiting_before",
        "sum by (tandem_dev_role) (vllm:num_requests_waiting SEL offset WINDOW)",
        "requests waiting one window earlier (the queue's growth; absent when the pool is younger)",
    ),
    Query(
        "running",
        "sum by (tandem_dev_role) (vllm:num_requests_running SEL)",
        "requests running, summed over the pool",
    ),
    Query(
        "running_before",
        "sum by (tandem_dev_role) (vllm:num_requests_running SEL offset WINDOW)",
        "requests running one window earlier (a prefill pool's prompts in progress, for the queue's growth)",
    ),
    Query(
        "kv_usage_mean",
        "avg by (tandem_dev_role) (vllm:kv_cache_usage_perc SEL)",
        "mean KV-cache usage over the pool's pods, 0..1",
    ),
    Query(
        "kv_usage_max",
        "max by (tandem_dev_role) (vllm:kv_cache_usage_perc SEL)",
        "the fullest pod's KV-cache usage, 0..1",
    ),
    Query(
        "prompt_tokens_rate",
        "sum by (tandem_dev_role) (rate(vllm:prompt_tokens_total SEL [WINDOW]))",
        "prompt tokens computed per second",
    ),
    Query(
        "generation_tokens_rate",
        "sum by (tandem_dev_role) (rate(vllm:generation_tokens_total SEL [WINDOW]))",
        "output tokens generated per second",
    ),
    Query(
        "request_rate",
        "sum by (tandem_dev_role) (rate(vllm:request_success_total SEL [WINDOW]))",
        "requests finished per second (every finished_reason, abort included)",
    ),
    Query(
        "mean_prompt_tokens",
        "sum by (tandem_dev_role) (increase(vllm:request_prompt_tokens_sum SEL [WINDOW]))"
        " / sum by (tandem_dev_role) (increase(vllm:request_prompt_tokens_count SEL [WINDOW]))",
        "mean prompt length of the window's finished requests (NaN without any)",
    ),
    Query(
        "mean_output_tokens",
        "sum by (tandem_dev_role) (increase(vllm:request_generation_tokens_sum SEL [WINDOW]))"
        " / sum by (tandem_dev_role) (increase(vllm:request_generation_tokens_count SEL [WINDOW]))",
        "mean output length of the window's finished requests (NaN without any)",
    ),
    Query(
        "prompt_tokens_buckets",
        "sum by (tandem_dev_role, le) (increase(vllm:request_prompt_tokens_bucket SEL [WINDOW]))",
        "the window's finished prompts by length bucket (cumulative, by le): their second moment",
    ),
    Query(
        "output_tokens_buckets",
        "sum by (tandem_dev_role, le) (increase(vllm:request_generation_tokens_bucket SEL [WINDOW]))",
        "the window's finished outputs by length bucket (cumulative, by le): their second moment",
    ),
    Query(
        "preemptions_rate",
        "sum by (tandem_dev_role) (rate(vllm:num_preemptions_total SEL [WINDOW]))",
        "sequences preempted per second (the KV cache ran out; 0 when none)",
    ),
    Query(
        "mean_prompt_tokens_lifetime",
        "sum by (tandem_dev_role) (vllm:request_prompt_tokens_sum SEL)"
        " / sum by (tandem_dev_role) (vllm:request_prompt_tokens_count SEL)",
        "mean prompt length since the pods started, for queued prompt tokens when the window has none",
    ),
    Query(
        "prefix_cache_queries_rate",
        "sum by (tandem_dev_role) (rate(vllm:prefix_cache_queries_total SEL [WINDOW]))",
        "prompt tokens looked up in the prefix caches per second",
    ),
    Query(
        "prefix_cache_hits_rate",
        "sum by (tandem_dev_role) (rate(vllm:prefix_cache_hits_total SEL [WINDOW]))",
        "prompt tokens found in the prefix caches per second (not computed)",
    ),
    Query(
        "local_prompt_tokens_rate",
        "sum by (tandem_dev_role, source) (rate(vllm:prompt_tokens_by_source_total SEL [WINDOW]))",
        "prompt tokens per second by source; source local_compute: computed by the pool's own engines "
        "(decode: its local prefills, and one recomputed token per pulled request)",
    ),
    Query(
        "queue_seconds_mean",
        "sum by (tandem_dev_role) (rate(vllm:request_queue_time_seconds_sum SEL [WINDOW]))"
        " / sum by (tandem_dev_role) (rate(vllm:request_queue_time_seconds_count SEL [WINDOW]))",
        "mean time a request waited in the engines' queue (the TTFT miss's attribution; NaN without any)",
    ),
    Query(
        "kv_read_seconds_mean",
        "sum by (tandem_dev_role) (rate(vllm:nixl_xfer_time_seconds_sum SEL [WINDOW]))"
        " / sum by (tandem_dev_role) (rate(vllm:nixl_xfer_time_seconds_count SEL [WINDOW]))",
        "mean duration of one KV read, on the engines that read (decode; absent without NIXL metrics)",
    ),
    Query(
        "engine_ttft_seconds_mean",
        "sum by (tandem_dev_role) (rate(vllm:time_to_first_token_seconds_sum SEL [WINDOW]))"
        " / sum by (tandem_dev_role) (rate(vllm:time_to_first_token_seconds_count SEL [WINDOW]))",
        "mean TTFT as the engines time it (on decode: the KV read, the wait for room and the first step,"
        " in the same scrape as the KV read's histogram)",
    ),
)

# Latencies per bucket, at the SLO's quantile over every path, for status.slo only (what people read,
# not what the autoscaler decides by): a failed one is left out of status, never "metrics missing".
# Query name -> the router histogram and its bucket label.
BUCKET_LATENCIES: Final[dict[str, tuple[str, str]]] = {
    "ttft_by_input_length": ("tandem_router_ttft_by_input_length_seconds", "input_length"),
    "tpot_by_output_length": ("tandem_router_tpot_by_output_length_seconds", "output_length"),
    "tpot_by_concurrency": ("tandem_router_tpot_by_concurrency_seconds", "concurrency"),
    "itl_by_output_length": ("tandem_router_itl_by_output_length_seconds", "output_length"),
    "itl_by_concurrency": ("tandem_router_itl_by_concurrency_seconds", "concurrency"),
    # P/D requests by where their prompt was prefilled (spec.router.disaggregation), every mode.
    "ttft_by_prefill": ("tandem_router_disaggregation_ttft_seconds", "prefill"),
    "tpot_by_prefill": ("tandem_router_disaggregation_tpot_seconds", "prefill"),
}

ROUTER_QUERIES: Final[tuple[Query, ...]] = (
    Query(
        "router_age",
        "max by (pod) (time() - timestamp(tandem_router_in_flight_requests SEL))",
        "seconds since each router pod's newest sample (freshness)",
    ),
    Query(
        "router_samples",
        "min by (pod) (count_over_time(tandem_router_in_flight_requests SEL [WINDOW]))",
        "samples per router pod in the window",
    ),
    Query(
        "path_request_rate",
        "sum by (path) (rate(tandem_router_requests_total SEL [WINDOW]))",
        "client requests finished per second, any status (refusals for want of pods included)",
    ),
    Query(
        "path_within_slo_rate",
        "sum by (path) (rate(tandem_router_requests_within_slo_total SEL [WINDOW]))",
        "client requests per second that met both SLO targets",
    ),
    Query(
        "path_ttft",
        "histogram_quantile(QUANTILE,"
        " sum by (path, le) (rate(tandem_router_time_to_first_token_seconds_bucket SEL [WINDOW])))",
        "client-seen TTFT at the SLO's attainment quantile",
    ),
    Query(
        "path_tpot",
        "histogram_quantile(QUANTILE,"
        " sum by (path, le) (rate(tandem_router_time_per_output_token_seconds_bucket SEL [WINDOW])))",
        "client-seen TPOT at the SLO's attainment quantile",
    ),
    Query(
        "path_ttft_mean",
        "sum by (path) (rate(tandem_router_time_to_first_token_seconds_sum SEL [WINDOW]))"
        " / sum by (path) (rate(tandem_router_time_to_first_token_seconds_count SEL [WINDOW]))",
        "client-seen mean TTFT (the whole the TTFT breakdown's parts add up to)",
    ),
    Query(
        "prefill_leg_mean",
        "sum by (outcome) (rate(tandem_router_prefill_leg_seconds_sum SEL [WINDOW]))"
        " / sum by (outcome) (rate(tandem_router_prefill_leg_seconds_count SEL [WINDOW]))",
        "mean prefill leg by outcome (ok: the prefill pod's queue and compute as the router saw them)",
    ),
    Query(
        "prefill_side_rate",
        "sum by (prefill) (rate(tandem_router_disaggregation_requests_total SEL [WINDOW]))",
        "P/D requests finished per second by where their prompt was prefilled (local: on the decode pod)",
    ),
    Query(
        "decode_first_token_mean",
        "sum by (path) (rate(tandem_router_decode_leg_first_token_seconds_sum SEL [WINDOW]))"
        " / sum by (path) (rate(tandem_router_decode_leg_first_token_seconds_count SEL [WINDOW]))",
        "mean time from sending the decode leg to its first token (decode's queue, the KV read, a step)",
    ),
    *(
        Query(
            name,
            f"histogram_quantile(QUANTILE, sum by ({label}, le) (rate({metric}_bucket SEL [WINDOW])))",
            f"{name.split('_')[0].upper()} at the SLO's quantile by {label} bucket, every path (status only)",
        )
        for name, (metric, label) in BUCKET_LATENCIES.items()
    ),
)

# pod_load selects {namespace="NS", pod=~"a|b"}. tandem:kv_held_blocks is the sim engine's
# (engine/metrics.py): prefill KV blocks held for decode pods that have not pulled them yet. Real
# vLLM exports no such metric. There, a prefill pod with no running or waiting request that still
# uses KV blocks holds them for a pull (vLLM V1 counts cached but unreferenced blocks as free, and
# the NIXL connector delays freeing a remote-decode request's blocks until they are read or the
# lease ends), so held blocks are estimated as kv_cache_usage_perc x num_gpu_blocks (a label of
# vllm:cache_config_info). Without either, held KV is unknown (NaN) and the drain of a prefill pod
# ends at the drain timeout. A pod reports per scrape target (a MultiPortExternal pod's ranks each on
# their own port): `pod_targets` counts the targets (distinct `instance`s) whose series are fresh, and a
# pod with fewer than its caller expects has no known load, since the sums would cover only the ranks
# that still report and a silent rank's requests would read as none.
POD_QUERIES: Final[tuple[Query, ...]] = (
    Query("pod_age", "max by (pod) (time() - timestamp(vllm:num_requests_running SEL))", "freshness"),
    Query(
        "pod_targets",
        "count by (pod) (count by (pod, instance) (vllm:num_requests_running SEL))",
        "scrape targets reporting",
    ),
    Query("pod_samples", "min by (pod) (count_over_time(vllm:num_requests_running SEL [WINDOW]))", "samples"),
    Query("pod_running", "sum by (pod) (vllm:num_requests_running SEL)", "requests running on the pod"),
    Query("pod_waiting", "sum by (pod) (vllm:num_requests_waiting SEL)", "requests waiting on the pod"),
    Query(
        "pod_kv_held_blocks", "sum by (pod) (tandem:kv_held_blocks SEL)", "KV blocks held for a pull (sim)"
    ),
    Query("pod_kv_usage", "max by (pod) (vllm:kv_cache_usage_perc SEL)", "KV-cache usage, 0..1"),
    Query("pod_cache_config", "vllm:cache_config_info SEL", "num_gpu_blocks (a label)"),
)

# The KV transport (`tandem.metrics.kv_transport`), over the engines' NIXL metrics (reference 3.4),
# which vLLM records on the engine that READs (decode): per successful transfer its duration and its
# bytes, and a counter of failed transfers. Engine selector (every pool role; prefill records none).
# Answers are sums over the window (increase(), so extrapolated and fractional) and by `le` for the
# two histograms; `kv_series` counts the pods that export them at all (none: no NIXL metrics).
KV_QUERIES: Final[tuple[Query, ...]] = (
    Query("kv_series", "count(vllm:nixl_xfer_time_seconds_count SEL)", "engine pods exporting NIXL metrics"),
    Query(
        "kv_transfers",
        "sum(increase(vllm:nixl_xfer_time_seconds_count SEL [WINDOW]))",
        "successful KV transfers in the window",
    ),
    Query(
        "kv_failed",
        "sum(increase(vllm:nixl_num_failed_transfers_total SEL [WINDOW]))",
        "failed KV transfers in the window",
    ),
    Query(
        "kv_seconds",
        "sum(increase(vllm:nixl_xfer_time_seconds_sum SEL [WINDOW]))",
        "seconds spent in successful KV transfers",
    ),
    Query(
        "kv_bytes",
        "sum(increase(vllm:nixl_bytes_transferred_sum SEL [WINDOW]))",
        "bytes moved by successful KV transfers",
    ),
    Query(
        "kv_seconds_buckets",
        "sum by (le) (increase(vllm:nixl_xfer_time_seconds_bucket SEL [WINDOW]))",
        "transfers per duration bucket (cumulative)",
    ),
    Query(
        "kv_bytes_buckets",
        "sum by (le) (increase(vllm:nixl_bytes_transferred_bucket SEL [WINDOW]))",
        "transfers per size bucket (cumulative)",
    ),
)

# The engine queries answered by role (the rest are about freshness, or the TTFT breakdown's).
_BREAKDOWN_ENGINE: Final = ("queue_seconds_mean", "kv_read_seconds_mean", "engine_ttft_seconds_mean")
_POOL_SIGNALS: Final = tuple(
    q.name
    for q in ENGINE_QUERIES
    if q.name
    not in (
        "engine_age",
        "engine_samples",
        "prompt_tokens_buckets",
        "output_tokens_buckets",
        "local_prompt_tokens_rate",
        *_BREAKDOWN_ENGINE,
    )
)

QUERIES: Final[dict[str, Query]] = {
    q.name: q for q in (*ENGINE_QUERIES, *ROUTER_QUERIES, *POD_QUERIES, *KV_QUERIES)
}


# --- building -------------------------------------------------------------------------------------


def _quote(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(**matchers: str) -> str:
    """`{a="x",b=~"y"}`: a key ending in `__re` is a regex matcher on the key without it."""
    parts = []
    for key, value in matchers.items():
        if key.endswith("__re"):
            parts.append(f"{key[:-4]}=~{_quote(value)}")
        else:
            parts.append(f"{key}={_quote(value)}")
    return "{" + ",".join(parts) + "}"


def duration(seconds: float) -> str:
    """A PromQL range, whole seconds (at least 1)."""
    return f"{max(1, round(seconds))}s"


def any_of(values: Iterable[str]) -> str:
    """A regex that matches exactly one of `values`."""
    return "|".join(re.escape(v) for v in values)


def engine_selector(namespace: str, pdd_name: str) -> str:
    return selector(namespace=namespace, **{LABEL_PDD: pdd_name, f"{LABEL_ROLE}__re": any_of(POOL_ROLES)})


def router_selector(namespace: str, pdd_name: str) -> str:
    return selector(namespace=namespace, **{LABEL_PDD: pdd_name, LABEL_ROLE: ROUTER_ROLE})


def quantile_of(attainment_percent: float | None) -> float:
    """The latency quantile an SLO is judged at (95 % attainment -> 0.95)."""
    if attainment_percent is None:
        return DEFAULT_QUANTILE
    return min(1.0, max(0.0, attainment_percent / 100.0))


def snapshot_queries(namespace: str, pdd_name: str, window_seconds: float, quantile: float) -> dict[str, str]:
    """Query name -> PromQL, for one PDDeployment's snapshot."""
    window = duration(window_seconds)
    engines, routers = engine_selector(namespace, pdd_name), router_selector(namespace, pdd_name)
    out = {q.name: q.render(engines, window, quantile) for q in ENGINE_QUERIES}
    out |= {q.name: q.render(routers, window, quantile) for q in ROUTER_QUERIES}
    return out


def kv_transport_queries(
    namespace: str, pdd_name: str, window_seconds: float, revision: str | None = None
) -> dict[str, str]:
    """Query name -> PromQL, for one PDDeployment's KV transport over the window; with `revision`,
    only its pods' (`tandem_dev_revision`, from the pod label `tandem.dev/revision`; "" selects the
    legacy revision's pods, which have no such label)."""
    sel, window = engine_selector(namespace, pdd_name), duration(window_seconds)
    if revision is not None:
        sel = sel[:-1] + f",{LABEL_REVISION}={_quote(revision)}}}"
    return {q.name: q.render(sel, window) for q in KV_QUERIES}


def pod_load_queries(namespace: str, pods: Sequence[str]) -> dict[str, str]:
    """Query name -> PromQL, for the loads of some pods of one namespace."""
    sel = selector(namespace=namespace, pod__re=any_of(pods))
    return {q.name: q.render(sel, duration(POD_LOAD_WINDOW_SECONDS)) for q in POD_QUERIES}


# --- parsing --------------------------------------------------------------------------------------


def _value(sample: Mapping[str, Any]) -> float:
    try:
        return float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return math.nan


def by_label(result: Result, label: str) -> dict[str, float]:
    """Label value -> sample value (a later duplicate wins; samples without the label are skipped)."""
    out: dict[str, float] = {}
    for sample in result:
        key = (sample.get("metric") or {}).get(label)
        if isinstance(key, str):
            out[key] = _value(sample)
    return out


def buckets_by_role(result: Result) -> dict[str, tuple[list[float], list[float]]]:
    """Role -> (finite upper bounds, counts per bucket, not cumulative, the last one `+Inf`) from a
    `sum by (tandem_dev_role, le)` over a histogram's `_bucket` series."""
    cumulative: dict[str, dict[float, float]] = {}
    for sample in result:
        labels = sample.get("metric") or {}
        role, le = labels.get(LABEL_ROLE), labels.get("le")
        if not isinstance(role, str) or not isinstance(le, str):
            continue
        try:
            bound = float(le)
        except ValueError:
            continue
        value = _value(sample)
        cumulative.setdefault(role, {})[bound] = value if math.isfinite(value) else 0.0
    out: dict[str, tuple[list[float], list[float]]] = {}
    for role, by_bound in cumulative.items():
        bounds = sorted(by_bound)
        counts, below = [], 0.0
        for bound in bounds:
            counts.append(max(0.0, by_bound[bound] - below))
            below = max(below, by_bound[bound])
        if not bounds or not math.isinf(bounds[-1]):
            counts.append(0.0)  # no +Inf series: nothing above the last bound
        else:
            bounds.pop()
        out[role] = (bounds, counts)
    return out


def _finite(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else 0.0


def _latency(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True, slots=True)
class _Freshness:
    fresh: dict[str, str]  # pod (or pod and instance) -> role (or "" for routers), of fresh series
    stale: list[str]  # messages


def _target(labels: Mapping[str, Any]) -> str | None:
    """`pod` or, where the series has an `instance` (address:port), `pod (instance)`: one scrape target."""
    pod, instance = labels.get("pod"), labels.get("instance")
    if not isinstance(pod, str):
        return None
    return f"{pod} ({instance})" if isinstance(instance, str) and instance else pod


def _freshness(
    age: Result,
    samples: Result,
    role_label: str | None,
    window_seconds: float,
    scrape_interval: float | None,
    query: str,
) -> _Freshness:
    """Fresh and stale series of `age` by their target (`_target`: the answers of a `by (pod)` query
    carry no instance, so they are per pod)."""
    counts: dict[str, float] = {}
    for sample in samples:
        key = _target(sample.get("metric") or {})
        if key is not None:
            counts[key] = _value(sample)
    fresh: dict[str, str] = {}
    stale: list[str] = []
    for sample in age:
        labels = sample.get("metric") or {}
        key = _target(labels)
        if key is None:
            continue
        seconds = _value(sample)
        count = counts.get(key, 0.0)
        interval = scrape_interval or (window_seconds / count if count >= 1 else window_seconds)
        limit = STALE_INTERVALS * interval
        if math.isfinite(seconds) and seconds <= limit:
            fresh[key] = str(labels.get(role_label, "")) if role_label else ""
        else:
            stale.append(
                f"{query}: pod {key} last scraped {seconds:.0f}s ago, more than {STALE_INTERVALS:g}"
                f" scrape intervals (~{interval:.1f}s)"
            )
    return _Freshness(fresh, stale)


def failed_queries(errors: Mapping[str, str]) -> list[str]:
    """One line per distinct error, naming the queries it hit (an unreachable Prometheus fails them
    all alike: say so once)."""
    by_error: dict[str, list[str]] = {}
    for name, error in sorted(errors.items()):
        by_error.setdefault(error, []).append(name)
    lines = []
    for error, names in sorted(by_error.items()):
        if len(names) == 1:
            lines.append(f"{names[0]}: {error}")
        else:
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            lines.append(f"{error} ({len(names)} queries: {shown})")
    return lines


def build_snapshot(
    results: Mapping[str, Result],
    errors: Mapping[str, str],
    *,
    now: float,
    window_seconds: float,
    slo_set: bool,
    sizes: Mapping[str, PoolSize] | None = None,
    scrape_interval: float | None = None,
) -> Snapshot:
    """A `Snapshot` from the answers of `snapshot_queries` (by name) and the queries that failed."""
    missing = failed_queries({name: error for name, error in errors.items() if name not in BUCKET_LATENCIES})

    def get(name: str) -> Result:
        return results.get(name) or []

    engines = _freshness(
        get("engine_age"), get("engine_samples"), LABEL_ROLE, window_seconds, scrape_interval, "engine_age"
    )
    routers = _freshness(
        get("router_age"), get("router_samples"), None, window_seconds, scrape_interval, "router_age"
    )
    missing += engines.stale + routers.stale
    checked = {"engine_age", "engine_samples"}.isdisjoint(errors)
    if checked:
        for role, size in (sizes or {}).items():
            if size.ready > 0 and role not in engines.fresh.values():
                missing.append(f"engine_age: {role} has {size.ready} ready pods but no fresh engine metrics")
    if {"router_age", "router_samples"}.isdisjoint(errors) and not routers.fresh:
        missing.append("router_age: no fresh router metrics (tandem_router_*) for this PDDeployment")

    per_role = {name: by_label(get(name), LABEL_ROLE) for name in _POOL_SIGNALS}
    prompt_buckets = buckets_by_role(get("prompt_tokens_buckets"))
    output_buckets = buckets_by_role(get("output_tokens_buckets"))
    computed_locally = by_label(
        [
            s
            for s in get("local_prompt_tokens_rate")
            if (s.get("metric") or {}).get("source") == "local_compute"
        ],
        LABEL_ROLE,
    )
    pools: dict[str, PoolSignals] = {}
    for role in POOL_ROLES:
        value = {name: _finite(per_role[name].get(role)) for name in _POOL_SIGNALS}
        queue_mean = value["mean_prompt_tokens"] or value["mean_prompt_tokens_lifetime"]
        before = per_role["waiting_before"].get(role)
        queued = value["waiting"]
        if role == "prefill":  # its running requests are prompts still being prefilled: half done
            queued += PREFILLING_SHARE * value["running"]
            if before is not None:
                before = _finite(before) + PREFILLING_SHARE * _finite(per_role["running_before"].get(role))
        pools[role] = PoolSignals(
            scraped_targets=sum(1 for r in engines.fresh.values() if r == role),
            waiting_requests=value["waiting"],
            running_requests=value["running"],
            kv_usage_mean=value["kv_usage_mean"],
            kv_usage_max=value["kv_usage_max"],
            prompt_tokens_rate=value["prompt_tokens_rate"],
            generation_tokens_rate=value["generation_tokens_rate"],
            request_rate=value["request_rate"],
            queued_prompt_tokens=queued * queue_mean,
            queued_prompt_tokens_before=_finite(before) * queue_mean if before is not None else None,
            mean_prompt_tokens=value["mean_prompt_tokens"],
            prompt_tokens_second_moment=second_moment(
                *prompt_buckets.get(role, ([], [])), value["mean_prompt_tokens"]
            ),
            mean_output_tokens=value["mean_output_tokens"],
            output_tokens_second_moment=second_moment(
                *output_buckets.get(role, ([], [])), value["mean_output_tokens"]
            ),
            preemptions_rate=value["preemptions_rate"],
            prefix_cache_queries_rate=value["prefix_cache_queries_rate"],
            prefix_cache_hits_rate=value["prefix_cache_hits_rate"],
            local_prompt_tokens_rate=_finite(computed_locally.get(role)),
        )

    requests = by_label(get("path_request_rate"), "path")
    within = by_label(get("path_within_slo_rate"), "path")
    ttft = by_label(get("path_ttft"), "path")
    tpot = by_label(get("path_tpot"), "path")
    sides = by_label(get("prefill_side_rate"), "prefill")
    counted = slo_set and "path_within_slo_rate" not in errors
    if counted and routers.fresh and not within and any(_finite(v) > 0 for v in requests.values()):
        missing.append(
            "path_within_slo_rate: the routers count requests but no tandem_router_requests_within_slo_total"
            " (have they seen spec.slo yet?)"
        )
    # rate() extrapolates each counter to the window's edges on its own, so the within-SLO rate can
    # come out a hair above the request rate: it is capped there.
    paths = {
        path: PathSignals(
            request_rate=_finite(requests.get(path)),
            within_slo_rate=min(_finite(within.get(path)), _finite(requests.get(path))) if slo_set else 0.0,
            ttft_seconds=_latency(ttft.get(path)),
            tpot_seconds=_latency(tpot.get(path)),
            ttft_breakdown=ttft_breakdown(results) if path == PATH_DISAGGREGATED else None,
            local_prefill_rate=_finite(sides.get("local")) if path == PATH_DISAGGREGATED else 0.0,
            remote_prefill_rate=_finite(sides.get("remote")) if path == PATH_DISAGGREGATED else 0.0,
        )
        for path in sorted(set(PATHS) | set(requests))
    }
    return Snapshot(
        observed_at=now,
        window_seconds=window_seconds,
        sizes=dict(sizes or {}),
        pools=pools,
        paths=paths,
        missing=tuple(missing),
        latency_by_bucket={
            name: found
            for name, (_, label) in BUCKET_LATENCIES.items()
            if (found := {k: v for k, v in by_label(get(name), label).items() if math.isfinite(v)})
        },
    )


def ttft_breakdown(results: Mapping[str, Result]) -> TtftBreakdown | None:
    """The P/D path's TTFT parts over the window (`autoscale.attribution`): None unless the routers
    timed the TTFT, successful prefill legs and decode legs to their first token; the engines' prefill
    queue, KV read and decode TTFT means are optional (None: not exported, or no request in the window).
    The share of P/D requests prefilled on their decode pod (`local_share`) is the routers' count by
    side; a window of local prefills only has no prefill leg (taken as 0: it weighs nothing)."""
    ttft = _latency(by_label(results.get("path_ttft_mean") or [], "path").get(PATH_DISAGGREGATED))
    leg = _latency(by_label(results.get("prefill_leg_mean") or [], "outcome").get("ok"))
    first = _latency(by_label(results.get("decode_first_token_mean") or [], "path").get(PATH_DISAGGREGATED))
    sides = by_label(results.get("prefill_side_rate") or [], "prefill")
    local, remote = _finite(sides.get("local")), _finite(sides.get("remote"))
    share = local / (local + remote) if local + remote > 0 else 0.0
    if leg is None and share >= 1.0:
        leg = 0.0
    if ttft is None or leg is None or first is None:
        return None
    queue = _latency(by_label(results.get("queue_seconds_mean") or [], LABEL_ROLE).get("prefill"))
    kv = _latency(by_label(results.get("kv_read_seconds_mean") or [], LABEL_ROLE).get("decode"))
    engine_first = _latency(by_label(results.get("engine_ttft_seconds_mean") or [], LABEL_ROLE).get("decode"))
    return TtftBreakdown(
        ttft,
        leg,
        first,
        prefill_queue=queue,
        kv_transfer=kv,
        decode_engine_first_token=engine_first,
        local_share=share,
    )


@dataclass(frozen=True, slots=True)
class PodLoad:
    """One engine pod's work in progress, for drain-aware scale-down (`controller.drain`)."""

    running: float  # vllm:num_requests_running
    waiting: float  # vllm:num_requests_waiting
    kv_blocks_held: float  # prefill KV awaiting a pull: exact on the sim, estimated on vLLM, NaN unknown


def build_pod_loads(
    results: Mapping[str, Result],
    pods: Sequence[str],
    scrape_interval: float | None = None,
    targets: Mapping[str, int] | None = None,
) -> dict[str, PodLoad]:
    """Loads of the pods with fresh engine series from every scrape target they should have
    (`targets`: pod -> targets, 1 for a pod not named); a pod left out has no known load."""
    fresh = _freshness(
        results.get("pod_age") or [],
        results.get("pod_samples") or [],
        None,
        POD_LOAD_WINDOW_SECONDS,
        scrape_interval,
        "pod_age",
    ).fresh
    reporting = by_label(results.get("pod_targets") or [], "pod")
    running = by_label(results.get("pod_running") or [], "pod")
    waiting = by_label(results.get("pod_waiting") or [], "pod")
    held = by_label(results.get("pod_kv_held_blocks") or [], "pod")
    usage = by_label(results.get("pod_kv_usage") or [], "pod")
    blocks: dict[str, float] = {}
    for sample in results.get("pod_cache_config") or []:
        labels = sample.get("metric") or {}
        try:
            blocks[str(labels["pod"])] = float(labels["num_gpu_blocks"])
        except (KeyError, TypeError, ValueError):
            continue
    loads: dict[str, PodLoad] = {}
    for pod in pods:
        if pod not in fresh or pod not in running:
            continue
        if reporting.get(pod, 0.0) < (targets or {}).get(pod, 1):
            continue
        if pod in held:
            kv = held[pod]
        elif pod in usage and pod in blocks:
            kv = usage[pod] * blocks[pod]
        else:
            kv = math.nan
        loads[pod] = PodLoad(
            running=_finite(running[pod]), waiting=_finite(waiting.get(pod)), kv_blocks_held=kv
        )
    return loads
