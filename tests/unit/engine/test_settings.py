"""TANDEM_SIM_* and VLLM_NIXL_* environment parsing, and fault patches."""

from __future__ import annotations

import pytest

from tandem.engine.settings import Faults, SettingsError, SimSettings


def test_defaults() -> None:
    settings = SimSettings.from_env({})
    assert settings.gpu == "H100"
    assert settings.time_scale == 1.0
    assert settings.nixl_side_channel_host == "localhost"
    assert settings.nixl_side_channel_port == 5600
    assert settings.faults == Faults()


def test_environment_is_read() -> None:
    settings = SimSettings.from_env(
        {
            "TANDEM_SIM_TIME_SCALE": "0",
            "TANDEM_SIM_KV_BANDWIDTH_GBPS": "25",
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.9",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601",
            "TANDEM_SIM_FAULTS": '{"slowdown": 2, "error_rate": 0.5}',
        }
    )
    assert settings.time_scale == 0
    assert settings.kv_bandwidth_gbps == 25
    assert settings.nixl_side_channel_host == "127.0.0.9"
    assert settings.faults.slowdown == 2
    assert settings.faults.error_rate == 0.5


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"TANDEM_SIM_TIME_SCALE": "fast"}, "TANDEM_SIM_TIME_SCALE"),
        ({"TANDEM_SIM_FAULTS": "{"}, "TANDEM_SIM_FAULTS"),
        ({"TANDEM_SIM_FAULTS": '{"error_rate": 3}'}, "TANDEM_SIM_FAULTS.error_rate"),
        ({"VLLM_NIXL_SIDE_CHANNEL_PORT": "70000"}, "VLLM_NIXL_SIDE_CHANNEL_PORT"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError, match=names):
        SimSettings.from_env(env)


def test_fault_patches_merge_and_validate() -> None:
    faults = Faults().merged({"hang": True}).merged({"slowdown": 3})
    assert faults.hang
    assert faults.slowdown == 3
    with pytest.raises(ValueError, match="kv_pull_failure_rate"):
        faults.merged({"kv_pull_failure_rate": -1})


def test_handshake_delay_is_read() -> None:
    assert SimSettings.from_env({"TANDEM_SIM_NIXL_HANDSHAKE_SECONDS": "5"}).nixl_handshake_seconds == 5


def test_request_latency_is_read_and_checked() -> None:
    env = {"TANDEM_SIM_REQUEST_LATENCY_SECONDS": "0.004"}
    assert SimSettings.from_env(env).request_latency_seconds == 0.004
    assert SimSettings.from_env({}).request_latency_seconds == 0
    with pytest.raises(SettingsError, match="TANDEM_SIM_REQUEST_LATENCY_SECONDS"):
        SimSettings.from_env({"TANDEM_SIM_REQUEST_LATENCY_SECONDS": "-1"})


def test_load_seconds_is_read_and_checked() -> None:
    assert SimSettings.from_env({}).load_seconds == 0
    assert SimSettings.from_env({"TANDEM_SIM_LOAD_SECONDS": "120"}).load_seconds == 120
    with pytest.raises(SettingsError, match="TANDEM_SIM_LOAD_SECONDS"):
        SimSettings.from_env({"TANDEM_SIM_LOAD_SECONDS": "-1"})
