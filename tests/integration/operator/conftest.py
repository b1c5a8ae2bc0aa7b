"""Fixtures for operator tests: one `tandem operator` process (the CRD fixture is shared)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess


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
