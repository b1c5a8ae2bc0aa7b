"""The engine command line, case by case: connectors, model URI schemes, roles, sim vs vLLM."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tandem.api.meta import Role
from tandem.api.models import PDDeployment
from tandem.engine.args import parse_serve_args
from tandem.perf.engine_args import flag_values
from tandem.render import engine_command, kv_transfer_config, render

MakePdd = Callable[..., PDDeployment]


def _kv_json(command: list[str]) -> dict[str, Any] | None:
    values = flag_values(command, "--kv-transfer-config")
    if not values:
        return None
    assert len(values) == 1
    assert values[0] is not None
    parsed: dict[str, Any] = json.loads(values[0])
    return parsed


def test_prefill_command_is_exactly_the_vllm_serve_line(make_pdd: MakePdd) -> None:
    pdd = make_pdd(
        {
            "model": {"maxModelLen": 8192},
            "prefill": {"tensorParallelSize": 2},
            "decode": {"tensorParallelSize": 2},
        }
    )
    assert engine_command(pdd, "prefill") == [
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "$(POD_IP)",
        "--port",
        "8000",
        "--served-model-name",
        "llama-8b",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "8192",
        "--kv-transfer-config",
        '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_load_failure_policy":"fail"}',
    ]


@pytest.mark.parametrize(
    ("connector", "role", "want_config"),
    [
        pytest.param(
            "NixlConnector",
            "prefill",
            {"kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_load_failure_policy": "fail"},
            id="nixl prefill produces",
        ),
        pytest.param(
            "NixlConnector",
            "decode",
            {"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_load_failure_policy": "fail"},
            id="nixl decode consumes",
        ),
        pytest.param(
            "MooncakeConnector",
            "prefill",
            {
                "kv_connector": "MooncakeConnector",
                "kv_role": "kv_producer",
                "kv_load_failure_policy": "fail",
                "kv_connector_extra_config": {"mooncake_protocol": "rdma"},
            },
            id="mooncake prefill over rdma",
        ),
        pytest.param(
            "MooncakeConnector",
            "decode",
            {
                "kv_connector": "MooncakeConnector",
                "kv_role": "kv_consumer",
                "kv_load_failure_policy": "fail",
                "kv_connector_extra_config": {"mooncake_protocol": "rdma"},
            },
            id="mooncake decode over rdma",
        ),
        pytest.param(
            "LMCacheConnectorV1",
            "prefill",
            {
                "kv_connector": "LMCacheConnectorV1",
                "kv_role": "kv_producer",
                "kv_load_failure_policy": "fail",
                "kv_connector_extra_config": {
                    "discard_partial_chunks": False,
                    "lmcache_rpc_port": "producer1",
                },
            },
            id="lmcache prefill",
        ),
        pytest.param(
            "LMCacheConnectorV1",
            "decode",
            {
                "kv_connector": "LMCacheConnectorV1",
                "kv_role": "kv_consumer",
                "kv_load_failure_policy": "fail",
                "kv_connector_extra_config": {
                    "discard_partial_chunks": False,
                    "lmcache_rpc_port": "consumer1",
                },
            },
            id="lmcache decode",
        ),
    ],
)
def test_kv_transfer_config_per_connector_and_role(
    make_pdd: MakePdd, connector: str, role: Role, want_config: dict[str, Any]
) -> None:
    pdd = make_pdd({"kvTransfer": {"connector": connector}})
    assert _kv_json(engine_command(pdd, role)) == want_config
    assert kv_transfer_config(pdd, role) == want_config


def test_load_failure_policy_comes_from_the_spec(make_pdd: MakePdd) -> None:
    pdd = make_pdd({"kvTransfer": {"loadFailurePolicy": "recompute"}})
    config = _kv_json(engine_command(pdd, "decode"))
    assert config is not None
    assert config["kv_load_failure_policy"] == "recompute"


def test_mooncake_without_rdma_uses_tcp(make_pdd: MakePdd) -> None:
    pdd = make_pdd(
        {"kvTransfer": {"connector": "MooncakeConnector"}, "network": {"rdma": {"enabled": False}}}
    )
    assert kv_transfer_config(pdd, "decode") == {
        "kv_connector": "MooncakeConnector",
        "kv_role": "kv_consumer",
        "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"mooncake_protocol": "tcp"},
    }


@pytest.mark.parametrize(
    ("uri", "want_model", "want_revision"),
    [
        pytest.param(
            "hf://meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", None, id="hf"
        ),
        pytest.param("hf://Qwen/Qwen2.5-32B@a1b2c3", "Qwen/Qwen2.5-32B", "a1b2c3", id="hf with revision"),
        pytest.param("pvc://weights/llama/8b", "/models/weights/llama/8b", None, id="pvc with path"),
        pytest.param("pvc://weights", "/models/weights", None, id="pvc root"),
        pytest.param("file:///opt/models/llama", "/opt/models/llama", None, id="file in the image"),
    ],
)
def test_model_uri_schemes(make_pdd: MakePdd, uri: str, want_model: str, want_revision: str | None) -> None:
    command = engine_command(make_pdd({"model": {"uri": uri}}), "decode")
    assert command[2] == want_model
    assert flag_values(command, "--revision") == ([want_revision] if want_revision else [])


def test_pvc_model_is_mounted_read_only(make_pdd: MakePdd) -> None:
    objects = render(make_pdd({"model": {"uri": "pvc://weights/llama"}}))
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod[
        "volumes"
    ]
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "model", "mountPath": "/models/weights", "readOnly": True} in mounts


def test_colocated_gets_chunked_prefill_and_no_kv_transfer(make_pdd: MakePdd) -> None:
    pdd = make_pdd({"colocated": {"replicas": 1}})
    command = engine_command(pdd, "colocated")
    assert _kv_json(command) is None
    assert "--enable-chunked-prefill" in command
    assert flag_values(command, "--max-num-batched-tokens") == ["2048"]
    assert flag_values(command, "--shutdown-timeout") == ["120"]


@pytest.mark.parametrize(
    ("engine_args", "want_absent_flag"),
    [
        pytest.param(["--max-num-batched-tokens", "4096"], "--max-num-batched-tokens", id="token budget"),
        pytest.param(["--max-num-batched-tokens=4096"], "--max-num-batched-tokens", id="token budget ="),
        pytest.param(["--no-enable-chunked-prefill"], "--enable-chunked-prefill", id="chunked prefill off"),
        pytest.param(["--shutdown-timeout", "30"], "--shutdown-timeout", id="shutdown timeout"),
    ],
)
def test_user_args_replace_colocated_defaults(
    make_pdd: MakePdd, engine_args: list[str], want_absent_flag: str
) -> None:
    command = engine_command(make_pdd({"colocated": {"replicas": 1, "engineArgs": engine_args}}), "colocated")
    tandem_part, user_part = command[: -len(engine_args)], command[-len(engine_args) :]
    assert user_part == engine_args
    assert not flag_values(tandem_part, want_absent_flag)


def test_decode_drains_streams_and_prefill_does_not(make_pdd: MakePdd) -> None:
    pdd = make_pdd()
    assert flag_values(engine_command(pdd, "decode"), "--shutdown-timeout") == ["120"]
    assert flag_values(engine_command(pdd, "prefill"), "--shutdown-timeout") == []


def test_grace_period_follows_the_users_shutdown_timeout(make_pdd: MakePdd) -> None:
    def grace(pdd: PDDeployment, role: str) -> int:
        sts = next(
            o for o in render(pdd) if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith(role)
        )
        value: int = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        return value

    assert grace(make_pdd(), "decode") == 15 + 120 + 15
    assert (
        grace(make_pdd({"decode": {"engineArgs": ["--shutdown-timeout", "300"]}}), "decode") == 15 + 300 + 15
    )
    assert grace(make_pdd(), "prefill") == 15 + 30 + 15


def test_extra_args_then_pool_args_come_last(make_pdd: MakePdd) -> None:
    pdd = make_pdd(
        {"engine": {"extraArgs": ["--block-size", "128"]}, "decode": {"engineArgs": ["--max-num-seqs", "64"]}}
    )
    assert engine_command(pdd, "decode")[-4:] == ["--block-size", "128", "--max-num-seqs", "64"]
    assert engine_command(pdd, "prefill")[-2:] == ["--block-size", "128"]


@pytest.mark.parametrize(
    ("engine_type", "want_prefix"),
    [
        pytest.param("vllm", ["vllm", "serve"], id="vllm"),
        pytest.param("sim", ["tandem", "engine", "serve"], id="sim"),
    ],
)
def test_sim_engine_runs_the_same_arguments(
    make_pdd: MakePdd, engine_type: str, want_prefix: list[str]
) -> None:
    pdd = make_pdd({"engine": {"type": engine_type}})
    vllm = make_pdd({"engine": {"type": "vllm"}})
    for role in ("prefill", "decode"):
        command = engine_command(pdd, role)
        assert command[: len(want_prefix)] == want_prefix
        assert command[len(want_prefix) :] == engine_command(vllm, role)[2:]


@pytest.mark.parametrize("connector", ["NixlConnector", "MooncakeConnector", "LMCacheConnectorV1"])
@pytest.mark.parametrize("role", ["prefill", "decode", "colocated"])
def test_sim_engine_accepts_every_rendered_command(make_pdd: MakePdd, connector: str, role: Role) -> None:
    pdd = make_pdd(
        {
            "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct@main", "maxModelLen": 16384},
            "engine": {"type": "sim", "extraArgs": ["--block-size", "128"]},
            "kvTransfer": {"connector": connector},
            "colocated": {"replicas": 1},
        }
    )
    command = engine_command(pdd, role)
    args = parse_serve_args(command[3:])
    assert args.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert args.served_model_name == ("llama-8b",)
    assert args.max_model_len == 16384
    assert (args.kv_transfer_config is None) == (role == "colocated")


@pytest.mark.parametrize(
    ("max_num_seqs", "want_budget"),
    [
        pytest.param("256", "2048", id="fewer sequences than the budget"),
        pytest.param("4096", "4096", id="budget raised to max-num-seqs"),
    ],
)
def test_colocated_token_budget_is_never_below_max_num_seqs(
    make_pdd: MakePdd, max_num_seqs: str, want_budget: str
) -> None:
    pdd = make_pdd({"colocated": {"replicas": 1, "engineArgs": ["--max-num-seqs", max_num_seqs]}})
    command = engine_command(pdd, "colocated")
    assert flag_values(command, "--max-num-batched-tokens") == [want_budget]
