"""`spec.rollout`: the gray rollout (steps, analysis)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from tandem.api.models.common import ApiModel


class OnMetricsUnavailable(StrEnum):
    Pause = "Pause"
    Rollback = "Rollback"


class RolloutStep(ApiModel):
    """One step of a rollout: a share of requests on the target arm, held at least this long."""

    weight: Annotated[
        int,
        Field(
            ge=0,
            le=100,
            description=(
                "Percent of requests on the target arm (strictly increasing). 0, on the first step only: "
                "the tenants stage, where only spec.rollout.tenants go to the target arm."
            ),
        ),
    ]
    pause_seconds: Annotated[
        float | None,
        Field(
            ge=0,
            le=86400,
            description=(
                "Least time at this weight (the step also bakes at least one analysis window); "
                "unset: a manual gate, after a passing verdict the rollout waits for a promote command."
            ),
        ),
    ] = None


class RolloutAnalysisSpec(ApiModel):
    """How each step's target arm is judged, against the SLO and against the source arm."""

    window_seconds: Annotated[
        int,
        Field(ge=10, le=3600, description="Traffic one verdict judges (seconds); each step's least bake."),
    ] = 60
    min_samples: Annotated[
        int, Field(ge=1, le=1_000_000, description="Requests the target arm must finish in a window.")
    ] = 100
    attainment_floor: Annotated[
        float | None,
        Field(
            ge=0,
            le=1,
            description="Least SLO attainment of the target arm (0..1); unset: spec.slo.attainmentPercent.",
        ),
    ] = None
    max_attainment_drop: Annotated[
        float, Field(ge=0, le=1, description="Most the target's attainment may be below the source arm's.")
    ] = 0.05
    max_error_rate: Annotated[
        float, Field(ge=0, le=1, description="Most failed requests / requests on the target arm.")
    ] = 0.01
    max_kv_failure_rate: Annotated[
        float,
        Field(ge=0, le=1, alias="maxKVFailureRate", description="Most failed KV transfers / transfers."),
    ] = 0.01
    min_kv_bandwidth_ratio: Annotated[
        float,
        Field(
            ge=0,
            le=1,
            alias="minKVBandwidthRatio",
            description="Least effective KV bandwidth / spec.kvTransfer.bandwidthGbps.",
        ),
    ] = 0.5
    on_metrics_unavailable: Annotated[
        OnMetricsUnavailable,
        Field(description="What a step does when its metrics cannot be read: Pause or Rollback."),
    ] = OnMetricsUnavailable.Pause
    metrics_unavailable_seconds: Annotated[
        int, Field(ge=0, le=3600, description="How long metrics may be missing before that applies.")
    ] = 0
    inconclusive_pause_seconds: Annotated[
        int,
        Field(
            ge=0,
            le=86400,
            description="How long after its bake a step may stay undecided (little traffic) until it pauses.",
        ),
    ] = 600


class RolloutSpec(ApiModel):
    """Gray rollout between the colocated pool and P/D when spec.serving.mode changes."""

    steps: Annotated[
        list[RolloutStep],
        Field(min_length=1, max_length=20, description="Weights of the target arm, strictly increasing."),
    ]
    analysis: RolloutAnalysisSpec = RolloutAnalysisSpec()
    auto_rollback: Annotated[
        bool,
        Field(
            description=(
                "Roll back by itself on a failed verdict, and fall back from a steady P/D deployment "
                "whose SLO breach persists at its maximum size; off: pause instead."
            )
        ),
    ] = True
    scale_down_delay_seconds: Annotated[
        int,
        Field(
            ge=0,
            le=3600,
            description="How long the arm traffic left keeps its pods after the weight moved (seconds).",
        ),
    ] = 30
    prepare_timeout_seconds: Annotated[
        int,
        Field(
            ge=10,
            le=86400,
            description=(
                "Most time a rollout may wait in Preparing for the target's pods to be ready "
                "(seconds); past it, it rolls back with reason PrepareTimeout."
            ),
        ),
    ] = 900
    tenants: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=63)]],
        Field(
            max_length=64,
            description="Tenants (of spec.router.tenants) whose requests go to the target arm first: from "
            "the first step on (a first step of weight 0 is theirs alone); everyone else by the weight.",
        ),
    ] = []
