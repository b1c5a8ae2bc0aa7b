"""The PDDeployment spec as pydantic v2 models: the source of truth for the CRD and the renderer.

Field names are snake_case in Python and camelCase in YAML (aliases). Every field here has
behaviour behind it in the renderer, the router or the operator. Cross-field rules live in
`rules.py` so that the CRD's CEL and these models enforce the same thing.
"""

from __future__ import annotations

import re
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from tandem.api import rules

# A non-negative Kubernetes resource quantity ("500m", "1Gi", "2", 4): what a pod's resources take.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Quantity = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(max_length=64, pattern=QUANTITY_PATTERN)],
    Field(
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "maxLength": 64,
            "minimum": 0,
        }
    ),
]


# A label key (an optional DNS subdomain prefix and '/', then a name of at most 63 characters) and a
# label value, as Kubernetes validates them on the pods tandem renders.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# An image reference has no whitespace (a pod's image may not begin or end with any); empty is left
# to the rule that names it ("must not be empty").
IMAGE_PATTERN = r"^\S*$"


LABEL_MAP_MESSAGE = (
    "keys must be label keys: an optional DNS subdomain prefix and '/', then a name of at most 63 "
    "letters, digits, '-', '_' or '.', beginning and ending alphanumeric"
)


def _check_label_keys(labels: dict[str, str]) -> dict[str, str]:
    if bad := [key for key in labels if re.match(LABEL_KEY_PATTERN, key) is None]:
        raise ValueError(f"{LABEL_MAP_MESSAGE}: {', '.join(repr(k) for k in bad)}")
    return labels


LABEL_MAP_CEL = f"self.all(k, k.matches({rules._cel_string(LABEL_KEY_PATTERN)}))"
# Node selectors and label selectors: Kubernetes validates them on the objects tandem renders, so
# they are checked at admission (a stored spec always renders objects the apiserver takes): values by
# the schema, keys by CEL (a structural schema cannot constrain map keys).
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
Labels = Annotated[
    dict[str, LabelValue],
    Field(
        max_length=16,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": LABEL_MAP_CEL, "message": LABEL_MAP_MESSAGE, "reason": "FieldValueInvalid"}
            ]
        },
    ),
    AfterValidator(_check_label_keys),
]


class ApiModel(BaseModel):
    """Base for every API model: camelCase aliases, unknown fields refused, values validated."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )


class EngineType(StrEnum):
    vllm = "vllm"
    sim = "sim"


class KVConnector(StrEnum):
    NixlConnector = "NixlConnector"
    MooncakeConnector = "MooncakeConnector"
    LMCacheConnectorV1 = "LMCacheConnectorV1"


class KVLoadFailurePolicy(StrEnum):
    fail = "fail"
    recompute = "recompute"


class ServingMode(StrEnum):
    Disaggregated = "Disaggregated"
    Colocated = "Colocated"


# An object's name (a DNS subdomain) and a key of a Secret's or ConfigMap's data, as Kubernetes
# checks them where the pods refer to them.
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DATA_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=OBJECT_NAME_PATTERN)]
DataKey = Annotated[str, Field(min_length=1, max_length=253, pattern=DATA_KEY_PATTERN)]


class SecretKeyRef(ApiModel):
    """A key of a Secret in the PDDeployment's namespace."""

    name: ObjectName
    key: DataKey


class ModelSpec(ApiModel):
    """What model is served, from where, and under which name."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$",
            description="Name clients put in `model` (vLLM --served-model-name).",
        ),
    ]
    uri: Annotated[
        str,
        Field(
            min_length=1,
            max_length=512,
            description=(
                "Where the weights come from: hf://org/repo[@revision], pvc://claim/path (mounted "
                "read-only), or file:///absolute/path inside the image."
            ),
        ),
    ]
    max_model_len: Annotated[
        int | None,
        Field(ge=128, le=10_485_760, description="Context limit (vLLM --max-model-len)."),
    ] = None
    token_secret_ref: Annotated[
        SecretKeyRef | None,
        Field(description="Secret key holding a Hugging Face token (hf:// only), exported as HF_TOKEN."),
    ] = None
    kv_bytes_per_token: Annotated[
        int | None,
        Field(
            ge=1,
            description=(
                "KV-cache bytes per token, for status and transfer estimates. Derived from known "
                "architectures when unset."
            ),
        ),
    ] = None


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


def _unique(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError("must not repeat a name")
    return names


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
        Field(description="GPUs per replica (vLLM --tensor-parallel-size): 1, 2, 4 or 8."),
    ] = 1
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


TENANT_NAME_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"  # also a valid Secret data key
HEADER_NAME_PATTERN = r"^[A-Za-z0-9][-A-Za-z0-9]*$"


class TenantLimits(ApiModel):
    """Token-bucket limits of one tenant, per router replica; an unset rate is no limit."""

    requests_per_second: Annotated[
        float | None, Field(gt=0, le=1_000_000, description="Requests admitted per second (refill rate).")
    ] = None
    request_burst: Annotated[
        int | None,
        Field(
            ge=1,
            le=1_000_000,
            description="Requests admitted at once (bucket size); unset: the rate, at least 1.",
        ),
    ] = None
    prompt_tokens_per_second: Annotated[
        float | None,
        Field(
            gt=0,
            le=1_000_000_000,
            description="Prompt tokens admitted per second (the router's estimate of each prompt).",
        ),
    ] = None
    prompt_token_burst: Annotated[
        int | None,
        Field(
            ge=1,
            le=1_000_000_000,
            description="Prompt tokens admitted at once (bucket size); unset: the rate, at least 1. A prompt "
            "larger than the bucket is admitted when the bucket is full, and leaves it in debt.",
        ),
    ] = None


class TenantSpec(ApiModel):
    """A tenant the router knows by name: its own limits and its own value of the `tenant` label."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=63,
            pattern=TENANT_NAME_PATTERN,
            description="The tenant: an entry of the API keys Secret, or the tenant header's value.",
        ),
    ]
    limits: Annotated[
        TenantLimits | None,
        Field(description="This tenant's limits; unset: spec.router.admission.defaultLimits."),
    ] = None


class RouterAuthSpec(ApiModel):
    """Who sent a request: an API key from a Secret, or a trusted tenant header."""

    api_keys_secret: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=253,
            pattern=OBJECT_NAME_PATTERN,
            description="Secret in the namespace whose data maps tenant -> API keys (one or more per "
            "entry, one a line). When set, every request needs `Authorization: Bearer <key>` (401 "
            "otherwise), and the tenant is the key's entry.",
        ),
    ] = None
    tenant_header: Annotated[
        str,
        Field(
            min_length=1,
            max_length=128,
            pattern=HEADER_NAME_PATTERN,
            description="Without apiKeysSecret: the request header naming the tenant (trusted as sent).",
        ),
    ] = "X-Tenant"


class LongPromptSpec(ApiModel):
    """A cap on long prompts in flight, so a burst of long prefills cannot starve short requests."""

    min_tokens: Annotated[
        int,
        Field(
            ge=1,
            le=10_485_760,
            description="A prompt of at least this many tokens (the router's estimate) is long.",
        ),
    ]
    max_concurrent: Annotated[
        int, Field(ge=1, le=100_000, description="Long requests in flight at once, per router replica.")
    ]


class DecodeBackpressureSpec(ApiModel):
    """Decode pods near KV capacity (their vllm:kv_cache_usage_perc, read by the router) get no transfers."""

    kv_usage_percent: Annotated[
        float, Field(gt=0, le=100, description="A decode pod at or above this KV-cache usage is full.")
    ] = 90.0
    scrape_interval_seconds: Annotated[
        float, Field(ge=1, le=60, description="How often the router reads each decode pod's /metrics.")
    ] = 2.0
    queue_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=60,
            description="When every decode pod is full: how long a request waits for room (then 429).",
        ),
    ] = 2.0


# Bounds of spec.router.admission.maxBodyBytes (and of the router's --max-body-bytes).
MIN_BODY_BYTES = 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_BODY_BYTES = 4 * 1024 * 1024


class AdmissionSpec(ApiModel):
    """What each router replica admits; limits are per replica (N replicas admit up to N times as much)."""

    default_limits: Annotated[
        TenantLimits | None,
        Field(
            description="Limits of the tenants without their own: `default` (no tenant named) and `other` "
            "(tenants not in spec.router.tenants, which share one bucket)."
        ),
    ] = None
    long_prompts: LongPromptSpec | None = None
    decode_backpressure: DecodeBackpressureSpec | None = None
    max_body_bytes: Annotated[
        int | None,
        Field(
            ge=MIN_BODY_BYTES,
            le=MAX_BODY_BYTES,
            description="The largest request body a router accepts, in bytes; a larger one gets 413 "
            "before its body is read (a body is held in the router's memory while it is read). Raise "
            "it for large inputs such as base64 images. Unset: 4 MiB (the router's --max-body-bytes).",
        ),
    ] = None


LengthBounds = Annotated[list[Annotated[int, Field(ge=1, le=10_000_000)]], Field(min_length=1, max_length=16)]


class RouterMetricsSpec(ApiModel):
    """How the routers split their latency histograms (docs/observability.md)."""

    input_length_buckets: Annotated[
        LengthBounds,
        Field(
            description="Prompt-token bounds of the TTFT buckets, strictly increasing: the default "
            "[1024, 4096, 16384] gives 0-1024, 1024-4096, 4096-16384 and 16384+."
        ),
    ] = [1024, 4096, 16384]
    output_length_buckets: Annotated[
        LengthBounds,
        Field(description="Output-token bounds of the TPOT buckets, strictly increasing."),
    ] = [128, 512, 2048]


class PrefixAwareSpec(ApiModel):
    """The prefill (and colocated) pod choice by expected prefix-cache hit against load (docs/router.md).

    The router cuts each prompt's text into chunks, hashes them chained (a key names the whole text
    up to its chunk) and remembers which pod it sent which keys; a request goes to the pod holding
    its longest prefix among the pods within the load bound. Decode pods stay load-balanced."""

    enabled: Annotated[
        bool, Field(description="Choose prefill/colocated pods by prefix; false: by load only.")
    ] = True
    block_chars: Annotated[
        int,
        Field(
            ge=8,
            le=8192,
            description="Characters of prompt text per chunk (64: about one 16-token engine block at "
            "about 4 characters a token; the chunks approximate blocks, they do not line up with them).",
        ),
    ] = 64
    max_blocks: Annotated[
        int, Field(ge=1, le=4096, description="Leading chunks of a prompt considered (the rest is ignored).")
    ] = 256
    load_bound: Annotated[
        float,
        Field(
            ge=1,
            le=10,
            description="A pod takes a request for its cached prefix only while its outstanding load is "
            "at most loadBound x the pool's mean + 1; past it the request goes to the next-best pod.",
        ),
    ] = 1.25
    index_blocks_per_pod: Annotated[
        int,
        Field(
            ge=16,
            le=10_000_000,
            description="Chunks the router remembers per pod (least recently used forgotten first): "
            "about the engine's prefix-cache capacity in blocks.",
        ),
    ] = 32768


class RouterSpec(ApiModel):
    replicas: Annotated[int, Field(ge=1, le=64)] = 2
    image: Annotated[
        str, Field(max_length=512, pattern=IMAGE_PATTERN, description="Container image of tandem (router).")
    ] = "ghcr.io/tandem-dev/tandem:0.1.0"
    image_pull_policy: ImagePullPolicy = "IfNotPresent"
    image_pull_secrets: ImagePullSecrets = []
    resources: Resources = Resources(
        requests={"cpu": "500m", "memory": "256Mi"}, limits={"cpu": "2", "memory": "1Gi"}
    )
    node_selector: Annotated[
        Labels,
        Field(description="Node labels router pods require (they prefer nodes without GPUs)."),
    ] = {}
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = []
    auth: RouterAuthSpec = RouterAuthSpec()
    tenants: Annotated[
        list[TenantSpec],
        Field(
            max_length=64,
            description="Tenants with their own limits and metrics label; any other counts as `other`.",
        ),
    ] = []
    admission: AdmissionSpec = AdmissionSpec()
    metrics: RouterMetricsSpec = RouterMetricsSpec()
    prefix_aware: PrefixAwareSpec = PrefixAwareSpec()
    prefill_policy: Annotated[
        Literal["PrefixAware", "LeastLoaded", "RoundRobin"] | None,
        Field(
            description="How the router picks prefill (and colocated) pods: PrefixAware (by expected "
            "prefix-cache hit against load, prefixAware's knobs), LeastLoaded (by load only) or "
            "RoundRobin (in turn, load ignored). Set, it wins over prefixAware.enabled; unset: "
            "PrefixAware, or LeastLoaded when prefixAware.enabled is false. Decode pods are "
            "load-balanced whatever it says."
        ),
    ] = None


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
    scale_down: ScalingRules = ScalingRules(stabilization_seconds=600, max_step=1)
    drain_timeout_seconds: Annotated[
        int,
        Field(
            ge=0,
            le=3600,
            description="Longest wait for a draining pod's streams and unpulled KV before it is removed.",
        ),
    ] = 300


class OnMetricsUnavailable(StrEnum):
    Pause = "Pause"
    Rollback = "Rollback"


class RolloutStep(ApiModel):
    """One step of a rollout: a share of requests on the target arm, held at least this long."""

    weight: Annotated[
        int, Field(ge=1, le=100, description="Percent of requests on the target arm (strictly increasing).")
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
            description="Tenants (of spec.router.tenants) whose requests go to the target arm first, at "
            "any weight above 0; everyone else by the weight.",
        ),
    ] = []


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
