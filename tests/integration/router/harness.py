"""Starting a router in-process for tests, and reading what it answers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client import generate_latest

from tandem.router.flow import Flow
from tandem.router.front import Front
from tandem.router.main import RouterConfig, build
from tandem.router.server import refresh_models
from tandem.router.state import RouterState


@dataclass
class RunningRouter:
    url: str
    state: RouterState
    flow: Flow

    def metrics_text(self) -> str:
        return generate_latest(self.state.metrics.registry).decode()

    def sample(self, name: str, **labels: str) -> float:
        value = self.state.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


async def until(
    check: Callable[[], object],
    within_s: float = 30.0,
    what: str = "condition",
    *,
    every_s: float = 0.1,
    blocking: bool = False,
    detail: Callable[[], str] | None = None,
) -> float:
    """Seconds until `check()` held, polled every `every_s` (in a thread when it blocks, e.g. on HTTP);
    fails after `within_s` with `what` and, if given, `detail()` (pods' logs)."""
    started = time.monotonic()
    while not (await asyncio.to_thread(check) if blocking else check()):
        if time.monotonic() - started > within_s:
            raise AssertionError(f"{what}: not within {within_s} s" + (f"\n{detail()}" if detail else ""))
        await asyncio.sleep(every_s)
    return time.monotonic() - started


@asynccontextmanager
async def running_router(*, learn_models: bool = False, **config: Any) -> AsyncIterator[RunningRouter]:
    app, state, flow = build(RouterConfig(host="127.0.0.1", port=0, **config))
    front = Front(app.handle, max_body_bytes=app.body_limit, on_refused=app.count_refusal)
    port = await front.start("127.0.0.1", 0)
    refresher = asyncio.create_task(refresh_models(state, flow, interval_s=0.2))
    if learn_models:
        for _ in range(100):
            if state.catalog.from_engines:
                break
            await asyncio.sleep(0.1)
    try:
        yield RunningRouter(f"http://127.0.0.1:{port}", state, flow)
    finally:
        refresher.cancel()
        await front.stop(grace_s=1.0)
        await flow.upstream.close()


@dataclass
class StreamResult:
    status: int
    events: list[Any]  # decoded JSON payloads, "[DONE]" as the string
    text: str  # concatenated generated text

    @property
    def errors(self) -> list[Any]:
        return [e for e in self.events if isinstance(e, dict) and "error" in e]


def text_of(payload: Any) -> str:
    if not isinstance(payload, dict):
        return ""
    out = []
    for choice in payload.get("choices") or []:
        if "text" in choice:
            out.append(choice["text"] or "")
        elif "delta" in choice:
            out.append(choice["delta"].get("content") or "")
        elif "message" in choice:
            out.append(choice["message"].get("content") or "")
    return "".join(out)


async def stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> StreamResult:
    async with session.post(url, json={**body, "stream": True}) as response:
        raw = await response.read()
    if response.status != 200:
        return StreamResult(response.status, [json.loads(raw)], "")
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
    return StreamResult(200, events, "".join(text_of(e) for e in events))
