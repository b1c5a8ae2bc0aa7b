"""The data-parallel flags of External and MultiPortExternal pods: which ranks a sim engine process
serves, on which ports and side channels (`tandem.engine.args`, `tandem.engine.ranks`)."""

from __future__ import annotations

import pytest

from tandem.engine.args import ArgumentError, parse_serve_args
from tandem.engine.config import resolve
from tandem.engine.core import EngineCore
from tandem.engine.ranks import rank_configs
from tandem.engine.settings import SimSettings

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GROUP = ["--nnodes", "2", "--data-parallel-address", "127.20.0.1", "--data-parallel-rpc-port", "29550"]
# The flags render gives a MultiPortExternal pod of 2 ranks over 2 pods (parallel_args).
MULTI_PORT = [
    "--data-parallel-size", "4", "--data-parallel-size-local", "2", *GROUP,
    "--data-parallel-multi-port-external-lb", "--data-parallel-supervisor-port", "9256",
]  # fmt: skip
EXTERNAL = ["--data-parallel-size", "2", *GROUP]


def ports(argv: list[str]) -> list[tuple[int, int]]:
    """(API port, NIXL side channel port) of every rank the process serves."""
    config = resolve(parse_serve_args([MODEL, "--port", "8000", *argv]), SimSettings())
    return [(rank.args.port, rank.sim.nixl_side_channel_port) for rank in rank_configs(config)]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], [(8000, 5600)]),
        # Internal: the leader's one API; its side channel as before.
        (["--data-parallel-size", "2", "--data-parallel-size-local", "1", *GROUP], [(8000, 5600)]),
        # External: the pod's rank is its node rank, and offsets its side channel.
        ([*EXTERNAL, "--node-rank", "1", "--data-parallel-rank", "1"], [(8000, 5601)]),
        ([*EXTERNAL, "--data-parallel-rank", "0"], [(8000, 5600)]),
        # MultiPortExternal: a port per local rank; global ranks 2 and 3 on node rank 1.
        ([*MULTI_PORT, "--node-rank", "1"], [(8000, 5602), (8001, 5603)]),
        ([*MULTI_PORT, "--node-rank", "0"], [(8000, 5600), (8001, 5601)]),
        # One pod of 2 ranks, no group.
        (["--data-parallel-size", "2", "--data-parallel-multi-port-external-lb",
          "--data-parallel-supervisor-port", "9256"], [(8000, 5600), (8001, 5601)]),
    ],
)  # fmt: skip
def test_ranks_ports_and_side_channels(argv: list[str], expected: list[tuple[int, int]]) -> None:
    assert ports(argv) == expected


def test_the_group_of_external_ranks_balances_nothing_on_its_leader() -> None:
    args = parse_serve_args([MODEL, *MULTI_PORT, "--node-rank", "1"])
    assert args.group is not None
    assert (args.group.external, args.group.data) == (True, 4)
    assert (args.ranks.local, args.ranks.first, args.ranks.supervisor_port) == (2, 2, 9256)
    internal = parse_serve_args([MODEL, "--data-parallel-size", "2", *GROUP])
    assert internal.group is not None
    assert not internal.group.external


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*EXTERNAL, "--node-rank", "1", "--data-parallel-rank", "0"], "it is the node rank"),
        ([*MULTI_PORT[:-2]], "needs --data-parallel-supervisor-port"),
        (["--data-parallel-supervisor-port", "9256"], "needs --data-parallel-multi-port-external-lb"),
        (["--data-parallel-size", "4", "--data-parallel-size-local", "3", *GROUP,
          "--data-parallel-multi-port-external-lb", "--data-parallel-supervisor-port", "9256"],
         "x --nnodes 2 must be --data-parallel-size 4"),
        ([*MULTI_PORT, "--node-rank", "1", "--headless"], "only a worker of an Internal group"),
        (["--data-parallel-rank", "0"], "needs --data-parallel-size > 1"),
        ([*EXTERNAL, "--data-parallel-hybrid-lb"], "--data-parallel-hybrid-lb is vLLM's"),
    ],
)  # fmt: skip
def test_flags_the_sim_cannot_run_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        parse_serve_args([MODEL, *argv])


def test_a_side_channel_on_any_free_port_stays_so_for_every_rank() -> None:
    config = resolve(parse_serve_args([MODEL, *MULTI_PORT]), SimSettings(nixl_side_channel_port=0))
    assert [rank.sim.nixl_side_channel_port for rank in rank_configs(config)] == [0, 0]


@pytest.mark.parametrize(
    ("argv", "engines"),
    [
        ([], ["0"]),
        (["--data-parallel-size", "2", "--data-parallel-size-local", "1", *GROUP], ["0"]),  # Internal leader
        ([*EXTERNAL, "--node-rank", "1", "--data-parallel-rank", "1"], ["1"]),
        ([*MULTI_PORT, "--node-rank", "1"], ["2", "3"]),
        ([*MULTI_PORT, "--node-rank", "0"], ["0", "1"]),
    ],
)
async def test_each_rank_reports_its_own_engine_labelled_with_its_global_rank(
    argv: list[str], engines: list[str]
) -> None:
    """An externally balanced rank's /metrics (its own port) holds its one engine, `engine="<global
    rank>"`, as vLLM's API server of such a rank labels it: Prometheus scrapes every rank's port."""
    config = resolve(parse_serve_args([MODEL, "--port", "8000", *argv]), SimSettings())
    for rank, engine in zip(rank_configs(config), engines, strict=True):
        text = EngineCore(rank, rank.sim.faults).metrics.exposition()[0].decode()
        running = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running{")]
        assert running == [f'vllm:num_requests_running{{engine="{engine}",model_name="{MODEL}"}} 0.0'], (
            running
        )
