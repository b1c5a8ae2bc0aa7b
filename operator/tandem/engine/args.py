"""Parses a `vllm serve` command line into `ServeArgs`, as vLLM's own parser would.

Only flags that vLLM has are accepted (argparse refuses the rest, exit status 2). Flags that change
nothing in a simulation (`--dtype`, `--enforce-eager`, `--trust-remote-code`, ...) are accepted and
kept so that the exact command line the operator renders for vLLM also starts the sim engine.
`--kv-transfer-config` takes JSON or vLLM's dotted form (`--kv-transfer-config.kv_role kv_consumer`).
Checks that need the model's architecture live in `config.py`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tandem.api.meta import ENGINE_PORT

KNOWN_CONNECTORS = (
    "NixlConnector",
    "NixlPushConnector",
    "P2pNcclConnector",
    "LMCacheConnectorV1",
    "LMCacheMPConnector",
    "MooncakeConnector",
    "MultiConnector",
    "OffloadingConnector",
    "SharedStorageConnector",
    "ExampleConnector",
    "DecodeBenchConnector",
)
KV_CONFIG_FLAG = "--kv-transfer-config"


class ArgumentError(ValueError):
    """A command line vLLM would refuse at start; the message says why."""


class KVTransferConfig(BaseModel):
    """vLLM's KVTransferConfig (reference section 1.1); unknown keys are refused as vLLM does."""

    model_config = ConfigDict(extra="forbid")

    kv_connector: str | None = None
    kv_role: Literal["kv_producer", "kv_consumer", "kv_both"] | None = None
    engine_id: str | None = None
    kv_buffer_device: Literal["cuda", "cpu"] = "cuda"
    kv_buffer_size: float = 1e9
    kv_rank: int | None = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: dict[str, Any] = Field(default_factory=dict)
    kv_connector_module_path: str | None = None
    enable_permute_local_kv: bool = False
    kv_load_failure_policy: Literal["recompute", "fail"] = "fail"

    @property
    def is_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")


class GroupArgs(BaseModel):
    """This pod's place in a multi-node replica (a LeaderWorkerSet group): vLLM's multi-node flags.

    `data` is 1 (one rank spans the pods: multi-node TP) or the pods' ranks together: one per pod
    balanced by the leader (Internal), one per pod each serving itself (External:
    `--data-parallel-rank`), or `local` per pod each on its own port (MultiPortExternal)."""

    model_config = ConfigDict(frozen=True)

    nodes: int  # --nnodes
    node_rank: int  # --node-rank: 0 on the leader
    address: str  # where the group meets: --data-parallel-address (DP) or --master-addr
    port: int  # --data-parallel-rpc-port (DP) or --master-port
    data: int  # --data-parallel-size
    headless: bool  # --headless: a worker without an API endpoint of its own
    external: bool = False  # each rank serves its own API (External, MultiPortExternal): no leader balancing

    @property
    def leader(self) -> bool:
        return self.node_rank == 0


class RankArgs(BaseModel):
    """The data-parallel ranks this process serves, each an engine with its own API port
    (MultiPortExternal: `--data-parallel-size-local` ranks on ports `--port` + local rank, and a
    supervisor whose /health stands for them all); one rank on `--port` otherwise."""

    model_config = ConfigDict(frozen=True)

    local: int = 1  # --data-parallel-size-local under --data-parallel-multi-port-external-lb
    first: int = 0  # the global data-parallel rank of local rank 0
    supervisor_port: int | None = None  # --data-parallel-supervisor-port (MultiPortExternal)


class ServeArgs(BaseModel):
    """The parsed command line; None means "vLLM's default", resolved in `config.py`."""

    model_config = ConfigDict(frozen=True)

    model: str
    host: str | None
    port: int
    served_model_name: tuple[str, ...] | None
    tensor_parallel_size: int
    max_model_len: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    enable_chunked_prefill: bool | None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float
    kv_transfer_config: KVTransferConfig | None
    block_size: int
    seed: int
    kv_cache_dtype: str
    num_gpu_blocks_override: int | None
    shutdown_timeout: float
    api_key: str | None
    enable_request_id_headers: bool
    enable_force_include_usage: bool
    group: GroupArgs | None = None  # a multi-node replica's member (`--nnodes` > 1)
    ranks: RankArgs = RankArgs()  # the data-parallel ranks of this process


def human_int(text: str) -> int:
    """vLLM's human-readable ints: `32k` = 32,000, `32K` = 32,768, `1m`/`1M` likewise."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}")
    number, unit = float(match.group(1)), match.group(2)
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    value = number * scale
    if value != int(value):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(value)


def _kv_config_json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--kv-transfer-config is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--kv-transfer-config must be a JSON object")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tandem engine serve",
        description="vLLM-compatible simulation engine; takes `vllm serve` arguments.",
        allow_abbrev=False,
    )
    p.add_argument("model_tag", nargs="?", help="model name or path (as `vllm serve MODEL`)")
    p.add_argument("--model", dest="model_flag", help="model name or path (deprecated form)")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=ENGINE_PORT)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None)
    p.add_argument("--data-parallel-rank", "-dpn", type=int, default=None)
    p.add_argument("--data-parallel-address", "-dpa", default=None)
    p.add_argument("--data-parallel-rpc-port", "-dpp", type=int, default=None)
    p.add_argument("--data-parallel-hybrid-lb", "-dph", action="store_true")
    p.add_argument("--data-parallel-external-lb", "-dpe", action="store_true")
    p.add_argument("--data-parallel-multi-port-external-lb", action="store_true")
    p.add_argument("--data-parallel-supervisor-port", type=int, default=None)
    p.add_argument("--nnodes", "-n", type=int, default=1)
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--max-model-len", type=human_int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=human_int, default=None)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument(KV_CONFIG_FLAG, type=_kv_config_json, default=None)
    p.add_argument("--block-size", type=int, choices=[1, 8, 16, 32, 64, 128], default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dtype", choices=["auto", "half", "float16", "bfloat16", "float", "float32"], default="auto"
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"],
        default="auto",
    )
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--shutdown-timeout", type=float, default=0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--enable-request-id-headers", action="store_true")
    p.add_argument("--enable-force-include-usage", action="store_true")
    p.add_argument("--disable-log-requests", action="store_true")
    p.add_argument("--enable-log-requests", action="store_true")
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--disable-uvicorn-access-log", action="store_true")
    p.add_argument("--disable-access-log-for-endpoints", default=None)
    p.add_argument("--uvicorn-log-level", choices=["debug", "info", "warning", "error", "critical", "trace"])
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--disable-hybrid-kv-cache-manager", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-server-load-tracking", action="store_true")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--revision", default=None)
    p.add_argument("--tokenizer-revision", default=None)
    p.add_argument("--download-dir", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--swap-space", type=float, default=4)
    p.add_argument("--generation-config", default="auto")
    p.add_argument("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"])
    p.add_argument("--api-server-count", type=int, default=1)
    return p


def _split_dotted_kv_flags(argv: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """Pulls `--kv-transfer-config.a.b[+] VALUE` pairs out of argv into a nested dict."""
    rest: list[str] = []
    dotted: dict[str, Any] = {}
    items = list(argv)
    i = 0
    while i < len(items):
        arg = items[i]
        if not arg.startswith(KV_CONFIG_FLAG + "."):
            rest.append(arg)
            i += 1
            continue
        path, eq, inline = arg[len(KV_CONFIG_FLAG) + 1 :].partition("=")
        if eq:
            raw = inline
            i += 1
        elif i + 1 < len(items):
            raw = items[i + 1]
            i += 2
        else:
            raise ArgumentError(f"{arg} expects a value")
        append = path.endswith("+")
        keys = path.rstrip("+").split(".")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = dotted
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        if append:
            node.setdefault(keys[-1], []).append(value)
        else:
            node[keys[-1]] = value
    return rest, dotted


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_serve_args(argv: Sequence[str]) -> ServeArgs:
    """argv after `serve`. Raises SystemExit(2) for unknown/malformed flags, ArgumentError otherwise."""
    rest, dotted = _split_dotted_kv_flags(argv)
    ns = build_parser().parse_args(rest)
    model = ns.model_tag or ns.model_flag
    if not model:
        raise ArgumentError("a model is required: `serve MODEL [options]`")
    if ns.model_tag and ns.model_flag and ns.model_tag != ns.model_flag:
        raise ArgumentError(
            f"model given twice with different values: {ns.model_tag!r} and --model {ns.model_flag!r}"
        )
    if ns.pipeline_parallel_size != 1:
        raise ArgumentError(
            f"--pipeline-parallel-size {ns.pipeline_parallel_size}: the tandem sim engine simulates one "
            "engine per process; use 1"
        )
    group, ranks = _group(ns)
    if ns.api_server_count != 1:
        raise ArgumentError("--api-server-count: the tandem sim engine runs one API server")
    kv_raw = _merge(ns.kv_transfer_config or {}, dotted)
    return ServeArgs(
        model=model,
        host=ns.host,
        port=ns.port,
        served_model_name=tuple(ns.served_model_name) if ns.served_model_name else None,
        tensor_parallel_size=ns.tensor_parallel_size,
        max_model_len=ns.max_model_len,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        enable_chunked_prefill=ns.enable_chunked_prefill,
        enable_prefix_caching=ns.enable_prefix_caching,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        kv_transfer_config=_kv_transfer_config(kv_raw) if kv_raw else None,
        block_size=ns.block_size,
        seed=ns.seed,
        kv_cache_dtype=ns.kv_cache_dtype,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        shutdown_timeout=ns.shutdown_timeout,
        api_key=ns.api_key,
        enable_request_id_headers=ns.enable_request_id_headers,
        enable_force_include_usage=ns.enable_force_include_usage,
        group=group,
        ranks=ranks,
    )


def _group(ns: argparse.Namespace) -> tuple[GroupArgs | None, RankArgs]:
    """The multi-node and data-parallel flags, as far as the sim engine runs them: one rank per pod
    (Internal, External), or several on their own ports (MultiPortExternal); not Hybrid."""
    data, nodes = ns.data_parallel_size, ns.nnodes
    multi_port = ns.data_parallel_multi_port_external_lb
    external = multi_port or ns.data_parallel_external_lb or ns.data_parallel_rank is not None
    if ns.data_parallel_hybrid_lb:
        raise ArgumentError(
            "--data-parallel-hybrid-lb is vLLM's: the tandem sim engine balances a data-parallel group "
            "on its leader (Internal) or serves each rank itself (External, MultiPortExternal)"
        )
    if nodes < 1 or not 0 <= ns.node_rank < nodes:
        raise ArgumentError(f"--node-rank {ns.node_rank} is not in 0..{nodes - 1} (--nnodes {nodes})")
    ranks = _ranks(ns, data, nodes) if multi_port else RankArgs()
    if not multi_port:
        if ns.data_parallel_supervisor_port is not None:
            raise ArgumentError(
                "--data-parallel-supervisor-port needs --data-parallel-multi-port-external-lb"
            )
        if ns.data_parallel_size_local not in (None, 1) and data > 1:
            raise ArgumentError(
                f"--data-parallel-size-local {ns.data_parallel_size_local}: the tandem sim engine runs one "
                "data-parallel rank per pod unless --data-parallel-multi-port-external-lb; use 1"
            )
        if data != 1 and data != nodes:
            raise ArgumentError(
                f"--data-parallel-size {data}: the tandem sim engine runs one engine per process, so 1 or "
                f"one rank per node (--nnodes {nodes})"
            )
        if ns.data_parallel_rank is not None and ns.data_parallel_rank != ns.node_rank:
            raise ArgumentError(
                f"--data-parallel-rank {ns.data_parallel_rank}: with one rank per pod it is the node rank "
                f"({ns.node_rank})"
            )
        if external and data == 1:
            raise ArgumentError("external data-parallel balancing needs --data-parallel-size > 1")
    if nodes == 1:
        if ns.headless:
            raise ArgumentError("--headless needs --nnodes > 1 (a worker of a multi-node group)")
        return None, ranks
    if data > 1:
        if ns.data_parallel_address is None or ns.data_parallel_rpc_port is None:
            raise ArgumentError(
                "a data-parallel group over nodes needs --data-parallel-address and --data-parallel-rpc-port"
            )
        address, port = ns.data_parallel_address, ns.data_parallel_rpc_port
    else:
        address, port = ns.master_addr, ns.master_port
    if ns.headless and (ns.node_rank == 0 or external):
        raise ArgumentError("--headless: only a worker of an Internal group has no API server")
    group = GroupArgs(
        nodes=nodes,
        node_rank=ns.node_rank,
        address=address,
        port=port,
        data=data,
        headless=ns.headless,
        external=external,
    )
    return group, ranks


def _ranks(ns: argparse.Namespace, data: int, nodes: int) -> RankArgs:
    """MultiPortExternal: this pod's ranks, each on its own port, and the supervisor's port."""
    local = ns.data_parallel_size_local if ns.data_parallel_size_local is not None else data // nodes
    if local < 1 or local * nodes != data:
        raise ArgumentError(
            f"--data-parallel-size-local {local} x --nnodes {nodes} must be --data-parallel-size {data}"
        )
    if ns.data_parallel_rank is not None:
        raise ArgumentError("--data-parallel-rank: a multi-port pod's ranks follow from --node-rank")
    if ns.data_parallel_supervisor_port is None:
        raise ArgumentError("--data-parallel-multi-port-external-lb needs --data-parallel-supervisor-port")
    return RankArgs(local=local, first=ns.node_rank * local, supervisor_port=ns.data_parallel_supervisor_port)


def _kv_transfer_config(raw: dict[str, Any]) -> KVTransferConfig:
    try:
        config = KVTransferConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ArgumentError(f"invalid --kv-transfer-config: {problems}") from None
    if config.kv_connector is not None and config.kv_role is None:
        raise ArgumentError(
            "Please specify kv_role when kv_connector is set, supported roles are "
            "kv_producer, kv_consumer, kv_both"
        )
    if config.kv_connector is None and config.kv_role is not None:
        raise ArgumentError("--kv-transfer-config: kv_role is set but kv_connector is not")
    if (
        config.kv_connector is not None
        and config.kv_connector not in KNOWN_CONNECTORS
        and config.kv_connector_module_path is None
    ):
        raise ArgumentError(
            f"--kv-transfer-config: unknown kv_connector {config.kv_connector!r}; "
            f"registered: {', '.join(KNOWN_CONNECTORS)} (or set kv_connector_module_path)"
        )
    return config
