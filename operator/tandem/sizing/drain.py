"""Drain-aware scale-down of one pool (pure: pods, loads and time come in, a plan comes out).

A StatefulSet removes its highest ordinals first. Before it may, those pods are annotated
`tandem.dev/draining` (the router sends them no new work) and the drain is recorded in
`status.autoscaling.pools.<role>.draining`; the StatefulSet keeps its replicas until every drained
pod is idle (no running or waiting requests, and for prefill no KV blocks a decode pod has yet to
pull) or the drain timeout passed. A scale-up during a drain cancels it: the annotations go and the
pods stay. Idleness counts only once the router has had time to see the annotation and Prometheus
to scrape a request it sent just before (`DRAIN_SETTLE_SECONDS`).

A multi-node pool's LeaderWorkerSet removes its highest groups first: its leaders' StatefulSet
(`<lws>`, pods `<lws>-<group>`) loses its highest ordinals, and each leader's worker StatefulSet
(`<lws>-<group>`, pods `<lws>-<group>-<worker>`, workers 1..size-1) goes with its leader. So a drain
of a group pool works in groups: the ordinal is the group index, the marks name every pod of each
group leaving (the router takes a group out as a unit when any of its pods is marked, and stops
sending to every rank), and a group is idle when every pod of it that reports engine metrics (its
leader, whose /metrics counts every rank, or each serving pod) is idle; a headless worker has no
metrics of its own (`PodView.reports`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tandem.api import meta
from tandem.api.status import DrainStatus

DRAIN_SETTLE_SECONDS = 10.0  # the routers' pod watch and a couple of Prometheus scrapes
DRAIN_POLL_SECONDS = 5.0  # how often a pass checks a drain's pods


class Load(Protocol):
    """A pod's load as `tandem.metrics` reads it (PodLoad)."""

    @property
    def running(self) -> float: ...
    @property
    def waiting(self) -> float: ...
    @property
    def kv_blocks_held(self) -> float: ...


@dataclass(frozen=True, slots=True)
class PodView:
    """The part of a pool's pod a drain needs."""

    name: str
    ordinal: int  # the StatefulSet ordinal; a LeaderWorkerSet pod's group index
    serving: bool  # Running with an IP: it may hold requests
    draining: bool  # carries the draining annotation
    reports: bool = True  # has engine metrics of its own (Prometheus scrapes it); a headless worker not


@dataclass(frozen=True, slots=True)
class DrainPlan:
    replicas: int  # the StatefulSet's replicas for this pass
    drain: DrainStatus | None  # the drain to record in status (None: none in progress)
    annotate: tuple[str, ...] = ()  # pods to mark draining
    unannotate: tuple[str, ...] = ()  # pods that stay: remove their mark
    finished: str = ""  # "idle" or "timeout" when the pool shrinks in this pass
    cancelled: bool = False  # a drain in progress was called off (scale-up)


def _ordinal(name: str, workload: str, nodes: int) -> int | None:
    """The ordinal of a pod of `workload` by its name: `<sts>-<ordinal>`; for a group pool (`nodes` > 1)
    `<lws>-<group>` (a leader) or `<lws>-<group>-<worker>` (a worker, 1..nodes-1). None: not its pod."""
    if not name.startswith(workload + "-"):
        return None
    parts = name[len(workload) + 1 :].split("-")
    if not all(part.isdigit() for part in parts):
        return None
    if len(parts) == 1:
        return int(parts[0])
    if nodes > 1 and len(parts) == 2 and 1 <= int(parts[1]) < nodes:
        return int(parts[0])
    return None


def pod_views(pods: Sequence[Mapping[str, Any]], statefulset: str, nodes: int = 1) -> list[PodView]:
    """The pods of one StatefulSet (by name: `<statefulset>-<ordinal>`), or of one LeaderWorkerSet of
    groups of `nodes` pods (leaders and workers, the ordinal their group index), from API objects."""
    views = []
    for pod in pods:
        md = pod.get("metadata") or {}
        name = str(md.get("name", ""))
        ordinal = _ordinal(name, statefulset, nodes)
        if ordinal is None:
            continue
        status = pod.get("status") or {}
        annotations = md.get("annotations") or {}
        views.append(
            PodView(
                name=name,
                ordinal=ordinal,
                serving=status.get("phase") == "Running" and bool(status.get("podIP")),
                draining=meta.ANNOTATION_DRAINING in annotations,
                reports=nodes == 1 or str(annotations.get(meta.ANNOTATION_SCRAPE, "")) == "true",
            )
        )
    return sorted(views, key=lambda v: (v.ordinal, v.name))


def drained_names(statefulset: str, target: int, current: int, nodes: int = 1) -> list[str]:
    """The pods a StatefulSet deletes going from `current` to `target` replicas; for a LeaderWorkerSet of
    groups of `nodes` pods, every pod of each group it deletes (its leader, then its workers)."""
    return [
        f"{statefulset}-{i}" + (f"-{w}" if w else "") for i in range(target, current) for w in range(nodes)
    ]


def idle(load: Load | None, role: str) -> bool:
    """Known to hold no work; no figures, or NaN ones (vLLM's unpulled KV), mean wait (up to the timeout)."""
    if load is None:
        return False
    if not (load.running <= 0 and load.waiting <= 0):
        return False
    return role != "prefill" or load.kv_blocks_held <= 0


def loads_needed(drain: DrainStatus | None, now: float, timeout: float) -> bool:
    """Whether this pass should read the drained pods' loads (settled, not yet timed out)."""
    if drain is None:
        return False
    elapsed = now - drain.started_at
    return min(DRAIN_SETTLE_SECONDS, timeout) <= elapsed < timeout


def plan(
    *,
    role: str,
    statefulset: str,
    desired: int,
    applied: int | None,
    drain: DrainStatus | None,
    pods: Sequence[PodView],
    loads: Mapping[str, Load] | None,
    now: float,
    timeout: float,
    nodes: int = 1,
) -> DrainPlan:
    """What this pass does about a pool whose decided size is `desired`.

    `applied` is the StatefulSet's `spec.replicas` (None before it exists), `drain` the drain in
    status, `pods` the StatefulSet's pods, `loads` their loads by pod name (None when not read).
    A group pool (`nodes` pods a replica, a LeaderWorkerSet `statefulset`) counts replicas in groups.
    """
    if applied is None or desired >= applied:
        keep = [p.name for p in pods if p.draining and p.ordinal < desired]
        return DrainPlan(replicas=desired, drain=None, unannotate=tuple(keep), cancelled=drain is not None)

    names = drained_names(statefulset, desired, applied, nodes)
    fresh = drain is None or desired < drain.target_replicas  # new pods join: they get the full time
    started = now if fresh or drain is None else drain.started_at
    record = DrainStatus(pod=names[0], pods=names, started_at=started, target_replicas=desired)
    leaving = [p for p in pods if desired <= p.ordinal < applied]
    annotate = tuple(p.name for p in leaving if not p.draining)
    unannotate = tuple(p.name for p in pods if p.draining and p.ordinal < desired)
    elapsed = now - started
    if elapsed >= timeout:
        return DrainPlan(desired, None, annotate, unannotate, finished="timeout")
    settled = elapsed >= min(DRAIN_SETTLE_SECONDS, timeout) and not annotate
    loads = loads or {}
    if settled and all(not p.serving or not p.reports or idle(loads.get(p.name), role) for p in leaving):
        return DrainPlan(desired, None, annotate, unannotate, finished="idle")
    return DrainPlan(applied, record, annotate, unannotate)
