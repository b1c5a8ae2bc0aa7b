"""One level-based reconcile pass of one PDDeployment: render, apply what differs, prune, report.

The pass moves data between the API (through `tandem.kube.rest`) and the pure core (`render`,
`status.derive`, `drift`). It applies only children whose desired fields differ from the live
object and patches status only when it changed, so a steady state writes nothing. Failures land
in status and Events; nothing here raises for a problem the user has to fix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from tandem import sizing
from tandem.api import meta
from tandem.api.models import PDDeployment
from tandem.api.status import PDDeploymentStatus, RevisionsStatus, RolloutStatus
from tandem.api.times import parse_rfc3339
from tandem.controller import commands, disaggregation, handover, metrics, revisions
from tandem.controller.api_keys import api_keys_problems
from tandem.controller.autoscaler import Autoscaler, Outcome
from tandem.controller.drift import is_subset
from tandem.controller.events import EventRecorder
from tandem.controller.kv_transport import KvOutcome, KvTransportCheck
from tandem.controller.replicas import is_external
from tandem.controller.rollout import ConditionTuple, RolloutController, RolloutOutcome
from tandem.kube.informer import Cache
from tandem.kube.rest import PDDEPLOYMENT, POD, Kind, KubeError, KubeRest, Obj
from tandem.render import CHILD_KINDS, GROUP_KINDS, names, render
from tandem.render.revision import revision_id
from tandem.status.container_error import error_line
from tandem.status.derive import (
    UNSCHEDULABLE_GRACE_SECONDS,
    Observed,
    PodProblem,
    WorkloadState,
    derive_status,
)

log = logging.getLogger(__name__)

_In = TypeVar("_In")
_Out = TypeVar("_Out")

KINDS: dict[str, Kind] = {
    kind: Kind(api_version, kind, plural) for api_version, kind, plural in (*CHILD_KINDS, *GROUP_KINDS)
}
# Kinds of an add-on's API (LeaderWorkerSet, for multi-node pools) that a cluster may not serve.
OPTIONAL_KINDS = frozenset(kind for _, kind, _ in GROUP_KINDS)
# The workload kinds of a pool: a StatefulSet, or a LeaderWorkerSet for a multi-node pool. Both have
# spec.replicas and status.replicas/readyReplicas/updatedReplicas (pods of a StatefulSet, groups of a
# LeaderWorkerSet: one instance each), which is all the rollout, autoscaler and revision steps read.
WORKLOAD_KINDS = ("StatefulSet", meta.LWS_KIND)
SECRET = Kind("v1", "Secret", "secrets")

# Waiting reasons of a container that need a human (image or config), mapped to status reasons.
_WAITING_PROBLEMS = {
    "ErrImagePull": "ImagePullFailed",
    "ImagePullBackOff": "ImagePullFailed",
    "InvalidImageName": "ImagePullFailed",
    "CrashLoopBackOff": "CrashLoopBackOff",
    "CreateContainerConfigError": "ConfigError",
}

REQUEUE_PROGRESSING_SECONDS = 15.0
REQUEUE_STALLED_SECONDS = 60.0
# Stalled reasons whose moment the rollout steps already post as an Event (RolloutRolledBack,
# RevisionRolledBack): a second, generic Warning would say the same thing again.
ROLLOUT_POSTED = frozenset({"RolledBack"})
REQUEUE_CONFLICT_SECONDS = 1.0  # someone else wrote the object during the pass: read it again


@dataclass
class PassResult:
    """What one pass did; `requeue_after` asks for another pass even without a watch event."""

    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_written: bool = False
    conflict: bool = False  # the status write lost a race; the pass is repeated at once
    phase: str = ""
    requeue_after: float | None = None

    def requeue(self, delay: float | None) -> None:
        if delay is not None:
            self.requeue_after = delay if self.requeue_after is None else min(self.requeue_after, delay)


@dataclass(frozen=True)
class PassContext:
    """What the read step found; every later step reads it, none changes it."""

    body: Obj
    now: str  # RFC 3339, for status
    epoch: float  # the same instant in seconds
    pdd: PDDeployment
    previous: PDDeploymentStatus | None
    existing: Mapping[tuple[str, str], Obj]  # owned children by (kind, name)
    pods: list[Obj]
    # The serving revision's workloads by role: a StatefulSet, or a multi-node pool's LeaderWorkerSet.
    statefulsets: Mapping[str, Obj | None]
    routed: commands.Routed  # the command annotation, routed to one rollout
    absent: frozenset[str] = frozenset()  # optional kinds the cluster does not serve (no CRD)

    @property
    def key(self) -> tuple[str, str]:
        return self.pdd.metadata.namespace, self.pdd.metadata.name

    @property
    def stored_revisions(self) -> RevisionsStatus | None:
        return self.previous.revisions if self.previous is not None else None

    @property
    def revision_change(self) -> bool:
        """Two pairs serve, or the spec names a new revision (not one held back after a rollback)."""
        stored = self.stored_revisions
        return stored is not None and (
            stored.previous is not None
            or (stored.current.id != revision_id(self.pdd.spec) and stored.rollout is None)
        )


@dataclass(frozen=True)
class Desired:
    """What the desire step decided: each step's outcome, the sizes, the objects to apply."""

    rollout: RolloutOutcome
    scaling: Outcome
    kv: KvOutcome
    revs: revisions.RevisionOutcome
    disaggregation: disaggregation.DisaggregationOutcome
    sizes: sizing.Sizes  # every size of the pass (`sizes.serving`: stages 1-3, the drain's marks)
    objects: list[Obj]  # rendered, less a pair kept as it is


@dataclass
class Applied:
    """What the apply step did."""

    live: dict[tuple[str, str], Obj] = field(default_factory=dict)  # children as the API now has them
    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    unserved: list[str] = field(default_factory=list)  # kinds the cluster does not serve: applied nothing
    terminating: bool = False  # the namespace is being deleted: the pass stops here


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch that turns `old` into `new` (`None` removes a key; lists are whole)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch(old[key], value)
    return patch


def status_patch(old: Obj, new: Obj) -> Obj:
    """The status merge patch: the operator's fields as `new` has them; fields of other writers
    (keys the status model does not know) are left alone."""
    owned = {info.alias or name for name, info in PDDeploymentStatus.model_fields.items()}
    patch: Obj = merge_patch({k: v for k, v in old.items() if k in owned}, new)
    return patch


def _owned_by(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def _key(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _kept_pod_group(key: tuple[str, str], keep: Collection[tuple[str, str]]) -> bool:
    """A PodGroup of a group of a kept LeaderWorkerSet (`<lws>-<group index>`)."""
    kind, name = key
    lws, _, index = name.rpartition("-")
    return kind == meta.POD_GROUP_KIND and index.isdigit() and (meta.LWS_KIND, lws) in keep


def _workload_state(obj: Obj) -> WorkloadState:
    status = obj.get("status") or {}
    generation = int(obj["metadata"].get("generation", 0))
    observed = int(status.get("observedGeneration", 0))
    if obj["kind"] == meta.LWS_KIND:
        # LeaderWorkerSet's status has no observedGeneration (v0.7.0); its controller recounts groups
        # (replicas, ready: the leader and every worker Ready; updated: the template's revision) on
        # each of its passes, so its counts stand for the current generation.
        observed = generation
    return WorkloadState(
        generation=generation,
        observed_generation=observed,
        replicas=int(status.get("replicas", 0)),
        ready_replicas=int(status.get("readyReplicas", 0)),
        updated_replicas=int(status.get("updatedReplicas", 0)),
    )


def missing_api(kind: str, roles: Sequence[str]) -> str:
    """The Stalled message for objects of a kind the cluster does not serve (its CRD is missing, or
    for PodGroups the alpha API is off)."""
    api_version, plural = KINDS[kind].api_version, KINDS[kind].plural
    if kind == meta.POD_GROUP_KIND:
        return (
            f"the cluster does not serve {kind} ({plural}.{api_version}): pools with "
            f"groupPlacement.gangScheduling: Kubernetes ({', '.join(roles)}) need Kubernetes' gang "
            "scheduling, 1.36 or later with the GangScheduling and GenericWorkload feature gates and "
            f"--runtime-config={api_version}=true. Nothing was applied (docs/multinode.md)"
        )
    return (
        f"the cluster does not serve {kind} ({plural}.{api_version.split('/')[0]}): the CRD is not "
        f"installed; pools with nodesPerInstance > 1 ({', '.join(roles)}) need LeaderWorkerSet "
        "(sigs.k8s.io/lws, v0.7.0 or later). Nothing was applied (docs/multinode.md)"
    )


def pod_problems(pods: list[Obj]) -> list[PodProblem]:
    """Unschedulable pods and containers stuck on images or config, from the pods' own status. A
    container in CrashLoopBackOff is quoted with the error line of its last exit's log tail (the
    engines' `FallbackToLogsOnError`)."""
    problems = []
    for pod in pods:
        name = pod["metadata"]["name"]
        role = pod["metadata"].get("labels", {}).get(meta.LABEL_ROLE, "")
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                problems.append(
                    PodProblem(
                        name,
                        role,
                        "Unschedulable",
                        cond.get("message", ""),
                        cond.get("lastTransitionTime", ""),
                    )
                )
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = _WAITING_PROBLEMS.get(waiting.get("reason", ""))
            if reason:
                message = f"{waiting['reason']}: {waiting.get('message', '')}"
                failed = (
                    ((cs.get("lastState") or {}).get("terminated") or {})
                    if reason == "CrashLoopBackOff"
                    else {}
                )
                why = error_line(str(failed.get("message") or ""))
                if why:
                    message += f"; last exit {failed.get('exitCode', '?')}: {why}"
                problems.append(PodProblem(name, role, reason, message))
    return problems


def missing_secrets(kube: KubeRest, pdd: PDDeployment) -> list[PodProblem]:
    """Secrets the spec names that do not exist: pods would never start, so say so up front."""
    wanted = [(s, "spec.engine.imagePullSecrets") for s in pdd.spec.engine.image_pull_secrets]
    wanted += [(s, "spec.router.imagePullSecrets") for s in pdd.spec.router.image_pull_secrets]
    if pdd.spec.model.token_secret_ref is not None:
        wanted.append((pdd.spec.model.token_secret_ref.name, "spec.model.tokenSecretRef"))
    problems = []
    for name, use in wanted:
        if kube.get(SECRET, pdd.metadata.namespace, name) is None:
            problems.append(PodProblem("", "", "ConfigError", f"Secret {name!r} ({use}) not found"))
    return problems + api_keys_problems(kube, pdd)


class Reconciler:
    """Reconciles PDDeployments through one KubeRest; holds no state between passes (the
    autoscaler's lives in status)."""

    def __init__(
        self,
        kube: KubeRest,
        events: EventRecorder,
        autoscaler: Autoscaler | None = None,
        rollouts: RolloutController | None = None,
        kv_transport: KvTransportCheck | None = None,
        api_pool: Executor | None = None,
        unschedulable_grace_seconds: float = UNSCHEDULABLE_GRACE_SECONDS,
        cache: Cache | None = None,
    ) -> None:
        self.kube = kube
        # Watch caches of the children and pods (the operator's): a pass reads them instead of
        # listing each kind; None: it lists (tests without informers).
        self.cache = cache
        self.events = events
        self.unschedulable_grace_seconds = unschedulable_grace_seconds
        self._pool = api_pool  # where a pass's independent API calls run at once; None: in turn
        self.autoscaler = autoscaler or Autoscaler(kube)
        self.rollouts = rollouts or RolloutController(self.autoscaler)
        self.kv_transport = kv_transport or KvTransportCheck(
            self.autoscaler.prometheus_url, reader_for=self.autoscaler.reader
        )

    def reconcile(self, body: Obj, now: str, epoch: float | None = None) -> PassResult:
        """One pass; `now` is the RFC 3339 time for status, `epoch` the same instant in seconds.

        The steps, each with one result: read (`PassContext`), desire (`Desired`: every step's
        decision, the sizes, the objects to render), apply (`Applied`), derive (the status), write
        (`PassResult`: the status patch, Events, when to come back)."""
        ctx = self._read(body, now, epoch)
        if isinstance(ctx, PassResult):  # a spec the models refuse: reported, nothing else to do
            return ctx
        desired = self._desire(ctx)
        applied = self._apply(ctx, desired)
        if applied.terminating:
            # The namespace controller is deleting everything in it, this PDDeployment too: a child
            # cannot be created, and a Stalled status or a Warning would only report the deletion.
            log.info("%s/%s: the namespace is being deleted; the pass stops after its applies", *ctx.key)
            return PassResult(applied=list(applied.applied))
        status = self._derive(ctx, desired, applied)
        return self._write(ctx, desired, applied, status)

    # -- read --------------------------------------------------------------------------------------

    def _read(self, body: Obj, now: str, epoch: float | None) -> PassContext | PassResult:
        """The spec, the previous status, the owned children and the pods: everything a pass reads
        from the API before it decides."""
        try:
            pdd = PDDeployment.from_object(body)
        except ValidationError as exc:
            # Locations start at the object's top level (spec..., metadata...): the message names the field.
            self._report_invalid(body, _errors(exc), now)
            return PassResult(phase="Degraded")
        except Exception as exc:  # a validator that raised something pydantic does not wrap: a bug,
            # but the object is still reported, not retried pass after pass with no status
            log.exception("reading the spec of %s", body.get("metadata", {}).get("name"))
            self._report_invalid(
                body, f"spec: the operator could not read it: {type(exc).__name__}: {exc}", now
            )
            return PassResult(phase="Degraded")
        ns, name = pdd.metadata.namespace, pdd.metadata.name
        selector = f"{meta.LABEL_PDD}={name}"
        previous = _previous_status(body)
        existing: dict[tuple[str, str], Obj] = {}
        kinds = [*KINDS.values(), POD]
        absent: set[str] = set()
        if self.cache is not None:
            # From the watch caches (`tandem.kube.informer`): no request at all.
            cache = self.cache
            *listed, pods = [cache.by_label(kind, ns, name) for kind in kinds]
            absent = {kind for kind in OPTIONAL_KINDS if not cache.served(KINDS[kind])}
        else:
            # The reads of a pass are independent: at once, on the API pool (`api_parallelism`).
            *found, pods_or_none = self._each(lambda kind: self._list_served(kind, ns, selector), kinds)
            absent = {kind.kind for kind, objs in zip(kinds, found, strict=False) if objs is None}
            listed = [objs or [] for objs in found]
            pods = pods_or_none or []
        for objs in listed:
            for obj in objs:
                if _owned_by(obj, pdd.metadata.uid):
                    existing[_key(obj)] = obj
        stored = previous.revisions if previous is not None else None
        serving = stored.current if stored is not None else None
        # One command annotation, two rollouts that may read it: each command goes to one of them.
        command_value = ((body.get("metadata") or {}).get("annotations") or {}).get(
            meta.ANNOTATION_ROLLOUT_COMMAND
        )
        return PassContext(
            body=body,
            now=now,
            epoch=_epoch(now) if epoch is None else epoch,
            pdd=pdd,
            previous=previous,
            existing=existing,
            pods=pods,
            statefulsets={
                role: existing.get(("StatefulSet", names.child_name(pdd, role, serving)))
                or existing.get((meta.LWS_KIND, names.workload_name(pdd, role, serving)))
                for role in meta.POOL_ROLES
            },
            absent=frozenset(absent),
            routed=commands.route(
                command_value if isinstance(command_value, str) else None,
                previous.rollout if previous is not None else None,
                stored.rollout if stored is not None else None,
                previous.disaggregation.rollout
                if previous is not None and previous.disaggregation is not None
                else None,
            ),
        )

    # -- desire ------------------------------------------------------------------------------------

    def _desire(self, ctx: PassContext) -> Desired:
        """Every decision of the pass (rollout, autoscaler, KV check, revisions), each pool's size from
        the sizing chain (`tandem.sizing`), and the objects to apply."""
        pdd, previous, epoch = ctx.pdd, ctx.previous, ctx.epoch
        rollout = self.rollouts.step(
            pdd,
            ctx.body,
            previous,
            ctx.statefulsets,
            ctx.pods,
            epoch,
            revision_change=ctx.revision_change,
            disaggregation_change=disaggregation.active(previous.disaggregation if previous else None),
            command_value=ctx.routed.mode,
            command_problem=ctx.routed.problem,
        )
        decided = self.autoscaler.decide(pdd, ctx.body, previous, ctx.statefulsets, epoch, rollout.bounds)
        kv = self.kv_transport.step(pdd, previous, epoch)
        sizes, revs = sizing.size_pools(  # the one call: the revision step runs between stages 3 and 4
            self.autoscaler.sizing_input(pdd, decided, previous, ctx.pods, epoch, rollout.bounds),
            lambda served: self._revision_step(ctx, rollout.status, served),
        )
        scaling = self.autoscaler.outcome(pdd, decided, sizes.serving, epoch)
        objects = [
            obj
            for obj in render(pdd, sizes.replicas, revs.status.current)
            if (obj["kind"], obj["metadata"]["name"]) not in revs.frozen  # a pair kept as it is
        ]
        disagg = disaggregation.step(
            pdd,
            previous.disaggregation if previous is not None else None,
            first_pass=previous is None,
            command_value=ctx.routed.disaggregation,
            verdict_for=disaggregation.verdict_reader(self.autoscaler, pdd, epoch),
            now=epoch,
        )
        return Desired(rollout, scaling, kv, revs, disagg, sizes, objects)

    def _revision_step(
        self, ctx: PassContext, mode_rollout: RolloutStatus | None, served: sizing.Serving
    ) -> tuple[sizing.Change, revisions.RevisionOutcome]:
        """The revision step, between the sizing chain's stages 3 and 4: whether the new pair is ready
        (at stage 3's sizes), status.revisions after this pass, and the change stages 4-5 size."""
        pdd = ctx.pdd
        revs = revisions.step(
            pdd,
            ctx.stored_revisions,
            ctx.statefulsets,
            served.replicas,
            ctx.epoch,
            pods=ctx.pods,
            command_value=ctx.routed.revision,
            verdict_for=revisions.verdict_reader(self.autoscaler, pdd, ctx.epoch),
            loads_for=revisions.loads_reader(self.autoscaler, pdd),
        )
        kept = revs.status.previous
        change = sizing.Change(
            revisions=revs.status,
            mode_rollout=mode_rollout,
            step_weights=[st.weight for st in pdd.spec.rollout.steps] if pdd.spec.rollout is not None else [],
            previous_live={
                role: _replicas_or_one(revisions.pair_workload(ctx.existing, kept, role))
                for role in meta.REVISIONED_ROLES
            }
            if kept is not None
            else {},
        )
        return change, revs

    # -- apply -------------------------------------------------------------------------------------

    def _apply(self, ctx: PassContext, desired: Desired) -> Applied:
        """The drain marks, every child that differs from its live object, the kept pair's shares,
        and the prune of children no longer rendered."""
        out = Applied()
        ns, selector = ctx.pdd.metadata.namespace, f"{meta.LABEL_PDD}={ctx.pdd.metadata.name}"
        # A kind the cache found unserved is asked once more when this spec needs it: its informer
        # lists again only every 30 s, and a CRD just installed should not stall the pass meanwhile.
        unserved = sorted(
            kind
            for kind in {obj["kind"] for obj in desired.objects} & ctx.absent
            if self.cache is None or self._list_served(KINDS[kind], ns, selector) is None
        )
        if unserved:
            # A multi-node pool's LeaderWorkerSet where its CRD is missing: nothing is applied (no
            # router or decode pool without the prefill it needs), nothing pruned, Stalled says why.
            for kind in unserved:
                roles = list(
                    dict.fromkeys(
                        o["metadata"]["labels"].get(meta.LABEL_ROLE, "")
                        for o in desired.objects
                        if o["kind"] == kind
                    )
                )
                out.unserved.append(missing_api(kind, roles))
            return out
        self.autoscaler.mark(ctx.pdd, desired.sizes.serving, ctx.epoch)
        changes: list[tuple[Obj, Obj | None, handover.Step]] = []
        for obj in desired.objects:
            key = _key(obj)
            current = ctx.existing.get(key)
            role = obj["metadata"]["labels"].get(meta.LABEL_ROLE, "")
            transfer: handover.Step = "none"
            if obj["kind"] in WORKLOAD_KINDS:  # an HPA or KEDA scales either through its scale subresource
                transfer = handover.step(current, is_external(ctx.pdd.spec, role))
            if transfer == "none" and current is not None and is_subset(obj, current):
                out.live[key] = current
                continue
            changes.append((obj, current, transfer))
        # Children differ independently: applied at once (each one's hand-over steps stay in order),
        # reported in the rendered order. LeaderWorkerSets go last, each only once its headless Service
        # (of its name, the group's DNS subdomain) is there: LeaderWorkerSet's controller makes its own
        # Service of that name, as its controller, where none exists, and the operator's could then
        # never be applied (two controller references).
        first = [change for change in changes if change[0]["kind"] not in OPTIONAL_KINDS]
        outcomes = self._apply_each(first, out)
        groups = []
        for change in changes:
            if change[0]["kind"] == meta.POD_GROUP_KIND:
                groups.append(change)
            elif change[0]["kind"] in OPTIONAL_KINDS:
                name = change[0]["metadata"]["name"]
                if ("Service", name) in out.live:
                    groups.append(change)
                else:
                    out.errors.append(
                        f"{change[0]['kind']}/{name}: not applied: its Service {name} is not there"
                    )
        outcomes += self._apply_each(groups, out)
        if any(isinstance(outcome, KubeError) and outcome.namespace_terminating for outcome in outcomes):
            out.terminating = True
            return out
        self._apply_shares(ctx, desired, out)
        wanted = {_key(obj) for obj in desired.objects}
        for key, obj in ctx.existing.items():
            # The previous revision's pair drains (with its groups' PodGroups: <lws>-<group index>).
            if (
                key not in wanted
                and key not in desired.revs.keep
                and not _kept_pod_group(key, desired.revs.keep)
            ):
                try:
                    self.kube.delete(
                        KINDS[key[0]], ctx.pdd.metadata.namespace, key[1], obj["metadata"].get("uid")
                    )
                    out.deleted.append(f"{key[0]}/{key[1]}")
                except KubeError as exc:
                    out.errors.append(f"delete {key[0]}/{key[1]}: {exc.message}")
        return out

    def _apply_each(
        self, changes: list[tuple[Obj, Obj | None, handover.Step]], out: Applied
    ) -> list[Obj | KubeError]:
        """`changes` applied at once; each result recorded in `out` in their order."""
        outcomes = self._each(self._try_apply, changes)
        for (obj, _, _), outcome in zip(changes, outcomes, strict=True):
            key = _key(obj)
            if isinstance(outcome, KubeError):
                out.errors.append(f"{key[0]}/{key[1]}: {outcome.message}")
            else:
                out.live[key] = outcome
                out.applied.append(f"{key[0]}/{key[1]}")
        return outcomes

    def _apply_shares(self, ctx: PassContext, desired: Desired, out: Applied) -> None:
        """The kept previous pair's workloads (StatefulSets, or LeaderWorkerSets: groups) at the sizes
        the chain gave them (replicas only)."""
        kept = desired.revs.status.previous
        if kept is None:
            return
        for role, size in desired.sizes.previous.items():
            sts = revisions.pair_workload(ctx.existing, kept, role)
            if sts is None or int((sts.get("spec") or {}).get("replicas", 1)) == size:
                continue
            config = revisions.share_config(sts, size)
            what = f"{config['kind']}/{config['metadata']['name']}"
            try:
                self.kube.apply(KINDS[config["kind"]], config, revisions.SHARE_MANAGER)
                out.applied.append(f"{what} (replicas {size})")
            except KubeError as exc:
                out.errors.append(f"{what}: {exc.message}")

    # -- derive ------------------------------------------------------------------------------------

    def _derive(self, ctx: PassContext, desired: Desired, applied: Applied) -> PDDeploymentStatus:
        """The status from what the pass decided and what the API now holds."""
        pdd, previous = ctx.pdd, ctx.previous
        rollout, scaling, revs = desired.rollout, desired.scaling, desired.revs
        workloads = {
            obj["metadata"]["labels"][meta.LABEL_ROLE]: _workload_state(obj)
            for (kind, _), obj in applied.live.items()
            if kind in (*WORKLOAD_KINDS, "Deployment")
        }
        observed = Observed(
            workloads=workloads,
            desired_replicas=_status_replicas(pdd, desired.sizes, applied.live),
            pod_problems=missing_secrets(self.kube, pdd) + pod_problems(ctx.pods),
            apply_errors=applied.errors,
            unserved=applied.unserved,
            sources=scaling.sources,
            limited_by={role: pool.limited_by for role, pool in desired.sizes.pools.items()},
            autoscaling=scaling.state,
            slo=scaling.slo,
            autoscaling_condition=scaling.condition,
            kv_measured=desired.kv.measured,
            kv_condition=desired.kv.condition,
            mode=rollout.mode,
            rollout=rollout.status,
            rollout_conditions=self._rollout_conditions(ctx, desired),
            revisions=revs.status,
            disaggregation=desired.disaggregation.status,
        )
        return derive_status(
            pdd, observed, previous.conditions if previous else [], ctx.now, self.unschedulable_grace_seconds
        )

    @staticmethod
    def _rollout_conditions(ctx: PassContext, desired: Desired) -> list[ConditionTuple]:
        """RolloutProgressing and RolledBack: the mode rollout's; with none, a revision rollout's; with
        neither running (none, or Promoted), a disaggregation-mode rollout's (status/derive.py)."""
        had = ctx.previous.conditions if ctx.previous is not None else []
        rollout, revs = desired.rollout, desired.revs
        shown = rollout.status if rollout.status is not None else revs.status.rollout
        disagg = desired.disaggregation.status
        if disagg is not None and disagg.rollout is not None and (shown is None or shown.phase == "Promoted"):
            return disaggregation.rollout_conditions(disagg, had)
        if rollout.status is None:  # no mode rollout: a revision rollout's phase shows in the same conditions
            return revisions.rollout_conditions(revs.status, had) or rollout.conditions
        return rollout.conditions

    # -- write -------------------------------------------------------------------------------------

    def _write(
        self, ctx: PassContext, desired: Desired, applied: Applied, status: PDDeploymentStatus
    ) -> PassResult:
        """The status patch (when it changed), the pass's Events, and when to come back."""
        body, previous = ctx.body, ctx.previous
        ns, name = ctx.key
        result = PassResult(applied=list(applied.applied), deleted=list(applied.deleted))
        result.phase = status.phase.value
        metrics.observe_status(ns, name, _dump(status))
        if previous is None or _dump(previous) != _dump(status):
            patch = status_patch(body.get("status") or {}, _dump(status))
            try:
                self.kube.patch_status(PDDEPLOYMENT, ns, name, patch, body["metadata"].get("resourceVersion"))
            except KubeError as exc:
                if exc.status != 409:
                    raise
                result.conflict = True  # its decisions are not recorded: the next pass makes them again
                result.requeue(REQUEUE_CONFLICT_SECONDS)
                self._record_child_events(body, result)
                return result
            result.status_written = True
        self._record_events(body, result, previous, status)
        steps = (desired.rollout, desired.scaling, desired.kv, desired.revs, desired.disaggregation)
        for event_type, reason, message in [event for step in steps for event in step.events]:
            self.events.post(body, event_type, reason, message)
        if status.phase.value == "Degraded":
            result.requeue(REQUEUE_STALLED_SECONDS)
        elif status.phase.value != "Healthy":
            result.requeue(REQUEUE_PROGRESSING_SECONDS)
        for step in steps:
            result.requeue(step.requeue_after)
        return result

    def _list_served(self, kind: Kind, namespace: str, selector: str) -> list[Obj] | None:
        """The objects of `kind` with `selector`; None for an optional kind the cluster does not serve."""
        try:
            return self.kube.list(kind, namespace, selector)
        except KubeError as exc:
            if exc.status == 404 and kind.kind in OPTIONAL_KINDS:
                return None
            raise

    def _each(self, call: Callable[[_In], _Out], items: Sequence[_In]) -> list[_Out]:
        """`call` over `items`, results in order: on the API pool when there is one, else in turn."""
        if self._pool is None or len(items) < 2:
            return [call(item) for item in items]
        return list(self._pool.map(call, items))

    def _try_apply(self, change: tuple[Obj, Obj | None, handover.Step]) -> Obj | KubeError:
        try:
            return self._apply_child(*change)
        except KubeError as exc:
            return exc

    def _apply_child(self, obj: Obj, current: Obj | None, transfer: handover.Step) -> Obj:
        """Server-side apply of one child; for a workload (a StatefulSet or a LeaderWorkerSet), with the
        replicas hand-over or hand-back."""
        kind = KINDS[obj["kind"]]
        if transfer == "hand-over" and current is not None:
            self.kube.apply(kind, handover.pin_replicas(current), handover.HANDOVER_MANAGER)
        applied = self.kube.apply(kind, obj)
        if (
            transfer == "hand-back"
            and current is not None
            and handover.has_manager(current, handover.HANDOVER_MANAGER)
        ):
            applied = self.kube.apply(kind, handover.release(current), handover.HANDOVER_MANAGER)
        return applied

    def _record_child_events(self, body: Obj, result: PassResult) -> None:
        if result.applied:
            self.events.normal(body, "Applied", "applied " + ", ".join(result.applied))
        if result.deleted:
            self.events.normal(body, "Pruned", "deleted " + ", ".join(result.deleted))

    def _record_events(
        self, body: Obj, result: PassResult, previous: PDDeploymentStatus | None, status: PDDeploymentStatus
    ) -> None:
        self._record_child_events(body, result)
        old = {c.type: c for c in previous.conditions} if previous else {}
        new = {c.type: c for c in status.conditions}
        stalled, was = new.get("Stalled"), old.get("Stalled")
        if (
            stalled
            and stalled.status == "True"
            and stalled.reason not in ROLLOUT_POSTED  # the rollout step posted its own Event
            and (
                was is None
                or (was.reason, was.message)
                != (
                    stalled.reason,
                    stalled.message,
                )
            )
        ):
            self.events.warning(body, stalled.reason, stalled.message)
        ready, was_ready = new.get("Ready"), old.get("Ready")
        if ready and ready.status == "True" and (was_ready is None or was_ready.status != "True"):
            self.events.normal(body, "Ready", ready.message)

    def _report_invalid(self, body: Obj, errors: str, now: str) -> None:
        """A spec the apiserver accepted but the models refuse (e.g. CRD older than the operator)."""
        md = body.get("metadata", {})
        errors = errors[:1024]
        previous = _previous_status(body)
        conds = [c for c in (previous.conditions if previous else []) if c.type == "Stalled"]
        if conds and conds[0].message == errors:
            return
        status = {
            "observedGeneration": int(md.get("generation", 0)),
            "phase": "Degraded",
            "conditions": [
                _cond("Ready", "False", "InvalidSpec", errors, md, now),
                _cond("Reconciling", "False", "InvalidSpec", errors, md, now),
                _cond("Stalled", "True", "InvalidSpec", errors, md, now),
            ],
        }
        self.kube.patch_status(PDDEPLOYMENT, md.get("namespace", "default"), md["name"], status)
        self.events.warning(body, "InvalidSpec", errors)


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()[:5])


def _cond(kind: str, status: str, reason: str, message: str, md: Mapping[str, Any], now: str) -> Obj:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": int(md.get("generation", 0)),
        "lastTransitionTime": now,
    }


def _status_replicas(
    pdd: PDDeployment, sizes: sizing.Sizes, live: Mapping[tuple[str, str], Obj]
) -> dict[str, int]:
    """status.pools.<role>.desiredReplicas: the size the chain gave the pool; for an external pool,
    the count its controller set on the StatefulSet (or LeaderWorkerSet: groups)."""
    counts: dict[str, int] = {"router": sizes.router}
    for role in meta.POOL_ROLES:
        pool = sizes.pools.get(role)
        if pool is None:
            continue
        size = pool.desired
        if size is None:
            sts = live.get(("StatefulSet", f"{pdd.metadata.name}-{role}")) or live.get(
                (meta.LWS_KIND, names.workload_name(pdd, role))
            )
            size = int(((sts or {}).get("spec") or {}).get("replicas", 1)) if sts is not None else 0
        counts[role] = size
    return counts


def _replicas_or_one(sts: Obj | None) -> int | None:
    """A StatefulSet's spec.replicas (the API's default 1 when unset); None when there is none."""
    return int((sts.get("spec") or {}).get("replicas", 1)) if sts is not None else None


def _epoch(now: str) -> float:
    return parse_rfc3339(now)


def _previous_status(body: Obj) -> PDDeploymentStatus | None:
    raw = body.get("status")
    if not raw or "conditions" not in raw:
        return None
    try:
        return PDDeploymentStatus.model_validate(raw)
    except ValidationError:
        return None


def _dump(status: PDDeploymentStatus) -> Obj:
    data: Obj = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    return data
