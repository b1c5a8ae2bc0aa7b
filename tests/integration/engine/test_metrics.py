"""/metrics speaks vLLM V1's names, types, labels and buckets, parsed by Prometheus' own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from .harness import NAME, Engine

EXPECTED_TYPES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
}
TTFT_BUCKETS = (
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1.0 "
    "2.5 5.0 7.5 10.0 20.0 40.0 80.0 160.0 640.0 2560.0"
)
ITL_BUCKETS = "0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1.0 2.5 5.0 7.5 10.0 20.0 40.0 80.0"


def scrape(engine: Engine) -> tuple[str, dict[str, object]]:
    status, headers, raw = engine.request("GET", "/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(raw.decode())}
    return headers["Content-Type"], families


def bucket_bounds(family: object) -> list[str]:
    samples = family.samples  # type: ignore[attr-defined]
    return [s.labels["le"] for s in samples if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"]


def test_metric_names_types_labels_and_buckets(colocated: Engine) -> None:
    body = {"model": NAME, "prompt": "one two three", "max_tokens": 4, "stream": True}
    assert colocated.stream("/v1/completions", body)[0] == 200
    content_type, families = scrape(colocated)
    assert content_type.startswith("text/plain")
    for name, kind in EXPECTED_TYPES.items():
        assert name in families, name
        assert families[name].type == kind, name  # type: ignore[attr-defined]
        for sample in families[name].samples:  # type: ignore[attr-defined]
            if sample.name.endswith("_created"):
                continue
            assert sample.labels["model_name"] == NAME
            assert sample.labels["engine"] == "0"
    assert [float(b) for b in bucket_bounds(families["vllm:time_to_first_token_seconds"])] == [
        float(x) for x in TTFT_BUCKETS.split()
    ]
    assert [float(b) for b in bucket_bounds(families["vllm:inter_token_latency_seconds"])] == [
        float(x) for x in ITL_BUCKETS.split()
    ]
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}  # type: ignore[attr-defined]
    assert {"stop", "length", "abort", "error"} <= reasons
    assert "vllm:nixl_xfer_time_seconds" not in families  # colocated: no connector


def test_counters_follow_requests(colocated: Engine) -> None:
    _, before = scrape(colocated)

    def value(families: dict[str, object], name: str, **labels: str) -> float:
        for s in families[name].samples:  # type: ignore[attr-defined]
            if s.name == name + "_total" and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
        return 0.0

    assert colocated.post("/v1/completions", {"model": NAME, "prompt": "a b c d", "max_tokens": 3})[0] == 200
    _, after = scrape(colocated)
    assert value(after, "vllm:generation_tokens") - value(before, "vllm:generation_tokens") == 3
    assert value(after, "vllm:prompt_tokens") - value(before, "vllm:prompt_tokens") == 4
    success = "vllm:request_success"
    assert (
        value(after, success, finished_reason="length") - value(before, success, finished_reason="length")
        == 1
    )
