"""Prometheus adapter: what the autoscaler reads about a PDDeployment (the only `prometheus_api_client` user).

`queries` holds every PromQL expression in one table and the pure parsing of answers into a
`tandem.signals.Snapshot` (and `PodLoad`s for drains); `prometheus.PrometheusReader` runs
them with a timeout and reports failures as `Snapshot.missing`, never as exceptions. `reader` is the
typed seam the controller reads through (`MetricsReader`, made by a `ReaderFactory`).
"""

from __future__ import annotations

from tandem.metrics.prometheus import PrometheusReader
from tandem.metrics.queries import QUERIES, PodLoad
from tandem.metrics.reader import MetricsReader, QueryRunner, ReaderFactory

__all__ = ["QUERIES", "MetricsReader", "PodLoad", "PrometheusReader", "QueryRunner", "ReaderFactory"]
