"""The asyncio task gauges of the operator and the router (the soak, bench/soak.py, watches them for
leaks): read on an event loop they count that loop's live tasks; read outside one they are nan. The
operator's is set on its loop by its /metrics handler, which renders the registry in a thread."""

from __future__ import annotations

import asyncio
import math

from prometheus_client import generate_latest

from tandem.controller import metrics as operator_metrics
from tandem.devcluster.testing import metric_total
from tandem.router.metrics import RouterMetrics


def test_the_gauges_count_the_tasks_of_the_running_loop() -> None:
    router = RouterMetrics()

    async def scrape(extra: int) -> tuple[float, float]:
        gate = asyncio.Event()
        parked = [asyncio.create_task(gate.wait()) for _ in range(extra)]
        await asyncio.sleep(0)
        operator_metrics.count_tasks()  # what the operator's /metrics handler does on its loop
        op = metric_total(
            generate_latest(operator_metrics.REGISTRY).decode(), "tandem_operator_asyncio_tasks"
        )
        rt = metric_total(generate_latest(router.registry).decode(), "tandem_router_asyncio_tasks")
        gate.set()
        await asyncio.gather(*parked)
        return op, rt

    # The main task itself is one; each parked task adds one.
    assert asyncio.run(scrape(0)) == (1.0, 1.0)
    assert asyncio.run(scrape(5)) == (6.0, 6.0)


def test_outside_a_loop_the_gauges_read_nan() -> None:
    assert math.isnan(operator_metrics.running_tasks())
    router = RouterMetrics()
    assert math.isnan(metric_total(generate_latest(router.registry).decode(), "tandem_router_asyncio_tasks"))
