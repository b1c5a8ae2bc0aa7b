"""Runs command lines through vLLM's own `vllm serve` argument parser; run by the pinned vLLM's python.

Input (stdin): a JSON list of argument lists, each what follows `vllm serve` (MODEL first).
Output (stdout, last line): a JSON list, one entry per input: null when vLLM's parser, the serve
subcommand's validation and `AsyncEngineArgs.from_cli_args` all accept it, else the error text.

The CPU platform is forced (`VLLM_TARGET_DEVICE=cpu`): parsing and building the engine arguments
need no GPU. Nothing here imports tandem; `tests/unit/render/test_vllm_parser.py` drives it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import vllm.entrypoints.cli.serve as serve  # noqa: E402
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


def check(parser: FlexibleArgumentParser, commands: dict[str, object], argv: list[str]) -> str | None:
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
    return None


def main() -> None:
    lines = json.load(sys.stdin)
    parser, commands = _parser()
    print(json.dumps([check(parser, commands, list(argv)) for argv in lines]))


if __name__ == "__main__":
    main()
