"""Fixtures of the rollout e2e tests: one operator (restartable: a test kills it -9 mid-rollout) and a
namespace kept for the whole module."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import (
    RestartableOperator,
    e2e_operator_args,
    leading_operator,
    scratch_namespace,
)


@pytest.fixture(scope="module")
def operator(
    cluster: ClusterHandle, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RestartableOperator]:
    lease = f"tandem-rollout-e2e-{uuid.uuid4().hex[:6]}"
    args = e2e_operator_args(cluster, lease)
    op = RestartableOperator(
        cluster, args, tmp_path_factory.mktemp("rollout-operator"), identity="rollout-e2e"
    )
    try:
        with leading_operator(op, timeout=90):
            yield op
    finally:
        cluster.kubectl("delete", "lease", lease, "-n", "default", check=False)


@pytest.fixture(scope="module")
def module_namespace(cluster: ClusterHandle) -> Iterator[str]:
    with scratch_namespace(cluster, f"t-rollout-{uuid.uuid4().hex[:6]}") as name:
        yield name
