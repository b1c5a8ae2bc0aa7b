"""`spec.router`: the router (tenants, auth, admission, metrics, prefix-aware routing, disaggregation)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tandem.api.models.common import IMAGE_PATTERN, OBJECT_NAME_PATTERN, ApiModel, Labels, LengthBounds
from tandem.api.models.engine import ImagePullPolicy, ImagePullSecrets
from tandem.api.models.pool import Resources, Toleration

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
        Field(description="Output-token bounds of the TPOT and ITL buckets, strictly increasing."),
    ] = [128, 512, 2048]
    concurrency_buckets: Annotated[
        LengthBounds,
        Field(
            description="Bounds of the TPOT and ITL concurrency buckets (requests in flight at a router on "
            "the request's path when it arrived, itself included), strictly increasing: the default "
            "[4, 16, 64, 256] gives 0-4, 4-16, 16-64, 64-256 and 256+."
        ),
    ] = [4, 16, 64, 256]


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


class DisaggregationSpec(ApiModel):
    """Per request, prefill on a prefill pod and pull the KV (remote), or prefill on the chosen decode
    pod (local): docs/router.md, "Remote or local prefill". Absent: Always."""

    mode: Annotated[
        Literal["Always", "Auto", "Threshold"],
        Field(
            description="Always: every P/D request is prefilled on a prefill pod (as without this field). "
            "Threshold: on its decode pod when the prompt tokens that pod lacks are at most "
            "thresholdTokens. Auto: the side with the lower estimated time to first token, from what "
            "the router measures (its prefill legs, the KV pulls, local prefills, queues, the decode "
            "pod's TPOT against spec.slo), within maxLocalTokens and maxLocalPrefills. Auto and "
            "Threshold prefill on the decode pod when no prefill pod is ready. A change of mode goes "
            "through spec.rollout's steps when spec.rollout is set."
        ),
    ] = "Always"
    threshold_tokens: Annotated[
        int | None,
        Field(
            ge=1,
            le=1_048_576,
            description="Threshold (required there, refused otherwise): the most prompt tokens a decode "
            "pod may lack (not in its prefix cache) for the request to be prefilled on it.",
        ),
    ] = None
    max_local_tokens: Annotated[
        int | None,
        Field(
            ge=1,
            le=1_048_576,
            description="Auto only: the most prompt tokens one local prefill may lack on its decode pod, "
            "and those the pod's local prefills in flight may lack together, per router replica (a local "
            "prefill stalls the pod's streams while it runs); together up to twice that where the router "
            "can check the streams' TPOT against spec.slo (their stall counted). Unset: 1024.",
        ),
    ] = None
    max_local_prefills: Annotated[
        int | None,
        Field(
            ge=1,
            le=64,
            description="Auto only: local prefills at once on one decode pod, per router replica. Unset: 8.",
        ),
    ] = None


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
            "load-balanced whatever it says, except under disaggregation Auto or Threshold, where "
            "they too are chosen by prefix (a decode pod may prefill the request itself)."
        ),
    ] = None
    disaggregation: Annotated[
        DisaggregationSpec | None,
        Field(description="Remote or local prefill, per request; unset: Always (every request remote)."),
    ] = None
