"""The autoscaling step of a reconcile pass: decide when due, drain before shrinking, report.

Runs inside the reconcile pass (a worker thread, on the leader only), before rendering, so one pass
computes everything the status says and one status write records it: the pool sizes the
StatefulSets get, `status.autoscaling` (sizes, stabilization history, capacity correction, drains),
`status.slo` and the AutoscalingActive condition. State lives only in status, so a restart or a
fail-over resumes where the last leader stopped.

A decision is due once per `spec.autoscaling.intervalSeconds` (`status.autoscaling.lastEvaluated`)
and at once after a spec change; the pass asks to be requeued when the next one is due. The
Prometheus reads (`tandem.metrics`) block this thread for at most the spec's timeout; an error is
"no data" to `decide()`, which holds every size. Pods are drained before a pool shrinks
(`drain.py`); the drained pods' loads are read only while a drain waits on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tandem.api import meta
from tandem.api.models import PDDeployment, PDDeploymentSpec
from tandem.api.status import (
    AutoscalingPoolsStatus,
    AutoscalingStatus,
    ConditionType,
    PDDeploymentStatus,
    PoolAutoscalingStatus,
    ReplicaSource,
    SLOStatus,
)
from tandem.api.times import rfc3339
from tandem.autoscale.bounds import autoscaled_roles
from tandem.controller import drain, metrics, replicas
from tandem.kube.rest import POD, KubeError, KubeRest, Obj
from tandem.metrics import MetricsReader, PrometheusReader, ReaderFactory
from tandem.rollout.arms import Bound, bounded_spec
from tandem.signals import PoolSize, Snapshot
from tandem.status.derive import AutoscalingView, ConditionValue, autoscaling_condition, measured_slo

if TYPE_CHECKING:
    from tandem.autoscale.decide import Decision

log = logging.getLogger(__name__)

MIN_WINDOW_SECONDS = 60.0  # rates over at least a minute: several scrapes at any usual interval


def window_seconds(spec: PDDeploymentSpec) -> float:
    """The window the snapshot's rates and quantiles cover: two decision intervals, at least a minute."""
    return max(MIN_WINDOW_SECONDS, 2.0 * spec.autoscaling.interval_seconds)


def is_paused(body: Mapping[str, Any]) -> bool:
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(meta.ANNOTATION_AUTOSCALING_PAUSED, "")).lower() == "true"


def _figures(figures: Mapping[str, float]) -> str:
    return ", ".join(f"{key} {value:.4g}" for key, value in list(figures.items())[:12])


@dataclass
class Outcome:
    """What the autoscaling step hands the rest of the pass."""

    replicas: dict[str, int | None]  # StatefulSet replicas this pass (None: another controller's)
    desired: dict[str, int | None]  # status.pools.<role>.desiredReplicas (None: the live count)
    sources: dict[str, ReplicaSource]
    state: AutoscalingStatus | None
    slo: SLOStatus | None
    condition: ConditionValue | None  # None: leave AutoscalingActive as it is
    requeue_after: float | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


class Autoscaler:
    """The I/O around `decide()` and the drain plan; one per operator, shared by the workers."""

    def __init__(
        self, kube: KubeRest, prometheus_url: str | None = None, reader_for: ReaderFactory = PrometheusReader
    ) -> None:
        """`reader_for(url, timeout)` makes the reader of a Prometheus (`PrometheusReader`; tests give
        one answering recorded queries); one is made per URL and timeout and shared."""
        self.kube = kube
        self.prometheus_url = prometheus_url or None
        self._reader_for = reader_for
        self._readers: dict[tuple[str, float], MetricsReader] = {}
        self._advice: dict[tuple[str, str, str], int] = {}  # last advice per pool (Advisory events)

    # -- Prometheus ------------------------------------------------------------------------------

    def url(self, spec: PDDeploymentSpec) -> str | None:
        return spec.autoscaling.prometheus.url or self.prometheus_url

    def reader(self, url: str, timeout: float) -> MetricsReader:
        """The shared reader for `url` (the rollout, revision and KV-transport steps read through it)."""
        reader = self._readers.get((url, timeout))
        if reader is None:
            reader = self._readers[(url, timeout)] = self._reader_for(url, timeout)
        return reader

    def _snapshot(self, pdd: PDDeployment, url: str, now: float, sizes: Mapping[str, PoolSize]) -> Snapshot:
        spec = pdd.spec
        window = window_seconds(spec)
        try:
            reader = self.reader(url, spec.autoscaling.prometheus.timeout_seconds)
            snapshot: Snapshot = reader.snapshot(
                pdd.metadata.namespace, pdd.metadata.name, spec.slo, window, now, sizes=sizes
            )
        except Exception as exc:  # unreachable, timeout, bad answer: no data, and decide() holds
            metrics.PROMETHEUS_ERRORS.labels(query="snapshot").inc()
            log.warning("%s/%s: Prometheus at %s: %s", pdd.metadata.namespace, pdd.metadata.name, url, exc)
            return Snapshot(observed_at=now, window_seconds=window, missing=(f"Prometheus at {url}: {exc}",))
        if snapshot.missing:  # the reader names failed queries (and absent signals) here, never raises
            metrics.PROMETHEUS_ERRORS.labels(query="snapshot").inc()
            log.info(
                "%s/%s: no data: %s", pdd.metadata.namespace, pdd.metadata.name, "; ".join(snapshot.missing)
            )
        return snapshot

    def _loads(self, pdd: PDDeployment, url: str, pods: Sequence[str]) -> Mapping[str, drain.Load] | None:
        try:
            reader = self.reader(url, pdd.spec.autoscaling.prometheus.timeout_seconds)
            loads: Mapping[str, drain.Load] = reader.pod_load(pdd.metadata.namespace, list(pods))
            return loads
        except Exception as exc:
            metrics.PROMETHEUS_ERRORS.labels(query="pod_load").inc()
            log.warning("%s/%s: pod loads from %s: %s", pdd.metadata.namespace, pdd.metadata.name, url, exc)
            return None

    # -- the step --------------------------------------------------------------------------------

    def step(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        previous: PDDeploymentStatus | None,
        statefulsets: Mapping[str, Obj | None],
        pods: Sequence[Obj],
        now: float,
        bounds: Mapping[str, Bound] | None = None,
    ) -> Outcome:
        """`bounds` (from the rollout step) clamp each pool's decided size: an arm sized for its share
        of the traffic, or scaled to zero once traffic has left it."""
        spec = pdd.spec
        paused = is_paused(body)
        live: dict[str, int | None] = {
            role: _spec_replicas(statefulsets.get(role)) for role in meta.POOL_ROLES
        }
        state = replicas.prepare_state(spec, previous.autoscaling if previous else None, live, paused, now)
        url = self.url(spec)
        slo = previous.slo if previous else None
        outcome_events: list[tuple[str, str, str]] = []
        decision_condition: ConditionValue | None = None
        requeue: float | None = None
        interval = float(spec.autoscaling.interval_seconds)

        if state is not None and autoscaled_roles(spec) and url:
            prior = next(
                (
                    c
                    for c in (previous.conditions if previous else [])
                    if c.type == ConditionType.AutoscalingActive
                ),
                None,
            )
            decided_generation = prior.observed_generation if prior is not None else None
            if replicas.decision_due(state, interval, now, pdd.metadata.generation, decided_generation):
                started = time.monotonic()
                sizes_now = _sizes(spec, state, statefulsets)
                snapshot = dataclasses.replace(self._snapshot(pdd, url, now, sizes_now), sizes=sizes_now)
                decision = _decide(bounded_spec(spec, bounds or {}), snapshot, state, now, paused)
                metrics.DECISION_SECONDS.observe(time.monotonic() - started)
                outcome_events += self._decision_events(pdd, state, decision)
                state = decision.state
                decision_condition = decision.condition
                slo = measured_slo(snapshot, rfc3339(snapshot.observed_at)) or slo
            requeue = (
                max(1.0, replicas.seconds_until_due(state, interval, now))
                if state.last_evaluated
                else interval
            )

        sizes = replicas.pool_sizes(spec, state)
        for role, bound in (bounds or {}).items():
            size = sizes.get(role)
            if size is not None:
                sizes[role] = bound.apply(size)
        sources: dict[str, ReplicaSource] = {
            role: replicas.source(spec, role, paused) for role in meta.POOL_ROLES
        }
        applied: dict[str, int | None] = dict(sizes)
        name = pdd.metadata.name
        for role in meta.POOL_ROLES:
            sts_name = f"{name}-{role}"
            views = drain.pod_views([p for p in pods if _role(p) == role], sts_name)
            size = sizes[role]
            if sources[role] is ReplicaSource.autoscaler and size is not None and state is not None:
                pool: PoolAutoscalingStatus = getattr(state.pools, role)
                loads = None
                timeout = float(spec.autoscaling.drain_timeout_seconds)
                if url and pool.draining is not None and drain.loads_needed(pool.draining, now, timeout):
                    loads = self._loads(pdd, url, pool.draining.pods or [pool.draining.pod])
                plan = drain.plan(
                    role=role,
                    statefulset=sts_name,
                    desired=size,
                    applied=live[role],
                    drain=pool.draining,
                    pods=views,
                    loads=loads,
                    now=now,
                    timeout=timeout,
                )
                started_at = plan.drain.started_at if plan.drain is not None else now
                self._mark(pdd, plan.annotate, rfc3339(started_at))
                self._mark(pdd, plan.unannotate, None)
                state = _with_drain(state, role, plan.drain)
                applied[role] = plan.replicas
                outcome_events += _drain_events(role, pool.draining, plan, live[role], now)
                if plan.drain is not None:
                    requeue = min(requeue or drain.DRAIN_POLL_SECONDS, drain.DRAIN_POLL_SECONDS)
            elif size is None and live[role] is None:  # a new external pool starts at the spec's size
                applied[role] = spec.pool(role).replicas  # (handed over on the next pass)
            else:  # no drain for pools the autoscaler does not size: lift the marks of one it left
                recorded = _recorded_drain(previous, role)
                keep = [
                    v.name
                    for v in views
                    if v.draining and v.name in recorded and (size is None or v.ordinal < size)
                ]
                self._mark(pdd, keep, None)
                if state is not None and getattr(state.pools, role).draining is not None:
                    state = _with_drain(state, role, None)

        for pool_name, count in sizes.items():
            if count is not None:
                metrics.DESIRED_REPLICAS.labels(
                    namespace=pdd.metadata.namespace, pddeployment=name, pool=pool_name
                ).set(count)
        condition = autoscaling_condition(
            pdd, AutoscalingView(url, decision_condition), previous.conditions if previous else []
        )
        return Outcome(
            replicas=applied,
            desired=dict(sizes),
            sources=sources,
            state=state,
            slo=slo,
            condition=condition,
            requeue_after=requeue,
            events=outcome_events,
        )

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted PDDeployment's gauges and advice."""
        for role in meta.POOL_ROLES:
            with contextlib.suppress(KeyError):
                metrics.DESIRED_REPLICAS.remove(namespace, name, role)
            self._advice.pop((namespace, name, role), None)

    def _mark(self, pdd: PDDeployment, pods: Sequence[str], value: str | None) -> None:
        for pod in pods:
            try:
                self.kube.annotate(POD, pdd.metadata.namespace, pod, {meta.ANNOTATION_DRAINING: value})
            except KubeError as exc:
                if exc.status != 404:  # a pod already gone needs no mark
                    log.warning("could not %s pod %s: %s", "mark" if value else "unmark", pod, exc)

    def _decision_events(
        self, pdd: PDDeployment, before: AutoscalingStatus, decision: Decision
    ) -> list[tuple[str, str, str]]:
        events: list[tuple[str, str, str]] = []
        advisory = decision.state.mode == replicas.Mode.Advisory
        for role, pool in decision.pools.items():
            direction = (
                "up" if pool.target > pool.current else "down" if pool.target < pool.current else "hold"
            )
            metrics.DECISIONS.labels(pool=role, direction=direction).inc()
            old = getattr(before.pools, role).desired_replicas
            new = getattr(decision.state.pools, role).desired_replicas
            cause = f" [cause {pool.cause}]" if pool.cause else ""
            text = f"{role} {pool.current} -> {pool.target}{cause}: {pool.reason} ({_figures(pool.figures)})"
            if advisory:
                key = (pdd.metadata.namespace, pdd.metadata.name, role)
                last = self._advice.get(key, pool.current)
                if pool.target != last:
                    events.append(("Normal", "AutoscalerAdvice", text))
                self._advice[key] = pool.target
            elif old is not None and new is not None and new != old:
                events.append(("Normal", "ScaledUp" if new > old else "ScaledDown", text))
        return events


def _decide(
    spec: PDDeploymentSpec, snapshot: Snapshot, state: AutoscalingStatus, now: float, paused: bool
) -> Decision:
    from tandem.autoscale.decide import decide

    return decide(spec, snapshot, state, now, paused=paused)


def _recorded_drain(previous: PDDeploymentStatus | None, role: str) -> set[str]:
    """The pods a drain in the last status marked (a pool's marks are lifted only when recorded)."""
    if previous is None or previous.autoscaling is None:
        return set()
    record = getattr(previous.autoscaling.pools, role).draining
    return set(record.pods or [record.pod]) if record is not None else set()


def _spec_replicas(sts: Obj | None) -> int | None:
    if sts is None:
        return None
    value = (sts.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)  # the API's default


def _ready(sts: Obj | None) -> int:
    return int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)


def _role(pod: Obj) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(meta.LABEL_ROLE, ""))


def _sizes(
    spec: PDDeploymentSpec, state: AutoscalingStatus, statefulsets: Mapping[str, Obj | None]
) -> dict[str, PoolSize]:
    """The pools' sizes for the snapshot: an autoscaled pool's is the size it holds (pods being
    drained are no capacity); others' are their StatefulSets' (or the spec's before one exists)."""
    sizes: dict[str, PoolSize] = {}
    for role in meta.POOL_ROLES:
        sts = statefulsets.get(role)
        held = getattr(state.pools, role).desired_replicas
        if role in autoscaled_roles(spec) and held is not None:
            sizes[role] = PoolSize(replicas=held, ready=min(held, _ready(sts)))
        else:
            count = _spec_replicas(sts)
            sizes[role] = PoolSize(
                replicas=spec.pool(role).replicas if count is None else count, ready=_ready(sts)
            )
    return sizes


def _with_drain(state: AutoscalingStatus, role: str, record: Any) -> AutoscalingStatus:
    pools: dict[str, PoolAutoscalingStatus] = {r: getattr(state.pools, r) for r in meta.POOL_ROLES}
    pools[role] = pools[role].model_copy(update={"draining": record})
    return state.model_copy(update={"pools": AutoscalingPoolsStatus(**pools)})


def _drain_events(
    role: str, before: Any, plan: drain.DrainPlan, applied: int | None, now: float
) -> list[tuple[str, str, str]]:
    if plan.cancelled:
        return [
            (
                "Normal",
                "DrainCancelled",
                f"{role}: scaled up during the drain; {', '.join(before.pods or [before.pod])} stay",
            )
        ]
    if plan.finished:
        why = "idle" if plan.finished == "idle" else "drain timeout passed"
        waited = f" after {now - before.started_at:.0f}s" if before is not None else ""
        return [("Normal", "Drained", f"{role}: {applied} -> {plan.replicas} replicas ({why}{waited})")]
    if plan.drain is not None and before is None:
        pods = ", ".join(plan.drain.pods)
        return [
            (
                "Normal",
                "Draining",
                f"{role}: draining {pods} before {applied} -> {plan.drain.target_replicas}",
            )
        ]
    return []
