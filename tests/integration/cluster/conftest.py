"""Fixtures for the dev cluster's own smoke tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle


@pytest.fixture
def core(cluster: ClusterHandle) -> Iterator[client.CoreV1Api]:
    api = cluster.api_client()
    yield client.CoreV1Api(api)
    kube.close(api)
