"""The pod template of an engine pool: container, resources, volumes, scheduling and lifecycle.

Pure. GPUs per pod are a replica's GPUs (TP x PP x DP) over its pods (`tandem.api.shape`): the
tensor parallel size for a plain pool. A multi-node replica's pods are the `member`s of a
LeaderWorkerSet group (`command.Member`): the leader carries the startup and liveness probes (a dead
rank makes the group's engines fail, the leader's /health with them, and LeaderWorkerSet recreates
the whole group), workers that serve the API (Hybrid, External, MultiPortExternal) a readiness
probe, headless workers none; with MultiPortExternal the probes ask the pod's supervisor. P/D pools
on RDMA also get the RDMA
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
from tandem.api.models import DataParallelLoadBalancing, EngineType, KVConnector, PDDeployment, Quantity
from tandem.api.rules import GPU_PRODUCT_LABEL, GPU_RESOURCE
from tandem.api.status import RevisionRecord
from tandem.render import command as engine_cmd
from tandem.render import env, lifecycle, model_source, names
from tandem.render.command import Member

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
    devices = {GPU_RESOURCE: str(pool.shape.gpus_per_pod)} if requests_accelerators(pdd) else {}
    if uses_rdma(pdd, role):
        rdma = pdd.spec.network.rdma
        devices[rdma.resource_name] = str(rdma.per_pod)
    # Extended resources cannot be overcommitted: requests must equal limits.
    return {
        "requests": {**_quantities(pool.resources.requests), **devices},
        "limits": {**_quantities(pool.resources.limits), **devices},
    }


def serves(pdd: PDDeployment, role: Role, member: Member = "single") -> bool:
    """Whether this member's pod serves the OpenAI API (and /metrics): all but headless workers."""
    return member != "worker" or pdd.spec.pool(role).shape.workers_serve


def _port(name: str, number: int) -> dict[str, Any]:
    return {"name": name, "containerPort": number, "protocol": "TCP"}


def _group_ports(pdd: PDDeployment, role: Role, member: Member) -> list[dict[str, Any]]:
    """The ports of a data-parallel or multi-node replica beyond the first API port and the KV's."""
    shape = pdd.spec.pool(role).shape
    result: list[dict[str, Any]] = []
    if shape.ports_per_pod > 1 and serves(pdd, role, member):  # MultiPortExternal: a port per local rank
        result += [_port(meta.api_port_name(i), meta.ENGINE_PORT + i) for i in range(1, shape.ports_per_pod)]
    if shape.data > 1 and shape.load_balancing == DataParallelLoadBalancing.MultiPortExternal.value:
        result.append(_port("supervisor", meta.DP_SUPERVISOR_PORT))
    if shape.multi_node and member != "worker":
        result.append(_port("master", meta.MASTER_PORT))
        if shape.data > 1:
            result.append(_port("dp-rpc", meta.DP_RPC_PORT))
    return result


def ports(pdd: PDDeployment, role: Role, member: Member = "single") -> list[dict[str, Any]]:
    """The container's named ports. A NIXL side channel listens on 5600 + the global data-parallel rank
    of each of the pod's ranks; the named one is rank 0's (the NetworkPolicy admits the whole range)."""
    result = [_port(meta.api_port_name(0), meta.ENGINE_PORT)] if serves(pdd, role, member) else []
    result += _group_ports(pdd, role, member)
    if not engine_cmd.is_disaggregated(role) or member == "worker":
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
    gpus = pdd.spec.pool(role).shape.gpus_per_pod
    volumes: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": lifecycle.shm_size(gpus)}}
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


def probes(pdd: PDDeployment, role: Role, member: Member = "single") -> dict[str, dict[str, Any]]:
    """The member's probes: all three on the only pod or the leader, readiness alone on a worker that
    serves the API, none on a headless worker. MultiPortExternal pods are asked through their
    supervisor (its /health is up when every local rank's server is)."""
    pool = pdd.spec.pool(role)
    shape = pool.shape
    supervised = shape.data > 1 and shape.load_balancing == DataParallelLoadBalancing.MultiPortExternal.value
    port = "supervisor" if supervised else "http"
    if member == "worker":
        return {"readinessProbe": lifecycle.readiness_probe(port)} if serves(pdd, role, member) else {}
    downloads = model_source.parse(pdd.spec.model.uri).downloads
    return lifecycle.engine_probes(shape.gpus_per_instance, downloads=downloads, port=port)


def container(
    pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None, member: Member = "single"
) -> dict[str, Any]:
    spec = pdd.spec
    _, mounts = _volumes(pdd, role)
    result: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": engine_cmd.engine_command(pdd, role, member),
        "env": env.engine_env(pdd, role, revision),
        "ports": ports(pdd, role, member),  # none on a headless worker of a multi-node TP/PP group
        "resources": resources(pdd, role),
        "volumeMounts": mounts,
        "lifecycle": {"preStop": {"sleep": {"seconds": lifecycle.prestop_seconds(role)}}},
        # vLLM writes no termination message: a container that fails shows the end of its log (its own
        # error line) in lastState.terminated.message, which the status's CrashLoopBackOff quotes.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **probes(pdd, role, member),
    }
    if not result["ports"]:  # the apiserver drops an empty list: leave it out to compare equal
        del result["ports"]
    if uses_rdma(pdd, role):
        result["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return result


def node_selector(pdd: PDDeployment, role: Role) -> dict[str, str]:
    """The pool's nodeSelector, with GPU Feature Discovery's product label when `gpuType` is set."""
    pool = pdd.spec.pool(role)
    selector = dict(pool.node_selector)
    if pool.gpu_type is not None:
        selector[GPU_PRODUCT_LABEL] = pool.gpu_type
    return selector


def gang_scheduled(pdd: PDDeployment, role: Role) -> bool:
    """The pool's groups are placed by Kubernetes' own gang scheduling (a PodGroup per group)."""
    placement = pdd.spec.pool(role).group_placement
    return placement is not None and placement.gang_scheduling is not None


def pod_template(
    pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None, member: Member = "single"
) -> dict[str, Any]:
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
    if pool.group_placement is not None and pool.group_placement.scheduler_name is not None:
        pod_spec["schedulerName"] = pool.group_placement.scheduler_name
    selector = node_selector(pdd, role)
    if selector:
        pod_spec["nodeSelector"] = selector
    pod_affinity = affinity(pdd, role, revision)
    if pod_affinity:
        pod_spec["affinity"] = pod_affinity
    pod_tolerations = tolerations(pdd, role)
    if pod_tolerations:
        pod_spec["tolerations"] = pod_tolerations
    pod_spec["containers"] = [container(pdd, role, revision, member)]
    pod_spec["volumes"] = volumes
    metadata: dict[str, Any] = {"labels": names.labels(pdd, role, revision)}
    if member != "single" and gang_scheduled(pdd, role):
        metadata["labels"][meta.LABEL_POD_GROUP_MEMBER] = member
    if serves(pdd, role, member):  # a headless worker has no /metrics to scrape
        metadata["annotations"] = names.scrape_annotations(meta.ENGINE_PORT, "/metrics")
    return {"metadata": metadata, "spec": pod_spec}
