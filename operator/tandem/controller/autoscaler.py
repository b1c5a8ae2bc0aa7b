"""The autoscaling step of a reconcile pass: decide when due, carry out the drains, report.

Runs inside the reconcile pass (a worker thread, on the leader only), before rendering, so one pass
computes everything the status says and one status write records it: `decide()` makes the
decision; the sizing chain (`tandem.sizing`) turns it into the pool sizes the StatefulSets get;
`outcome()` and `mark()` report them and mark the drained pods: `status.autoscaling` (sizes,
stabilization history, capacity correction, drains), `status.slo` and the AutoscalingActive
condition. State lives only in status, so a restart or a fail-over resumes where the last leader
stopped.

A decision is due once per `spec.autoscaling.intervalSeconds` (`status.autoscaling.lastEvaluated`)
and at once after a spec change; the pass asks to be requeued when the next one is due. The
Prometheus reads (`tandem.metrics`) block this thread for at most the spec's timeout; an error is
"no data" to `decide()`, which holds every size. Pods are drained before a pool shrinks
(`sizing/drain.py`); the drained pods' loads are read only while a drain waits on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tandem import sizing
from tandem.api import meta
from tandem.api.models import PDDeployment, PDDeploymentSpec
from tandem.api.status import (
    AutoscalingStatus,
    ConditionType,
    PDDeploymentStatus,
    ReplicaSource,
    SLOStatus,
)
from tandem.api.times import rfc3339
from tandem.autoscale.bounds import autoscaled_roles
from tandem.controller import metrics, replicas
from tandem.kube.rest import POD, KubeError, KubeRest, Obj
from tandem.metrics import MetricsReader, PrometheusReader, ReaderFactory
from tandem.render import names
from tandem.rollout.arms import Bound, bounded_spec
from tandem.signals import PoolSize, Snapshot
from tandem.sizing import drain
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


@dataclass
class Decided:
    """The autoscaler's part of a pass before the sizing chain runs: its state after the decision."""

    state: AutoscalingStatus | None
    live: dict[str, int | None]  # the StatefulSets' spec.replicas (None: not created yet)
    slo: SLOStatus | None
    loads: dict[str, Mapping[str, drain.Load] | None] = field(default_factory=dict)  # drained pods'
    decision_condition: ConditionValue | None = None  # the decision's AutoscalingActive, if one ran
    condition: ConditionValue | None = None
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

    def _loads(
        self, pdd: PDDeployment, url: str, role: str, pods: Sequence[str]
    ) -> Mapping[str, drain.Load] | None:
        """The drained pods' loads; a pod counts as known only with every API port's target reporting
        (a MultiPortExternal pod's ranks each on their own)."""
        ports = pdd.spec.pool(role).shape.ports_per_pod
        try:
            reader = self.reader(url, pdd.spec.autoscaling.prometheus.timeout_seconds)
            loads: Mapping[str, drain.Load] = reader.pod_load(
                pdd.metadata.namespace, list(pods), targets={pod: ports for pod in pods}
            )
            return loads
        except Exception as exc:
            metrics.PROMETHEUS_ERRORS.labels(query="pod_load").inc()
            log.warning("%s/%s: pod loads from %s: %s", pdd.metadata.namespace, pdd.metadata.name, url, exc)
            return None

    # -- the step --------------------------------------------------------------------------------

    def decide(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        previous: PDDeploymentStatus | None,
        statefulsets: Mapping[str, Obj | None],
        now: float,
        bounds: Mapping[str, Bound] | None = None,
    ) -> Decided:
        """The decision when one is due, within `bounds` (from the rollout step: an arm sized for its
        share of the traffic, or scaled to zero once traffic has left it), and the loads of the pods a
        drain waits on; the sizing chain (`tandem.sizing`) then sizes the pools."""
        spec = pdd.spec
        paused = is_paused(body)
        live: dict[str, int | None] = {
            role: _spec_replicas(statefulsets.get(role)) for role in meta.POOL_ROLES
        }
        state = replicas.prepare_state(spec, previous.autoscaling if previous else None, live, paused, now)
        url = self.url(spec)
        decided = Decided(state=state, live=live, slo=previous.slo if previous else None)
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
                self._decide(pdd, decided, statefulsets, now, paused, bounds or {})
                state = decided.state
            assert state is not None
            decided.requeue_after = (
                max(1.0, replicas.seconds_until_due(state, interval, now))
                if state.last_evaluated
                else interval
            )
        timeout = float(spec.autoscaling.drain_timeout_seconds)
        for role in autoscaled_roles(spec):
            record = getattr(state.pools, role).draining if state is not None else None
            due = record is not None and drain.loads_needed(record, now, timeout)
            if sizing.source(spec, role) is ReplicaSource.autoscaler and url and record is not None and due:
                decided.loads[role] = self._loads(pdd, url, role, record.pods or [record.pod])
        decided.condition = autoscaling_condition(
            pdd, AutoscalingView(url, decided.decision_condition), previous.conditions if previous else []
        )
        return decided

    def _decide(
        self,
        pdd: PDDeployment,
        decided: Decided,
        statefulsets: Mapping[str, Obj | None],
        now: float,
        paused: bool,
        bounds: Mapping[str, Bound],
    ) -> None:
        """One decision: the snapshot, `decide()` on the spec within the rollout's bounds, its Events."""
        state = decided.state
        url = self.url(pdd.spec)
        assert state is not None
        assert url
        started = time.monotonic()
        sizes_now = _sizes(pdd.spec, state, statefulsets)
        snapshot = dataclasses.replace(self._snapshot(pdd, url, now, sizes_now), sizes=sizes_now)
        decision = _decide(bounded_spec(pdd.spec, bounds), snapshot, state, now, paused)
        metrics.DECISION_SECONDS.observe(time.monotonic() - started)
        decided.events += self._decision_events(pdd, state, decision)
        decided.state = decision.state
        decided.decision_condition = decision.condition
        decided.slo = measured_slo(snapshot, rfc3339(snapshot.observed_at)) or decided.slo

    def sizing_input(
        self,
        pdd: PDDeployment,
        decided: Decided,
        previous: PDDeploymentStatus | None,
        pods: Sequence[Obj],
        now: float,
        bounds: Mapping[str, Bound] | None = None,
    ) -> sizing.ServingInput:
        """The sizing chain's first stages' input: the decision, the arms' bounds, the pools' pods."""
        name = pdd.metadata.name
        stored = previous.revisions if previous is not None else None
        serving = stored.current if stored is not None else None
        # The serving pair's workloads, as `live` reads them: a StatefulSet, or a LeaderWorkerSet
        workloads: dict[str, str] = {r: names.workload_name(pdd, r, serving) for r in meta.POOL_ROLES}
        return sizing.ServingInput(
            spec=pdd.spec,
            name=name,
            workloads=workloads,
            state=decided.state,
            bounds=dict(bounds or {}),
            live=decided.live,
            now=now,
            drain_timeout=float(pdd.spec.autoscaling.drain_timeout_seconds),
            pods={
                role: tuple(
                    drain.pod_views(
                        [p for p in pods if _role(p) == role],
                        workloads[role],
                        pdd.spec.pool(role).nodes_per_instance,
                    )
                )
                for role in meta.POOL_ROLES
            },
            loads=decided.loads,
            recorded={role: frozenset(_recorded_drain(previous, role)) for role in meta.POOL_ROLES},
        )

    def outcome(self, pdd: PDDeployment, decided: Decided, served: sizing.Serving, now: float) -> Outcome:
        """What the autoscaling step reports once the chain sized the pools: the drain Events, when to
        check a drain again, the desired-size gauges."""
        events = list(decided.events)
        requeue = decided.requeue_after
        for role, pool in served.pools.items():
            plan = pool.drain.plan
            if plan is None:
                continue
            events += _drain_events(role, pool.drain.before, plan, decided.live[role], now)
            if plan.drain is not None:
                requeue = min(requeue or drain.DRAIN_POLL_SECONDS, drain.DRAIN_POLL_SECONDS)
        for role, pool in served.pools.items():
            if pool.desired is not None:
                metrics.DESIRED_REPLICAS.labels(
                    namespace=pdd.metadata.namespace, pddeployment=pdd.metadata.name, pool=role
                ).set(pool.desired)
        return Outcome(
            replicas=served.replicas,
            desired={role: pool.desired for role, pool in served.pools.items()},
            sources={role: pool.source for role, pool in served.pools.items()},
            state=served.state,
            slo=decided.slo,
            condition=decided.condition,
            requeue_after=requeue,
            events=events,
        )

    def mark(self, pdd: PDDeployment, served: sizing.Serving, now: float) -> None:
        """The drain stage's marks on the pods: draining pods annotated (with the drain's start), pods
        that stay unmarked, the marks of a drain a pool left lifted."""
        for pool in served.pools.values():
            plan = pool.drain.plan
            if plan is None:
                self._mark(pdd, pool.drain.lift, None)
                continue
            started_at = plan.drain.started_at if plan.drain is not None else now
            self._mark(pdd, plan.annotate, rfc3339(started_at))
            self._mark(pdd, plan.unannotate, None)

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
