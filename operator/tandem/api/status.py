"""The PDDeployment status as pydantic models (written by the operator, read by kubectl and GitOps).

Conditions follow metav1.Condition and kstatus: `Ready`, `Reconciling`, `Stalled` are always
present after the first reconcile, `observedGeneration` is an integer.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from tandem.api.models import ApiModel


class Phase(StrEnum):
    """Maps 1:1 onto Argo CD health: Healthy, Progressing, Suspended (Paused), Degraded."""

    Healthy = "Healthy"
    Progressing = "Progressing"
    Paused = "Paused"
    Degraded = "Degraded"


class ConditionType(StrEnum):
    Ready = "Ready"
    Reconciling = "Reconciling"
    Stalled = "Stalled"
    Available = "Available"


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    type: Annotated[str, Field(min_length=1, max_length=316)]
    status: ConditionStatus
    observed_generation: Annotated[int, Field(ge=0)] = 0
    last_transition_time: Annotated[str, Field(description="RFC 3339 time the status last changed.")]
    reason: Annotated[
        str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    ]
    message: Annotated[str, Field(max_length=32768)] = ""


class PoolStatus(ApiModel):
    replicas: Annotated[int, Field(ge=0, description="Pods that exist (StatefulSet status.replicas).")] = 0
    ready_replicas: Annotated[int, Field(ge=0, description="Pods that pass readiness.")] = 0
    desired_replicas: Annotated[int, Field(ge=0, description="Replicas the operator asks for.")] = 0
    gpus: Annotated[int, Field(ge=0, description="GPUs the desired replicas request.")] = 0
    ready: Annotated[str, Field(description="readyReplicas/desiredReplicas, for printer columns.")] = "0/0"


class PoolsStatus(ApiModel):
    prefill: PoolStatus = PoolStatus()
    decode: PoolStatus = PoolStatus()
    colocated: PoolStatus = PoolStatus()
    router: PoolStatus = PoolStatus()


class KVTransferStatus(ApiModel):
    bytes_per_token: Annotated[
        int | None, Field(description="KV-cache bytes per token (spec or the known architecture).")
    ] = None
    ms_per_thousand_tokens: Annotated[
        int | None,
        Field(description="Transfer time of 1,000 tokens of KV at spec.kvTransfer.bandwidthGbps (ms)."),
    ] = None


class PDDeploymentStatus(ApiModel):
    observed_generation: Annotated[int, Field(ge=0)] = 0
    phase: Phase = Phase.Progressing
    mode: Annotated[str, Field(description="Serving mode in effect, for printer columns.")] = ""
    conditions: Annotated[list[Condition], Field(max_length=32)] = []
    pools: PoolsStatus = PoolsStatus()
    kv_transfer: KVTransferStatus = KVTransferStatus()
