"""The whole spec (`PDDeploymentSpec`, its cross-field rules in `rules.py`), the metadata the
operator reads and the PDDeployment object.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from tandem.api import rules
from tandem.api.models.autoscaling import AutoscalingSpec
from tandem.api.models.common import ApiModel
from tandem.api.models.engine import EngineSpec
from tandem.api.models.model import ModelSpec
from tandem.api.models.network import KVTransferSpec, NetworkSpec
from tandem.api.models.pool import PoolSpec
from tandem.api.models.rollout import RolloutSpec
from tandem.api.models.router import RouterSpec
from tandem.api.models.serving import ServingSpec, SLOSpec


class PDDeploymentSpec(ApiModel):
    model: ModelSpec
    engine: EngineSpec
    kv_transfer: KVTransferSpec = KVTransferSpec()
    network: NetworkSpec = NetworkSpec()
    prefill: PoolSpec = PoolSpec()
    decode: PoolSpec = PoolSpec()
    colocated: PoolSpec = PoolSpec()
    router: RouterSpec = RouterSpec()
    serving: ServingSpec = ServingSpec()
    slo: Annotated[SLOSpec | None, Field(description="Latency targets; required by autoscaling.")] = None
    max_gpus: Annotated[
        int | None,
        Field(
            ge=1,
            le=65536,
            alias="maxGPUs",
            description="GPUs all pools together may request (the autoscaler's budget).",
        ),
    ] = None
    autoscaling: AutoscalingSpec = AutoscalingSpec()
    rollout: Annotated[
        RolloutSpec | None,
        Field(description="Shift traffic gradually, judged and reversible, when spec.serving.mode changes."),
    ] = None

    @model_validator(mode="after")
    def _check(self) -> PDDeploymentSpec:
        violations = rules.spec_violations(self.model_dump(by_alias=True, mode="json"))
        if violations:
            raise ValueError("; ".join(violations))
        return self

    def pool(self, role: str) -> PoolSpec:
        pool: PoolSpec = getattr(self, role)
        return pool


class ObjectMeta(ApiModel):
    """The parts of metadata the operator reads (extra keys such as labels are ignored)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}

    @model_validator(mode="after")
    def _check(self) -> ObjectMeta:
        violations = rules.name_violations(self.name)
        if violations:
            raise ValueError("; ".join(violations))
        return self


class PDDeployment(ApiModel):
    """A whole PDDeployment object as read from the API (status is kept raw; see status.py)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    api_version: str = "tandem.dev/v1alpha1"
    kind: str = "PDDeployment"
    metadata: ObjectMeta
    spec: PDDeploymentSpec

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> PDDeployment:
        return cls.model_validate(obj)
