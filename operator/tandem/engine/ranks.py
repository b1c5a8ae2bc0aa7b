"""The data-parallel ranks one sim engine process serves, and the supervisor that stands for them.

With `--data-parallel-multi-port-external-lb` vLLM runs `--data-parallel-size-local` ranks in a pod,
rank i's API server on `--port` + i, and a supervisor on `--data-parallel-supervisor-port` whose
/health is up when every local rank's is (the pod's probes ask it). The sim engine does the same in
one process: an engine and an API server per rank (`rank_configs`), the supervisor (`supervisor_app`).
Each rank's NIXL side channel listens on VLLM_NIXL_SIDE_CHANNEL_PORT + its global data-parallel rank,
as vLLM's connector offsets it; an External rank (one per pod) likewise. (A base of 0, any free port,
stays 0 for every rank.) Each rank's /metrics, on its own port, reports its own engine only, labelled
`engine="<global rank>"`, as the API server of an externally balanced vLLM rank does: Prometheus
scrapes every rank's port (docs/multinode.md, "Metrics of External and MultiPortExternal ranks").
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from tandem.engine.config import EngineConfig
from tandem.engine.server import EngineServer


def rank_configs(config: EngineConfig) -> list[EngineConfig]:
    """One config per rank this process serves: ports `--port` + local rank, side channels offset by
    the global rank. A process of one Internal rank (or no data parallelism) keeps its config."""
    args = config.args
    ranks, group = args.ranks, args.group
    external = ranks.supervisor_port is not None or (group is not None and group.external)
    if not external:
        return [config]
    first = ranks.first if ranks.supervisor_port is not None else (group.node_rank if group else 0)
    side_channel = config.sim.nixl_side_channel_port

    def side_channel_of(local: int) -> int:
        return side_channel + first + local if side_channel else 0  # 0: any free port, every rank

    return [
        config.model_copy(
            update={
                "args": args.model_copy(update={"port": args.port + local}),
                "sim": config.sim.model_copy(update={"nixl_side_channel_port": side_channel_of(local)}),
                "engine_index": first + local,
            }
        )
        for local in range(ranks.local)
    ]


def supervisor_app(servers: Sequence[EngineServer]) -> web.Application:
    """GET /health: the first local rank's answer that is not 200 (loading, group not formed, draining),
    else 200."""

    async def health(request: web.Request) -> web.Response:
        for server in servers:
            answer = await server.health(request)
            if answer.status != 200:
                return answer
        return web.Response(status=200)

    app = web.Application()
    app.router.add_get("/health", health)
    return app
