"""Fixtures for the chaos e2e modules: a namespace for the module, and `tandem operator` as a local
process the tests may kill -9 and restart (`RestartableOperator`), watching that namespace only.

Compressed settings, stated here: resync every 10 s, a leader lease of 10 s (the default is 30 s;
a follower takes over a lease that was not renewed for that long), the autoscaler reading the dev
cluster's Prometheus (which scrapes the pods every 2 s).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import RestartableOperator, leading_operator, scratch_namespace

RESYNC_SECONDS = 10
LEASE_SECONDS = 10


@pytest.fixture(scope="module")
def chaos_namespace(cluster: ClusterHandle, request: pytest.FixtureRequest) -> Iterator[str]:
    """One namespace for the whole module, deleted after it."""
    stem = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")[:30]
    with scratch_namespace(cluster, f"chaos-{stem}-{uuid.uuid4().hex[:6]}") as name:
        yield name


def operator_args(cluster: ClusterHandle, namespace: str, lease: str) -> list[str]:
    """The flags of every operator process of a chaos module (a standby replica uses the same)."""
    return [
        "--namespace",
        namespace,
        "--resync-seconds",
        str(RESYNC_SECONDS),
        "--lease-namespace",
        namespace,
        "--lease-name",
        lease,
        "--lease-duration-seconds",
        str(LEASE_SECONDS),
        "--prometheus-url",
        cluster.prometheus_url,
    ]


@pytest.fixture(scope="module")
def chaos_operator(
    cluster: ClusterHandle, crd: None, chaos_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RestartableOperator]:
    """The operator for the module's namespace, with a fixed identity (`crash_and_restart`)."""
    handle = RestartableOperator(
        cluster,
        operator_args(cluster, chaos_namespace, "tandem-chaos"),
        tmp_path_factory.mktemp("chaos-operator"),
    )
    with leading_operator(handle, timeout=90):
        yield handle
