"""The pod template of an engine pool: container, resources, volumes, scheduling and lifecycle.

Pure. GPUs per pod equal the pool's tensor parallel size; P/D pools on RDMA also get the RDMA
device resource, `IPC_LOCK` (RDMA registers pinned memory), required node affinity to RDMA nodes and
a preferred affinity to the other P/D pool within `spec.network.topologyKey`, so KV moves inside
one fabric domain when there is room. Simulator pods (`engine.type: sim`) request no GPU or RDMA
device, so they run on any CPU node, unless `engine.sim.requestAccelerators` asks for them (the dev
cluster's fake GPU/RDMA nodes).
"""

from __future__ import annotations

from typing import Any

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import EngineType, KVConnector, PDDeployment, Quantity
from tandem.api.rules import GPU_RESOURCE
from tandem.api.status import RevisionRecord
from tandem.render import command as engine_cmd
from tandem.render import env, lifecycle, model_source, names

CONTAINER_NAME = "engine"
SHM_VOLUME = "dshm"
PEER_ROLE: dict[Role, Role] = {"prefill": "decode", "decode": "prefill"}
PEER_AFFINITY_WEIGHT = 100
GPU_TOLERATION: dict[str, Any] = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def _quantities(values: dict[str, Quantity]) -> dict[str, str]:
    # The apiserver returns quantities as strings; render them so to compare equal.
    return {key: str(value) for key, value in values.items()}


def requests_accelerators(pdd: PDDeployment) -> bool:
    """vLLM pods always request GPUs (and RDMA); sim pods only with `engine.sim.requestAccelerators`."""
    engine = pdd.spec.engine
    if engine.type is not EngineType.sim:
        return True
    return engine.sim is not None and engine.sim.request_accelerators


def uses_rdma(pdd: PDDeployment, role: Role) -> bool:
    return engine_cmd.is_disaggregated(role) and pdd.spec.network.rdma.enabled and requests_accelerators(pdd)


def resources(pdd: PDDeployment, role: Role) -> dict[str, Any]:
    pool = pdd.spec.pool(role)
    devices = {GPU_RESOURCE: str(pool.tensor_parallel_size)} if requests_accelerators(pdd) else {}
    if uses_rdma(pdd, role):
        rdma = pdd.spec.network.rdma
        devices[rdma.resource_name] = str(rdma.per_pod)
    # Extended resources cannot be overcommitted: requests must equal limits.
    return {
        "requests": {**_quantities(pool.resources.requests), **devices},
        "limits": {**_quantities(pool.resources.limits), **devices},
    }


def ports(pdd: PDDeployment, role: Role) -> list[dict[str, Any]]:
    result = [{"name": "http", "containerPort": meta.ENGINE_PORT, "protocol": "TCP"}]
    if not engine_cmd.is_disaggregated(role):
        return result
    connector = pdd.spec.kv_transfer.connector
    if connector is KVConnector.NixlConnector:
        result.append({"name": "nixl", "containerPort": meta.NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"})
    elif connector is KVConnector.MooncakeConnector and role == "prefill":
        result.append({"name": "mooncake", "containerPort": env.MOONCAKE_BOOTSTRAP_PORT, "protocol": "TCP"})
    elif connector is KVConnector.LMCacheConnectorV1 and role == "decode":
        result += [
            {"name": "lmcache-init", "containerPort": env.LMCACHE_PEER_INIT_PORT, "protocol": "TCP"},
            {"name": "lmcache-alloc", "containerPort": env.LMCACHE_PEER_ALLOC_PORT, "protocol": "TCP"},
        ]
    return result


def affinity(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {}
    rdma_nodes = pdd.spec.network.rdma.node_selector
    if uses_rdma(pdd, role) and rdma_nodes:
        expressions = [
            {"key": key, "operator": "In", "values": [value]} for key, value in sorted(rdma_nodes.items())
        ]
        result["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": expressions}]
            }
        }
    peer = PEER_ROLE.get(role)
    if peer is not None:
        result["podAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": PEER_AFFINITY_WEIGHT,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": names.selector(pdd, peer, revision)},
                        "topologyKey": pdd.spec.network.topology_key,
                    },
                }
            ]
        }
    return result


def tolerations(pdd: PDDeployment, role: Role) -> list[dict[str, Any]]:
    given = [t.model_dump(by_alias=True, exclude_none=True) for t in pdd.spec.pool(role).tolerations]
    if not requests_accelerators(pdd):  # a CPU pod has no business on a GPU node's taint
        return given
    return given if GPU_TOLERATION in given else [*given, GPU_TOLERATION]


def _volumes(pdd: PDDeployment, role: Role) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tp = pdd.spec.pool(role).tensor_parallel_size
    volumes: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": lifecycle.shm_size(tp)}}
    ]
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    source = model_source.parse(pdd.spec.model.uri)
    if source.claim is not None and source.mount_path is not None:
        volumes.append(
            {
                "name": model_source.MODEL_VOLUME,
                "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True},
            }
        )
        mounts.append({"name": model_source.MODEL_VOLUME, "mountPath": source.mount_path, "readOnly": True})
    return volumes, mounts


def container(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> dict[str, Any]:
    spec = pdd.spec
    _, mounts = _volumes(pdd, role)
    source = model_source.parse(spec.model.uri)
    result: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": engine_cmd.engine_command(pdd, role),
        "env": env.engine_env(pdd, role, revision),
        "ports": ports(pdd, role),
        "resources": resources(pdd, role),
        "volumeMounts": mounts,
        "lifecycle": {"preStop": {"sleep": {"seconds": lifecycle.prestop_seconds(role)}}},
        # vLLM writes no termination message: a container that fails shows the end of its log (its own
        # error line) in lastState.terminated.message, which the status's CrashLoopBackOff quotes.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **lifecycle.engine_probes(spec.pool(role).tensor_parallel_size, downloads=source.downloads),
    }
    if uses_rdma(pdd, role):
        result["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return result


def pod_template(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> dict[str, Any]:
    spec = pdd.spec
    pool = spec.pool(role)
    volumes, _ = _volumes(pdd, role)
    pod_spec: dict[str, Any] = {
        # Service env vars would collide with vLLM's own VLLM_* settings (e.g. a Service named "vllm"
        # injects VLLM_PORT); nothing here discovers peers through them.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": lifecycle.termination_grace_seconds(
            role, drain_seconds=engine_cmd.shutdown_timeout(pdd, role)
        ),
    }
    if spec.engine.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in spec.engine.image_pull_secrets]
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    pod_affinity = affinity(pdd, role, revision)
    if pod_affinity:
        pod_spec["affinity"] = pod_affinity
    pod_tolerations = tolerations(pdd, role)
    if pod_tolerations:
        pod_spec["tolerations"] = pod_tolerations
    pod_spec["containers"] = [container(pdd, role, revision)]
    pod_spec["volumes"] = volumes
    return {
        "metadata": {
            "labels": names.labels(pdd, role, revision),
            "annotations": names.scrape_annotations(meta.ENGINE_PORT, "/metrics"),
        },
        "spec": pod_spec,
    }
