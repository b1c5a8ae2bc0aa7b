"""A slow P->D link (the `kv_bandwidth_factor` fault) and failed KV reads, as the decode engine's NIXL
metrics show them (vLLM records transfers, their bytes and their failures on the side that READs).

Compressed settings: a 4 Gb/s link at time scale 1, so a 600-token Llama-3.1-8B prompt (75 MiB of
KV) takes 157 ms on a healthy link and 629 ms at a quarter of it; steps stay real-time short."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tandem.perf import kv_transfer_seconds

from .harness import NAME, Engine, kv_config, start_engine
from .test_pd import PROMPT, prefill_leg

LINK_GBPS = 4.0
PROMPT_TOKENS = 600
KV_BYTES_PER_TOKEN = 131072  # Llama-3.1-8B, bf16
ENV = {"TANDEM_SIM_TIME_SCALE": "1", "TANDEM_SIM_KV_BANDWIDTH_GBPS": str(LINK_GBPS)}
BODY = {"model": NAME, "prompt": PROMPT, "max_tokens": 2}


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Engine, Engine]]:
    prefill = start_engine("--kv-transfer-config", kv_config("kv_producer"), env=ENV, side_channel=True)
    decode = start_engine("--kv-transfer-config", kv_config("kv_consumer"), env=ENV, side_channel=True)
    yield prefill, decode
    prefill.stop()
    decode.stop()


@pytest.fixture(autouse=True)
def clear_faults(pair: tuple[Engine, Engine]) -> Iterator[None]:
    yield
    for engine in pair:
        assert engine.request("DELETE", "/admin/faults")[0] == 200


def nixl(decode: Engine) -> tuple[float, float, float, float]:
    return (
        decode.metric("vllm:nixl_xfer_time_seconds_count"),
        decode.metric("vllm:nixl_xfer_time_seconds_sum"),
        decode.metric("vllm:nixl_bytes_transferred_sum"),
        decode.metric("vllm:nixl_num_failed_transfers_total"),
    )


def one_request(prefill: Engine, decode: Engine, request_id: str) -> int:
    # A prompt of its own (its first token differs): the decode engine's prefix cache, which holds
    # the prompts it pulled before, has none of its blocks, so the whole KV moves every time.
    body = {**BODY, "prompt": request_id.replace("-", "_") + PROMPT[PROMPT.index(" ") :]}
    params = prefill_leg(prefill, body, request_id)
    return int(decode.post("/v1/completions", {**body, "kv_transfer_params": params})[0])


def timed_read(prefill: Engine, decode: Engine, request_id: str) -> tuple[float, float]:
    """(seconds, bytes) the decode engine recorded for one pull."""
    count, seconds, size, failed = nixl(decode)
    assert one_request(prefill, decode, request_id) == 200
    count2, seconds2, size2, failed2 = nixl(decode)
    assert (count2, failed2) == (count + 1, failed)
    return seconds2 - seconds, size2 - size


@pytest.mark.parametrize("slow_side", ["prefill", "decode"])
def test_a_slow_link_on_either_end_stretches_the_recorded_transfer(
    pair: tuple[Engine, Engine], slow_side: str
) -> None:
    prefill, decode = pair
    # The fastest of three healthy reads: a busy machine only ever adds time, so the minimum is the
    # link's pace and one slow read does not make the upper bound (or the slow/healthy ratio) flaky.
    reads = [timed_read(prefill, decode, f"healthy-{slow_side}-{i}") for i in range(3)]
    healthy_s = min(seconds for seconds, _ in reads)
    healthy_bytes = reads[0][1]
    modelled = kv_transfer_seconds(PROMPT_TOKENS, KV_BYTES_PER_TOKEN, LINK_GBPS)
    assert all(size == PROMPT_TOKENS * KV_BYTES_PER_TOKEN for _, size in reads)
    assert all(seconds >= modelled for seconds, _ in reads)  # paced to the link, never sooner
    assert healthy_s < 4 * modelled

    slow = prefill if slow_side == "prefill" else decode
    status, faults = slow.post("/admin/faults", {"kv_bandwidth_factor": 0.25})
    assert status == 200
    assert faults["kv_bandwidth_factor"] == 0.25
    slow_s, slow_bytes = timed_read(prefill, decode, f"slow-{slow_side}")
    assert slow_bytes == healthy_bytes  # the same KV, only slower
    assert slow_s >= 4 * modelled
    assert slow_s > 2 * healthy_s


def test_an_out_of_range_factor_is_refused(pair: tuple[Engine, Engine]) -> None:
    prefill, _ = pair
    assert prefill.post("/admin/faults", {"kv_bandwidth_factor": 0})[0] == 400
    assert prefill.post("/admin/faults", {"kv_bandwidth_factor": 1.5})[0] == 400


@pytest.mark.parametrize("failing_side", ["prefill", "decode"])
def test_injected_pull_failures_count_as_failed_transfers_on_the_reader(
    pair: tuple[Engine, Engine], failing_side: str
) -> None:
    prefill, decode = pair
    count, seconds, size, failed = nixl(decode)
    prefill_failed = prefill.metric("vllm:nixl_num_failed_transfers_total")
    failing = prefill if failing_side == "prefill" else decode
    assert failing.post("/admin/faults", {"kv_pull_failure_rate": 1.0})[0] == 200
    assert one_request(prefill, decode, f"fail-{failing_side}") == 500  # kv_load_failure_policy fail
    # One failed READ on the decode engine; no time or bytes observed for it; nothing on prefill.
    assert nixl(decode) == (count, seconds, size, failed + 1)
    assert prefill.metric("vllm:nixl_num_failed_transfers_total") == prefill_failed
