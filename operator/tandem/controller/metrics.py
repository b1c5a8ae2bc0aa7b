"""The operator's own Prometheus metrics and its /healthz and /metrics HTTP endpoints."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

REGISTRY = CollectorRegistry()
RECONCILES = Counter(
    "tandem_operator_reconciles_total", "Reconcile passes by result.", ["result"], registry=REGISTRY
)
RECONCILE_SECONDS = Histogram(
    "tandem_operator_reconcile_duration_seconds",
    "Duration of one reconcile pass.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
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
QUEUE_DEPTH = Gauge("tandem_operator_queue_depth", "PDDeployments waiting for a pass.", registry=REGISTRY)
LEADER = Gauge("tandem_operator_leader", "1 while this replica holds the leader lease.", registry=REGISTRY)

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
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app
