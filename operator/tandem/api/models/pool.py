"""`spec.prefill`, `spec.decode`, `spec.colocated`: one pool (size, parallelism and nodes per
instance, GPU type, resources, placement, autoscaling bounds).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from tandem.api import rules
from tandem.api.models.common import (
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    ApiModel,
    Labels,
    Quantity,
)
from tandem.api.models.parallelism import GroupPlacement, Parallelism
from tandem.api.shape import Shape

# Kubernetes' own rules for a toleration (the pods' apiserver validation), checked at admission so
# that a spec the apiserver stores never renders a StatefulSet it refuses: (CEL on the toleration,
# message, fieldPath, the same in Python over the toleration's camelCase dict).
TOLERATION_RULES: tuple[tuple[str, str, str, Any], ...] = (
    (
        "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
        "value must be empty when operator is Exists",
        ".value",
        lambda t: t.get("operator") != "Exists" or not t.get("value"),
    ),
    (
        "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
        "operator must be Exists when key is empty (a toleration of every taint)",
        ".operator",
        lambda t: bool(t.get("key")) or t.get("operator") == "Exists",
    ),
    (
        "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        "tolerationSeconds needs effect NoExecute",
        ".tolerationSeconds",
        lambda t: t.get("tolerationSeconds") is None or t.get("effect") == "NoExecute",
    ),
)


class Toleration(ApiModel):
    """A Kubernetes toleration of the pool's pods, with Kubernetes' own rules checked at admission."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": cel, "message": message, "fieldPath": path, "reason": "FieldValueInvalid"}
                for cel, message, path, _ in TOLERATION_RULES
            ]
        }
    )

    key: Annotated[str | None, Field(max_length=317, pattern=LABEL_KEY_PATTERN)] = None
    operator: Literal["Exists", "Equal"] | None = None
    value: Annotated[str | None, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)] = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    @model_validator(mode="after")
    def _check(self) -> Toleration:
        fields = self.model_dump(by_alias=True, exclude_none=True)
        violations = [message for _, message, _, check in TOLERATION_RULES if not check(fields)]
        if violations:
            raise ValueError("; ".join(violations))
        return self


_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_RESOURCE_NAME_CEL = (
    f"k in {list(_STANDARD_RESOURCES)} || k.startsWith('hugepages-') || "
    f"(k.contains('/') && k.matches({rules._cel_string(LABEL_KEY_PATTERN)}))"
)
RESOURCE_NAME_MESSAGE = (
    "names must be cpu, memory, ephemeral-storage, hugepages-<size> or a domain-prefixed name "
    "(example.com/device)"
)
REQUEST_OVER_LIMIT_MESSAGE = "requests must not be greater than limits of the same resource"
EXTENDED_LIMIT_MESSAGE = (
    "requests of an extended resource (a domain-prefixed name) or of hugepages need a limit equal to them "
    "(they cannot be overcommitted)"
)

EXTENDED_WHOLE_MESSAGE = "extended resources (domain-prefixed names) must be whole numbers"


def _overcommitable(name: str) -> bool:
    return "/" not in name and not name.startswith("hugepages-")


def _resource_name(name: str) -> bool:
    return (
        name in _STANDARD_RESOURCES
        or name.startswith("hugepages-")
        or ("/" in name and re.match(LABEL_KEY_PATTERN, name) is not None)
    )


def _quantity(value: int | str) -> Decimal:
    """A quantity QUANTITY_PATTERN admits, as a number."""
    text = str(value).lstrip("+")
    for suffixes, base in (
        (("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1024),
        (("k", "M", "G", "T", "P", "E"), 1000),
    ):
        for power, suffix in enumerate(suffixes, start=1):
            if text.endswith(suffix):
                return Decimal(text.removesuffix(suffix)) * Decimal(base) ** power
    for suffix, scale in (("n", Decimal("1e-9")), ("u", Decimal("1e-6")), ("m", Decimal("1e-3"))):
        if text.endswith(suffix):
            return Decimal(text.removesuffix(suffix)) * scale
    return Decimal(text)


class Resources(ApiModel):
    """CPU, memory and other non-GPU resources; GPUs and RDMA devices are derived. Checked as
    Kubernetes checks a container's resources (names, quantities, requests within limits)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        f"self.requests.all(k, {_RESOURCE_NAME_CEL}) && "
                        f"self.limits.all(k, {_RESOURCE_NAME_CEL})"
                    ),
                    "message": RESOURCE_NAME_MESSAGE,
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "self.requests.all(k, !(k in self.limits) || "
                    "quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) <= 0)",
                    "message": REQUEST_OVER_LIMIT_MESSAGE,
                    "fieldPath": ".requests",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "self.requests.all(k, !(k.contains('/') || k.startsWith('hugepages-')) || "
                    "(k in self.limits && "
                    "quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) == 0))",
                    "message": EXTENDED_LIMIT_MESSAGE,
                    "fieldPath": ".limits",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "self.limits.all(k, !k.contains('/') || "
                    "quantity(string(self.limits[k])).isInteger())",
                    "message": EXTENDED_WHOLE_MESSAGE,
                    "fieldPath": ".limits",
                    "reason": "FieldValueInvalid",
                },
            ]
        }
    )

    requests: Annotated[dict[str, Quantity], Field(max_length=16)] = {}
    limits: Annotated[dict[str, Quantity], Field(max_length=16)] = {}

    @model_validator(mode="after")
    def _check(self) -> Resources:
        if not all(_resource_name(k) for k in [*self.requests, *self.limits]):
            raise ValueError(RESOURCE_NAME_MESSAGE)
        if any(
            k in self.limits and _quantity(v) > _quantity(self.limits[k]) for k, v in self.requests.items()
        ):
            raise ValueError(REQUEST_OVER_LIMIT_MESSAGE)
        if any(
            not _overcommitable(k) and (k not in self.limits or _quantity(v) != _quantity(self.limits[k]))
            for k, v in self.requests.items()
        ):
            raise ValueError(EXTENDED_LIMIT_MESSAGE)
        if any("/" in k and _quantity(v) % 1 != 0 for k, v in self.limits.items()):
            raise ValueError(EXTENDED_WHOLE_MESSAGE)
        return self


class PoolAutoscaling(ApiModel):
    """Bounds of one pool's size under the autoscaler, or its hand-over to an HPA / KEDA."""

    min_replicas: Annotated[
        int, Field(ge=0, le=1024, description="The autoscaler never goes below this many replicas.")
    ] = 1
    max_replicas: Annotated[
        int, Field(ge=1, le=1024, description="The autoscaler never goes above this many replicas.")
    ] = 8
    external: Annotated[
        bool,
        Field(
            description=(
                "Hand this pool's replicas to another controller (HPA, KEDA): the operator stops "
                "owning the StatefulSet's replicas without changing the count."
            )
        ),
    ] = False


class PoolSpec(ApiModel):
    """One pool of engine replicas (prefill, decode or colocated)."""

    replicas: Annotated[
        int,
        Field(
            ge=0,
            le=1024,
            description="Replicas; with autoscaling, the initial size only (the autoscaler owns it after).",
        ),
    ] = 0
    tensor_parallel_size: Annotated[
        int,
        Field(
            description="Tensor parallelism of one rank (vLLM --tensor-parallel-size): 1, 2, 4 or 8, or "
            "up to 8 x nodesPerInstance when one rank spans nodes. GPUs per replica = tensorParallelSize "
            "x parallelism.pipeline x parallelism.data."
        ),
    ] = 1
    parallelism: Annotated[
        Parallelism,
        Field(description="Pipeline, data and expert parallelism of one replica (docs/multinode.md)."),
    ] = Parallelism()
    nodes_per_instance: Annotated[
        int,
        Field(
            ge=1,
            le=64,
            description="Pods (one per node) of one replica: 1 renders a StatefulSet pod per replica, more "
            "a LeaderWorkerSet group per replica (a leader and nodesPerInstance - 1 workers).",
        ),
    ] = 1
    gpu_type: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=63,
            pattern=LABEL_VALUE_PATTERN,
            description="The GPU model this pool runs on, as GPU Feature Discovery labels nodes "
            "(nvidia.com/gpu.product, e.g. NVIDIA-H100-80GB-HBM3): the pool's pods select such nodes.",
        ),
    ] = None
    engine_args: Annotated[
        list[Annotated[str, Field(max_length=1024)]],
        Field(max_length=64, description="Arguments appended to this pool's engine command line."),
    ] = []
    resources: Resources = Resources()
    node_selector: Labels = {}
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = []
    autoscaling: Annotated[
        PoolAutoscaling | None,
        Field(description="Size this pool from the SLO (needs spec.autoscaling.enabled); fixed when unset."),
    ] = None
    group_placement: Annotated[
        GroupPlacement | None,
        Field(description="All-or-nothing placement of each replica's pods (nodesPerInstance > 1 only)."),
    ] = None

    @property
    def shape(self) -> Shape:
        """The pool's instance shape (GPUs per replica and per pod, ranks per pod; `tandem.api.shape`)."""
        par = self.parallelism
        return Shape(
            tensor=self.tensor_parallel_size,
            pipeline=par.pipeline,
            data=par.data,
            data_local=par.data_local,
            expert=par.expert,
            load_balancing=par.load_balancing.value,
            nodes=self.nodes_per_instance,
        )

    @property
    def gpus_per_instance(self) -> int:
        """GPUs one replica requests (all its pods): what maxGPUs, the autoscaler and status count."""
        return self.shape.gpus_per_instance
