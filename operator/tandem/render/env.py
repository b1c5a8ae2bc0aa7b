"""Environment of the engine container: downward API, KV-connector settings, UCX, secrets, sim knobs.

Pure. `spec.engine.env` comes last and replaces a tandem variable of the same name (the apiserver
refuses two entries with one name under server-side apply), so every default here is overridable.

UCX (used by NIXL, and by LMCache's NIXL channel): with RDMA, `rc` (RDMA reliable connection),
`ud` (its connection set-up), `sm`/`self` (same host) and `cuda_copy` (GPU memory detection);
`cuda_ipc` is left out because GPU IPC cannot cross pod boundaries. Without RDMA NIXL falls back to
TCP. `UCX_NET_DEVICES=all` is UCX's own default, rendered so that the knob is visible; set it to
e.g. `mlx5_0:1` (and `UCX_IB_GID_INDEX` on RoCE) through `spec.engine.env`.
"""

from __future__ import annotations

from typing import Any

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import EngineType, EnvVar, KVConnector, PDDeployment
from tandem.api.status import RevisionRecord
from tandem.perf import profile_gpu
from tandem.render import names
from tandem.render.command import is_disaggregated

SERVING_REVISION_ENV = "TANDEM_SERVING_REVISION"

UCX_TLS_RDMA = "rc,ud,sm,self,cuda_copy"
UCX_TLS_TCP = "tcp,sm,self,cuda_copy"
UCX_NET_DEVICES = "all"

MOONCAKE_BOOTSTRAP_PORT = 8998  # vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default; prefill only

# LMCache's P/D transfer over NIXL (vLLM's disagg_prefill_lmcache_v1 example): buffers of 1 GiB on
# the sender and 2 GiB on the receiver; the receiver listens on the init/alloc ports.
LMCACHE_PEER_INIT_PORT = 7300
LMCACHE_PEER_ALLOC_PORT = 7400
LMCACHE_BUFFER_BYTES: dict[Role, int] = {"prefill": 1 << 30, "decode": 2 << 30}


def _value(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _ucx(pdd: PDDeployment) -> list[dict[str, Any]]:
    tls = UCX_TLS_RDMA if pdd.spec.network.rdma.enabled else UCX_TLS_TCP
    return [_value("UCX_TLS", tls), _value("UCX_NET_DEVICES", UCX_NET_DEVICES)]


def _connector_env(pdd: PDDeployment, role: Role) -> list[dict[str, Any]]:
    connector = pdd.spec.kv_transfer.connector
    if connector is KVConnector.NixlConnector:
        return [
            _value("VLLM_NIXL_SIDE_CHANNEL_HOST", "$(POD_IP)"),
            _value("VLLM_NIXL_SIDE_CHANNEL_PORT", str(meta.NIXL_SIDE_CHANNEL_PORT)),
            *_ucx(pdd),
        ]
    if connector is KVConnector.MooncakeConnector:
        return (
            [_value("VLLM_MOONCAKE_BOOTSTRAP_PORT", str(MOONCAKE_BOOTSTRAP_PORT))]
            if role == "prefill"
            else []
        )
    env = [
        _value("LMCACHE_USE_EXPERIMENTAL", "True"),
        _value("LMCACHE_ENABLE_PD", "True"),
        _value("LMCACHE_TRANSFER_CHANNEL", "nixl"),
        _value("LMCACHE_PD_ROLE", "sender" if role == "prefill" else "receiver"),
        _value("LMCACHE_PD_BUFFER_DEVICE", "cuda"),
        _value("LMCACHE_PD_BUFFER_SIZE", str(LMCACHE_BUFFER_BYTES[role])),
        # Prefix hashes must agree between P and D.
        _value("PYTHONHASHSEED", "0"),
    ]
    if role == "decode":
        env += [
            _value("LMCACHE_PD_PEER_HOST", "$(POD_IP)"),
            _value("LMCACHE_PD_PEER_INIT_PORT", str(LMCACHE_PEER_INIT_PORT)),
            _value("LMCACHE_PD_PEER_ALLOC_PORT", str(LMCACHE_PEER_ALLOC_PORT)),
        ]
    return [*env, *_ucx(pdd)]


def _user_env(entries: list[EnvVar]) -> list[dict[str, Any]]:
    """The user's entries; of two with one name the later wins, as it would in the container."""
    by_name = {entry.name: entry.model_dump(by_alias=True, exclude_none=True) for entry in entries}
    return list(by_name.values())


def engine_env(pdd: PDDeployment, role: Role, revision: RevisionRecord | None = None) -> list[dict[str, Any]]:
    spec = pdd.spec
    env = [
        _field("POD_IP", "status.podIP"),
        _field("POD_NAME", "metadata.name"),
        _field("POD_NAMESPACE", "metadata.namespace"),
    ]
    if is_disaggregated(role):
        env += _connector_env(pdd, role)
    token = spec.model.token_secret_ref
    if token is not None:
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}}
        )
    if spec.engine.type is EngineType.sim:
        env.append(_value("TANDEM_SIM_KV_BANDWIDTH_GBPS", str(spec.kv_transfer.bandwidth_gbps)))
        gpu_type = spec.pool(role).gpu_type
        gpu = profile_gpu(gpu_type) if gpu_type is not None else None
        if gpu is not None:  # the pool's GPU type is the profile its engines run (and are sized with)
            env.append(_value("TANDEM_SIM_GPU", gpu))
    if revision is not None and names.revisioned(role, revision):
        # The sim engine refuses a KV pull from another revision's prefill; vLLM ignores it.
        env.append(_value(SERVING_REVISION_ENV, revision.id))
    user = _user_env(spec.engine.env)
    overridden = {entry["name"] for entry in user}
    return [entry for entry in env if entry["name"] not in overridden] + user
