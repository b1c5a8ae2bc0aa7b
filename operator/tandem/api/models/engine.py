"""`spec.engine`: the engine (vLLM or the sim engine), its image, environment and arguments."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from tandem.api.models.common import IMAGE_PATTERN, ApiModel, DataKey, ObjectName, _unique


class EngineType(StrEnum):
    vllm = "vllm"
    sim = "sim"


# The pod fields an environment variable may take (Kubernetes' downward API for env).
FIELD_PATH_PATTERN = (
    r"^(metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']+'\]"
    r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$"
)


class FieldRef(ApiModel):
    field_path: Annotated[str, Field(min_length=1, max_length=256, pattern=FIELD_PATH_PATTERN)]


class ConfigMapKeyRef(ApiModel):
    name: ObjectName
    key: DataKey
    optional: bool | None = None


class SecretKeySelector(ConfigMapKeyRef):
    pass


ONE_SOURCE_MESSAGE = "must set exactly one of fieldRef, secretKeyRef and configMapKeyRef"


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from: exactly one source."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.fieldRef) ? 1 : 0) + (has(self.secretKeyRef) ? 1 : 0) + "
                    "(has(self.configMapKeyRef) ? 1 : 0) == 1",
                    "message": ONE_SOURCE_MESSAGE,
                    "reason": "FieldValueInvalid",
                }
            ]
        }
    )

    field_ref: FieldRef | None = None
    secret_key_ref: SecretKeySelector | None = None
    config_map_key_ref: ConfigMapKeyRef | None = None

    @model_validator(mode="after")
    def _one(self) -> EnvVarSource:
        if [self.field_ref, self.secret_key_ref, self.config_map_key_ref].count(None) != 2:
            raise ValueError(ONE_SOURCE_MESSAGE)
        return self


class EnvVar(ApiModel):
    """An environment variable of the engine container (Kubernetes EnvVar, the common sources)."""

    name: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]
    value: str | None = None
    value_from: EnvVarSource | None = None


ImagePullPolicy = Literal["Always", "IfNotPresent", "Never"]


def _unique_env(env: list[EnvVar]) -> list[EnvVar]:
    _unique([var.name for var in env])
    return env


# Lists the pods keep by name (server-side apply merges them by it): a repeated name is refused at
# admission (x-kubernetes-list-type) instead of by the apply of the rendered pod template.
ImagePullSecrets = Annotated[
    list[ObjectName],
    Field(
        max_length=16,
        description="Names of Secrets used to pull the image.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    ),
    AfterValidator(_unique),
]


class SimSpec(ApiModel):
    """Settings of `engine.type: sim` (the simulator needs no accelerator)."""

    request_accelerators: Annotated[
        bool,
        Field(
            description="Request GPUs (nvidia.com/gpu = tensorParallelSize) and RDMA devices, with the RDMA "
            "node affinity and IPC_LOCK, as vLLM pods do, to try GPU/RDMA scheduling on a cluster with such "
            "nodes (the dev cluster's fake GPU nodes). False: sim pods request neither, for any CPU node."
        ),
    ] = False


class EngineSpec(ApiModel):
    """The serving engine every pool runs."""

    type: Annotated[
        EngineType,
        Field(description="vllm runs `vllm serve`; sim runs tandem's simulator with the same arguments."),
    ] = EngineType.vllm
    image: Annotated[
        str,
        Field(max_length=512, pattern=IMAGE_PATTERN, description="Container image of the engine."),
    ]
    image_pull_policy: ImagePullPolicy = "IfNotPresent"
    image_pull_secrets: ImagePullSecrets = []
    env: Annotated[
        list[EnvVar],
        Field(
            max_length=64,
            json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        ),
        AfterValidator(_unique_env),
    ] = []
    extra_args: Annotated[
        list[Annotated[str, Field(max_length=1024)]],
        Field(max_length=64, description="Arguments appended to every pool's engine command line."),
    ] = []
    sim: Annotated[
        SimSpec | None,
        Field(description="Simulator settings; only with type sim."),
    ] = None
