"""vLLM V1's Prometheus metrics (reference section 3): names, types, labels and buckets.

Every metric carries `model_name` (first served name) and `engine` ("0"; an External or
MultiPortExternal rank's global data-parallel rank). NIXL metrics exist only when a KV connector is
configured. `tandem:` metrics are the simulator's own (held/leaked KV).
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tandem.engine.scheduler import Sequence
from tandem.routing.buckets import token_buckets

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
NIXL_XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_POST_BUCKETS = (0.001, *NIXL_XFER_BUCKETS)
NIXL_BYTES_BUCKETS = tuple(float(2**e) for e in range(11, 34, 2))  # 2 KiB, 8 KiB, ... 8 GiB
NIXL_DESCRIPTOR_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
FINISHED_REASONS = ("stop", "length", "abort", "error")


class BulkHistogram(Histogram):
    """prometheus_client's Histogram (same samples, same exposition) that also takes one value for
    many observations at once: in a busy step every stream that got a token in the step before has
    the same inter-token latency, so the step records it once, not once per stream."""

    def observe_many(self, amount: float, count: int) -> None:
        """As `count` calls of `observe(amount)`, the sum up to float rounding."""
        self._sum.inc(amount * count)
        self._buckets[bisect_left(self._upper_bounds, amount)].inc(count)


class EngineMetrics:
    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        with_nixl: bool,
        cache_info: dict[str, str],
        engine: str = "0",
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("model_name", "engine")
        values = (model_name, engine)
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(*values)

        self.num_requests_running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.num_requests_waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_cache_usage_perc = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens."
        )
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.num_preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        by_source = Counter(
            "vllm:prompt_tokens_by_source", "Prompt tokens by source.", (*labels, "source"), registry=r
        )
        self.prompt_tokens_local = by_source.labels(*values, "local_compute")
        self.prompt_tokens_external = by_source.labels(*values, "external_kv_transfer")
        self.prompt_tokens_cached = by_source.labels(*values, "local_cache_hit")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*labels, "finished_reason"),
            registry=r,
        )
        self.request_success = {reason: success.labels(*values, reason) for reason in FINISHED_REASONS}
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            sorted(cache_info),
            registry=r,
        )
        info.labels(**cache_info).set(1)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl: BulkHistogram = BulkHistogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            buckets=ITL_BUCKETS,
            registry=r,
        ).labels(*values)
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        tokens = token_buckets(max_model_len)
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.request_params_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )

        # Decode requests refused because the prefill pod that holds their KV is another serving
        # revision (TANDEM_SERVING_REVISION; docs/rollout.md, Revisions): a mixed pair, never expected.
        self.revision_refusals = counter(
            "tandem:kv_revision_mismatch_refusals",
            "Decode requests refused: their KV is held by a prefill engine of another serving revision.",
        )
        self.with_nixl = with_nixl
        if with_nixl:
            self.nixl_xfer_time = histogram(
                "vllm:nixl_xfer_time_seconds",
                "Histogram of transfer duration for NIXL KV Cache transfers.",
                NIXL_XFER_BUCKETS,
            )
            self.nixl_post_time = histogram(
                "vllm:nixl_post_time_seconds",
                "Histogram of transfer post time for NIXL KV Cache transfers.",
                NIXL_POST_BUCKETS,
            )
            self.nixl_bytes = histogram(
                "vllm:nixl_bytes_transferred",
                "Histogram of bytes transferred per NIXL KV Cache transfers.",
                NIXL_BYTES_BUCKETS,
            )
            self.nixl_descriptors = histogram(
                "vllm:nixl_num_descriptors",
                "Histogram of number of descriptors per NIXL KV Cache transfers.",
                NIXL_DESCRIPTOR_BUCKETS,
            )
            self.nixl_failed_transfers = counter(
                "vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers."
            )
            self.nixl_failed_notifications = counter(
                "vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications."
            )
            self.nixl_expired = counter(
                "vllm:nixl_num_kv_expired_reqs",
                "Number of requests whose KV blocks expired before being read.",
            )
            self.held_requests = gauge(
                "tandem:kv_held_requests",
                "Finished prefills whose KV blocks wait for a decode engine to pull them.",
            )
            self.held_blocks = gauge(
                "tandem:kv_held_blocks", "KV blocks held for remote decode (leaked if never pulled)."
            )

    def observe_finished(self, seq: Sequence, max_tokens_param: int) -> None:
        """Per-request histograms and counters, from the sequence's engine timestamps."""
        reason = seq.finish_reason or "abort"
        self.request_success[reason if reason in self.request_success else "abort"].inc()
        self.request_prompt_tokens.observe(seq.prompt_tokens)
        self.request_generation_tokens.observe(seq.num_output)
        self.request_params_max_tokens.observe(max_tokens_param)
        end = seq.finished_at if seq.finished_at is not None else seq.arrival
        self.e2e.observe(end - seq.arrival)
        if seq.first_scheduled is not None:
            self.queue_time.observe(seq.first_scheduled - seq.arrival)
            if seq.last_token is not None:
                self.inference_time.observe(seq.last_token - seq.first_scheduled)
            if seq.first_token is not None:
                self.prefill_time.observe(seq.first_token - seq.first_scheduled)
        if seq.first_token is not None and seq.last_token is not None:
            self.decode_time.observe(seq.last_token - seq.first_token)
            if seq.num_output > 1:
                self.tpot.observe((seq.last_token - seq.first_token) / (seq.num_output - 1))

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
