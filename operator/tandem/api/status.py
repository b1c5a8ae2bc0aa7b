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
    AutoscalingActive = "AutoscalingActive"
    KVTransportDegraded = "KVTransportDegraded"
    RolloutProgressing = "RolloutProgressing"
    RolledBack = "RolledBack"


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


class ReplicaSource(StrEnum):
    """Who sets a pool's replicas."""

    spec = "spec"  # spec.<pool>.replicas
    autoscaler = "autoscaler"  # tandem's SLO autoscaler (status.autoscaling)
    external = "external"  # another controller (HPA, KEDA) through the scale subresource


class SizingStage(StrEnum):
    """The stage of the sizing chain (`tandem.sizing`) that last changed a pool's replica count."""

    spec = "spec"  # spec.<pool>.replicas, unchanged
    autoscaler = "autoscaler"  # the autoscaler's decision, unchanged
    external = "external"  # another controller's count (HPA, KEDA)
    rollout_arm = "rolloutArm"  # a mode rollout's arm: its share of the traffic, or held at zero
    drain = "drain"  # a shrinking pool keeps the pods still draining
    revision_share = "revisionShare"  # a revision rollout: the pair at its share of the P/D requests
    max_gpus = "maxGPUs"  # cut so that both sides of a change fit spec.maxGPUs


class PoolStatus(ApiModel):
    replicas: Annotated[
        int,
        Field(
            ge=0,
            description="Replicas (instances) that exist: pods of a StatefulSet, groups of a multi-node "
            "pool's LeaderWorkerSet (its status.replicas).",
        ),
    ] = 0
    ready_replicas: Annotated[
        int,
        Field(
            ge=0,
            description="Replicas that are ready: pods that pass readiness; for a multi-node pool, groups "
            "whose every pod (the leader and each worker) is Ready.",
        ),
    ] = 0
    desired_replicas: Annotated[
        int, Field(ge=0, description="Replicas the operator asks for (groups for a multi-node pool).")
    ] = 0
    gpus: Annotated[
        int, Field(ge=0, description="GPUs the desired replicas request (every pod of every group).")
    ] = 0
    ready: Annotated[str, Field(description="readyReplicas/desiredReplicas, for printer columns.")] = "0/0"
    shape: Annotated[
        str,
        Field(
            max_length=128,
            description="A replica's shape, e.g. `2x8 TP1 DP16 EP Internal`: pods x GPUs per pod, then the "
            "parallelism other than 1 (tandem.api.shape), for printer columns.",
        ),
    ] = ""
    source: Annotated[ReplicaSource, Field(description="Who sets desiredReplicas.")] = ReplicaSource.spec
    limited_by: Annotated[
        SizingStage,
        Field(
            description="The last stage of the sizing chain that changed the pool's replicas (its "
            "source when none did): spec, autoscaler, external, rolloutArm, drain, revisionShare, maxGPUs."
        ),
    ] = SizingStage.spec


class PoolsStatus(ApiModel):
    prefill: PoolStatus = PoolStatus()
    decode: PoolStatus = PoolStatus()
    colocated: PoolStatus = PoolStatus()
    router: PoolStatus = PoolStatus()


class KVTransportMeasurement(ApiModel):
    """The KV transport as the engines' NIXL metrics showed it over the last window (operator-read)."""

    observed_at: Annotated[float, Field(description="Unix time of the reading.")]
    window_seconds: Annotated[int, Field(ge=0, description="The window the reading covers (seconds).")]
    transfers: Annotated[int, Field(ge=0, description="KV transfers in the window, failed included.")] = 0
    failed_transfers: Annotated[int, Field(ge=0)] = 0
    judged_transfers: Annotated[
        int, Field(ge=0, description="Successful transfers over the minimum judged size.")
    ] = 0
    effective_gbps: Annotated[
        float | None, Field(description="Effective bandwidth of the judged transfers, at most (Gb/s).")
    ] = None
    link_gbps: Annotated[
        float, Field(description="What a healthy link gives (spec.kvTransfer.bandwidthGbps, Gb/s).")
    ]
    bandwidth_percent: Annotated[int | None, Field(description="effectiveGbps / linkGbps, percent.")] = None
    readings_below: Annotated[
        int,
        Field(ge=0, description="Judged readings in a row below spec.kvTransfer.degradedBelowPercent."),
    ] = 0
    judged_at: Annotated[
        float | None,
        Field(
            description="Unix time of the last reading that judged the bandwidth (held over unjudged ones)."
        ),
    ] = None


class KVTransferStatus(ApiModel):
    bytes_per_token: Annotated[
        int | None, Field(description="KV-cache bytes per token (spec or the known architecture).")
    ] = None
    ms_per_thousand_tokens: Annotated[
        int | None,
        Field(description="Transfer time of 1,000 tokens of KV at spec.kvTransfer.bandwidthGbps (ms)."),
    ] = None
    measured: KVTransportMeasurement | None = None


class ScaleDecision(ApiModel):
    """One autoscaler decision for one pool, with the figures it used."""

    time: Annotated[str, Field(description="RFC 3339 time of the decision.")]
    from_replicas: Annotated[int, Field(ge=0, alias="from")]
    to: Annotated[int, Field(ge=0)]
    reason: Annotated[str, Field(max_length=1024)]
    figures: Annotated[dict[str, float], Field(max_length=32)] = {}
    cause: Annotated[
        str | None,
        Field(
            max_length=32,
            description=(
                "What the pool's own SLO miss was charged to, when it missed: tpot, a TTFT part"
                " (prefillQueue, prefillCompute, routerQueue, decodeWait, decodeFull, prefill) or ttft"
                " (colocated); load when the capacity model alone decided."
            ),
        ),
    ] = None


class Recommendation(ApiModel):
    """A raw recommendation kept for the stabilization windows (survives operator restarts)."""

    time: Annotated[float, Field(description="Unix time of the recommendation, in seconds.")]
    replicas: Annotated[int, Field(ge=0)]


class DrainStatus(ApiModel):
    """Pods being emptied before their StatefulSet loses them (the highest ordinals go first)."""

    pod: Annotated[str, Field(description="The first pod the StatefulSet will remove.")]
    pods: Annotated[
        list[str],
        Field(max_length=1024, description="Every pod being drained (annotated tandem.dev/draining)."),
    ] = []
    started_at: Annotated[float, Field(description="Unix time the drain started, in seconds.")]
    target_replicas: Annotated[
        int, Field(ge=0, description="The StatefulSet's replicas once the drained pods are idle.")
    ]


FORECAST_BUCKETS = 96  # the seasonal profile's buckets over one period (15 min of a day)


class ForecastStatus(ApiModel):
    """A pool's demand forecast (`autoscale.forecast`): a Holt level and trend of its demand, a
    seasonal profile learnt over earlier periods, and its measured start-to-ready time. About 1 KB."""

    level: Annotated[float, Field(ge=0, description="Smoothed demand (prompt or output tokens/s).")] = 0.0
    trend: Annotated[float, Field(description="Smoothed change of the demand, per second.")] = 0.0
    updated_at: Annotated[float | None, Field(description="Unix time of the last observation.")] = None
    first_at: Annotated[float | None, Field(description="Unix time of the first observation.")] = None
    period_seconds: Annotated[int, Field(ge=0, description="The period the profile was learnt over.")] = 0
    profile: Annotated[
        list[float],
        Field(
            max_length=FORECAST_BUCKETS,
            description="Mean demand per bucket of the period, learnt period over period; -1: not seen yet.",
        ),
    ] = []
    bucket: Annotated[int | None, Field(description="The bucket (since the epoch) being accumulated.")] = None
    bucket_sum: Annotated[float, Field(ge=0)] = 0.0
    bucket_count: Annotated[int, Field(ge=0)] = 0
    starting_since: Annotated[
        float | None, Field(description="Unix time pods of the pool were first seen starting.")
    ] = None
    load_seconds: Annotated[
        float | None, Field(ge=0, description="Measured start-to-ready time of the pool's pods (seconds).")
    ] = None


class PoolAutoscalingStatus(ApiModel):
    desired_replicas: Annotated[
        int | None, Field(ge=0, description="The size the autoscaler holds this pool at.")
    ] = None
    last_decision: ScaleDecision | None = None
    last_scale_time: Annotated[float | None, Field(description="Unix time of the last change.")] = None
    recommendations: Annotated[list[Recommendation], Field(max_length=512)] = []
    capacity_correction: Annotated[
        float,
        Field(gt=0, description="Measured / profile capacity per replica, learnt from what pods sustained."),
    ] = 1.0
    draining: DrainStatus | None = None
    forecast: Annotated[
        ForecastStatus | None, Field(description="The demand forecast's state (spec.autoscaling.forecast).")
    ] = None


class AutoscalingPoolsStatus(ApiModel):
    prefill: PoolAutoscalingStatus = PoolAutoscalingStatus()
    decode: PoolAutoscalingStatus = PoolAutoscalingStatus()
    colocated: PoolAutoscalingStatus = PoolAutoscalingStatus()


class AutoscalingStatus(ApiModel):
    mode: Annotated[str, Field(description="Active, Advisory, Paused, or Disabled.")] = "Disabled"
    last_evaluated: Annotated[float | None, Field(description="Unix time of the last decision pass.")] = None
    pools: AutoscalingPoolsStatus = AutoscalingPoolsStatus()


class SLOStatus(ApiModel):
    """The SLO as measured at the routers over the last window."""

    ttft_ms: Annotated[float | None, Field(description="TTFT at the attainment percentile (ms).")] = None
    tpot_ms: Annotated[float | None, Field(description="TPOT at the attainment percentile (ms).")] = None
    attainment_percent: Annotated[
        float | None, Field(description="Share of requests within both targets (percent).")
    ] = None
    requests_per_second: float | None = None
    local_prefill_percent: Annotated[
        float | None,
        Field(
            description="Share of P/D requests whose prompt was prefilled on their decode pod "
            "(spec.router.disaggregation), percent; unset while none was counted."
        ),
    ] = None
    window_seconds: int = 0
    observed_at: Annotated[str, Field(description="RFC 3339 time of the measurement.")] = ""
    # At the attainment percentile over every path, per bucket label (spec.router.metrics' bounds):
    # the routers' bucketed histograms (docs/observability.md); a bucket without requests is left out.
    ttft_ms_by_input_length: Annotated[
        dict[str, float], Field(max_length=17, description="TTFT by input-length bucket (ms).")
    ] = {}
    tpot_ms_by_output_length: Annotated[
        dict[str, float], Field(max_length=17, description="TPOT by output-length bucket (ms).")
    ] = {}
    tpot_ms_by_concurrency: Annotated[
        dict[str, float],
        Field(
            max_length=17,
            description="TPOT by concurrency bucket: requests in flight at a router on the request's path "
            "when it arrived (ms).",
        ),
    ] = {}
    itl_ms_by_output_length: Annotated[
        dict[str, float],
        Field(max_length=17, description="Inter-token latency by output-length bucket (ms)."),
    ] = {}
    itl_ms_by_concurrency: Annotated[
        dict[str, float], Field(max_length=17, description="Inter-token latency by concurrency bucket (ms).")
    ] = {}
    ttft_ms_by_prefill: Annotated[
        dict[str, float],
        Field(
            max_length=2,
            description="TTFT of P/D requests by where their prompt was prefilled (remote: a prefill pod, "
            "local: their decode pod; spec.router.disaggregation) (ms).",
        ),
    ] = {}
    tpot_ms_by_prefill: Annotated[
        dict[str, float],
        Field(max_length=2, description="TPOT of P/D requests by where their prompt was prefilled (ms)."),
    ] = {}


class RolloutVerdictStatus(ApiModel):
    """One analysis verdict on the target arm, with the figures it was judged on."""

    step: Annotated[int, Field(ge=0, description="The step it judged.")]
    result: Annotated[str, Field(description="Pass, Fail or Inconclusive.")]
    reason: Annotated[str, Field(max_length=1024)] = ""
    figures: Annotated[dict[str, float], Field(max_length=32)] = {}
    window_start: Annotated[float, Field(description="Unix time the judged window began, in seconds.")]
    window_end: Annotated[float, Field(description="Unix time the judged window ended, in seconds.")]
    missing: Annotated[
        list[Annotated[str, Field(max_length=1024)]],
        Field(max_length=32, description="Signals that could not be read (Inconclusive)."),
    ] = []


class RolloutStatus(ApiModel):
    """A gray rollout between the colocated pool and P/D: the state machine's record (docs/rollout.md)."""

    target: Annotated[
        str, Field(description="The serving mode traffic moves to: Disaggregated or Colocated.")
    ] = "Disaggregated"
    phase: Annotated[
        str, Field(description="Preparing, Shifting, Paused, Promoted, RollingBack or RolledBack.")
    ]
    step: Annotated[int, Field(ge=0, description="Index of the current step.")] = 0
    weight: Annotated[
        int, Field(ge=0, le=100, description="Percent of requests on the target arm (the routers follow it).")
    ] = 0
    attempt: Annotated[int, Field(ge=1, description="1 + the retries after a rollback.")] = 1
    started_at: Annotated[float, Field(description="Unix time this attempt began, in seconds.")]
    step_started_at: Annotated[float, Field(description="Unix time the current step began.")]
    phase_since: Annotated[float, Field(description="Unix time the phase was entered.")]
    reason: Annotated[str, Field(max_length=1024)] = ""
    pause_cause: Annotated[
        str | None,
        Field(description="Why it is Paused: AwaitingPromote, Inconclusive, MetricsUnavailable or Failed."),
    ] = None
    rollback_stage: Annotated[
        str | None, Field(description="RollingBack: RestoringWeight, then ScalingDown.")
    ] = None
    metrics_missing_since: Annotated[
        float | None, Field(description="Verdicts have said 'metrics unavailable' since (unix time).")
    ] = None
    last_command: Annotated[
        str | None,
        Field(max_length=1024, description="The last tandem.dev/rollout-command value acted on (once)."),
    ] = None
    last_command_outcome: Annotated[str | None, Field(max_length=1024)] = None
    problems: Annotated[
        list[Annotated[str, Field(max_length=1024)]],
        Field(max_length=16, description="What the last pass did not act on (unknown commands, ...)."),
    ] = []
    verdicts: Annotated[
        list[RolloutVerdictStatus], Field(max_length=5, description="The last verdicts, newest last.")
    ] = []


class RevisionRecord(ApiModel):
    """One serving revision of the P/D pair (docs/rollout.md, Revisions)."""

    id: Annotated[
        str, Field(max_length=16, description="Hash of the fields prefill and decode must agree on.")
    ]
    prefix: Annotated[
        str, Field(max_length=63, description="Its StatefulSets, Services and PDBs are <prefix>-<role>.")
    ]
    legacy: Annotated[
        bool, Field(description="Today's names and pod template (no revision label): the first revision.")
    ] = False


class RevisionsStatus(ApiModel):
    """The P/D pair's serving revisions: the spec's, and during a change the one it replaces."""

    current: RevisionRecord
    previous: Annotated[
        RevisionRecord | None, Field(description="The revision being replaced; gone once drained.")
    ] = None
    weight: Annotated[
        int, Field(ge=0, le=100, description="Percent of P/D requests on the current revision.")
    ] = 100
    since: Annotated[
        float | None, Field(description="Unix time the weight last changed (the old pair drains from it).")
    ] = None
    rollout: Annotated[
        RolloutStatus | None,
        Field(description="With spec.rollout: the steps between the two revisions (target: the new id)."),
    ] = None


class DisaggregationStatus(ApiModel):
    """spec.router.disaggregation's mode in effect, and a change of it moving through spec.rollout's steps."""

    mode: Annotated[str, Field(description="The mode the routers choose by: Always, Auto or Threshold.")] = (
        "Always"
    )
    rollout: Annotated[
        RolloutStatus | None,
        Field(description="With spec.rollout: the steps to a new mode (target: the new mode)."),
    ] = None


class PDDeploymentStatus(ApiModel):
    observed_generation: Annotated[int, Field(ge=0)] = 0
    phase: Phase = Phase.Progressing
    mode: Annotated[str, Field(description="Serving mode in effect, for printer columns.")] = ""
    conditions: Annotated[list[Condition], Field(max_length=32)] = []
    pools: PoolsStatus = PoolsStatus()
    kv_transfer: KVTransferStatus = KVTransferStatus()
    slo: SLOStatus | None = None
    autoscaling: AutoscalingStatus | None = None
    rollout: RolloutStatus | None = None
    revisions: RevisionsStatus | None = None
    disaggregation: DisaggregationStatus | None = None
