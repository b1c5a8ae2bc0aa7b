"""Fixtures for operator tests: one `tandem operator` process, or one the autoscaling tests can crash
and restart (the CRD fixture is shared)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess, RestartableOperator, leading_operator


# Module scope: a cluster-wide operator must be gone before other tests run operators of their own
# (chart, GitOps), or two would reconcile the same PDDeployment.
@pytest.fixture(scope="module")
def operator(
    cluster: ClusterHandle, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """`tandem operator` watching all namespaces, with a short resync so tests see several."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    handle = OperatorProcess(cluster, ["--resync-seconds", "20", "--lease-namespace", "default"], log)
    with leading_operator(handle, timeout=60):
        yield handle


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
    with leading_operator(handle, timeout=60):
        yield handle
