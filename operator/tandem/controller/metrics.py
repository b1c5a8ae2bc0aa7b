"""The operator's own Prometheus metrics and its /healthz and /metrics HTTP endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from tandem.runtime import running_tasks

REGISTRY = CollectorRegistry()
RECONCILES = Counter(
    "tandem_operator_reconciles_total", "Reconcile passes by result.", ["result"], registry=REGISTRY
)
RECONCILE_SECONDS = Histogram(
    "tandem_operator_reconcile_duration_seconds",
    "Duration of one reconcile pass.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "tandem_operator_reconcile_errors_total", "Reconcile passes that raised.", ["reason"], registry=REGISTRY
)
API_WRITES = Counter(
    "tandem_operator_api_writes_total",
    "Write requests sent to the apiserver.",
    ["verb", "kind"],
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    "tandem_operator_api_requests_total",
    "Requests sent to the apiserver by the operator's own client (kopf's watches not included).",
    ["method", "resource"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge("tandem_operator_queue_depth", "PDDeployments waiting for a pass.", registry=REGISTRY)
LEADER = Gauge("tandem_operator_leader", "1 while this replica holds the leader lease.", registry=REGISTRY)
ASYNCIO_TASKS = Gauge(
    "tandem_operator_asyncio_tasks",
    "Tasks alive in the operator's event loop when scraped (a leak shows as growth over time).",
    registry=REGISTRY,
)


def count_tasks() -> None:
    """Sets the task gauge from the running loop's tasks (nan off a loop). The /metrics handler calls
    it on the operator's loop before it renders the registry in a thread, where no loop runs."""
    ASYNCIO_TASKS.set(running_tasks())


# The autoscaler (controller/autoscaler.py).
DECISIONS = Counter(
    "tandem_operator_autoscaler_decisions_total",
    "Autoscaler decisions by pool and direction (up, down, hold).",
    ["pool", "direction"],
    registry=REGISTRY,
)
DESIRED_REPLICAS = Gauge(
    "tandem_operator_autoscaler_desired_replicas",
    "The size each pool is held at (autoscaler's decision, or the spec's for fixed pools).",
    ["namespace", "pddeployment", "pool"],
    registry=REGISTRY,
)
PROMETHEUS_ERRORS = Counter(
    "tandem_operator_autoscaler_prometheus_errors_total",
    "Operator reads of Prometheus that failed or came back incomplete (query: snapshot, pod_load,"
    " kv_transport).",
    ["query"],
    registry=REGISTRY,
)
DECISION_SECONDS = Histogram(
    "tandem_operator_autoscaler_decision_duration_seconds",
    "Duration of one autoscaler decision, Prometheus reads included.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)

# What a PDDeployment's status says, for dashboards (docs/observability.md); set on every pass.
POOL_READY_REPLICAS = Gauge(
    "tandem_operator_pool_ready_replicas",
    "Ready pods of each pool (status.pools.<pool>.readyReplicas).",
    ["namespace", "pddeployment", "pool"],
    registry=REGISTRY,
)
POOL_GPUS = Gauge(
    "tandem_operator_pool_gpus",
    "GPUs the desired replicas of each pool request (status.pools.<pool>.gpus).",
    ["namespace", "pddeployment", "pool"],
    registry=REGISTRY,
)
DISAGGREGATED_WEIGHT = Gauge(
    "tandem_operator_disaggregated_weight_percent",
    "Percent of requests the routers send disaggregated (the gray rollout's weight, else 0 or 100 by mode).",
    ["namespace", "pddeployment"],
    registry=REGISTRY,
)
REVISION_WEIGHT = Gauge(
    "tandem_operator_revision_weight_percent",
    "Percent of P/D requests on the current serving revision (status.revisions.weight).",
    ["namespace", "pddeployment"],
    registry=REGISTRY,
)
_POOLS = ("prefill", "decode", "colocated", "router")


def observe_status(namespace: str, name: str, status: Mapping[str, Any]) -> None:
    """The gauges above from a PDDeployment's status (its camelCase JSON form)."""
    pools = status.get("pools") or {}
    for pool in _POOLS:
        record = pools.get(pool) or {}
        POOL_READY_REPLICAS.labels(namespace, name, pool).set(record.get("readyReplicas") or 0)
        POOL_GPUS.labels(namespace, name, pool).set(record.get("gpus") or 0)
    rollout = status.get("rollout") or {}
    if isinstance(rollout.get("weight"), int):
        weight = rollout["weight"]
        share = 100 - weight if rollout.get("target") == "Colocated" else weight
    else:
        share = 0 if status.get("mode") == "Colocated" else 100
    DISAGGREGATED_WEIGHT.labels(namespace, name).set(share)
    revisions = status.get("revisions") or {}
    REVISION_WEIGHT.labels(namespace, name).set(revisions.get("weight", 100) if revisions else 100)


def forget_status(namespace: str, name: str) -> None:
    """Drops a deleted PDDeployment's gauges."""
    for pool in _POOLS:
        for gauge in (POOL_READY_REPLICAS, POOL_GPUS):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name, pool)
    for gauge in (DISAGGREGATED_WEIGHT, REVISION_WEIGHT):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)


class Health:
    """The worker loop beats; /healthz fails when it has been silent for too long."""

    def __init__(self, max_silence: float) -> None:
        self.max_silence = max_silence
        self.last_beat = time.monotonic()

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def healthy(self) -> bool:
        return time.monotonic() - self.last_beat < self.max_silence


def make_app(health: Health) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        if health.healthy():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="worker loop stalled\n")

    async def metrics(_: web.Request) -> web.Response:
        # Off the event loop: with a thousand PDDeployments' gauges a scrape takes long enough to
        # hold up the workers' dispatch and the informers' enqueues.
        count_tasks()
        body = await asyncio.to_thread(generate_latest, REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app
