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
- the old pair is deleted once idle: from `SETTLE_SECONDS` after it got its last request (weight 0
  from `since`) its engines report no request running or waiting and no KV held for a pull, so legs
  already sent to it (decode streams, KV pulls from its prefill pods) finish first; at the latest
  `spec.autoscaling.drainTimeoutSeconds` after (Event `RevisionRemoved` says which);
- the spec going back to the previous revision swaps the two (the old pair still serves, so the
  weight returns to it first and the new pair drains); a third revision during a change replaces
  a new pair that never got traffic, or else supersedes the previous pair, which is dropped.

With `spec.rollout`, `advance_rollout` runs the gray rollout's state machine (`tandem.rollout`)
between the two revisions instead of the cut-over: Preparing until the new pair is Ready, then the
steps' weights on the new revision, each judged from the routers' per-revision counters
(`tandem.metrics.revisions`) against the SLO and against the old revision; the command annotation
acts as for a mode rollout. Promoted: the old pair is deleted once idle, as above. A
failed verdict or `abort`: the weight goes back to the old pair first, `scaleDownDelaySeconds`
later the new pair is deleted and the old one is `current` again (RolledBack); while the spec still
names the rejected revision, the old pair is kept exactly as it is (not rendered from the spec) until
`retry` starts the rollout again or the spec changes. The machine's record is
`status.revisions.rollout` (its `target` is the new revision's id).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from tandem.api import meta
from tandem.api.models import PDDeployment
from tandem.api.status import Condition, ConditionStatus, RevisionRecord, RevisionsStatus
from tandem.kube.rest import Obj
from tandem.metrics.queries import quantile_of
from tandem.metrics.revisions import pod_revision_label, read_revision_window, revision_label
from tandem.render import names
from tandem.render.revision import name_prefix, revision_id
from tandem.rollout.config import RolloutConfig
from tandem.rollout.judge import Verdict
from tandem.rollout.machine import Command, Observed, Transition, parse_command, promoted
from tandem.rollout.machine import step as machine_step
from tandem.rollout.state import Phase, RollbackStage, RolloutState, start
from tandem.sizing import PairSizes as PairSizes  # the pairs' shares moved to the sizing chain (stage 4)
from tandem.sizing import pair_sizes as pair_sizes

if TYPE_CHECKING:
    from tandem.controller.autoscaler import Autoscaler
    from tandem.metrics.reader import MetricsReader
    from tandem.rollout.judge import Window

DEFAULT_DRAIN_SECONDS: Final = 30.0  # the old pair's fixed drain before it went by idleness (e2e bound)
# The old pair is judged idle only this long after its weight went to 0: the routers have the weight
# and Prometheus has scraped a request sent just before (as a draining pod: sizing/drain.py).
SETTLE_SECONDS: Final = 10.0
REQUEUE_SECONDS: Final = 5.0
# Kinds of a revision's per-role objects (all named <prefix>-<role>; a multi-node pool's LeaderWorkerSet
# and headless Service cut to `names.group_name` of it).
PAIR_KINDS: Final = ("StatefulSet", "Service", "PodDisruptionBudget", meta.LWS_KIND)

Event = tuple[str, str, str]  # (type, reason, message)
ConditionTuple = tuple[str, ConditionStatus, str, str]


def legacy_record(pdd_name: str, rev: str) -> RevisionRecord:
    return RevisionRecord(id=rev, prefix=name_prefix(pdd_name, rev, legacy=True), legacy=True)


IdleCheck = Callable[[], "bool | None"]


def _not_read() -> bool | None:
    return None


def removal(since: float, now: float, old_idle: IdleCheck, settle: float, timeout: float) -> str | None:
    """Whether the previous pair, whose weight went to 0 at `since`, goes now, and why: "idle" (checked
    from `settle` seconds on: its engines report no request running or waiting and, on prefill, no
    KV held for a pull), "timeout" (`timeout` seconds passed, idle or not), or None (it stays).
    `old_idle` reads the pods' loads (None: not known, which waits); it is called only when due."""
    elapsed = now - since
    if elapsed >= timeout:
        return "timeout"
    if elapsed >= settle and old_idle() is True:
        return "idle"
    return None


def removal_message(previous: RevisionRecord, why: str, since: float, now: float, timeout: float) -> str:
    waited = f"{now - since:.0f} s after its weight went to 0"
    if why == "idle":
        return (
            f"revision {previous.id} idle (no request running or waiting, no KV held for a pull) "
            f"{waited}: its pair is deleted"
        )
    return (
        f"revision {previous.id} not seen idle within the drain timeout ({timeout:g} s, "
        f"spec.autoscaling.drainTimeoutSeconds; {waited}): its pair is deleted anyway"
    )


def advance(
    stored: RevisionsStatus | None,
    pdd_name: str,
    spec_revision: str,
    *,
    current_ready: bool,
    now: float,
    drain_seconds: float,
    old_idle: IdleCheck = _not_read,
    settle_seconds: float = 0.0,
) -> tuple[RevisionsStatus, list[Event]]:
    """status.revisions after this pass, and the Events that say what changed. The previous pair goes
    once idle (`old_idle`, from `settle_seconds` after its weight went to 0), at the latest
    `drain_seconds` after."""
    if stored is None:
        return RevisionsStatus(current=legacy_record(pdd_name, spec_revision), weight=100), []
    current, previous, weight = stored.current, stored.previous, stored.weight
    if current.id != spec_revision:
        if previous is not None and previous.id == spec_revision:
            return _reverted(stored, now)
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
    why = removal(since, now, old_idle, settle_seconds, drain_seconds)
    if why is not None:
        message = removal_message(previous, why, since, now, drain_seconds)
        return RevisionsStatus(current=current, weight=100), [("Normal", "RevisionRemoved", message)]
    return stored, []


def pair_names(record: RevisionRecord) -> set[tuple[str, str]]:
    """(kind, name) of every object a revision's P/D pair may have: a pool of either shape (a pair kept
    across a change of `nodesPerInstance` has the other revision's kind)."""
    return {
        (kind, name)
        for role in meta.REVISIONED_ROLES
        for name in {f"{record.prefix}-{role}", names.group_name(f"{record.prefix}-{role}")}
        for kind in PAIR_KINDS
    }


def pair_workload(existing: Mapping[tuple[str, str], Obj], record: RevisionRecord, role: str) -> Obj | None:
    """The workload of `role` in `record`'s pair: its StatefulSet, or its LeaderWorkerSet (groups)."""
    name = f"{record.prefix}-{role}"
    return existing.get(("StatefulSet", name)) or existing.get((meta.LWS_KIND, names.group_name(name)))


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


def _new_record(pdd_name: str, rev: str) -> RevisionRecord:
    return RevisionRecord(id=rev, prefix=name_prefix(pdd_name, rev, legacy=False))


def _state_of(stored: RevisionsStatus) -> RolloutState | None:
    if stored.rollout is None:
        return None
    try:
        return RolloutState.from_dict(
            stored.rollout.model_dump(by_alias=True, mode="json", exclude_none=True)
        )
    except ValueError:
        return None


def _record_of(state: RolloutState, target: str, problems: tuple[str, ...] = ()) -> Any:
    from tandem.controller.rollout import to_status  # the mode rollout's record, reused

    return to_status(state, target, problems)


def _echo(transition: Transition, before: RolloutState) -> Transition:
    from tandem.controller.rollout import echo_kind

    return echo_kind(transition, before, "revision rollout")


VerdictFor = Callable[[RolloutState, RevisionRecord, RevisionRecord], "Verdict | None"]


def advance_rollout(
    stored: RevisionsStatus,
    pdd_name: str,
    spec_revision: str,
    *,
    config: RolloutConfig,
    current_ready: bool,
    current_pods: int | None,
    command: Command | None,
    verdict_for: VerdictFor,
    now: float,
    old_idle: IdleCheck = _not_read,
    settle_seconds: float = 0.0,
    drain_timeout: float | None = None,
) -> tuple[RevisionsStatus, list[Event]]:
    """status.revisions after one pass of a revision change under `spec.rollout` (module docstring).
    Promoted: the old pair goes once idle (`old_idle`, from `settle_seconds` on), at the latest
    `drain_timeout` (default: `scaleDownDelaySeconds`) after the promotion.

    `verdict_for(state, new, old)` reads and judges a window when one is due (else None); it is only
    called while the machine is Shifting or Paused."""
    current, previous, weight = stored.current, stored.previous, stored.weight
    state = _state_of(stored)
    if current.id != spec_revision:
        return _spec_moved(stored, state, pdd_name, spec_revision, config, command, now)
    if previous is None:
        return (stored if stored.rollout is None else stored.model_copy(update={"rollout": None})), []
    if state is None:  # a change the cut-over began (spec.rollout added since): continue it here
        state = (
            promoted(config, stored.since or now, "the new revision serves every request")
            if weight == 100
            else start(config, now)
        )
    verdict = None
    if state.phase in (Phase.Shifting, Phase.Paused):
        verdict = verdict_for(state, current, previous)
    t = _echo(
        machine_step(state, verdict, command, now, config, Observed(current_ready, current_pods)), state
    )
    s = t.state
    head = f"revision {previous.id} -> {current.id}, weight {s.weight}%"
    events = _machine_events(t, state, head)
    if s.phase is Phase.Promoted:
        timeout = config.scale_down_delay_seconds if drain_timeout is None else drain_timeout
        return _after_promotion(stored, t, events, now, old_idle, settle_seconds, timeout)
    if s.phase is Phase.RolledBack or (
        s.phase is Phase.RollingBack and s.rollback_stage is RollbackStage.ScalingDown
    ):
        return _rolled_back(stored, t, events, head, now, config)
    since = stored.since if s.weight == weight else now
    return (
        RevisionsStatus(
            current=current,
            previous=previous,
            weight=s.weight,
            since=since,
            rollout=_record_of(s, current.id, t.problems),
        ),
        events,
    )


def _spec_moved(
    stored: RevisionsStatus,
    state: RolloutState | None,
    pdd_name: str,
    spec_revision: str,
    config: RolloutConfig,
    command: Command | None,
    now: float,
) -> tuple[RevisionsStatus, list[Event]]:
    """The spec names a revision other than `current`: the one rolled back (held until `retry`), the
    previous one (the two swap), or a new one (a change starts at Preparing)."""
    current, previous, weight = stored.current, stored.previous, stored.weight
    held = state is not None and state.phase is Phase.RolledBack
    if state is not None and held and stored.rollout and stored.rollout.target == spec_revision:
        return _held_or_retried(stored, state, pdd_name, spec_revision, config, command, now)
    if previous is not None and previous.id == spec_revision:
        return _reverted(stored, now)
    new = _new_record(pdd_name, spec_revision)
    old = previous if previous is not None and weight == 0 else current
    last = command.id if command is not None else (state.last_command if state is not None else None)
    fresh = start(config, now, last_command=last)
    steps = config.describe_steps()
    message = f"revision {old.id} -> {new.id} in steps of {steps}: the new P/D pair starts beside the old"
    return (
        RevisionsStatus(current=new, previous=old, weight=0, since=now, rollout=_record_of(fresh, new.id)),
        [("Normal", "RevisionRolloutStarted", message)],
    )


def _held_or_retried(
    stored: RevisionsStatus,
    state: RolloutState,
    pdd_name: str,
    spec_revision: str,
    config: RolloutConfig,
    command: Command | None,
    now: float,
) -> tuple[RevisionsStatus, list[Event]]:
    """Held after a rollback of the revision the spec names: only `retry` starts it again."""
    current = stored.current
    t = _echo(machine_step(state, None, command, now, config), state)
    if t.state.phase is not Phase.Preparing:
        kept = _record_of(t.state, spec_revision, t.problems)
        return stored.model_copy(update={"rollout": kept}), []
    new = _new_record(pdd_name, spec_revision)
    message = f"revision {current.id} -> {new.id}: {t.state.reason}"
    retried = _record_of(t.state, new.id, t.problems)
    return (
        RevisionsStatus(current=new, previous=current, weight=0, since=now, rollout=retried),
        [("Normal", "RevisionRolloutRetried", message)],
    )


def _reverted(stored: RevisionsStatus, now: float) -> tuple[RevisionsStatus, list[Event]]:
    """The spec is back at the previous revision, which still serves: the two pairs swap."""
    current, previous = stored.current, stored.previous
    assert previous is not None
    message = f"spec back at revision {previous.id}: traffic returns to it, {current.id} drains"
    return (
        RevisionsStatus(current=previous, previous=current, weight=100 - stored.weight, since=now),
        [("Warning", "RevisionReverted", message)],
    )


def _machine_events(t: Transition, before: RolloutState, head: str) -> list[Event]:
    """The Event of the machine's transition, if any."""
    event = t.event_reason(before, "RevisionRollout")
    # The scale-down stage deletes the new pair in this same pass: RevisionRolledBack says so (one Event).
    if event is None or event == "RevisionRolloutScalingDown":
        return []
    kind = "Warning" if t.state.phase in (Phase.RollingBack, Phase.RolledBack) else "Normal"
    return [(kind, event, f"{head}: {t.state.reason}")]


def _after_promotion(
    stored: RevisionsStatus,
    t: Transition,
    events: list[Event],
    now: float,
    old_idle: IdleCheck,
    settle_seconds: float,
    timeout: float,
) -> tuple[RevisionsStatus, list[Event]]:
    """Promoted: the old pair stays until it is idle, or the drain timeout passed."""
    s, current, previous = t.state, stored.current, stored.previous
    assert previous is not None
    why = removal(s.phase_since, now, old_idle, settle_seconds, timeout)
    if why is not None:
        message = removal_message(previous, why, s.phase_since, now, timeout)
        return RevisionsStatus(current=current, weight=100), [
            *events,
            ("Normal", "RevisionRemoved", message),
        ]
    return (
        RevisionsStatus(
            current=current,
            previous=previous,
            weight=100,
            since=s.phase_since,
            rollout=_record_of(s, current.id, t.problems),
        ),
        events,
    )


def _rolled_back(
    stored: RevisionsStatus, t: Transition, events: list[Event], head: str, now: float, config: RolloutConfig
) -> tuple[RevisionsStatus, list[Event]]:
    """The weight has been back on the old pair for the scale-down delay: the new pair goes."""
    s, current, previous = t.state, stored.current, stored.previous
    assert previous is not None
    if s.phase is Phase.RollingBack:
        s = machine_step(s, None, None, now, config, Observed(target_pods=0)).state
    message = f"{head}: the new pair is deleted, revision {previous.id} serves"
    return (
        RevisionsStatus(current=previous, weight=100, rollout=_record_of(s, current.id, t.problems)),
        [*events, ("Warning", "RevisionRolledBack", message)],
    )


@dataclass
class RevisionOutcome:
    status: RevisionsStatus
    keep: set[tuple[str, str]] = field(default_factory=set)  # objects not pruned (a pair kept as it is)
    # P/D objects not rendered: the serving pair while the spec names a revision that was rolled back
    # (rendering it from the spec would roll it to the rejected revision).
    frozen: set[tuple[str, str]] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None


def rollout_conditions(status: RevisionsStatus, had: Sequence[Condition]) -> list[ConditionTuple]:
    """RolloutProgressing and RolledBack for a revision rollout (status.revisions.rollout), as a mode
    rollout sets them; none without a record (or with an unreadable one)."""
    from tandem.controller.rollout import conditions_for, from_status

    record = status.rollout
    if record is None or record.target is None:
        return []
    try:
        state = from_status(record)
    except ValueError:
        return []
    old = status.previous if status.previous is not None else status.current
    if old.id == record.target:  # after a rollback the old revision is current again
        old = status.current
    return conditions_for(state, f"revision {record.target}", had, record.reason, source=f"revision {old.id}")


SHARE_MANAGER: Final = "tandem-revision-share"  # the field manager that sizes a kept previous pair


def share_config(workload: Obj, replicas: int) -> Obj:
    """The apply configuration that sets a kept pair's workload (a StatefulSet, or a LeaderWorkerSet:
    groups) to `replicas` and nothing else (the pair is not rendered: its template must stay the old
    revision's)."""
    md = workload.get("metadata") or {}
    return {
        "apiVersion": workload.get("apiVersion", "apps/v1"),
        "kind": workload.get("kind", "StatefulSet"),
        "metadata": {"name": md.get("name"), "namespace": md.get("namespace")},
        "spec": {"replicas": replicas},
    }


def drain_timeout_for(pdd: PDDeployment) -> float:
    """The longest an old pair waits to be idle before it is deleted anyway."""
    return float(pdd.spec.autoscaling.drain_timeout_seconds)


def pair_pods(pods: list[Obj], record: RevisionRecord) -> list[Obj]:
    """The P/D pods of one revision: its label's, or, for the legacy revision, those with none."""
    out = []
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(meta.LABEL_ROLE) not in meta.REVISIONED_ROLES:
            continue
        revision = labels.get(meta.LABEL_REVISION)
        if (revision is None) if record.legacy else (revision == record.id):
            out.append(pod)
    return out


LoadsFor = Callable[["Mapping[str, int]"], "Mapping[str, Any] | None"]  # pod -> its API ports


def api_ports(pod: Obj) -> int:
    """The OpenAI API ports of a pod's engine (`http`, and `http-<i>` per further MultiPortExternal
    rank): the scrape targets it reports from, as it was rendered, whatever the spec says now."""
    containers = (pod.get("spec") or {}).get("containers") or []
    names = {str(p.get("name", "")) for c in containers for p in c.get("ports") or []}
    return max(1, sum(1 for rank in range(len(names)) if meta.api_port_name(rank) in names))


def _headless(pod: Obj) -> bool:
    """A LeaderWorkerSet worker that is not scraped (no engine metrics of its own)."""
    md = pod.get("metadata") or {}
    worker = ((md.get("labels") or {}).get(meta.LWS_WORKER_INDEX_LABEL) or "0") != "0"
    return worker and (md.get("annotations") or {}).get(meta.ANNOTATION_SCRAPE) != "true"


def idle_check(pods: list[Obj], record: RevisionRecord | None, loads_for: LoadsFor | None) -> IdleCheck:
    """Reads whether every pod of `record`'s pair is idle (sizing/drain.idle), when asked."""

    def check() -> bool | None:
        from tandem.controller.drain import idle

        if record is None or loads_for is None:
            return None
        mine = pair_pods(pods, record)
        # A headless worker of a group has no engine metrics: its leader's /metrics counts its ranks.
        serving = [
            p
            for p in mine
            if (p.get("status") or {}).get("phase") == "Running"
            and (p.get("status") or {}).get("podIP")
            and not _headless(p)
        ]
        if not serving:
            return True  # no pod left that could hold a request
        loads = loads_for({str(p["metadata"]["name"]): api_ports(p) for p in serving})
        if loads is None:
            return None
        return all(
            idle(loads.get(str(p["metadata"]["name"])), str(p["metadata"]["labels"][meta.LABEL_ROLE]))
            for p in serving
        )

    return check


def step(
    pdd: PDDeployment,
    stored: RevisionsStatus | None,
    current_statefulsets: Mapping[str, Obj | None],
    wanted: Mapping[str, int | None],
    now: float,
    *,
    pods: list[Obj] | None = None,
    command_value: str | None = None,
    verdict_for: VerdictFor | None = None,
    loads_for: LoadsFor | None = None,
) -> RevisionOutcome:
    """One pass: `current_statefulsets` are the stored current revision's (by role); `pods` the
    deployment's pods; `command_value` the rollout command annotation; `verdict_for` reads a window;
    `loads_for` reads pods' loads (the old pair goes once idle)."""
    spec_revision = revision_id(pdd.spec)
    ready = pair_ready(current_statefulsets, wanted)
    old_idle = idle_check(pods or [], stored.previous if stored is not None else None, loads_for)
    if pdd.spec.rollout is None or stored is None:
        base = stored.model_copy(update={"rollout": None}) if stored is not None else None
        status, events = advance(
            base,
            pdd.metadata.name,
            spec_revision,
            current_ready=ready,
            now=now,
            drain_seconds=drain_timeout_for(pdd),
            old_idle=old_idle,
            settle_seconds=SETTLE_SECONDS,
        )
    else:
        status, events = _advance_under_rollout(
            pdd, stored, ready, now, pods or [], parse_command(command_value), verdict_for, old_idle
        )
    return _outcome(status, events, spec_revision)


def _advance_under_rollout(
    pdd: PDDeployment,
    stored: RevisionsStatus,
    ready: bool,
    now: float,
    pods: list[Obj],
    command: Command | None,
    verdict_for: VerdictFor | None,
    old_idle: IdleCheck,
) -> tuple[RevisionsStatus, list[Event]]:
    """`advance_rollout` with the spec's rollout config and the new revision's pod count."""
    from tandem.controller.rollout import rollout_config

    assert pdd.spec.rollout is not None
    current = stored.current
    current_pods = sum(
        1
        for pod in pods
        if ((pod.get("metadata") or {}).get("labels") or {}).get(meta.LABEL_REVISION) == current.id
    )
    return advance_rollout(
        stored,
        pdd.metadata.name,
        revision_id(pdd.spec),
        config=rollout_config(pdd.spec, pdd.spec.rollout),
        current_ready=ready,
        current_pods=None if current.legacy else current_pods,
        command=command,
        verdict_for=verdict_for or (lambda *_: None),
        now=now,
        old_idle=old_idle,
        settle_seconds=SETTLE_SECONDS,
        drain_timeout=drain_timeout_for(pdd),
    )


def _outcome(status: RevisionsStatus, events: list[Event], spec_revision: str) -> RevisionOutcome:
    """The objects kept and frozen for `status`, and when to come back."""
    outcome = RevisionOutcome(status=status, events=events)
    if status.current.id != spec_revision:  # held after a rollback: the serving pair stays as it is
        outcome.frozen = pair_names(status.current)
        outcome.keep |= outcome.frozen
    if status.previous is not None:
        outcome.keep |= pair_names(status.previous)
        outcome.requeue_after = REQUEUE_SECONDS  # steps, or the old pair's loads, read again
    return outcome


def loads_reader(autoscaler: Autoscaler, pdd: PDDeployment) -> LoadsFor:
    """`loads_for` through the autoscaler's Prometheus reader; None when it cannot be read."""

    def read(ports: Mapping[str, int]) -> Mapping[str, Any] | None:
        from tandem.controller import metrics as operator_metrics

        url = autoscaler.url(pdd.spec)
        if not url:
            return None
        try:
            reader = autoscaler.reader(url, pdd.spec.autoscaling.prometheus.timeout_seconds)
            loads: Mapping[str, Any] = reader.pod_load(pdd.metadata.namespace, list(ports), targets=ports)
            return loads
        except Exception:
            operator_metrics.PROMETHEUS_ERRORS.labels(query="pod_load").inc()
            return None

    return read


def verdict_reader(autoscaler: Autoscaler, pdd: PDDeployment, now: float) -> VerdictFor:
    """`verdict_for` reading the routers' per-revision counters through the autoscaler's Prometheus
    reader, at most once per analysis period (as the mode rollout does); never raises."""

    def read(state: RolloutState, new: RevisionRecord, old: RevisionRecord) -> Verdict | None:
        from tandem.controller.rollout import read_through, verdict_due
        from tandem.rollout.judge import judge

        spec = pdd.spec
        config = verdict_due(spec, state, now)
        if config is None:
            return None
        window_s = config.analysis.window_seconds

        def window(reader: MetricsReader) -> Window:
            return read_revision_window(
                reader,
                pdd.metadata.namespace,
                pdd.metadata.name,
                target=revision_label(new.id, new.legacy),
                baseline=revision_label(old.id, old.legacy),
                window_seconds=window_s,
                now=now,
                slo_set=spec.slo is not None,
                quantile=quantile_of(spec.slo.attainment_percent if spec.slo is not None else None),
                spec=spec,
                target_pods=pod_revision_label(new.id, new.legacy),
                baseline_pods=pod_revision_label(old.id, old.legacy),
            )

        return judge(read_through(autoscaler, spec, window_s, now, "revisions", window), config.analysis)

    return read
