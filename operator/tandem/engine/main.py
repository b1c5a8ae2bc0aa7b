"""`tandem engine serve MODEL [vllm serve args]`: starts the simulation engine.

Exit status: 0 after a clean shutdown, 2 for a command line argparse refuses, 1 for a
configuration vLLM would refuse (the message says why) or a port that cannot be bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from tandem.engine.args import ArgumentError, parse_serve_args
from tandem.engine.config import ConfigError, EngineConfig, resolve
from tandem.engine.core import EngineCore
from tandem.engine.group import Group
from tandem.engine.ranks import rank_configs, supervisor_app
from tandem.engine.server import EngineServer
from tandem.engine.settings import SettingsError, SimSettings

USAGE = "usage: tandem engine serve MODEL [vllm serve options]"


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if not args or args[0] in {"-h", "--help"}:
        print(USAGE)
        return 0 if args else 2
    if args[0] != "serve":
        print(f"tandem engine: unknown subcommand {args[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        serve_args = parse_serve_args(args[1:])
        settings = SimSettings.from_env(os.environ)
        config = resolve(serve_args, settings)
    except SystemExit as exc:  # argparse already printed usage and the error
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    except (ArgumentError, SettingsError, ConfigError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    if settings.faults.crash:
        print("ERROR: crashing at start (TANDEM_SIM_FAULTS crash=true)", file=sys.stderr)
        return 1
    for note in config.notes:
        print(f"WARNING: {note}", file=sys.stderr)
    _use_uvloop()
    try:
        return asyncio.run(serve(config))
    except OSError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1


def _use_uvloop() -> None:
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(config: EngineConfig) -> int:
    configs = rank_configs(config)
    cores = [EngineCore(rank, rank.sim.faults) for rank in configs]
    group = None
    host = config.args.host or "127.0.0.1"
    if config.args.group is not None:
        url = f"http://{host}:{config.args.port}"
        group = Group(config.args.group, url, config.sim.group_timeout_seconds)
    servers = [EngineServer(rank, core, group) for rank, core in zip(configs, cores, strict=True)]
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the request
    # (frees its KV blocks, counts finished_reason="abort"), as vLLM does.
    apps = [(server.app(), rank.args.port) for server, rank in zip(servers, configs, strict=True)]
    if config.args.ranks.supervisor_port is not None:
        apps.append((supervisor_app(servers), config.args.ranks.supervisor_port))
    runners = [
        (
            web.AppRunner(
                app, access_log=None, handle_signals=False, shutdown_timeout=1.0, handler_cancellation=True
            ),
            port,
        )
        for app, port in apps
    ]
    for runner, _ in runners:
        await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher: asyncio.Future[None] | None = None
    try:
        for core in cores:
            await core.start()
        for runner, port in runners:
            await web.TCPSite(runner, config.args.host, port, backlog=1024).start()
        if group is not None:
            await group.start()
            watcher = asyncio.ensure_future(_stop_when(group.failed, stop))
        for rank, core in zip(configs, cores, strict=True):
            _announce(rank, core)
        await stop.wait()
        if group is not None and group.failed.is_set():
            # vLLM's engines fail with a dead rank's collectives and the API server exits: no drain.
            print(f"ERROR: {group.reason}", file=sys.stderr, flush=True)
            return 1
        print("INFO: shutting down", flush=True)
        for server in servers:
            server.draining = True
        await asyncio.gather(*(_drain(core, config.args.shutdown_timeout) for core in cores))
    finally:
        if watcher is not None:
            watcher.cancel()
        if group is not None:
            await group.stop()
        for server, core in zip(servers, cores, strict=True):
            await server.close()
            await core.stop()
        for runner, _ in runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()
    return 0


def _announce(config: EngineConfig, core: EngineCore) -> None:
    kv = config.kv_transfer
    role = (
        f", kv_role={kv.kv_role}, side channel {config.sim.nixl_side_channel_host}:{core.side_channel_port}"
        if kv
        else ""
    )
    print(
        f"INFO: tandem sim engine for {config.model} as {config.model_name!r} "
        f"(perf: {config.arch.model_id} "
        f"on {config.sim.gpu} TP{config.tensor_parallel_size}, {config.num_gpu_blocks} KV blocks{role})",
        flush=True,
    )
    print(f"INFO: Uvicorn running on http://{config.args.host or '0.0.0.0'}:{config.args.port}", flush=True)


async def _stop_when(event: asyncio.Event, stop: asyncio.Event) -> None:
    await event.wait()
    stop.set()


async def _drain(core: EngineCore, shutdown_timeout: float) -> None:
    """vLLM's --shutdown-timeout: finish in-flight requests for up to that many seconds, then abort."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(core.idle.wait(), shutdown_timeout)
    # Give the handlers of just-finished requests a moment to write their last bytes.
    await asyncio.sleep(0.05)
