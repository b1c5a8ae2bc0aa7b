"""One level-based reconcile pass of one PDDeployment: render, apply what differs, prune, report.

The pass moves data between the API (through `tandem.kube.rest`) and the pure core (`render`,
`status.derive`, `drift`). It applies only children whose desired fields differ from the live
object and patches status only when it changed, so a steady state writes nothing. Failures land
in status and Events; nothing here raises for a problem the user has to fix.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tandem.api import meta
from tandem.api.models import PDDeployment
from tandem.api.status import PDDeploymentStatus
from tandem.controller.drift import is_subset
from tandem.controller.events import EventRecorder
from tandem.kube.rest import PDDEPLOYMENT, POD, Kind, KubeError, KubeRest, Obj
from tandem.render import CHILD_KINDS, render
from tandem.status.derive import Observed, PodProblem, WorkloadState, derive_status

log = logging.getLogger(__name__)

KINDS: dict[str, Kind] = {kind: Kind(api_version, kind, plural) for api_version, kind, plural in CHILD_KINDS}
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


@dataclass
class PassResult:
    """What one pass did; `requeue_after` asks for another pass even without a watch event."""

    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_written: bool = False
    phase: str = ""
    requeue_after: float | None = None


def desired_replicas(pdd: PDDeployment) -> dict[str, int]:
    replicas: dict[str, int] = {role: pdd.spec.pool(role).replicas for role in meta.POOL_ROLES}
    replicas["router"] = pdd.spec.router.replicas
    return replicas


def _owned_by(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def _key(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _workload_state(obj: Obj) -> WorkloadState:
    status = obj.get("status") or {}
    return WorkloadState(
        generation=int(obj["metadata"].get("generation", 0)),
        observed_generation=int(status.get("observedGeneration", 0)),
        replicas=int(status.get("replicas", 0)),
        ready_replicas=int(status.get("readyReplicas", 0)),
        updated_replicas=int(status.get("updatedReplicas", 0)),
    )


def pod_problems(pods: list[Obj]) -> list[PodProblem]:
    """Unschedulable pods and containers stuck on images or config, from the pods' own status."""
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
                problems.append(
                    PodProblem(name, role, reason, f"{waiting['reason']}: {waiting.get('message', '')}")
                )
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
    return problems


class Reconciler:
    """Reconciles PDDeployments through one KubeRest; holds no state between passes."""

    def __init__(self, kube: KubeRest, events: EventRecorder) -> None:
        self.kube = kube
        self.events = events

    def reconcile(self, body: Obj, now: str) -> PassResult:
        result = PassResult()
        try:
            pdd = PDDeployment.from_object(body)
        except ValidationError as exc:
            self._report_invalid(body, exc, now)
            result.phase = "Degraded"
            return result
        ns, name = pdd.metadata.namespace, pdd.metadata.name
        replicas = desired_replicas(pdd)
        desired = render(pdd, replicas)
        selector = f"{meta.LABEL_PDD}={name}"

        existing: dict[tuple[str, str], Obj] = {}
        for kind in KINDS.values():
            for obj in self.kube.list(kind, ns, selector):
                if _owned_by(obj, pdd.metadata.uid):
                    existing[_key(obj)] = obj

        live: dict[tuple[str, str], Obj] = {}
        apply_errors: list[str] = []
        for obj in desired:
            key = _key(obj)
            current = existing.get(key)
            if current is not None and is_subset(obj, current):
                live[key] = current
                continue
            try:
                live[key] = self.kube.apply(KINDS[obj["kind"]], obj)
                result.applied.append(f"{key[0]}/{key[1]}")
            except KubeError as exc:
                apply_errors.append(f"{key[0]}/{key[1]}: {exc.message}")
        wanted = {_key(obj) for obj in desired}
        for key, obj in existing.items():
            if key not in wanted:
                try:
                    self.kube.delete(KINDS[key[0]], ns, key[1], obj["metadata"].get("uid"))
                    result.deleted.append(f"{key[0]}/{key[1]}")
                except KubeError as exc:
                    apply_errors.append(f"delete {key[0]}/{key[1]}: {exc.message}")

        workloads = {
            obj["metadata"]["labels"][meta.LABEL_ROLE]: _workload_state(obj)
            for (kind, _), obj in live.items()
            if kind in ("StatefulSet", "Deployment")
        }
        problems = missing_secrets(self.kube, pdd) + pod_problems(self.kube.list(POD, ns, selector))
        observed = Observed(
            workloads=workloads, desired_replicas=replicas, pod_problems=problems, apply_errors=apply_errors
        )
        previous = _previous_status(body)
        status = derive_status(pdd, observed, previous.conditions if previous else [], now)
        result.phase = status.phase.value
        if previous is None or _dump(previous) != _dump(status):
            self.kube.patch_status(PDDEPLOYMENT, ns, name, _dump(status))
            result.status_written = True
        self._record_events(body, result, previous, status)
        if status.phase.value == "Degraded":
            result.requeue_after = REQUEUE_STALLED_SECONDS
        elif status.phase.value != "Healthy":
            result.requeue_after = REQUEUE_PROGRESSING_SECONDS
        return result

    def _record_events(
        self, body: Obj, result: PassResult, previous: PDDeploymentStatus | None, status: PDDeploymentStatus
    ) -> None:
        if result.applied:
            self.events.normal(body, "Applied", "applied " + ", ".join(result.applied))
        if result.deleted:
            self.events.normal(body, "Pruned", "deleted " + ", ".join(result.deleted))
        old = {c.type: c for c in previous.conditions} if previous else {}
        new = {c.type: c for c in status.conditions}
        stalled, was = new.get("Stalled"), old.get("Stalled")
        if (
            stalled
            and stalled.status == "True"
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

    def _report_invalid(self, body: Obj, exc: ValidationError, now: str) -> None:
        """A spec the apiserver accepted but the models refuse (e.g. CRD older than the operator)."""
        md = body.get("metadata", {})
        errors = "; ".join(
            f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()[:5]
        )
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


def _cond(kind: str, status: str, reason: str, message: str, md: Mapping[str, Any], now: str) -> Obj:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": int(md.get("generation", 0)),
        "lastTransitionTime": now,
    }


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
