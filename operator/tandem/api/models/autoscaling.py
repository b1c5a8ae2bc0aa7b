"""`spec.autoscaling`: the SLO autoscaler (Prometheus, scale rules, mode)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from tandem.api.models.common import ApiModel


class PrometheusSpec(ApiModel):
    """Where the autoscaler reads the routers' and engines' metrics."""

    url: Annotated[
        str | None,
        Field(
            max_length=2048,
            description="Prometheus base URL, http(s)://; unset means the operator's --prometheus-url.",
        ),
    ] = None
    timeout_seconds: Annotated[
        float, Field(gt=0, le=60, description="Timeout of one Prometheus query, in seconds.")
    ] = 5.0


class ScalingRules(ApiModel):
    """How fast one direction of scaling may move."""

    stabilization_seconds: Annotated[
        int,
        Field(
            ge=0,
            le=3600,
            description=(
                "Look-back window: scale down only to the highest recommendation within it "
                "(scale up: the lowest)."
            ),
        ),
    ]
    max_step: Annotated[int, Field(ge=1, le=1024, description="Most replicas added or removed at once.")]


class ScaleDownRules(ScalingRules):
    """Scale-down: the HPA's window, and a shorter one for a load on its way down."""

    descent_stabilization_seconds: Annotated[
        int | None,
        Field(
            ge=0,
            le=3600,
            description=(
                "Shorter look-back for a descent: scale down to the highest recommendation within it when, "
                "over stabilizationSeconds, no recommendation came back above that size after falling to "
                "it (bursts and flapping keep the full window). Unset or equal to stabilizationSeconds: "
                "off. At most stabilizationSeconds."
            ),
        ),
    ] = None


class ForecastSpec(ApiModel):
    """The predictive part: order capacity one model load ahead of a forecast of each pool's demand."""

    enabled: Annotated[
        bool,
        Field(
            description=(
                "Size each pool for the larger of its measured demand and the demand forecast one model "
                "load ahead; the SLO feedback stays the guard."
            )
        ),
    ] = False
    season_period_seconds: Annotated[
        int,
        Field(
            ge=600,
            le=2678400,
            description="Period of the seasonal demand profile (86400: a day), learnt over past periods.",
        ),
    ] = 86400
    horizon_seconds: Annotated[
        int,
        Field(
            ge=0,
            le=3600,
            description="Forecast horizon until a pool's start-to-ready time has been measured (seconds).",
        ),
    ] = 180


class AutoscalingMode(StrEnum):
    Active = "Active"
    Advisory = "Advisory"


class AutoscalingSpec(ApiModel):
    """The SLO autoscaler: one decision per interval for every pool with `autoscaling` bounds."""

    enabled: bool = False
    mode: Annotated[
        AutoscalingMode,
        Field(description="Active changes replicas; Advisory decides and reports in status without acting."),
    ] = AutoscalingMode.Active
    prometheus: PrometheusSpec = PrometheusSpec()
    interval_seconds: Annotated[int, Field(ge=5, le=3600, description="Seconds between decisions.")] = 30
    gpu: Annotated[
        str,
        Field(
            min_length=1,
            max_length=64,
            description="GPU type of the performance profile that seeds per-replica capacity (e.g. H100).",
        ),
    ] = "H100"
    scale_up: ScalingRules = ScalingRules(stabilization_seconds=0, max_step=4)
    scale_down: ScaleDownRules = ScaleDownRules(stabilization_seconds=600, max_step=1)
    drain_timeout_seconds: Annotated[
        int,
        Field(
            ge=0,
            le=3600,
            description="Longest wait for a draining pod's streams and unpulled KV before it is removed.",
        ),
    ] = 300
    forecast: ForecastSpec = ForecastSpec()
