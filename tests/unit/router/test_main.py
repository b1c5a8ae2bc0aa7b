"""`tandem router` flags: the operator's command line, static mode, and refusals."""

from __future__ import annotations

import pytest

from tandem.api import meta
from tandem.router.main import build, parse_args


def test_the_command_the_operator_renders() -> None:
    # As render/router.py writes it, with $(POD_NAMESPACE) and $(POD_IP) expanded.
    config = parse_args(
        [
            "--namespace",
            "team-a",
            "--pddeployment",
            "llm",
            "--host",
            "127.20.0.7",
            "--port",
            str(meta.ROUTER_PORT),
        ]
    )
    assert (config.namespace, config.pddeployment, config.host, config.port) == (
        "team-a",
        "llm",
        "127.20.0.7",
        meta.ROUTER_PORT,
    )
    assert config.engine_port == meta.ENGINE_PORT
    _, state, _ = build(config)
    assert state.pdd_name == "llm"
    assert state.endpoints == {"prefill": [], "decode": [], "colocated": []}


def test_static_endpoints_and_tuning_flags() -> None:
    static = [
        "--prefill",
        "http://127.0.0.1:1",
        "--prefill",
        "http://127.0.0.1:2",
        "--decode",
        "http://127.0.0.1:3",
    ]
    tuning = ["--model", "m", "--max-model-len", "4096", "--prefill-timeout", "5", "--max-retries", "1"]
    config = parse_args([*static, *tuning])
    assert config.prefill == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    _, state, flow = build(config)
    assert state.endpoints["prefill"] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert state.catalog.max_model_len("m") == 4096
    assert flow.timeouts.prefill_s == 5.0
    assert flow.max_retries == 1


@pytest.mark.parametrize(
    "argv",
    [
        [],  # no way to find engines
        ["--pddeployment", "llm", "--decode", "http://127.0.0.1:3"],  # both ways at once
        ["--decode", "http://127.0.0.1:3", "--max-retries", "-1"],
        ["--decode", "http://127.0.0.1:3", "--prefix-max-blocks", "4097"],  # past the key weights
        ["--decode", "http://127.0.0.1:3", "--prefix-block-chars", "8193"],
    ],
)
def test_refusals(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
