"""Fixtures for operator tests: one `tandem operator` process, or one the autoscaling tests can crash
and restart (the CRD fixture is shared)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess, RestartableOperator


# Module scope: a cluster-wide operator must be gone before other tests run operators of their own
# (chart, GitOps), or two would reconcile the same PDDeployment.
@pytest.fixture(scope="module")
def operator(
    cluster: ClusterHandle, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """`tandem operator` watching all namespaces, with a short resync so tests see several."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    handle = OperatorProcess(cluster, ["--resync-seconds", "20", "--lease-namespace", "default"], log)
    try:
        handle.wait_leader(timeout=60)
    except AssertionError as exc:
        handle.stop()
        pytest.fail(str(exc))
    yield handle
    handle.stop()
    if os.environ.get("TANDEM_SHOW_OPERATOR_LOG"):
        print(handle.log_text())


@pytest.fixture(scope="module")
def autoscaling_operator(
    cluster: ClusterHandle, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RestartableOperator]:
    """`tandem operator` whose autoscaler reads the dev cluster's Prometheus (`--prometheus-url`),
    with a fixed identity so a test can kill -9 it and restart it (`crash_and_restart`)."""
    handle = RestartableOperator(
        cluster,
        [
            "--resync-seconds",
            "20",
            "--lease-namespace",
            "default",
            "--prometheus-url",
            cluster.prometheus_url,
        ],
        tmp_path_factory.mktemp("autoscaling-operator"),
    )
    try:
        handle.current.wait_leader(timeout=60)
    except AssertionError as exc:
        handle.stop()
        pytest.fail(str(exc))
    yield handle
    handle.stop()
    if os.environ.get("TANDEM_SHOW_OPERATOR_LOG"):
        print(handle.log_text())
