"""Serving revisions of the P/D pair in a reconcile pass: which pair is rendered, which is kept, the weight.

`advance` is the pure decision (table-tested with a fake clock); `RevisionStep` reads the
StatefulSets around it. State lives only in `status.revisions` (docs/rollout.md, Revisions):

- no record yet (a new deployment, or one created before revisions existed): the spec's revision is
  recorded as the *legacy* one, with today's names and pod template, so nothing is renamed or rolled;
- the spec's revision id differs from `current`: the new revision becomes `current` at weight 0
  (percent of P/D requests on it) and the old one `previous`; the new pair is rendered beside the
  old pair, which the operator keeps as it is;
- once every StatefulSet of the new pair has all its replicas Ready (or P/D has no pods to run),
  the weight goes to 100 at once (`since` = now): no request goes to a pair that is not ready;
- the old pair is deleted `drain_seconds` after it got its last request (weight 0 from `since`),
  so legs already sent to it (decode streams, KV pulls from its prefill pods) finish first;
- the spec going back to the previous revision swaps the two (the old pair still serves, so the
  weight returns to it first and the new pair drains); a third revision during a change replaces
  a new pair that never got traffic, or else supersedes the previous pair, which is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from tandem.api import meta
from tandem.api.models import PDDeployment
from tandem.api.status import RevisionRecord, RevisionsStatus
from tandem.kube.rest import Obj
from tandem.render.revision import name_prefix, revision_id

DEFAULT_DRAIN_SECONDS: Final = 30.0
REQUEUE_SECONDS: Final = 5.0
# Kinds of a revision's per-role objects (all named <prefix>-<role>).
PAIR_KINDS: Final = ("StatefulSet", "Service", "PodDisruptionBudget")

Event = tuple[str, str, str]  # (type, reason, message)


def legacy_record(pdd_name: str, rev: str) -> RevisionRecord:
    return RevisionRecord(id=rev, prefix=name_prefix(pdd_name, rev, legacy=True), legacy=True)


def advance(
    stored: RevisionsStatus | None,
    pdd_name: str,
    spec_revision: str,
    *,
    current_ready: bool,
    now: float,
    drain_seconds: float,
) -> tuple[RevisionsStatus, list[Event]]:
    """status.revisions after this pass, and the Events that say what changed."""
    if stored is None:
        return RevisionsStatus(current=legacy_record(pdd_name, spec_revision), weight=100), []
    current, previous, weight = stored.current, stored.previous, stored.weight
    if current.id != spec_revision:
        if previous is not None and previous.id == spec_revision:
            message = f"spec back at revision {previous.id}: traffic returns to it, {current.id} drains"
            return (
                RevisionsStatus(current=previous, previous=current, weight=100 - weight, since=now),
                [("Warning", "RevisionReverted", message)],
            )
        new = RevisionRecord(id=spec_revision, prefix=name_prefix(pdd_name, spec_revision, legacy=False))
        if previous is not None and weight == 0:
            message = f"revision {new.id} replaces {current.id}, which never served; {previous.id} serves"
            return (
                RevisionsStatus(current=new, previous=previous, weight=0, since=stored.since),
                [("Normal", "RevisionReplaced", message)],
            )
        message = f"revision {current.id} -> {new.id}: the new P/D pair starts beside the old one"
        if previous is not None:
            message += f" (revision {previous.id}, already drained of requests, is removed)"
        return (
            RevisionsStatus(current=new, previous=current, weight=0, since=now),
            [("Normal", "RevisionStarted", message)],
        )
    if previous is None:
        return stored, []
    if weight < 100:
        if not current_ready:
            return stored, []
        message = f"revision {previous.id} -> {current.id}: the new P/D pair is ready, it takes every request"
        return (
            RevisionsStatus(current=current, previous=previous, weight=100, since=now),
            [("Normal", "RevisionSwitched", message)],
        )
    since = stored.since if stored.since is not None else now
    if now - since >= drain_seconds:
        message = (
            f"revision {previous.id} drained ({drain_seconds:g} s without requests): its pair is deleted"
        )
        return RevisionsStatus(current=current, weight=100), [("Normal", "RevisionRemoved", message)]
    return stored, []


def pair_names(record: RevisionRecord) -> set[tuple[str, str]]:
    """(kind, name) of every object of a revision's P/D pair."""
    return {(kind, f"{record.prefix}-{role}") for kind in PAIR_KINDS for role in meta.REVISIONED_ROLES}


def pair_ready(statefulsets: Mapping[str, Obj | None], wanted: Mapping[str, int | None]) -> bool:
    """Every P/D StatefulSet of the pair exists with all its replicas Ready; a pool that wants no pods
    needs none. `wanted`: each role's rendered replicas (None: sized by another controller)."""
    for role in meta.REVISIONED_ROLES:
        want = wanted.get(role, 0)
        if want == 0:
            continue
        sts = statefulsets.get(role)
        if sts is None:
            return False
        spec_replicas = (sts.get("spec") or {}).get("replicas")
        need = max(1, int(spec_replicas) if spec_replicas is not None else 1)
        ready = int((sts.get("status") or {}).get("readyReplicas") or 0)
        if ready < need:
            return False
    return True


@dataclass
class RevisionOutcome:
    status: RevisionsStatus
    keep: set[tuple[str, str]] = field(default_factory=set)  # the previous pair's objects, not pruned
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None


def drain_seconds_for(pdd: PDDeployment) -> float:
    rollout = pdd.spec.rollout
    return float(rollout.scale_down_delay_seconds) if rollout is not None else DEFAULT_DRAIN_SECONDS


def step(
    pdd: PDDeployment,
    stored: RevisionsStatus | None,
    current_statefulsets: Mapping[str, Obj | None],
    wanted: Mapping[str, int | None],
    now: float,
) -> RevisionOutcome:
    """One pass: `current_statefulsets` are the stored current revision's (by role)."""
    drain = drain_seconds_for(pdd)
    status, events = advance(
        stored,
        pdd.metadata.name,
        revision_id(pdd.spec),
        current_ready=pair_ready(current_statefulsets, wanted),
        now=now,
        drain_seconds=drain,
    )
    outcome = RevisionOutcome(status=status, events=events)
    if status.previous is not None:
        outcome.keep = pair_names(status.previous)
        if status.weight < 100:
            outcome.requeue_after = REQUEUE_SECONDS
        else:
            left = (status.since if status.since is not None else now) + drain - now
            outcome.requeue_after = max(1.0, min(REQUEUE_SECONDS, left))
    return outcome
