"""A fleet of fake GPU nodes for scale runs: copies of the first `e2e/nodes/h100.yaml` node.

Node i is `fleet-h100-<i>` with the pod CIDR 127.<octet>.<16 + i // 16>.<(i % 16) * 16>/28 (16
loopback addresses, more than the pods a node takes here), clear of the e2e nodes'
127.<octet>.1-7.0/24 and KWOK's fallback 127.<octet>.250.0/24. KWOK manages them (label
`type: kwok`) like the e2e nodes; `tandem.dev/fleet: "true"` tells them apart.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tandem.devcluster import kube, layout

FLEET_LABEL = "tandem.dev/fleet"
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "CREATE", "UPDATE"})
# What the operator writes: PDDeployments (status), their children, Events.
OPERATOR_RESOURCES = frozenset(
    {
        "pddeployments", "statefulsets", "deployments", "services", "poddisruptionbudgets",
        "serviceaccounts", "roles", "rolebindings", "networkpolicies", "events",
    }
)  # fmt: skip
# What the operator reads: PDDeployments, their children, their pods, the Secrets a spec names.
OPERATOR_READS = (OPERATOR_RESOURCES - {"events"}) | {"pods", "secrets"}
READ_VERBS = frozenset({"GET", "LIST"})
MAX_NODES = (250 - 16) * 16


def fleet_cidr(index: int, octet: int) -> str:
    return f"127.{octet}.{16 + index // 16}.{(index % 16) * 16}/28"


def fleet_nodes(count: int, octet: int, taint: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """`count` fake 8-GPU nodes (no RDMA), optionally tainted (`{"key", "value", "effect"}`)."""
    if not 0 <= count <= MAX_NODES:
        raise ValueError(f"a fleet has 0 to {MAX_NODES} nodes, not {count}")
    template = next(d for d in yaml.safe_load_all((layout.NODES_DIR / "h100.yaml").read_text()) if d)
    nodes = []
    for i in range(count):
        node = copy.deepcopy(template)
        name = f"fleet-h100-{i}"
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        node["metadata"]["labels"][FLEET_LABEL] = "true"
        cidr = fleet_cidr(i, octet)
        node["spec"] = {"podCIDR": cidr, "podCIDRs": [cidr]}
        if taint is not None:
            node["spec"]["taints"] = [taint]
        node["status"]["addresses"] = [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": name},
        ]
        nodes.append(node)
    return nodes


def create(api: client.ApiClient, nodes: list[dict[str, Any]], parallel: int = 8) -> None:
    """Creates the nodes (existing ones are kept), `parallel` requests at a time."""
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for future in [pool.submit(kube.create_or_keep_node, api, node) for node in nodes]:
            future.result()


def schedulable(node: dict[str, Any]) -> bool:
    """Ready, and the node lifecycle controller has taken its `node.kubernetes.io/*` taints off."""
    taints = (node.get("spec") or {}).get("taints") or []
    return kube.is_ready(node) and not any(t["key"].startswith("node.kubernetes.io/") for t in taints)


def untaint(api: client.ApiClient, parallel: int = 8) -> int:
    """Takes the `node.kubernetes.io/not-ready` taint off Ready fleet nodes that still carry it.

    The apiserver taints every new node, and the node lifecycle controller lifts the taint only a
    few nodes a second (minutes for a thousand); KWOK has made these Ready, so the taint is stale.
    Returns how many nodes were patched.
    """
    stale = [
        node
        for node in kube.list_nodes(api)
        if (node["metadata"].get("labels") or {}).get(FLEET_LABEL) == "true"
        and kube.is_ready(node)
        and not schedulable(node)
    ]
    core = client.CoreV1Api(api)

    def patch(node: dict[str, Any]) -> None:
        taints = [
            t for t in node["spec"].get("taints") or [] if not t["key"].startswith("node.kubernetes.io/")
        ]
        core.patch_node(node["metadata"]["name"], {"spec": {"taints": taints}})

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for future in [pool.submit(patch, node) for node in stale]:
            future.result()
    return len(stale)


def registered_count(api: client.ApiClient) -> int:
    """Fleet nodes the node controller has posted its `RegisteredNode` Event for. It posts them
    rate-limited, minutes after the nodes for a thousand: a steady-state count of writes waits
    for them all, or counts them as the operator's."""
    resp = client.CoreV1Api(api).list_namespaced_event(
        "default", field_selector="reason=RegisteredNode", _preload_content=False
    )
    return sum(
        1
        for event in kube.raw(resp)["items"]
        if str((event.get("involvedObject") or {}).get("name", "")).startswith("fleet-h100-")
    )


def ready_count(api: client.ApiClient) -> int:
    """Fleet nodes that take pods: KWOK made them Ready and their not-ready taints are gone."""
    return sum(
        1
        for node in kube.list_nodes(api)
        if (node["metadata"].get("labels") or {}).get(FLEET_LABEL) == "true" and schedulable(node)
    )


def pddeployment(name: str, namespace: str) -> dict[str, Any]:
    """A small vLLM P/D deployment for scale runs: one prefill and one decode replica (TP1, KV over
    TCP: the fleet has no RDMA devices) and one router; 12 child objects."""
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "tiny", "uri": "hf://example/tiny"},
            "engine": {"type": "vllm", "image": "vllm/vllm-openai:v0.33.0"},
            "prefill": {"replicas": 1, "tensorParallelSize": 1},
            "decode": {"replicas": 1, "tensorParallelSize": 1},
            "router": {"replicas": 1},
            "serving": {"mode": "Disaggregated"},
            "network": {"rdma": {"enabled": False}},
        },
    }


def apiserver_requests(metrics_text: str, verbs: frozenset[str], resources: frozenset[str]) -> Counter[str]:
    """Requests an apiserver served (its own `apiserver_request_total`, every client: the metric has
    no user-agent label), by verb and resource[/subresource], for `verbs` and `resources`."""
    totals: Counter[str] = Counter()
    for line in metrics_text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if labels.get("verb") in verbs and labels.get("resource") in resources:
                sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
                totals[f"{labels['verb']} {labels['resource']}{sub}"] += int(float(line.rsplit(" ", 1)[1]))
    return totals


def apiserver_writes(metrics_text: str, resources: frozenset[str] = OPERATOR_RESOURCES) -> Counter[str]:
    """Write requests an apiserver served for `resources` (every client)."""
    return apiserver_requests(metrics_text, WRITE_VERBS, resources)


def apiserver_reads(metrics_text: str, resources: frozenset[str] = OPERATOR_READS) -> Counter[str]:
    """GET and LIST requests an apiserver served for `resources` (every client; watches apart)."""
    return apiserver_requests(metrics_text, READ_VERBS, resources)


def audit_offset(path: Path) -> int:
    """Where an audit log ends now: the start of a window for `audit_requests`."""
    return path.stat().st_size if path.exists() else 0


def audit_events(path: Path, offset: int) -> Iterator[dict[str, Any]]:
    """The events of an apiserver's audit log (`devcluster.up(audit=True)`) after byte `offset`."""
    if not path.exists():
        return
    with path.open("rb") as log:
        log.seek(offset)
        for line in log:
            try:
                event = json.loads(line)
            except ValueError:  # a line being written
                continue
            if isinstance(event, dict):
                yield event


def audit_requests(path: Path, offset: int, user_agent: str) -> Counter[str]:
    """Requests in an apiserver's audit log after byte `offset`, by clients whose user agent starts
    with `user_agent`: "verb resource[/subresource]" -> count."""
    totals: Counter[str] = Counter()
    for event in audit_events(path, offset):
        if not str(event.get("userAgent", "")).startswith(user_agent):
            continue
        ref = event.get("objectRef") or {}
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        totals[f"{event.get('verb', '')} {ref.get('resource', '')}{sub}"] += 1
    return totals
