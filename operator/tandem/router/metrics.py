"""The router's Prometheus metrics: what the user sees, per path, and what each leg costs.

All names start with `tandem_router_`. Latencies are measured at the router, so they include the
hop, both legs and any retry: the numbers the autoscaler and the rollout analysis judge by.
Each `RouterMetrics` owns its registry, so several routers can live in one process (tests).

The histogram buckets live in the pure module `tandem.routing.buckets`, shared with the cluster
simulator.

`tandem_router_requests_within_slo_total{path}` exists only while the router knows an SLO
(`spec.slo` or `--slo-ttft-ms/--slo-tpot-ms`): without one it has no series at all, so a query for
attainment finds no data instead of a false 0 %.

The checklist's split (docs/observability.md): TTFT by input-length bucket and TPOT by output-length
bucket, per path, tenant and model, recorded once per successful request from the engines' token
counts (`usage`). Their label values are bounded: length buckets by the configured bounds, tenants
as admission labels them (a configured tenant, `default` or `other`; at most `MAX_TENANT_LABELS`),
models by the first `MAX_LABEL_VALUES` served names and then `other`. TPOT and ITL are also split by
output length and by concurrency (the requests in flight at this router on the request's path when it
arrived, itself included), per path only. A request's inter-token gaps are counted per bucket while it
streams (`GapCounts`) and added to the ITL histograms once it ends (`BatchedHistogram`): its output
length is known only then.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Iterator, Sequence
from itertools import accumulate, pairwise
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from tandem.router.slo import SloTargets
from tandem.routing.buckets import (
    BUCKETED_ITL_BUCKETS,
    BUCKETED_TPOT_BUCKETS,
    BUCKETED_TTFT_BUCKETS,
    DEFAULT_CONCURRENCY_BOUNDS,
    DEFAULT_INPUT_LENGTH_BOUNDS,
    DEFAULT_OUTPUT_LENGTH_BOUNDS,
    E2E_BUCKETS,
    ITL_BUCKETS,
    LEG_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
)
from tandem.routing.paths import PATHS
from tandem.runtime import running_tasks

STATUS_CLASSES: Final = ("2xx", "4xx", "5xx")  # the `code` label of tandem_router_requests_total
OTHER: Final = "other"  # the label value of every tenant or model beyond the bound
MAX_LABEL_VALUES: Final = 16  # distinct models per router
MAX_TENANT_LABELS: Final = 66  # spec.router.tenants (at most 64), `default` and `other`


def length_labels(bounds: Sequence[int]) -> tuple[str, ...]:
    """Label values of the buckets `bounds` cut: (1024, 4096) -> 0-1024, 1024-4096, 4096+."""
    edges = [0, *bounds]
    return (*(f"{lo}-{hi}" for lo, hi in pairwise(edges)), f"{edges[-1]}+")


def check_length_bounds(bounds: Sequence[int]) -> tuple[int, ...]:
    """The bounds, if positive and strictly increasing; raises ValueError naming what is wrong."""
    out = tuple(bounds)
    if not out:
        raise ValueError("length bucket bounds must not be empty")
    if any(b <= 0 for b in out):
        raise ValueError(f"length bucket bounds must be positive: {list(out)}")
    if any(b >= c for b, c in pairwise(out)):
        raise ValueError(f"length bucket bounds must be strictly increasing: {list(out)}")
    return out


class LengthBuckets:
    """Token count -> bucket label, for bounds `b1 < b2 < ...`: [0, b1), [b1, b2), ..., [bn, inf)."""

    __slots__ = ("bounds", "labels")

    def __init__(self, bounds: Sequence[int]) -> None:
        self.bounds = check_length_bounds(bounds)
        self.labels = length_labels(self.bounds)

    def label(self, tokens: int) -> str:
        return self.labels[bisect_right(self.bounds, tokens)]


class LabelBound:
    """Keeps a label's values bounded: the configured values (or the first `cap` seen), then `other`."""

    __slots__ = ("cap", "configured", "seen")

    def __init__(self, cap: int = MAX_LABEL_VALUES) -> None:
        self.cap = cap
        self.configured: frozenset[str] | None = None
        self.seen: set[str] = set()

    def configure(self, values: Iterable[str] | None) -> None:
        self.configured = None if values is None else frozenset(values)

    def __call__(self, value: str | None) -> str:
        if not value:
            return OTHER
        if self.configured is not None:
            return value if value in self.configured else OTHER
        if value in self.seen:
            return value
        if len(self.seen) < self.cap:
            self.seen.add(value)
            return value
        return OTHER


class GapCounts:
    """One request's inter-token gaps, counted per bucket of `BUCKETED_ITL_BUCKETS` as they come (a
    bisection and an increment per read that carried tokens) and summed."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETED_ITL_BUCKETS) + 1)  # the last: above the last bound (+Inf)
        self.total = 0.0

    def add(self, gap: float) -> None:
        self.counts[bisect_left(BUCKETED_ITL_BUCKETS, gap)] += 1  # a bound is its bucket's upper edge
        self.total += gap


class BatchedHistogram:
    """A Prometheus histogram fed a request's observations at once, already counted per bucket
    (`GapCounts`): prometheus_client's `Histogram` takes one value at a time, which would mean keeping
    every gap of a stream until its end. Exposed like any histogram (`_bucket{le}`, `_count`, `_sum`;
    no `_created`); the router is one event loop, so no lock."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        bounds: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.les = [floatToGoString(b) for b in bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self.series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}  # counts, [sum]
        registry.register(self)

    def add(self, labels: tuple[str, ...], gaps: GapCounts) -> None:
        found = self.series.get(labels)
        if found is None:
            found = self.series[labels] = ([0] * len(self.les), [0.0])
        counts, total = found
        for i, count in enumerate(gaps.counts):
            if count:
                counts[i] += count
        total[0] += gaps.total

    def clear(self) -> None:
        self.series.clear()

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, (counts, total) in sorted(self.series.items()):
            family.add_metric(list(labels), list(zip(self.les, accumulate(counts), strict=True)), total[0])
        yield family


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            "tandem_router_time_to_first_token_seconds",
            "Client-visible time from request arrival to the first generated token.",
            ["path"], buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            "tandem_router_inter_token_latency_seconds",
            "Gap between successive engine reads that carried tokens (one per token for a paced engine).",
            ["path"], buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = Histogram(
            "tandem_router_time_per_output_token_seconds",
            "Per request: (end - first token) / (output tokens - 1).",
            ["path"], buckets=TPOT_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "tandem_router_e2e_request_latency_seconds",
            "Client-visible time from request arrival to the end of the answer.",
            ["path"], buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.prefill_leg = Histogram(
            "tandem_router_prefill_leg_seconds",
            "Duration of one prefill leg (request to P until its answer), successful or not.",
            ["outcome"], buckets=LEG_BUCKETS, registry=r,
        )  # fmt: skip
        self.decode_leg = Histogram(
            "tandem_router_decode_leg_seconds",
            "Duration of one decode (or colocated) leg, from sending until the last byte.",
            ["path", "outcome"], buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "tandem_router_requests_total",
            "Client requests finished, by path and HTTP status class sent to the client.",
            ["path", "code"], registry=r,
        )  # fmt: skip
        self.stood_in = Counter(
            "tandem_router_path_stood_in_total",
            "Client requests meant for a path (by the gray split or the serving mode) that the other path"
            " served because the one meant had no ready pods, by the path meant. A rollout counts them as"
            " its target arm's failures: an arm that lost its pods fails its share at any load.",
            ["wanted"], registry=r,
        )  # fmt: skip
        self.revision_requests = Counter(
            "tandem_router_revision_requests_total",
            "P/D requests finished, by the serving revision of the prefill/decode pair (legacy: the"
            " first revision, whose pods carry no revision label) and HTTP status class.",
            ["revision", "code"], registry=r,
        )  # fmt: skip
        self.revision_stood_in = Counter(
            "tandem_router_revision_stood_in_total",
            "P/D requests the weights meant for a serving revision (by `wanted`) that another revision's"
            " pair served because the one meant had no ready pair. A revision rollout counts them as the"
            " meant revision's failures.",
            ["wanted"], registry=r,
        )  # fmt: skip
        self.revision_within_slo = Counter(
            "tandem_router_revision_requests_within_slo_total",
            "P/D requests that succeeded within both SLO targets, by serving revision of the pair.",
            ["revision"], registry=r,
        )  # fmt: skip
        self.revision_ttft = Histogram(
            "tandem_router_revision_time_to_first_token_seconds",
            "TTFT of successful P/D requests, by the serving revision of the pair (a revision rollout's"
            " analysis compares the new revision's quantile with the old one's).",
            ["revision"], buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.revision_tpot = Histogram(
            "tandem_router_revision_time_per_output_token_seconds",
            "TPOT of successful P/D requests, by the serving revision of the pair.",
            ["revision"], buckets=TPOT_BUCKETS, registry=r,
        )  # fmt: skip
        self.within_slo = Counter(
            "tandem_router_requests_within_slo_total",
            "Client requests that succeeded within both SLO targets (TTFT, and TPOT when more than one"
            " output token), by path; only while an SLO is set.",
            ["path"], registry=r,
        )  # fmt: skip
        self.slo_target = Gauge(
            "tandem_router_slo_target_seconds",
            "The SLO the router judges requests by (target: ttft, tpot); absent without an SLO.",
            ["target"], registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "tandem_router_retries_total",
            "Legs tried again: leg is prefill (another P) or decode (re-prefill elsewhere).",
            ["leg", "reason"], registry=r,
        )  # fmt: skip
        self.failures = Counter(
            "tandem_router_failures_total",
            "Failed legs by role and reason (connect, timeout, http_5xx, http_4xx, stream_error, ...).",
            ["role", "reason"], registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            "tandem_router_rejected_requests_total",
            "Requests answered by the router itself without an engine (bad input, no pods).",
            ["reason"], registry=r,
        )  # fmt: skip
        self.in_flight = Gauge(
            "tandem_router_in_flight_requests", "Client requests being served, by path.",
            ["path"], registry=r,
        )  # fmt: skip
        self.upstream_in_flight = Gauge(
            "tandem_router_upstream_in_flight_requests", "Legs outstanding at engines, by role.",
            ["role"], registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "tandem_router_prompt_tokens_total", "Prompt tokens of served requests.",
            ["path"], registry=r,
        )  # fmt: skip
        self.generation_tokens = Counter(
            "tandem_router_generation_tokens_total", "Output tokens streamed or returned to clients.",
            ["path"], registry=r,
        )  # fmt: skip
        self.endpoints = Gauge(
            "tandem_router_ready_endpoints", "Ready engine pods the router routes to, by role.",
            ["role"], registry=r,
        )  # fmt: skip
        self.endpoint_legs = Counter(
            "tandem_router_endpoint_legs_total",
            "Legs sent to each engine endpoint (a data-parallel rank where pods serve one per port), by"
            " role, pod, port and the pod's LeaderWorkerSet group (empty for a single-node pod); a deleted"
            " pod's series are removed.",
            ["role", "pod", "port", "group"], registry=r,
        )  # fmt: skip
        self.draining_endpoints = Gauge(
            "tandem_router_draining_endpoints",
            "Ready engine pods marked tandem.dev/draining: no new requests, in-flight ones finish.",
            ["role"], registry=r,
        )  # fmt: skip
        self.retry_budget = Gauge(
            "tandem_router_retry_budget_available", "Retries the router-wide budget still allows.",
            registry=r,
        )  # fmt: skip
        self.asyncio_tasks = Gauge(
            "tandem_router_asyncio_tasks",
            "Tasks alive in the router's event loop when scraped (a leak shows as growth over time).",
            registry=r,
        )  # fmt: skip
        self.asyncio_tasks.set_function(running_tasks)
        # The checklist's split: per length bucket, path, tenant and model (bounded label values).
        self.ttft_by_length = Histogram(
            "tandem_router_ttft_by_input_length_seconds",
            "Client-visible TTFT of successful requests by input-length bucket (the engine's prompt"
            " token count), path, tenant and model.",
            ["path", "input_length", "tenant", "model"], buckets=BUCKETED_TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot_by_length = Histogram(
            "tandem_router_tpot_by_output_length_seconds",
            "Per successful request with 2+ output tokens: TPOT by output-length bucket (the engine's"
            " completion token count), path, tenant and model.",
            ["path", "output_length", "tenant", "model"], buckets=BUCKETED_TPOT_BUCKETS, registry=r,
        )  # fmt: skip
        # TPOT and ITL by output length and by concurrency (path only: they multiply as the above do).
        self.tpot_by_concurrency = Histogram(
            "tandem_router_tpot_by_concurrency_seconds",
            "Per successful request with 2+ output tokens: TPOT by concurrency bucket (requests in flight"
            " at this router on the same path when it arrived, itself included) and path.",
            ["path", "concurrency"], buckets=BUCKETED_TPOT_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl_by_length = BatchedHistogram(
            "tandem_router_itl_by_output_length_seconds",
            "Gaps between engine reads that carried tokens, of successful streamed requests, by the"
            " request's output-length bucket (the engine's completion token count) and path.",
            ["path", "output_length"], BUCKETED_ITL_BUCKETS, r,
        )  # fmt: skip
        self.itl_by_concurrency = BatchedHistogram(
            "tandem_router_itl_by_concurrency_seconds",
            "Gaps between engine reads that carried tokens, of successful streamed requests, by the"
            " request's concurrency bucket (as tandem_router_tpot_by_concurrency_seconds) and path.",
            ["path", "concurrency"], BUCKETED_ITL_BUCKETS, r,
        )  # fmt: skip
        self.decode_first_token = Histogram(
            "tandem_router_decode_leg_first_token_seconds",
            "From sending a streamed decode (or colocated) leg to its first token: on P/D the decode"
            " pod's queue, the KV pull and one step; colocated, queue and prefill.",
            ["path"], buckets=LEG_BUCKETS, registry=r,
        )  # fmt: skip
        self.tenant_requests = Counter(
            "tandem_router_tenant_requests_total",
            "Client requests finished, by tenant, model, path and HTTP status class.",
            ["tenant", "model", "path", "code"], registry=r,
        )  # fmt: skip
        self.tenant_tokens = Counter(
            "tandem_router_tenant_tokens_total",
            "Tokens of successful requests by tenant, model and kind (prompt, generation), as the"
            " engines counted them.",
            ["tenant", "model", "kind"], registry=r,
        )  # fmt: skip
        self.length_buckets = Gauge(
            "tandem_router_length_bucket_bounds_tokens",
            "The length bucket bounds in use (kind: input, output; bound: the bucket's index).",
            ["kind", "bound"], registry=r,
        )  # fmt: skip
        self.input_buckets = LengthBuckets(DEFAULT_INPUT_LENGTH_BOUNDS)
        self.output_buckets = LengthBuckets(DEFAULT_OUTPUT_LENGTH_BOUNDS)
        self.concurrency_buckets = LengthBuckets(DEFAULT_CONCURRENCY_BOUNDS)
        # Admission bounds tenant labels already (spec.router.tenants, at most 64, then `default` and
        # `other`); this is a backstop.
        self.tenants = LabelBound(cap=MAX_TENANT_LABELS)
        self.models = LabelBound()
        self._show_bounds()
        # Bound children for the hot path: `labels()` costs more than the observation itself.
        self.by_path = {path: PathMetrics(self, path) for path in PATHS}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # Successful prefill legs exist from the start at 0: rate() of a series born with its first
        # requests reads no increase for them (the autoscaler's TTFT breakdown divides by it).
        self.child(self.prefill_leg, "ok")
        # Every path's request counters exist from the start at 0: a series born at 1 hides its first
        # request from rate(), and the within-SLO counter (bound at 0) would then outrun the total.
        for path in PATHS:
            for code in STATUS_CLASSES:
                self.child(self.requests, path, code)
            self.child(self.stood_in, path)

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, memoised (label sets on the hot path are few and fixed)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def forget_endpoint_legs(self, live_pods: Collection[str]) -> None:
        """Drops the leg counters of pods that are gone (deleted, not merely unready), so a router
        that outlives many revisions' pods does not keep a series for each of them."""
        legs = id(self.endpoint_legs)
        for key in [k for k in self._children if k[0] == legs and k[1][1] not in live_pods]:
            del self._children[key]
            self.endpoint_legs.remove(*key[1])

    def set_buckets(
        self,
        input_bounds: Sequence[int],
        output_bounds: Sequence[int],
        concurrency_bounds: Sequence[int],
    ) -> None:
        """New bucket bounds; the bucketed histograms start again (their old labels mean nothing now)."""
        wanted = (tuple(input_bounds), tuple(output_bounds), tuple(concurrency_bounds))
        if wanted == (self.input_buckets.bounds, self.output_buckets.bounds, self.concurrency_buckets.bounds):
            return
        self.input_buckets, self.output_buckets, self.concurrency_buckets = (
            LengthBuckets(bounds) for bounds in wanted
        )
        for metric in (self.ttft_by_length, self.tpot_by_length, self.tpot_by_concurrency):
            metric.clear()
            self._children = {k: v for k, v in self._children.items() if k[0] != id(metric)}
        self.itl_by_length.clear()
        self.itl_by_concurrency.clear()
        self._show_bounds()

    def _show_bounds(self) -> None:
        self.length_buckets.clear()
        for kind, buckets in (("input", self.input_buckets), ("output", self.output_buckets)):
            for index, bound in enumerate(buckets.bounds):
                self.length_buckets.labels(kind, str(index)).set(bound)

    def observe_request(
        self,
        path: str,
        *,
        tenant: str | None,
        model: str | None,
        code: str,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        prompt_tokens: int = 0,
        output_tokens: int = 0,
        concurrency: int = 1,
        gaps: GapCounts | None = None,
    ) -> None:
        """One finished request in the per-tenant/model counters and the bucketed histograms (`ttft_s`,
        `tpot_s` and `gaps` given only for a successful request that has them; `concurrency`: the
        requests in flight on its path when it arrived, itself included)."""
        tenant_label, model_label = self.tenants(tenant), self.models(model)
        child = self.child
        child(self.tenant_requests, tenant_label, model_label, path, code).inc()
        if code != "2xx":
            return
        child(self.tenant_tokens, tenant_label, model_label, "prompt").inc(prompt_tokens)
        child(self.tenant_tokens, tenant_label, model_label, "generation").inc(output_tokens)
        if ttft_s is not None:
            bucket = self.input_buckets.label(prompt_tokens)
            child(self.ttft_by_length, path, bucket, tenant_label, model_label).observe(ttft_s)
        length = self.output_buckets.label(output_tokens)
        crowd = self.concurrency_buckets.label(concurrency)
        if tpot_s is not None:
            child(self.tpot_by_length, path, length, tenant_label, model_label).observe(tpot_s)
            child(self.tpot_by_concurrency, path, crowd).observe(tpot_s)
        if gaps is not None:
            self.itl_by_length.add((path, length), gaps)
            self.itl_by_concurrency.add((path, crowd), gaps)

    def know_revision(self, revision: str) -> None:
        """A revision's series exist from 0 (a series born at 1 hides its first request from rate())."""
        for code in STATUS_CLASSES:
            self.child(self.revision_requests, revision, code)
        self.child(self.revision_within_slo, revision)
        self.child(self.revision_stood_in, revision)
        # the latency histograms too: a revision rollout's verdict reads their quantiles with rate()
        self.child(self.revision_ttft, revision)
        self.child(self.revision_tpot, revision)

    def set_slo(self, targets: SloTargets | None) -> None:
        """Starts (or stops) counting within-SLO requests; the series exist only with an SLO."""
        if targets is None:
            for path, bound in self.by_path.items():
                if bound.within_slo is not None:
                    self.within_slo.remove(path)
                    bound.within_slo = None
            self.slo_target.clear()
            return
        for path, bound in self.by_path.items():
            if bound.within_slo is None:
                bound.within_slo = self.within_slo.labels(path)
        self.slo_target.labels("ttft").set(targets.ttft_s)
        self.slo_target.labels("tpot").set(targets.tpot_s)


class PathMetrics:
    __slots__ = (
        "active", "e2e", "generation_tokens", "in_flight", "itl", "leg_first_token", "prompt_tokens", "tpot",
        "ttft", "within_slo",
    )  # fmt: skip

    def __init__(self, metrics: RouterMetrics, path: str) -> None:
        self.active = 0  # client requests on this path being served (the in-flight gauge reads it)
        self.leg_first_token = metrics.decode_first_token.labels(path)
        self.ttft = metrics.ttft.labels(path)
        self.itl = metrics.itl.labels(path)
        self.tpot = metrics.tpot.labels(path)
        self.e2e = metrics.e2e.labels(path)
        self.in_flight = metrics.in_flight.labels(path)
        self.in_flight.set_function(lambda: float(self.active))
        self.prompt_tokens = metrics.prompt_tokens.labels(path)
        self.generation_tokens = metrics.generation_tokens.labels(path)
        self.within_slo: Any = None  # bound by `RouterMetrics.set_slo` while an SLO is set
