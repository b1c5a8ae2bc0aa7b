"""Metric families: vLLM's names and bucket series, without a server."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tandem.engine.metrics import NIXL_BYTES_BUCKETS, EngineMetrics
from tandem.engine.scheduler import Sequence
from tandem.routing.buckets import token_buckets


def test_token_buckets_are_the_1_2_5_series_up_to_max_model_len() -> None:
    assert token_buckets(1000) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    assert token_buckets(16384)[-1] == 10000


def test_nixl_bytes_buckets_span_2_kib_to_8_gib() -> None:
    assert NIXL_BYTES_BUCKETS[0] == 2048
    assert NIXL_BYTES_BUCKETS[-1] == 8 * 2**30


def test_nixl_families_only_with_a_connector_and_finished_requests_are_observed() -> None:
    plain = EngineMetrics("m", 1000, with_nixl=False, cache_info={"block_size": "16"})
    nixl = EngineMetrics("m", 1000, with_nixl=True, cache_info={"block_size": "16"})
    names = {f.name for f in text_string_to_metric_families(plain.exposition()[0].decode())}
    assert "vllm:nixl_xfer_time_seconds" not in names
    names = {f.name for f in text_string_to_metric_families(nixl.exposition()[0].decode())}
    assert {"vllm:nixl_xfer_time_seconds", "vllm:nixl_num_kv_expired_reqs", "tandem:kv_held_blocks"} <= names

    seq = Sequence("r", 10, 3, arrival=1.0)
    seq.first_scheduled, seq.first_token, seq.last_token, seq.finished_at = 1.5, 2.0, 3.0, 3.0
    seq.num_output, seq.finish_reason = 3, "length"
    plain.observe_finished(seq, 3)
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(plain.exposition()[0].decode())
        for s in f.samples
    }
    assert samples["vllm:e2e_request_latency_seconds_sum"] == 2.0
    assert samples["vllm:request_queue_time_seconds_sum"] == 0.5
    assert samples["vllm:request_decode_time_seconds_sum"] == 1.0
    assert samples["vllm:request_time_per_output_token_seconds_sum"] == 0.5


def test_observe_many_is_observe_repeated() -> None:
    one = EngineMetrics("m", 1000, with_nixl=False, cache_info={"block_size": "16"})
    many = EngineMetrics("m", 1000, with_nixl=False, cache_info={"block_size": "16"})
    for value, count in ((0.03125, 5), (0.5, 3), (100.0, 2), (0.01, 1)):  # sums exact in binary
        for _ in range(count):
            one.itl.observe(value)
        many.itl.observe_many(value, count)

    def itl_lines(metrics: EngineMetrics) -> list[str]:
        text = metrics.exposition()[0].decode()
        return [
            line for line in text.splitlines() if "inter_token_latency" in line and "_created" not in line
        ]

    assert itl_lines(one) == itl_lines(many)
    assert any('le="+Inf"' in line and line.endswith(" 11.0") for line in itl_lines(many))
