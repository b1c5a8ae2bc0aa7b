"""`vllm serve` command lines: parsed as vLLM would, refused where vLLM would refuse them."""

from __future__ import annotations

import pytest

from tandem.engine.args import ArgumentError, human_int, parse_serve_args
from tandem.engine.config import ConfigError, resolve
from tandem.engine.settings import SimSettings
from tandem.perf import kv_cache_capacity

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RENDERED_PREFILL = [
    MODEL, "--host", "127.20.1.5", "--port", "8000", "--served-model-name", "llama-8b",
    "--tensor-parallel-size", "1", "--max-model-len", "16384",
    "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
]  # fmt: skip


def test_the_rendered_prefill_command_line() -> None:
    args = parse_serve_args(RENDERED_PREFILL)
    assert args.model == MODEL
    assert args.host == "127.20.1.5"
    assert args.port == 8000
    assert args.served_model_name == ("llama-8b",)
    assert args.kv_transfer_config is not None
    assert args.kv_transfer_config.is_producer
    assert not args.kv_transfer_config.is_consumer
    assert args.kv_transfer_config.kv_load_failure_policy == "fail"


def test_colocated_flags_and_short_tp() -> None:
    args = parse_serve_args([MODEL, "-tp", "2", "--enable-chunked-prefill", "--max-num-batched-tokens", "2k"])
    assert args.tensor_parallel_size == 2
    assert args.enable_chunked_prefill is True
    assert args.max_num_batched_tokens == 2000
    assert parse_serve_args([MODEL, "--no-enable-chunked-prefill"]).enable_chunked_prefill is False


def test_dotted_kv_transfer_config() -> None:
    args = parse_serve_args(
        [MODEL, "--kv-transfer-config.kv_connector", "NixlConnector", "--kv-transfer-config.kv_role=kv_both",
         "--kv-transfer-config.kv_connector_extra_config.backends+", "UCX",
         "--kv-transfer-config.kv_connector_extra_config.kv_lease_duration", "5"]
    )  # fmt: skip
    kv = args.kv_transfer_config
    assert kv is not None
    assert kv.kv_role == "kv_both"
    assert kv.kv_connector_extra_config == {"backends": ["UCX"], "kv_lease_duration": 5}


def test_accepted_no_op_flags() -> None:
    parse_serve_args(
        [MODEL, "--dtype", "bfloat16", "--disable-log-requests", "--enforce-eager", "--seed", "3"]
    )


@pytest.mark.parametrize(
    "argv",
    [[MODEL, "--frobnicate"], [MODEL, "--port", "x"], [MODEL, "--block-size", "7"], [MODEL, "--max-model"]],
)
def test_argparse_refusals_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_serve_args(argv)
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("kv", "message"),
    [
        ('{"kv_connector":"NixlConnector"}', "kv_role"),
        ('{"kv_role":"kv_producer"}', "kv_connector is not"),
        ('{"kv_connector":"Nope","kv_role":"kv_both"}', "unknown kv_connector"),
        ('{"kv_connector":"NixlConnector","kv_role":"kv_sideways"}', "kv_role"),
        ('{"kv_connector":"NixlConnector","kv_role":"kv_both","bogus":1}', "bogus"),
    ],
)
def test_kv_transfer_config_refusals(kv: str, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        parse_serve_args([MODEL, "--kv-transfer-config", kv])


def test_model_is_required_and_parallelism_is_one() -> None:
    with pytest.raises(ArgumentError, match="model is required"):
        parse_serve_args(["--port", "1"])
    with pytest.raises(ArgumentError, match="data-parallel"):
        parse_serve_args([MODEL, "-dp", "2"])


def test_human_int() -> None:
    assert human_int("32k") == 32_000
    assert human_int("32K") == 32_768
    assert human_int("1M") == 1 << 20


def resolved(*argv: str, **sim: object):  # type: ignore[no-untyped-def]
    return resolve(parse_serve_args([MODEL, *argv]), SimSettings.model_validate(sim))


def test_defaults_follow_vllm_on_h100() -> None:
    config = resolved()
    assert config.max_model_len == 131072
    assert config.max_num_batched_tokens == 8192
    assert config.max_num_seqs == 1024
    assert config.chunked_prefill is True
    assert config.model_name == MODEL
    assert config.num_gpu_blocks * 16 > 131072


def test_no_chunked_prefill_batches_whole_prompts() -> None:
    config = resolved("--no-enable-chunked-prefill", "--max-model-len", "16384")
    assert config.max_num_batched_tokens == 16384


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("-tp", "3"), "divisible by tensor parallel size"),
        (("--max-model-len", "200000"), "greater than the derived max_model_len"),
        (
            ("--no-enable-chunked-prefill", "--max-model-len", "16384", "--max-num-batched-tokens", "4096"),
            "smaller",
        ),
        (
            ("--max-num-seqs", "512", "--max-num-batched-tokens", "256"),
            "greater than or equal to max_num_seqs",
        ),
        (("--gpu-memory-utilization", "0.1"), "No available memory"),
        (("--gpu-memory-utilization", "0.3"), "max seq len"),
    ],
)
def test_contradictions_are_refused(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolved(*argv)


def test_fp8_kv_cache_halves_bytes_and_lease_comes_from_extra_config() -> None:
    extra = '"kv_connector_extra_config":{"kv_lease_duration":2}'
    kv = '{"kv_connector":"NixlConnector","kv_role":"kv_both",' + extra + "}"
    config = resolved("--kv-cache-dtype", "fp8", "--kv-transfer-config", kv)
    assert config.kv_bytes_per_token == 65536
    assert config.kv_lease_seconds == 2
    assert resolved(abort_request_timeout=480).kv_lease_seconds == 480


@pytest.mark.parametrize(
    ("argv", "tp"),
    [((), 1), (("-tp", "2", "--gpu-memory-utilization", "0.85"), 2), (("--block-size", "32"), 1)],
)
def test_kv_blocks_come_from_the_perf_capacity(argv: tuple[str, ...], tp: int) -> None:
    config = resolved(*argv)
    capacity = kv_cache_capacity(
        MODEL, tp=tp, gpu_memory_gib=80, gpu_memory_utilization=config.args.gpu_memory_utilization
    )
    assert config.num_gpu_blocks == capacity.tokens // config.block_size
    assert config.num_gpu_blocks > 0


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_doubles_blocks_and_halves_the_kv_read_time(dtype: str) -> None:
    bf16, fp8 = resolved(), resolved("--kv-cache-dtype", dtype)
    assert fp8.num_gpu_blocks in (2 * bf16.num_gpu_blocks, 2 * bf16.num_gpu_blocks + 1)
    assert fp8.profile.decode.per_context_token_ms == pytest.approx(
        bf16.profile.decode.per_context_token_ms / 2
    )
    assert fp8.profile.decode.base_ms == bf16.profile.decode.base_ms
    assert fp8.profile.prefill == bf16.profile.prefill


def test_unknown_models_fall_back_with_a_note_or_follow_the_override() -> None:
    config = resolve(parse_serve_args(["/models/mine"]), SimSettings())
    assert config.arch.model_id == MODEL
    assert config.notes
    config = resolve(
        parse_serve_args(["/models/mine", "-tp", "4"]),
        SimSettings(perf_model="meta-llama/Llama-3.1-70B-Instruct"),
    )
    assert config.profile.tensor_parallel_size == 4
    assert config.profile.derived_from is None
    with pytest.raises(ConfigError, match="TANDEM_SIM_PERF_MODEL"):
        resolve(parse_serve_args([MODEL]), SimSettings(perf_model="acme/none"))
