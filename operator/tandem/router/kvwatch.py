"""Decode backpressure's input: each decode pod's KV-cache usage, as its engine reports it.

Every `spec.router.admission.decodeBackpressure.scrapeIntervalSeconds` the router reads each ready
decode pod's `/metrics` and keeps `vllm:kv_cache_usage_perc` (0..1; vLLM before 0.10 named it
`vllm:gpu_cache_usage_perc`). The engine's own figure counts every router replica's transfers, not
only this one's. A pod whose /metrics cannot be read has no reading, so it is not held off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Final

from tandem.router.gateway import Gateway
from tandem.router.upstream import Upstream

log = logging.getLogger(__name__)

_NAMES: Final = (b"vllm:kv_cache_usage_perc", b"vllm:gpu_cache_usage_perc")


def kv_usage_of(text: bytes) -> float | None:
    """The highest KV usage sample (0..1) in a Prometheus text exposition, or None."""
    found: float | None = None
    for line in text.splitlines():
        for name in _NAMES:
            if line.startswith(name) and line[len(name) : len(name) + 1] in (b"{", b" "):
                rest = line.rsplit(b"}", 1)[1] if b"}" in line else line[len(name) :]
                with contextlib.suppress(ValueError, IndexError):
                    value = float(rest.split()[0])
                    found = value if found is None else max(found, value)
    return found


async def read_kv_usage(upstream: Upstream, pods: list[str], timeout_s: float) -> dict[str, float]:
    async def one(pod: str) -> tuple[str, float | None]:
        try:
            answer = await upstream.get(pod + "/metrics", timeout_s=timeout_s)
        except Exception as error:
            log.debug("KV usage of %s unreadable: %s", pod, error)
            return pod, None
        return pod, kv_usage_of(answer.body) if answer.status == 200 else None

    results = await asyncio.gather(*(one(pod) for pod in pods))
    return {pod: usage for pod, usage in results if usage is not None}


async def watch_kv_usage(gateway: Gateway, upstream: Upstream, decode_pods: Callable[[], list[str]]) -> None:
    """Keeps `gateway.kv_usage` current while decode backpressure is on."""
    while True:
        interval = gateway.kv_scrape_interval_s
        if gateway.kv_full_at is not None:
            pods = decode_pods()
            usage = await read_kv_usage(upstream, pods, timeout_s=min(interval, 2.0)) if pods else {}
            if gateway.kv_full_at is not None:
                gateway.set_kv_usage(usage)
        await asyncio.sleep(interval)
