"""Pure parts of the scale setup: fleet nodes and their CIDRs, KWOK-only stages, request paths."""

from __future__ import annotations

import ipaddress
import itertools

import pytest
import yaml

from tandem.devcluster import fleet, layout
from tandem.devcluster.cluster import kwok_only_stages
from tandem.kube.rest import resource_of


def test_fleet_nodes_have_disjoint_loopback_cidrs_clear_of_the_e2e_nodes() -> None:
    nodes = fleet.fleet_nodes(1000, octet=21)
    nets = [ipaddress.ip_network(n["spec"]["podCIDR"]) for n in nodes]
    assert len({n["metadata"]["name"] for n in nodes}) == 1000
    assert all(net.subnet_of(ipaddress.ip_network("127.21.0.0/16")) for net in nets)
    assert all(not a.overlaps(b) for a, b in itertools.pairwise(nets))
    assert len(set(nets)) == 1000
    reserved = [ipaddress.ip_network(f"127.21.{i}.0/24") for i in (*range(0, 8), 250)]
    assert not any(net.overlaps(r) for net in nets for r in reserved)
    assert nodes[7]["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert nodes[7]["metadata"]["labels"][fleet.FLEET_LABEL] == "true"
    assert nodes[7]["metadata"]["labels"]["type"] == "kwok"


def test_fleet_size_is_bounded() -> None:
    with pytest.raises(ValueError, match="fleet"):
        fleet.fleet_nodes(fleet.MAX_NODES + 1, octet=20)


def test_kwok_only_stages_drop_tandems_own() -> None:
    text = layout.KWOK_STAGES.read_text()
    full = [d["metadata"]["name"] for d in yaml.safe_load_all(text) if d]
    kept = [d["metadata"]["name"] for d in yaml.safe_load_all(kwok_only_stages(text)) if d]
    assert {"tandem-pod-start", "tandem-pod-delete"} <= set(full)
    assert kept == [n for n in full if not n.startswith("tandem-")]
    assert "pod-ready" in kept


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/apis/apps/v1/namespaces/ns/statefulsets/x", "statefulsets"),
        ("/apis/tandem.dev/v1alpha1/namespaces/ns/pddeployments/x/status", "pddeployments/status"),
        ("/api/v1/namespaces/ns/pods", "pods"),
        ("/api/v1/pods", "pods"),
        ("/apis/tandem.dev/v1alpha1/pddeployments", "pddeployments"),
        ("/api/v1/namespaces/ns", "namespaces"),
        ("/apis/leaderworkerset.x-k8s.io/v1", "discovery"),
        ("/api/v1", "discovery"),
    ],
)
def test_resource_of(path: str, resource: str) -> None:
    assert resource_of(path) == resource


def test_apiserver_writes_counts_write_verbs_of_the_operators_kinds() -> None:
    text = "\n".join(
        [
            'apiserver_request_total{code="200",resource="statefulsets",verb="APPLY"} 3',
            'apiserver_request_total{code="200",resource="pddeployments",subresource="status",'
            'verb="PATCH"} 2',
            'apiserver_request_total{code="200",resource="statefulsets",verb="LIST"} 50',
            'apiserver_request_total{code="200",resource="leases",verb="PUT"} 9',
        ]
    )
    assert fleet.apiserver_writes(text) == {"APPLY statefulsets": 3, "PATCH pddeployments/status": 2}
