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
from tandem.metrics.queries import PodLoad, Result
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
        self, namespace: str, pods: Sequence[str], now: float | None = None
    ) -> Mapping[str, PodLoad]:
        """The load of each named pod with fresh engine metrics (a pod left out has no known load);
        raises when a query failed."""
        ...


ReaderFactory = Callable[[str, float], MetricsReader]  # (url, timeout seconds) -> the reader
