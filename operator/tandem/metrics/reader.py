"""The seam between the operator and Prometheus: what a reader of one Prometheus must answer.

`QueryRunner` is the one primitive every window reader of this package runs its queries through
(`kv_transport.read_kv_transport`, `arms.read_arm_window`): instant queries by name at one time,
answers and errors by name, never raising. `MetricsReader` adds the two reads the autoscaler makes
directly: the snapshot `decide()` sees and the loads of pods being drained. `PrometheusReader` is the
real one; tests give the controller a reader that answers from recorded Prometheus answers.

The controller is handed a `ReaderFactory` (`PrometheusReader` itself, in `controller.main`) and
asks it for the reader of a Prometheus URL and timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from tandem.api.models import SLOSpec
from tandem.metrics.queries import (
    PodLoad,
    Result,
    build_pod_loads,
    build_snapshot,
    pod_load_queries,
    quantile_of,
    snapshot_queries,
)
from tandem.signals import PoolSize, Snapshot


class QueryRunner(Protocol):
    def run(self, queries: Mapping[str, str], at: float) -> tuple[dict[str, Result], dict[str, str]]:
        """Every query (name -> PromQL) at time `at` (unix seconds): (answers by name, errors by name).

        An answer is the `data.result` list of Prometheus' instant-query API. Never raises: a query that
        failed or did not answer in time is in the errors."""
        ...


class MetricsReader(QueryRunner, Protocol):
    def snapshot(
        self,
        namespace: str,
        pdd_name: str,
        slo: SLOSpec | None,
        window_seconds: float,
        now: float,
        *,
        sizes: Mapping[str, PoolSize] | None = None,
    ) -> Snapshot:
        """One PDDeployment's signals over `window_seconds` ending at `now`; failed queries are named
        in `Snapshot.missing`."""
        ...

    def pod_load(
        self,
        namespace: str,
        pods: Sequence[str],
        now: float | None = None,
        *,
        targets: Mapping[str, int] | None = None,
    ) -> Mapping[str, PodLoad]:
        """The load of each named pod with fresh engine metrics from each of its scrape targets
        (`targets`: pod -> how many, 1 for a pod not named; a pod left out has no known load); raises
        when a query failed."""
        ...


ReaderFactory = Callable[[str, float], MetricsReader]  # (url, timeout seconds) -> the reader


# -- the two direct reads, over any runner (`PrometheusReader`'s, and the recorded one of the tests) --


def read_snapshot(
    runner: QueryRunner,
    namespace: str,
    pdd_name: str,
    slo: SLOSpec | None,
    window_seconds: float,
    now: float,
    *,
    sizes: Mapping[str, PoolSize] | None = None,
    scrape_interval: float | None = None,
) -> Snapshot:
    """`MetricsReader.snapshot` by `runner`'s queries. With `sizes` (by role, from the cluster), a
    pool with ready pods but no engine series is reported missing, and the sizes are carried into
    the snapshot; `scrape_interval` (seconds) sets the staleness limit (unset: estimated per series)."""
    quantile = quantile_of(slo.attainment_percent if slo is not None else None)
    results, errors = runner.run(snapshot_queries(namespace, pdd_name, window_seconds, quantile), now)
    return build_snapshot(
        results,
        errors,
        now=now,
        window_seconds=window_seconds,
        slo_set=slo is not None,
        sizes=sizes,
        scrape_interval=scrape_interval,
    )


def read_pod_loads(
    runner: QueryRunner,
    namespace: str,
    pods: Sequence[str],
    now: float,
    *,
    scrape_interval: float | None = None,
    targets: Mapping[str, int] | None = None,
) -> dict[str, PodLoad]:
    """`MetricsReader.pod_load` by `runner`'s queries; raises `RuntimeError` when a query failed (the
    caller keeps waiting for the drain)."""
    if not pods:
        return {}
    results, errors = runner.run(pod_load_queries(namespace, pods), now)
    if errors:
        raise RuntimeError("; ".join(f"{name}: {error}" for name, error in sorted(errors.items())))
    return build_pod_loads(results, pods, scrape_interval, targets)
