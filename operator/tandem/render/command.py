"""The exact engine command line of each pool: `vllm serve MODEL ...` (or the sim engine's equivalent).

Pure. Order: MODEL, the flags tandem derives from the spec (host, port, served name, TP, revision,
context limit, `--kv-transfer-config`), the role's defaults (colocated: chunked prefill with an
ITL-friendly token budget; decode and colocated: `--shutdown-timeout`), then `spec.engine.extraArgs`,
then the pool's `engineArgs`. A role default is left out when the user's arguments set that flag,
so every flag appears at most once and `kubectl get sts -o yaml` shows what runs.

Needs vLLM >= 0.18 (`--shutdown-timeout`) with `kv_load_failure_policy` in KVTransferConfig.
`engine.type: sim` runs `tandem engine serve` with the same arguments (its parser accepts every
flag rendered here) and reads sim-only settings from `TANDEM_SIM_*` variables (see `env.py`).

Parallelism beyond TP (`spec.<pool>.parallelism`, `nodesPerInstance`; docs/multinode.md) adds its
flags right after `--tensor-parallel-size`. A multi-node replica is a LeaderWorkerSet group whose
pods run one line each, the `member` of the group: the leader (rank 0) and the workers, which differ
only in their node rank, the leader's address and `--headless`. The lines use Kubernetes' `$(VAR)`
expansion of the variables LeaderWorkerSet's pod webhook injects (`LWS_WORKER_INDEX`,
`LWS_LEADER_ADDRESS`), never a shell: vLLM derives a pod's first data-parallel rank from
`--node-rank` (node rank x `--data-parallel-size-local`), so no arithmetic is needed. The leader
uses its own IP for the addresses it listens on, so it never waits for its DNS name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import DataParallelLoadBalancing, EngineType, KVConnector, PDDeployment
from tandem.perf.engine_args import COLOCATED_MAX_NUM_BATCHED_TOKENS, flag_values
from tandem.render import lifecycle, model_source

VLLM_COMMAND = ("vllm", "serve")
SIM_COMMAND = ("tandem", "engine", "serve")

KV_ROLES: dict[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}

# Which pod of a replica a command line is for: the only pod of a single-node replica, or the
# leader / a worker of a LeaderWorkerSet group.
Member = Literal["single", "leader", "worker"]
POD_IP = "$(POD_IP)"
LEADER_ADDRESS = f"$({meta.LWS_LEADER_ADDRESS})"
WORKER_INDEX = f"$({meta.LWS_WORKER_INDEX})"

# Expert parallelism across nodes: the all-to-all kernels each role wants (vLLM's DeepEP modes, as
# llm-d's and Dynamo's wide-EP recipes use them): prefill moves long batches, decode small ones.
ALL2ALL_BACKENDS: dict[Role, str] = {"prefill": "deepep_high_throughput", "decode": "deepep_low_latency"}

# vLLM's LMCache P/D example names the RPC channel of each side.
LMCACHE_RPC_PORTS: dict[Role, str] = {"prefill": "producer1", "decode": "consumer1"}


def is_disaggregated(role: Role) -> bool:
    return role in KV_ROLES


def sets_flag(args: Sequence[str], *flags: str) -> bool:
    return any(flag_values(args, flag) for flag in flags)


def user_args(pdd: PDDeployment, role: Role) -> list[str]:
    return [*pdd.spec.engine.extra_args, *pdd.spec.pool(role).engine_args]


def kv_transfer_config(pdd: PDDeployment, role: Role) -> dict[str, Any] | None:
    """vLLM's KVTransferConfig for a P/D role (None for colocated)."""
    if not is_disaggregated(role):
        return None
    kv = pdd.spec.kv_transfer
    config: dict[str, Any] = {
        "kv_connector": kv.connector.value,
        "kv_role": KV_ROLES[role],
        "kv_load_failure_policy": kv.load_failure_policy.value,
    }
    if kv.connector is KVConnector.MooncakeConnector:
        protocol = "rdma" if pdd.spec.network.rdma.enabled else "tcp"
        config["kv_connector_extra_config"] = {"mooncake_protocol": protocol}
    elif kv.connector is KVConnector.LMCacheConnectorV1:
        config["kv_connector_extra_config"] = {
            "discard_partial_chunks": False,
            "lmcache_rpc_port": LMCACHE_RPC_PORTS[role],
        }
    return config


def shutdown_timeout(pdd: PDDeployment, role: Role) -> float | None:
    """The `--shutdown-timeout` in effect: the user's (last one wins, as in argparse) or tandem's."""
    given = [v for v in flag_values(user_args(pdd, role), "--shutdown-timeout") if v is not None]
    if given:
        try:
            return max(float(given[-1]), 0.0)
        except ValueError:
            return None
    return lifecycle.shutdown_timeout_seconds(role)


def _colocated_token_budget(given: Sequence[str]) -> int:
    """COLOCATED_MAX_NUM_BATCHED_TOKENS, raised to the user's --max-num-seqs (vLLM refuses less)."""
    budget = COLOCATED_MAX_NUM_BATCHED_TOKENS
    for value in flag_values(given, "--max-num-seqs"):
        if value is not None and value.isdigit():
            budget = max(budget, int(value))
    return budget


def parallel_args(pdd: PDDeployment, role: Role, member: Member = "single") -> list[str]:
    """The flags of the pool's parallelism beyond TP, for one `member` of a replica (empty for a plain
    single-GPU-group pool, so its line is what it always was)."""
    shape = pdd.spec.pool(role).shape
    lb = DataParallelLoadBalancing(shape.load_balancing)
    leader = member != "worker"
    args: list[str] = []
    if shape.pipeline > 1:
        args += ["--pipeline-parallel-size", str(shape.pipeline)]
    if shape.data > 1:
        args += ["--data-parallel-size", str(shape.data)]
        if lb is DataParallelLoadBalancing.External:  # one rank per pod: its rank is its node rank
            args += ["--data-parallel-rank", "0" if leader else WORKER_INDEX]
        else:
            args += ["--data-parallel-size-local", str(shape.ranks_per_pod)]
    if shape.expert:
        args.append("--enable-expert-parallel")
    if shape.multi_node:
        address = POD_IP if leader else LEADER_ADDRESS
        args += [
            "--nnodes",
            str(shape.nodes),
            "--node-rank",
            "0" if leader else WORKER_INDEX,
            "--master-addr",
            address,
            "--master-port",
            str(meta.MASTER_PORT),
        ]
        if shape.data > 1:
            args += ["--data-parallel-address", address, "--data-parallel-rpc-port", str(meta.DP_RPC_PORT)]
    if shape.data > 1 and lb is DataParallelLoadBalancing.Hybrid:
        args.append("--data-parallel-hybrid-lb")
    elif shape.data > 1 and lb is DataParallelLoadBalancing.MultiPortExternal:
        args += [
            "--data-parallel-multi-port-external-lb",
            "--data-parallel-supervisor-port",
            str(meta.DP_SUPERVISOR_PORT),
        ]
    if member == "worker" and not shape.workers_serve:
        args.append("--headless")
    return args


def _role_defaults(pdd: PDDeployment, role: Role) -> list[str]:
    given = user_args(pdd, role)
    defaults: list[str] = []
    shape = pdd.spec.pool(role).shape
    if (
        shape.expert
        and shape.multi_node
        and role in ALL2ALL_BACKENDS
        and not sets_flag(given, "--all2all-backend")
    ):
        defaults += ["--all2all-backend", ALL2ALL_BACKENDS[role]]
    if role == "colocated":
        if not sets_flag(given, "--enable-chunked-prefill", "--no-enable-chunked-prefill"):
            defaults.append("--enable-chunked-prefill")
        if not sets_flag(given, "--max-num-batched-tokens"):
            defaults += ["--max-num-batched-tokens", str(_colocated_token_budget(given))]
    drain = lifecycle.shutdown_timeout_seconds(role)
    if drain is not None and not sets_flag(given, "--shutdown-timeout"):
        defaults += ["--shutdown-timeout", str(drain)]
    return defaults


def engine_command(pdd: PDDeployment, role: Role, member: Member = "single") -> list[str]:
    """The container command of `role`'s engine, complete (no image entrypoint logic is assumed); for a
    multi-node pool, of the group's leader or of a worker (`member`)."""
    spec = pdd.spec
    source = model_source.parse(spec.model.uri)
    prefix = SIM_COMMAND if spec.engine.type is EngineType.sim else VLLM_COMMAND
    command = [
        *prefix,
        source.model,
        "--host",
        POD_IP,
        "--port",
        str(meta.ENGINE_PORT),
        "--served-model-name",
        spec.model.name,
        "--tensor-parallel-size",
        str(spec.pool(role).tensor_parallel_size),
        *parallel_args(pdd, role, member),
    ]
    if source.revision is not None:
        command += ["--revision", source.revision]
    if spec.model.max_model_len is not None:
        command += ["--max-model-len", str(spec.model.max_model_len)]
    kv_config = kv_transfer_config(pdd, role)
    if kv_config is not None:
        command += ["--kv-transfer-config", json.dumps(kv_config, separators=(",", ":"))]
    return [*command, *_role_defaults(pdd, role), *user_args(pdd, role)]
