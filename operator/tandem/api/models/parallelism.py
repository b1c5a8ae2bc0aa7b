"""`spec.<pool>.parallelism` and `spec.<pool>.groupPlacement`: how one instance of a pool is split
over GPUs and nodes (pipeline, data and expert parallelism beside `tensorParallelSize`), how requests
are balanced over its data-parallel ranks, and how a multi-node instance's pods are placed together.

The arithmetic lives in `tandem.api.shape`; the cross-field rules (GPUs per pod, each balancing
mode's needs) in `tandem.api.rules`. docs/multinode.md explains the shapes.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from tandem.api.models.common import LABEL_KEY_PATTERN, ApiModel

# A pod's schedulerName: a DNS-1123 subdomain (Kubernetes' own check on the pods).
SCHEDULER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class DataParallelLoadBalancing(StrEnum):
    """Who spreads requests over an instance's data-parallel ranks (vLLM's DP deployment modes)."""

    # One endpoint, on the leader: its API servers balance over every rank; the other pods --headless.
    Internal = "Internal"
    # One endpoint per pod, balancing over that pod's ranks (--data-parallel-hybrid-lb).
    Hybrid = "Hybrid"
    # One endpoint per rank, one rank per pod (--data-parallel-rank).
    External = "External"
    # One port per rank and a supervisor per pod (--data-parallel-multi-port-external-lb).
    MultiPortExternal = "MultiPortExternal"


class Parallelism(ApiModel):
    """Parallelism of one instance beyond tensor parallelism (`tensorParallelSize`). An instance has
    tensorParallelSize x pipeline x data GPUs, spread evenly over `nodesPerInstance` pods."""

    pipeline: Annotated[
        int,
        Field(
            ge=1,
            le=16,
            description="Pipeline stages of one rank (vLLM --pipeline-parallel-size); a rank has "
            "tensorParallelSize x pipeline GPUs.",
        ),
    ] = 1
    data: Annotated[
        int,
        Field(
            ge=1,
            le=1024,
            description="Data-parallel ranks of one instance (vLLM --data-parallel-size); with expert "
            "parallelism the MoE layers span all of them (wide EP).",
        ),
    ] = 1
    data_local: Annotated[
        int | None,
        Field(
            ge=1,
            le=8,
            description="Data-parallel ranks per pod (vLLM --data-parallel-size-local); derived as "
            "data / nodesPerInstance when unset. dataLocal x tensorParallelSize x pipeline = GPUs per pod.",
        ),
    ] = None
    expert: Annotated[
        bool,
        Field(
            description="Expert parallelism for MoE models (vLLM --enable-expert-parallel): the experts are "
            "sharded over data x tensorParallelSize GPUs instead of tensor-sliced."
        ),
    ] = False
    load_balancing: Annotated[
        DataParallelLoadBalancing,
        Field(
            description="How requests are spread over the data-parallel ranks: Internal (one endpoint on "
            "the leader pod), Hybrid (one per pod), External (one per rank, one rank per pod) or "
            "MultiPortExternal (one port per rank, a supervisor per pod)."
        ),
    ] = DataParallelLoadBalancing.Internal


class GangScheduling(StrEnum):
    """Which gang scheduling places a group's pods all together or not at all."""

    # Kubernetes' own (scheduling.k8s.io PodGroups and the default scheduler's GangScheduling plugin;
    # the GangScheduling and GenericWorkload feature gates, 1.35+).
    Kubernetes = "Kubernetes"


class GroupPlacement(ApiModel):
    """All-or-nothing placement of a multi-node instance's pods (a LeaderWorkerSet group)."""

    scheduler_name: Annotated[
        str | None,
        Field(
            max_length=253,
            pattern=SCHEDULER_NAME_PATTERN,
            description="The scheduler of the group's pods: a gang scheduler (Volcano: `volcano`) that the "
            "LeaderWorkerSet controller gives a PodGroup per group (its gangSchedulingManagement), so a "
            "group's pods start together or not at all.",
        ),
    ] = None
    exclusive_topology: Annotated[
        str | None,
        Field(
            max_length=317,
            pattern=LABEL_KEY_PATTERN,
            description="A node label key (e.g. a rack or NVLink-domain label): each group's pods share one "
            "domain of it and no two groups share one (LeaderWorkerSet's "
            "leaderworkerset.sigs.k8s.io/exclusive-topology).",
        ),
    ] = None
    gang_scheduling: Annotated[
        GangScheduling | None,
        Field(
            description="Kubernetes: Kubernetes' own gang scheduling. The operator keeps a PodGroup "
            "(scheduling.k8s.io) per group with gang minCount = nodesPerInstance, and tandem's "
            "MutatingAdmissionPolicy names it in each pod's spec.schedulingGroup, so the default "
            "scheduler binds a group's pods together or none of them. Needs the GangScheduling and "
            "GenericWorkload feature gates and the policy installed (docs/multinode.md).",
        ),
    ] = None
