"""`PrometheusReader`: runs the queries of `tandem.metrics.queries` against one Prometheus.

The only module that imports `prometheus_api_client`. Each query is one instant query at the
snapshot's time; they run side by side on a small thread pool, and the whole read is bounded by
the reader's timeout: a query that failed or did not answer in time is named in the snapshot's
`missing` (never raised), so the autoscaler holds. The HTTP session ignores proxy environment
variables (Prometheus is dialled directly) and does not retry: the next autoscaler pass is the retry.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from tandem.api.models import SLOSpec
from tandem.metrics.queries import PodLoad, Result
from tandem.metrics.reader import read_pod_loads, read_snapshot
from tandem.signals import PoolSize, Snapshot

log = logging.getLogger(__name__)

_WORKERS = 6


class PrometheusReader:
    """Reads one PDDeployment's signals from Prometheus at `url`; every read lasts at most `timeout` s.

    `scrape_interval` (seconds) sets the staleness limit (3 intervals); unset, it is estimated per
    series from its samples in the window.
    """

    def __init__(self, url: str, timeout: float = 5.0, *, scrape_interval: float | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.scrape_interval = scrape_interval
        session = requests.Session()
        session.trust_env = False  # no proxy from the environment: Prometheus is dialled directly
        self._client = PrometheusConnect(
            url=self.url, session=session, retry=Retry(total=0, raise_on_status=False), timeout=self.timeout
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(_WORKERS, thread_name_prefix="tandem-prometheus")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    # -- queries ---------------------------------------------------------------------------------

    def _query(self, promql: str, at: float) -> Result:
        result: Any = self._client.custom_query(promql, params={"time": f"{at:.3f}"}, timeout=self.timeout)
        if not isinstance(result, list):
            raise ValueError(f"unexpected answer: {str(result)[:200]}")
        return result

    def run(self, queries: Mapping[str, str], at: float) -> tuple[dict[str, Result], dict[str, str]]:
        """Every query at time `at`: (answers by name, errors by name); never raises."""
        deadline = time.monotonic() + self.timeout
        futures = {name: self._pool.submit(self._query, promql, at) for name, promql in queries.items()}
        results: dict[str, Result] = {}
        errors: dict[str, str] = {}
        for name, future in futures.items():
            try:
                results[name] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                future.cancel()
                errors[name] = f"no answer from {self.url} within {self.timeout:g}s"
            except requests.exceptions.ConnectionError as exc:
                errors[name] = f"Prometheus at {self.url} unreachable ({type(exc).__name__})"
            except Exception as exc:  # HTTP error, bad JSON: all mean "no data"
                errors[name] = f"{type(exc).__name__}: {_short(exc)}"
        if errors:
            log.warning("Prometheus at %s: %d of %d queries failed", self.url, len(errors), len(queries))
        return results, errors

    def _query_range(self, promql: str, start: float, end: float, step: float) -> Result:
        result: Any = self._client.custom_query_range(
            promql,
            start_time=datetime.fromtimestamp(start, UTC),
            end_time=datetime.fromtimestamp(end, UTC),
            step=f"{step:g}s",
            params={"timeout": f"{self.timeout:g}s"},
        )
        if not isinstance(result, list):
            raise ValueError(f"unexpected answer: {str(result)[:200]}")
        return result

    def run_range(
        self, queries: Mapping[str, str], start: float, end: float, step: float
    ) -> tuple[dict[str, Result], dict[str, str]]:
        """Every query over [start, end] every `step` s (`data.result` of range queries: series with
        `values`): (answers by name, errors by name); never raises. For dashboards' PNGs."""
        results: dict[str, Result] = {}
        errors: dict[str, str] = {}
        for name, promql in queries.items():
            try:
                results[name] = self._query_range(promql, start, end, step)
            except Exception as exc:  # connection, HTTP error, bad JSON
                errors[name] = f"{type(exc).__name__}: {_short(exc)}"
        return results, errors

    # -- the autoscaler's reads ------------------------------------------------------------------

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
        """One PDDeployment's signals over `window_seconds` ending at `now` (unix seconds).

        With `sizes` (by role, from the cluster), a pool with ready pods but no engine series is
        reported missing, and the sizes are carried into the snapshot.
        """
        return read_snapshot(
            self,
            namespace,
            pdd_name,
            slo,
            window_seconds,
            now,
            sizes=sizes,
            scrape_interval=self.scrape_interval,
        )

    async def snapshot_async(
        self,
        namespace: str,
        pdd_name: str,
        slo: SLOSpec | None,
        window_seconds: float,
        now: float,
        *,
        sizes: Mapping[str, PoolSize] | None = None,
    ) -> Snapshot:
        """`snapshot` on a worker thread, so the event loop never blocks on Prometheus."""
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self.snapshot, namespace, pdd_name, slo, window_seconds, now, sizes=sizes),
                self.timeout + 1.0,
            )
        except TimeoutError:
            message = f"snapshot: no answer from {self.url} within {self.timeout:g}s"
            return Snapshot(observed_at=now, window_seconds=window_seconds, missing=(message,))

    def pod_load(
        self,
        namespace: str,
        pods: Sequence[str],
        now: float | None = None,
        *,
        targets: Mapping[str, int] | None = None,
    ) -> dict[str, PodLoad]:
        """Load of each named pod with fresh engine metrics from each of its scrape targets
        (`targets`, 1 for a pod not named); a pod left out has no known load.

        Raises `RuntimeError` when a query failed (the caller keeps waiting for the drain).
        """
        return read_pod_loads(
            self,
            namespace,
            pods,
            time.time() if now is None else now,
            scrape_interval=self.scrape_interval,
            targets=targets,
        )


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."
