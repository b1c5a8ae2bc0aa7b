"""`spec.kvTransfer` and `spec.network`: the KV connector, RDMA and the network policy."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from tandem.api.models.common import LABEL_KEY_PATTERN, ApiModel, Labels


class KVConnector(StrEnum):
    NixlConnector = "NixlConnector"
    MooncakeConnector = "MooncakeConnector"
    LMCacheConnectorV1 = "LMCacheConnectorV1"


class KVLoadFailurePolicy(StrEnum):
    fail = "fail"
    recompute = "recompute"


class KVTransferSpec(ApiModel):
    """How KV caches move from prefill to decode."""

    connector: KVConnector = KVConnector.NixlConnector
    bandwidth_gbps: Annotated[
        int,
        Field(ge=1, le=3200, description="Per-pod link bandwidth used for transfer estimates (Gb/s)."),
    ] = 400
    load_failure_policy: Annotated[
        KVLoadFailurePolicy,
        Field(
            description="What decode does when it cannot load the remote KV (vLLM kv_load_failure_policy)."
        ),
    ] = KVLoadFailurePolicy.fail
    degraded_below_percent: Annotated[
        int,
        Field(
            ge=1,
            le=100,
            description="KVTransportDegraded is set when the effective KV bandwidth (engines' NIXL metrics, "
            "transfers over minJudgedTransferBytes) stays below this percent of bandwidthGbps.",
        ),
    ] = 50
    min_judged_transfer_bytes: Annotated[
        int,
        Field(
            ge=2048,
            le=8 * 1024**3,
            description="Only KV transfers larger than this are judged for bandwidth (smaller ones are "
            "latency-bound); rounded up to a bucket of vllm:nixl_bytes_transferred (powers of 4 from 2 KiB).",
        ),
    ] = 128 * 1024 * 1024  # 1024 tokens of Llama-3.1-8B KV: 2.7 ms at 400 Gb/s, well over a READ's latency


class RDMASpec(ApiModel):
    enabled: bool = True
    resource_name: Annotated[
        str,
        Field(
            min_length=3,
            max_length=253,
            pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
            description="Extended resource of the RDMA device plugin.",
        ),
    ] = "rdma/hca"
    per_pod: Annotated[int, Field(ge=1, le=16, description="RDMA devices requested per pod.")] = 1
    node_selector: Annotated[
        Labels,
        Field(description="Node labels that mark RDMA-capable nodes."),
    ] = {"network.tandem.dev/rdma": "true"}


class NetworkPolicySpec(ApiModel):
    """An optional NetworkPolicy on the engine pods (docs/security.md)."""

    enabled: Annotated[
        bool,
        Field(
            description="Render a NetworkPolicy that admits traffic to the engine pods only from this "
            "PDDeployment's routers and engines, and to the engine port from Prometheus."
        ),
    ] = False
    prometheus_namespace_selector: Annotated[
        Labels,
        Field(
            description="matchLabels of the namespaces Prometheus runs in (empty: any namespace).",
        ),
    ] = {}
    prometheus_pod_selector: Annotated[
        Labels,
        Field(description="matchLabels of the Prometheus pods that scrape the engines."),
    ] = {"app.kubernetes.io/name": "prometheus"}


class NetworkSpec(ApiModel):
    rdma: RDMASpec = RDMASpec()
    policy: NetworkPolicySpec = NetworkPolicySpec()
    topology_key: Annotated[
        str,
        Field(
            min_length=1,
            max_length=316,
            pattern=LABEL_KEY_PATTERN,
            description="Node label of a fabric domain; prefill and decode pods prefer to share one.",
        ),
    ] = "network.tandem.dev/fabric"
