"""The operator's Prometheus reads through its typed seam, answered by a real Prometheus' recording.

The autoscaler is given a `ReaderFactory` whose reader answers from `window_answers.json`, recorded
from the dev cluster's Prometheus by tests/integration/metrics (a P/D deployment that served 8
requests, all on the legacy revision). The rollout step, the revision rollout's verdict and the KV
transport check read through `Autoscaler.reader`: each must send exactly the PromQL that was
recorded and get back the figures Prometheus gave.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tandem.api.models import PDDeployment
from tandem.api.status import RevisionRecord
from tandem.api.testing import stored
from tandem.controller import revisions
from tandem.controller.autoscaler import Autoscaler
from tandem.controller.kv_transport import KvTransportCheck
from tandem.controller.rollout import RolloutController, rollout_config
from tandem.metrics import MetricsReader
from tandem.metrics.testing import RecordedPrometheus
from tandem.rollout.judge import Result
from tandem.rollout.state import start

RECORDING = Path(__file__).parents[1] / "metrics" / "data" / "window_answers.json"
RECORD = json.loads(RECORDING.read_text())
URL = "http://prometheus.recorded:9090"
REQUESTS = 11.185  # the recorded increase of the P/D path's (and the legacy revision's) requests
WITHIN_SLO = 8.948


def deployment() -> PDDeployment:
    """The integration test's deployment (its SLO's quantile and the 60 s windows it recorded)."""
    spec = {
        "model": {"name": "llama-8b", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "maxModelLen": 4096},
        "engine": {"type": "sim", "image": "img", "env": [{"name": "TANDEM_SIM_TIME_SCALE", "value": "0.1"}]},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
        "colocated": {"replicas": 1},
        "router": {"replicas": 1},
        "serving": {"mode": "Disaggregated"},
        "slo": {"ttftMs": 5000, "tpotMs": 500, "attainmentPercent": 95},
        "autoscaling": {"intervalSeconds": 30, "prometheus": {"url": URL}},
        "rollout": {"steps": [{"weight": 50}, {"weight": 100}], "analysis": {"windowSeconds": 60}},
    }
    return PDDeployment.from_object(stored(spec, name=RECORD["name"], namespace=RECORD["namespace"]))


class Recorded:
    """The operator's `ReaderFactory`: one recorded reader, made once per URL and timeout."""

    def __init__(self) -> None:
        self.reader = RecordedPrometheus.load(RECORDING)
        self.made: list[tuple[str, float]] = []

    def __call__(self, url: str, timeout: float) -> MetricsReader:
        self.made.append((url, timeout))
        return self.reader

    def unrecorded(self) -> list[str]:
        return [q for q in self.reader.asked if q not in self.reader.answers]


@pytest.fixture
def recorded() -> Recorded:
    return Recorded()


def autoscaler(recorded: Recorded) -> Autoscaler:
    kube: Any = None  # no Kubernetes call on these paths
    return Autoscaler(kube, reader_for=recorded)


def test_a_mode_rollouts_window_is_what_prometheus_answered(recorded: Recorded) -> None:
    pdd = deployment()
    assert pdd.spec.rollout is not None
    config = rollout_config(pdd.spec, pdd.spec.rollout)
    now = RECORD["now"]
    window = RolloutController(autoscaler(recorded))._window(pdd, "Disaggregated", config, now)
    assert recorded.made == [(URL, 5.0)]
    assert recorded.unrecorded() == [], "every query sent is one the recording answers"
    assert window.metrics_missing == ()
    assert (window.start, window.end) == (now - 60, now)
    pd, colocated = window.target, window.baseline
    assert pd.requests == round(REQUESTS)
    assert pd.attainment == pytest.approx(WITHIN_SLO / REQUESTS)
    assert (pd.ttft_seconds, pd.tpot_seconds) == pytest.approx((0.016, 0.002275))
    assert pd.error_rate == 0.0
    # The P/D arm's KV transport, from the engines' NIXL series: no failure; transfers far under the
    # 128 MiB minimum, so the bandwidth is not judged.
    assert (pd.kv_failure_rate, pd.kv_bandwidth_ratio) == (0.0, None)
    assert (colocated.requests, colocated.attainment, colocated.kv_failure_rate) == (0, None, None)


def test_a_revision_rollouts_verdict_compares_with_the_recorded_legacy_pair(recorded: Recorded) -> None:
    pdd = deployment()
    assert pdd.spec.rollout is not None
    now = RECORD["now"]
    state = start(rollout_config(pdd.spec, pdd.spec.rollout), now - 100)
    new = RevisionRecord(id="b2", prefix=f"{RECORD['name']}-b2")
    old = RevisionRecord(id="a1", prefix=RECORD["name"], legacy=True)
    verdict = revisions.verdict_reader(autoscaler(recorded), pdd, now)(state, new, old)
    assert verdict is not None
    # The legacy pair served every request (the routers count them on the path and on the revision
    # alike); the new revision none yet, so nothing is concluded.
    assert verdict.result is Result.Inconclusive
    assert verdict.figures["baselineRequests"] == round(REQUESTS)
    assert verdict.figures["baselineAttainment"] == pytest.approx(WITHIN_SLO / REQUESTS)
    assert verdict.figures["baselineKvFailureRate"] == 0.0, "the legacy pods' KV, read by their empty label"
    assert verdict.figures["targetRequests"] == 0
    # Only the new revision's KV reads were not recorded (no pod of it): its KV figures stay unjudged.
    unrecorded = recorded.unrecorded()
    assert unrecorded
    assert all('tandem_dev_revision="b2"' in q for q in unrecorded)
    assert "targetKvFailureRate" not in verdict.figures


def test_the_kv_transport_check_reads_through_the_autoscalers_reader(recorded: Recorded) -> None:
    shared = autoscaler(recorded)
    outcome = KvTransportCheck(None, shared.reader).step(deployment(), None, RECORD["now"])
    assert recorded.made == [(URL, 5.0)]
    assert recorded.unrecorded() == []
    assert outcome.measured is not None
    assert (outcome.measured.transfers, outcome.measured.failed_transfers) == (11, 0)
    assert outcome.measured.judged_transfers == 0
    pdd = deployment()
    assert pdd.spec.rollout is not None
    RolloutController(shared)._window(
        pdd, "Colocated", rollout_config(pdd.spec, pdd.spec.rollout), RECORD["now"]
    )
    assert recorded.unrecorded() == []
    assert recorded.made == [(URL, 5.0)], "one reader per Prometheus, shared by the steps"
