"""Fixtures of the autoscaling e2e tests: two operators on one lease (a leader that a test can kill -9
and restart, and a standby for the fail-over), and a namespace kept for the whole module."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import (
    OperatorProcess,
    RestartableOperator,
    e2e_operator_args,
    scratch_namespace,
)


@dataclass
class Operators:
    """`leader` (identity e2e-a: `crash_and_restart` keeps it the leader) and `standby` (e2e-b), which
    leads once e2e-a is killed and its lease lapses (30 s)."""

    leader: RestartableOperator
    standby: OperatorProcess

    def log_text(self) -> str:
        return self.leader.log_text() + f"--- standby\n{self.standby.log_text()}"


@pytest.fixture(scope="module")
def operators(
    cluster: ClusterHandle, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operators]:
    lease = f"tandem-autoscale-e2e-{uuid.uuid4().hex[:6]}"
    args = e2e_operator_args(cluster, lease)
    logs = tmp_path_factory.mktemp("autoscale-operators")
    leader = RestartableOperator(cluster, args, logs, identity="e2e-a")
    try:
        leader.current.wait_leader(timeout=90)
    except AssertionError as exc:
        leader.stop()
        pytest.fail(str(exc))
    # Started once e2e-a leads, so it follows: it leads only when e2e-a's lease lapses.
    standby = OperatorProcess(cluster, [*args, "--identity", "e2e-b"], logs / "standby.log")
    try:
        yield Operators(leader, standby)
    finally:
        if os.environ.get("TANDEM_SHOW_OPERATOR_LOG"):
            print(leader.log_text(), standby.log_text())
        leader.stop()
        standby.stop()
        cluster.kubectl("delete", "lease", lease, "-n", "default", check=False)


@pytest.fixture(scope="module")
def module_namespace(cluster: ClusterHandle) -> Iterator[str]:
    """A namespace for the module's PDDeployments, deleted at its end."""
    with scratch_namespace(cluster, f"t-autoscale-{uuid.uuid4().hex[:6]}") as name:
        yield name
