"""A `MetricsReader` for tests that answers from answers recorded from a real Prometheus.

`tests/integration/metrics/test_prometheus_reader.py` records them from the dev cluster's Prometheus
(TANDEM_RECORD_PROMETHEUS_ANSWERS) by PromQL: the recorded reader answers a query only when the
caller sent exactly the PromQL that was recorded (same selector, window and quantile), and names
any other query as failed, as `PrometheusReader` names a query Prometheus refused. Every query
asked is kept in `asked`. Pure: no I/O beyond `load` reading the file.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tandem.api.models import SLOSpec
from tandem.metrics.queries import PodLoad, Result
from tandem.metrics.reader import read_pod_loads, read_snapshot
from tandem.signals import PoolSize, Snapshot

NOT_RECORDED = "not recorded"  # the error of a query the recording does not hold


class RecordedPrometheus:
    """Answers by PromQL (`data.result` of the instant-query API), from one recording at `now`."""

    def __init__(self, answers: Mapping[str, Result], now: float) -> None:
        self.answers = dict(answers)
        self.now = now
        self.asked: list[str] = []

    @classmethod
    def load(cls, path: Path) -> RecordedPrometheus:
        """A recording as the integration test writes it: {"now": t, "answers": {PromQL: result}}."""
        record: dict[str, Any] = json.loads(path.read_text())
        return cls(record["answers"], float(record["now"]))

    def run(self, queries: Mapping[str, str], at: float) -> tuple[dict[str, Result], dict[str, str]]:
        results: dict[str, Result] = {}
        errors: dict[str, str] = {}
        for name, promql in queries.items():
            self.asked.append(promql)
            if promql in self.answers:
                results[name] = copy.deepcopy(self.answers[promql])
            else:
                errors[name] = NOT_RECORDED
        return results, errors

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
        return read_snapshot(self, namespace, pdd_name, slo, window_seconds, now, sizes=sizes)

    def pod_load(
        self,
        namespace: str,
        pods: Sequence[str],
        now: float | None = None,
        *,
        targets: Mapping[str, int] | None = None,
    ) -> dict[str, PodLoad]:
        return read_pod_loads(self, namespace, pods, self.now if now is None else now, targets=targets)
