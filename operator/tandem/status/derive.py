"""Derives a PDDeployment's status from what the operator observed (pure: time is an argument).

Input is a snapshot of the world after a reconcile pass: the child workloads' status, pod
problems the apiserver cannot reject up front (unschedulable, image pull failures, crash loops),
errors from applying children, and what the autoscaler decided (its state, the measured SLO, who
sizes each pool). Output is the full status, with kstatus conditions (`Ready`, `Reconciling`,
`Stalled`) present from the first pass, `Available` saying whether requests can be served at all,
and `AutoscalingActive` once autoscaling is configured. Condition transition times are carried
over while a status is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tandem.api import meta
from tandem.api.models import PDDeployment, ServingMode
from tandem.api.status import (
    AutoscalingStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    DisaggregationStatus,
    KVTransferStatus,
    KVTransportMeasurement,
    PDDeploymentStatus,
    Phase,
    PoolsStatus,
    PoolStatus,
    ReplicaSource,
    RevisionsStatus,
    RolloutStatus,
    SizingStage,
    SLOStatus,
)
from tandem.api.times import parse_rfc3339
from tandem.perf.kv import kv_bytes_per_token, kv_transfer_seconds
from tandem.signals import Snapshot

# (status, reason, message) of a condition.
ConditionValue = tuple[ConditionStatus, str, str]


@dataclass(frozen=True)
class WorkloadState:
    """The status of one StatefulSet or Deployment as read from the API."""

    generation: int = 0
    observed_generation: int = 0
    replicas: int = 0
    ready_replicas: int = 0
    updated_replicas: int = 0


@dataclass(frozen=True)
class PodProblem:
    """Something keeping a pod from running that no admission check could catch."""

    pod: str  # empty for a problem of the whole spec (a missing Secret, say)
    role: str
    reason: str  # CamelCase: Unschedulable, ImagePullFailed, CrashLoopBackOff, ...
    message: str
    since: str = ""  # RFC 3339 time the problem began, when known


@dataclass(frozen=True)
class Observed:
    """Everything a status derivation needs from one reconcile pass."""

    workloads: Mapping[str, WorkloadState] = field(default_factory=dict)  # role -> state, if it exists
    desired_replicas: Mapping[str, int] = field(default_factory=dict)  # role -> replicas asked for
    pod_problems: Sequence[PodProblem] = ()
    apply_errors: Sequence[str] = ()
    unserved: Sequence[str] = ()  # kinds the spec needs that the cluster does not serve (no CRD)
    sources: Mapping[str, ReplicaSource] = field(default_factory=dict)  # role -> who sizes it (spec)
    limited_by: Mapping[str, SizingStage] = field(default_factory=dict)  # role -> sizing stage (spec)
    autoscaling: AutoscalingStatus | None = None  # the autoscaler's state after this pass
    slo: SLOStatus | None = None  # the SLO as last measured
    autoscaling_condition: ConditionValue | None = None  # this pass's AutoscalingActive; None: keep
    kv_measured: KVTransportMeasurement | None = None  # status.kvTransfer.measured (controller/kv_transport)
    kv_condition: ConditionValue | None = None  # this pass's KVTransportDegraded; None: keep
    mode: str | None = None  # the serving mode in effect (a rollout's source until promoted); None: spec's
    rollout: RolloutStatus | None = None  # status.rollout after this pass
    rollout_conditions: Sequence[tuple[str, ConditionStatus, str, str]] = ()  # RolloutProgressing, RolledBack
    revisions: RevisionsStatus | None = None  # status.revisions after this pass (controller/revisions)
    disaggregation: DisaggregationStatus | None = None  # status.disaggregation (controller/disaggregation)


@dataclass(frozen=True)
class AutoscalingView:
    """What the AutoscalingActive condition depends on, beyond the spec."""

    prometheus_url: str | None = None  # spec.autoscaling.prometheus.url, else the operator's flag
    decision: ConditionValue | None = None  # decide()'s condition when a decision ran in this pass


# Reasons that stop progress until something outside the operator changes (kstatus "Stalled").
_STALLING_REASONS = ("Unschedulable", "ImagePullFailed", "CrashLoopBackOff", "ConfigError")
# Capacity often frees up by itself (a rollout ending, a node joining): a pod counts as stuck
# only after it has been unschedulable this long; until then the deployment is progressing. The
# operator's `--unschedulable-grace-seconds` sets it (a cluster whose autoscaler adds GPU nodes
# needs longer than the nodes take to join).
UNSCHEDULABLE_GRACE_SECONDS = 60.0


def _seconds_between(start: str, end: str) -> float:
    if not start:
        return float("inf")
    return parse_rfc3339(end) - parse_rfc3339(start)


def _stalling(problem: PodProblem, now: str, unschedulable_grace_seconds: float) -> bool:
    if problem.reason not in _STALLING_REASONS:
        return False
    return (
        problem.reason != "Unschedulable"
        or _seconds_between(problem.since, now) >= unschedulable_grace_seconds
    )


def _gpus_per_replica(pdd: PDDeployment, role: str) -> int:
    return 0 if role == "router" else pdd.spec.pool(role).gpus_per_instance


def _shape(pdd: PDDeployment, role: str) -> str:
    if role == "router":
        return ""
    pool = pdd.spec.pool(role)
    return pool.shape.summary(pool.gpu_type)


def _pool_status(pdd: PDDeployment, role: str, observed: Observed) -> PoolStatus:
    desired = observed.desired_replicas.get(role, 0)
    workload = observed.workloads.get(role, WorkloadState())
    return PoolStatus(
        replicas=workload.replicas,
        ready_replicas=workload.ready_replicas,
        desired_replicas=desired,
        gpus=desired * _gpus_per_replica(pdd, role),
        ready=f"{workload.ready_replicas}/{desired}",
        shape=_shape(pdd, role),
        source=observed.sources.get(role, ReplicaSource.spec),
        limited_by=observed.limited_by.get(role, SizingStage.spec),
    )


def autoscaling_condition(
    pdd: PDDeployment, view: AutoscalingView, previous: Sequence[Condition]
) -> ConditionValue | None:
    """AutoscalingActive for this pass; None to leave the condition as it is (or absent).

    Absent while nothing about autoscaling is configured; False `Disabled` when autoscaling is
    off (or no pool has bounds to act within), False `PrometheusNotConfigured` without a URL;
    otherwise the decision's own condition (True when acting; False `MetricsUnavailable`,
    `Paused`, `Advisory`, `LimitedByMaxGPUs`, `LimitedByMaxReplicas`), kept between decisions.
    """
    spec = pdd.spec
    bounded = [role for role in meta.POOL_ROLES if spec.pool(role).autoscaling is not None]
    external = [role for role in bounded if spec.pool(role).autoscaling.external]  # type: ignore[union-attr]
    decided = [role for role in bounded if role not in external]
    handed = f"; sized by another controller (HPA, KEDA): {', '.join(external)}" if external else ""
    if not spec.autoscaling.enabled:
        if not bounded and not any(c.type == ConditionType.AutoscalingActive for c in previous):
            return None
        return ("False", "Disabled", "spec.autoscaling.enabled is false" + handed)
    if not decided:
        return ("False", "Disabled", "no pool has autoscaling bounds (spec.<pool>.autoscaling)" + handed)
    if not view.prometheus_url:
        return (
            "False",
            "PrometheusNotConfigured",
            "no Prometheus to read: set spec.autoscaling.prometheus.url or the operator's --prometheus-url; "
            "pool sizes are held",
        )
    return view.decision


def measured_slo(snapshot: Snapshot, observed_at: str) -> SLOStatus | None:
    """`status.slo` from what the routers measured (latencies in ms, attainment in percent).

    None when the snapshot has no data: the last measurement stays, its `observedAt` says how old.
    """
    if not snapshot.has_data:
        return None
    total = snapshot.total()
    attainment = total.attainment
    pd = snapshot.paths.get("disaggregated")
    local = pd.local_prefill_share if pd is not None else None
    return SLOStatus(
        ttft_ms=None if total.ttft_seconds is None else round(total.ttft_seconds * 1000, 1),
        tpot_ms=None if total.tpot_seconds is None else round(total.tpot_seconds * 1000, 2),
        attainment_percent=None if attainment is None else round(attainment * 100, 2),
        requests_per_second=round(total.request_rate, 3),
        local_prefill_percent=None if local is None else round(local * 100, 2),
        window_seconds=round(snapshot.window_seconds),
        observed_at=observed_at,
        ttft_ms_by_input_length=_ms_by_bucket(snapshot, "ttft_by_input_length"),
        tpot_ms_by_output_length=_ms_by_bucket(snapshot, "tpot_by_output_length"),
        tpot_ms_by_concurrency=_ms_by_bucket(snapshot, "tpot_by_concurrency"),
        itl_ms_by_output_length=_ms_by_bucket(snapshot, "itl_by_output_length"),
        itl_ms_by_concurrency=_ms_by_bucket(snapshot, "itl_by_concurrency"),
        ttft_ms_by_prefill=_ms_by_bucket(snapshot, "ttft_by_prefill"),
        tpot_ms_by_prefill=_ms_by_bucket(snapshot, "tpot_by_prefill"),
    )


def _ms_by_bucket(snapshot: Snapshot, name: str) -> dict[str, float]:
    return {
        label: round(seconds * 1000, 2)
        for label, seconds in sorted(snapshot.latency_by_bucket.get(name, {}).items())
    }


def _converged(role: str, observed: Observed) -> bool:
    desired = observed.desired_replicas.get(role, 0)
    workload = observed.workloads.get(role)
    if workload is None:
        return desired == 0
    return (
        workload.observed_generation >= workload.generation
        and workload.replicas == desired
        and workload.updated_replicas == desired
        and workload.ready_replicas == desired
    )


def _serving_roles(mode: str) -> tuple[str, ...]:
    return ("prefill", "decode") if mode == ServingMode.Disaggregated.value else ("colocated",)


# Rollout phases and what they make of kstatus and the phase (docs/rollout.md, "Status"): a
# rollout moving traffic is Reconciling (InProgress, Argo CD Progressing); a paused one waits for
# a human (phase Paused, Argo CD Suspended); a rolled-back one serves the source arm while the spec
# asks for the target, and only a command or a spec change moves it (Stalled: kstatus Failed,
# Argo CD Degraded). Promoted changes nothing.
_ROLLOUT_MOVING = ("Preparing", "Shifting", "RollingBack")


def _with_rollout(
    rollout: RolloutStatus,
    phase: Phase,
    conditions: list[tuple[str, ConditionStatus, str, str]],
    label: str = "rollout",
) -> tuple[Phase, list[tuple[str, ConditionStatus, str, str]]]:
    by_type = {str(kind): (kind, status, reason, message) for kind, status, reason, message in conditions}
    what = f"{label} {rollout.phase} at {rollout.weight}%: {rollout.reason}"
    if rollout.phase in _ROLLOUT_MOVING:
        by_type[ConditionType.Reconciling] = (
            ConditionType.Reconciling,
            "True",
            f"Rollout{rollout.phase}",
            what,
        )
        return Phase.Progressing, list(by_type.values())
    if rollout.phase == "Paused":
        by_type[ConditionType.Reconciling] = (ConditionType.Reconciling, "False", "RolloutPaused", what)
        return Phase.Paused, list(by_type.values())
    if rollout.phase == "RolledBack":
        by_type[ConditionType.Ready] = (ConditionType.Ready, "False", "RolledBack", what)
        by_type[ConditionType.Reconciling] = (ConditionType.Reconciling, "False", "RolledBack", what)
        by_type[ConditionType.Stalled] = (ConditionType.Stalled, "True", "RolledBack", what)
        return Phase.Degraded, list(by_type.values())
    return phase, conditions


def _kv_status(pdd: PDDeployment) -> KVTransferStatus:
    model = pdd.spec.model
    per_token = model.kv_bytes_per_token
    if per_token is None and model.uri.startswith("hf://"):
        per_token = kv_bytes_per_token(model.uri.removeprefix("hf://").split("@", 1)[0])
    if per_token is None:
        return KVTransferStatus()
    seconds = kv_transfer_seconds(1000, per_token, pdd.spec.kv_transfer.bandwidth_gbps)
    return KVTransferStatus(bytes_per_token=per_token, ms_per_thousand_tokens=round(seconds * 1000))


# Distinct problems (by pool and reason) a Stalled message names; the rest are counted.
MAX_PROBLEMS_SHOWN = 3


def _problem_summary(problems: Sequence[PodProblem]) -> tuple[str, str]:
    """The first problem's reason, and a message naming the first problem of each distinct (pool,
    reason), up to `MAX_PROBLEMS_SHOWN`: two pools failing differently both show."""
    shown: dict[tuple[str, str], PodProblem] = {}
    for problem in problems:
        if len(shown) == MAX_PROBLEMS_SHOWN:
            break
        shown.setdefault((problem.role, problem.reason), problem)
    parts = [f"pod {p.pod} ({p.role}): {p.message}" if p.pod else p.message for p in shown.values()]
    left = len(problems) - len(shown)
    others = f" (and {left} more)" if left else ""
    return problems[0].reason, "; ".join(parts) + others


def _progress_message(pools: PoolsStatus, roles: Sequence[str]) -> str:
    parts = [f"{role} {getattr(pools, role).ready}" for role in roles]
    return "waiting for pods to be ready: " + ", ".join(parts)


def derive_status(
    pdd: PDDeployment,
    observed: Observed,
    previous: Sequence[Condition],
    now: str,
    unschedulable_grace_seconds: float = UNSCHEDULABLE_GRACE_SECONDS,
) -> PDDeploymentStatus:
    """The status to write after a reconcile pass; `now` is an RFC 3339 timestamp; a pod unschedulable
    for `unschedulable_grace_seconds` stalls the deployment."""
    generation = pdd.metadata.generation
    roles = [*meta.POOL_ROLES, "router"]
    pools = PoolsStatus(**{role: _pool_status(pdd, role, observed) for role in roles})
    active_roles = [role for role in roles if observed.desired_replicas.get(role, 0) > 0]
    converged = all(_converged(role, observed) for role in roles)

    stalling = [p for p in observed.pod_problems if _stalling(p, now, unschedulable_grace_seconds)]
    if observed.unserved:
        stalled: tuple[str, str] | None = ("CRDNotInstalled", "; ".join(observed.unserved))
    elif observed.apply_errors:
        stalled = ("ApplyFailed", "; ".join(observed.apply_errors))
    elif stalling:
        stalled = _problem_summary(stalling)
    else:
        stalled = None

    mode = observed.mode or pdd.spec.serving.mode.value
    serving_roles = (*_serving_roles(mode), "router")
    available = all(getattr(pools, role).ready_replicas >= 1 for role in serving_roles)

    conditions: list[tuple[str, ConditionStatus, str, str]] = []
    if stalled is not None:
        reason, message = stalled
        conditions += [
            (ConditionType.Ready, "False", reason, message),
            (ConditionType.Reconciling, "False", reason, "progress is blocked: " + message),
            (ConditionType.Stalled, "True", reason, message),
        ]
        phase = Phase.Degraded
    elif converged:
        message = "all pools have their desired replicas ready: " + ", ".join(
            f"{role} {getattr(pools, role).ready}" for role in active_roles
        )
        conditions += [
            (ConditionType.Ready, "True", "AllReplicasReady", message),
            (ConditionType.Reconciling, "False", "Converged", message),
            (ConditionType.Stalled, "False", "Progressing", "no problem blocks progress"),
        ]
        phase = Phase.Healthy
    else:
        message = _progress_message(pools, active_roles)
        if observed.pod_problems:
            message += "; " + _problem_summary(observed.pod_problems)[1]
        conditions += [
            (ConditionType.Ready, "False", "WaitingForReplicas", message),
            (ConditionType.Reconciling, "True", "WaitingForReplicas", message),
            (ConditionType.Stalled, "False", "Progressing", "no problem blocks progress"),
        ]
        phase = Phase.Progressing
    revision_rollout = observed.revisions.rollout if observed.revisions is not None else None
    if observed.rollout is not None and stalled is None:
        phase, conditions = _with_rollout(observed.rollout, phase, conditions)
    elif revision_rollout is not None and stalled is None:
        # A revision change under spec.rollout, with no mode rollout: its phase is the deployment's.
        label = f"revision rollout to {revision_rollout.target}"
        phase, conditions = _with_rollout(revision_rollout, phase, conditions, label)
    shown = observed.rollout if observed.rollout is not None else revision_rollout
    disaggregation = observed.disaggregation.rollout if observed.disaggregation is not None else None
    if disaggregation is not None and stalled is None and (shown is None or shown.phase == "Promoted"):
        # A rollout of spec.router.disaggregation.mode, no other one running: its phase is the
        # deployment's, as a serving-mode rollout's is (docs/rollout.md, "Status").
        label = f"disaggregation rollout to {disaggregation.target}"
        phase, conditions = _with_rollout(disaggregation, phase, conditions, label)
    kv = observed.kv_condition
    if kv is None:  # not read this pass: the condition status keeps
        kept = next((c for c in previous if c.type == ConditionType.KVTransportDegraded), None)
        kv = (kept.status, kept.reason, kept.message) if kept is not None else None
    if kv is not None and kv[0] == "True" and phase is Phase.Healthy:
        # Requests are still served (Ready stays True, kstatus Current), but slower than the link
        # should allow: the deployment's health is Degraded, with the condition's figures.
        kv_message = kv[2]
        by_type = {str(c[0]): c for c in conditions}
        ready = by_type.get(str(ConditionType.Ready))
        if ready is not None:
            by_type[str(ConditionType.Ready)] = (
                ready[0],
                ready[1],
                ready[2],
                f"{ready[3]}; but KVTransportDegraded: {kv_message}",
            )
        conditions = list(by_type.values())
        phase = Phase.Degraded
    if available:
        conditions.append((ConditionType.Available, "True", "Serving", f"{mode} path has ready pods"))
    else:
        missing = [role for role in serving_roles if getattr(pools, role).ready_replicas < 1]
        conditions.append(
            (ConditionType.Available, "False", "NoReadyPods", f"no ready pods in: {', '.join(missing)}")
        )
    if observed.autoscaling_condition is not None:
        conditions.append((ConditionType.AutoscalingActive, *observed.autoscaling_condition))
    if observed.kv_condition is not None:
        conditions.append((ConditionType.KVTransportDegraded, *observed.kv_condition))
    conditions += observed.rollout_conditions

    return PDDeploymentStatus(
        observed_generation=generation,
        phase=phase,
        mode=mode,
        conditions=merge_conditions(previous, conditions, generation, now),
        pools=pools,
        kv_transfer=_kv_status(pdd).model_copy(update={"measured": observed.kv_measured}),
        slo=observed.slo,
        autoscaling=observed.autoscaling,
        rollout=observed.rollout,
        revisions=observed.revisions,
        disaggregation=observed.disaggregation,
    )


def merge_conditions(
    previous: Sequence[Condition],
    current: Sequence[tuple[str, ConditionStatus, str, str]],
    generation: int,
    now: str,
) -> list[Condition]:
    """New conditions, keeping each one's lastTransitionTime while its status is unchanged.

    Conditions the operator does not own (set by other features) are kept as they were.
    """
    before = {c.type: c for c in previous}
    owned = {str(kind) for kind, *_ in current}
    merged = []
    for kind, status, reason, message in current:
        old = before.get(str(kind))
        since = old.last_transition_time if old is not None and old.status == status else now
        merged.append(
            Condition(
                type=str(kind),
                status=status,
                observed_generation=generation,
                last_transition_time=since,
                reason=reason,
                message=message[:32768],
            )
        )
    merged += [c for c in previous if c.type not in owned]
    return merged
