"""Thin helpers over the `kubernetes` client for the dev cluster (nodes, readiness checks).

Objects are read as plain JSON dicts (camelCase, as the API sends them) to keep types simple.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tandem.api import meta


def client_from(kubeconfig: Path) -> client.ApiClient:
    """A new ApiClient for `kubeconfig` (the caller closes it with `close(api)`)."""
    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    return cast(client.ApiClient, api)


def close(api: client.ApiClient) -> None:
    api.close()  # type: ignore[no-untyped-call]


def raw(response: Any) -> dict[str, Any]:
    """The JSON body of a call made with `_preload_content=False`."""
    return cast(dict[str, Any], json.loads(response.data))


def create_or_keep_node(api: client.ApiClient, node: dict[str, Any]) -> None:
    """Creates a Node with its labels, capacity and pod CIDR; an existing node is left as it is."""
    try:
        client.CoreV1Api(api).create_node(node)  # type: ignore[arg-type]
    except ApiException as e:
        if e.status != 409:
            raise


def apply_crd(api: client.ApiClient, crd: dict[str, Any], *, timeout: float = 60) -> None:
    """Creates a CustomResourceDefinition (unless it exists) and waits until it is Established."""
    ext = client.ApiextensionsV1Api(api)
    name = crd["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(crd)  # type: ignore[arg-type]
    except ApiException as e:
        if e.status != 409:
            raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        obj = raw(ext.read_custom_resource_definition(name, _preload_content=False))
        conditions = (obj.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s")


def create_or_keep_admission_policy(api: client.ApiClient, objects: list[dict[str, Any]]) -> None:
    """Creates MutatingAdmissionPolicies and their bindings (admissionregistration.k8s.io/v1) unless
    they exist."""
    adm = client.AdmissionregistrationV1Api(api)
    for obj in objects:
        create = (
            adm.create_mutating_admission_policy
            if obj["kind"] == "MutatingAdmissionPolicy"
            else adm.create_mutating_admission_policy_binding
        )
        try:
            create(obj)  # type: ignore[arg-type]  # a plain dict is what the API receives
        except ApiException as e:
            if e.status != 409:
                raise


def list_nodes(api: client.ApiClient) -> list[dict[str, Any]]:
    resp = client.CoreV1Api(api).list_node(_preload_content=False)
    return cast(list[dict[str, Any]], raw(resp)["items"])


def is_ready(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ready_pod_ips(api: client.ApiClient, namespace: str, pdd_name: str, role: str) -> list[str]:
    """Sorted IPs of the Ready pods of one role (a pool or the router) of a PDDeployment."""
    selector = f"{meta.LABEL_PDD}={pdd_name},{meta.LABEL_ROLE}={role}"
    core = client.CoreV1Api(api)
    pods = raw(core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False))["items"]
    return sorted(p["status"]["podIP"] for p in pods if is_ready(p) and p["status"].get("podIP"))


def nodes_ready(api: client.ApiClient, names: list[str]) -> bool:
    ready = {n["metadata"]["name"] for n in list_nodes(api) if is_ready(n)}
    return set(names) <= ready


def has_service_account(api: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        client.CoreV1Api(api).read_namespaced_service_account(name, namespace, _preload_content=False)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def node_summary(api: client.ApiClient) -> list[dict[str, Any]]:
    out = []
    for node in list_nodes(api):
        labels = node["metadata"].get("labels") or {}
        alloc = (node.get("status") or {}).get("allocatable") or {}
        out.append(
            {
                "name": node["metadata"]["name"],
                "ready": is_ready(node),
                "podCIDR": (node.get("spec") or {}).get("podCIDR", ""),
                "gpus": alloc.get("nvidia.com/gpu", "0"),
                "rdma": alloc.get("rdma/hca", "0"),
                "fabric": labels.get("network.tandem.dev/fabric", ""),
                "product": labels.get("nvidia.com/gpu.product", ""),
            }
        )
    return out
