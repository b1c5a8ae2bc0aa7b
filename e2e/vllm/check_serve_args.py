"""Runs command lines through vLLM's own `vllm serve` argument parser; run by the pinned vLLM's python.

Input (stdin): a JSON list, one entry per command line: the argument list that follows `vllm serve`
(MODEL first), or an object `{"argv": [...], "model": DIR, "launcher": NAME, "expect": [{...}]}` for
a line whose parallelism should be checked further (a multi-node or data-parallel line, with its
`$(VAR)`s already expanded for one pod of the group).
Output (stdout, last line): a JSON list, one entry per input: null when vLLM's parser, the serve
subcommand's validation and `AsyncEngineArgs.from_cli_args` all accept it (and, for an object, the
checks below pass), else the error text.

For an object, two more of vLLM's own steps run. The serve subcommand's launch-mode choice
(`ServeSubcommand.cmd`, with its launchers replaced by stubs that only record which one it picked:
`headless`, `supervisor`, `api-servers` or `api-server`) must pick `launcher`. And
`create_engine_config` builds the whole engine configuration (parallel sizes, the data-parallel
rank vLLM infers from --node-rank, load-balancing mode, world size per node) with the model replaced
by `DIR`, a local directory holding only a config.json of the same architecture (no weights), for
each engine process the line starts: the line's own, or with the supervisor
(--data-parallel-multi-port-external-lb) each child's, as the supervisor derives them. `expect` holds,
per process, attributes its `ParallelConfig` must have (e.g. `data_parallel_rank`).

The CPU platform is forced (`VLLM_TARGET_DEVICE=cpu`): parsing and building the engine arguments
need no GPU. Nothing here imports tandem; `tests/unit/render/test_vllm_parser.py` drives it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import vllm.entrypoints.cli.serve as serve  # noqa: E402
import vllm.entrypoints.launchers.dp_supervisor as dp_supervisor  # noqa: E402
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402


def _parser() -> tuple[FlexibleArgumentParser, dict[str, object]]:
    # The same construction as vllm.entrypoints.cli.main, with only the serve subcommand.
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    commands = {}
    for command in serve.cmd_init():
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
        commands[command.name] = command
    return parser, commands


def _parse(
    parser: FlexibleArgumentParser, commands: dict[str, object], argv: list[str]
) -> argparse.Namespace | str:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(["serve", *argv])
    except SystemExit:
        return stderr.getvalue().strip() or "the parser exited"
    try:
        commands[args.subparser].validate(args)  # type: ignore[attr-defined]
        if getattr(args, "model_tag", None):
            args.model = args.model_tag
        AsyncEngineArgs.from_cli_args(args)
    except Exception as error:  # noqa: BLE001 - any refusal is the answer
        return f"{type(error).__name__}: {error}"
    return args


def launcher(args: argparse.Namespace) -> str:
    """Which launcher `vllm serve` would start for `args` (its own choice, the launchers stubbed)."""
    chosen: list[str] = []

    async def api_server(_: argparse.Namespace) -> None:
        chosen.append("api-server")

    stubs = {
        "run_headless": lambda _: chosen.append("headless"),
        "run_dp_supervisor": lambda _: chosen.append("supervisor"),
        "run_multi_api_server": lambda _: chosen.append("api-servers"),
        "run_server": api_server,
    }
    saved = {name: getattr(serve, name) for name in stubs}
    try:
        for name, stub in stubs.items():
            setattr(serve, name, stub)
        serve.ServeSubcommand.cmd(copy.copy(args))
    finally:
        for name, original in saved.items():
            setattr(serve, name, original)
    return chosen[0] if len(chosen) == 1 else f"launchers {chosen}"


def parallel_configs(args: argparse.Namespace, model: str) -> list[Any]:
    """vLLM's ParallelConfig of each engine process `args` starts, the model replaced by `model`."""
    processes = [args]
    if args.data_parallel_multi_port_external_lb:
        processes = [
            dp_supervisor._build_vllm_dp_server_args(args, rank)
            for rank in range(args.data_parallel_size_local)
        ]
    configs = []
    for process in processes:
        local = copy.copy(process)
        local.model = local.model_tag = model
        local.revision = None
        engine = AsyncEngineArgs.from_cli_args(local)
        configs.append(engine.create_engine_config(headless=bool(args.headless)).parallel_config)
    return configs


def mismatches(configs: list[Any], expect: list[dict[str, Any]]) -> str | None:
    if len(configs) != len(expect):
        return f"{len(configs)} engine processes, expected {len(expect)}"
    wrong = [
        f"process {i}: {key} is {getattr(config, key)!r}, expected {value!r}"
        for i, (config, wanted) in enumerate(zip(configs, expect, strict=True))
        for key, value in wanted.items()
        if getattr(config, key) != value
    ]
    return "; ".join(wrong) or None


def check(parser: FlexibleArgumentParser, commands: dict[str, object], line: Any) -> str | None:
    argv = list(line["argv"] if isinstance(line, dict) else line)
    args = _parse(parser, commands, argv)
    if isinstance(args, str):
        return args
    if not isinstance(line, dict):
        return None
    try:
        picked = launcher(args)
        if picked != line["launcher"]:
            return f"vllm serve would start {picked}, not {line['launcher']}"
        return mismatches(parallel_configs(args, line["model"]), line.get("expect", []))
    except Exception as error:  # noqa: BLE001 - any refusal is the answer
        return f"{type(error).__name__}: {error}"


def main() -> None:
    lines = json.load(sys.stdin)
    parser, commands = _parser()
    print(json.dumps([check(parser, commands, line) for line in lines]))


if __name__ == "__main__":
    main()
