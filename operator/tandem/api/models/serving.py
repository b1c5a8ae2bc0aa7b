"""`spec.serving` and `spec.slo`: the serving mode and the latency targets."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from tandem.api.models.common import ApiModel


class ServingMode(StrEnum):
    Disaggregated = "Disaggregated"
    Colocated = "Colocated"


class ServingSpec(ApiModel):
    mode: Annotated[
        ServingMode,
        Field(description="The desired serving topology: Disaggregated (prefill + decode) or Colocated."),
    ] = ServingMode.Disaggregated


class SLOSpec(ApiModel):
    """The latency users must see: a request is within SLO when it meets both targets."""

    ttft_ms: Annotated[
        int, Field(ge=1, le=600_000, description="Time-to-first-token target, in milliseconds.")
    ]
    tpot_ms: Annotated[
        int, Field(ge=1, le=60_000, description="Time-per-output-token target, in milliseconds.")
    ]
    attainment_percent: Annotated[
        float,
        Field(gt=0, le=100, description="Share of requests (percent) that must meet both targets."),
    ] = 95.0
