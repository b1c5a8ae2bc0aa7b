"""Pod events -> the router's view of ready engine endpoints, as a pure reducer.

The watcher (`tandem.kube.pods`) reports ADDED/MODIFIED/DELETED pods and full relists (SYNC);
`apply_pod_event` folds them into a name -> PodInfo map and `endpoints_by_role` turns that map into
the base URLs the balancer chooses from. A pod is routable when it belongs to this PDDeployment,
has a pool role, is Running and Ready, has an IP, is not being deleted (a terminating pod gets
no new requests while it drains) and is not marked draining (`tandem.dev/draining`, set by the
autoscaler on the pod it is about to remove). A pod leaving the endpoint set only stops getting
new legs: legs already sent to it (streams, and the KV a decode pod pulls from a prefill pod) run
to their end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from tandem.api.meta import POOL_ROLES, REVISIONED_ROLES
from tandem.kube.pods import PodEventKind, PodInfo


def apply_pod_event(
    pods: Mapping[str, PodInfo], kind: PodEventKind, infos: Iterable[PodInfo]
) -> dict[str, PodInfo]:
    """The pod map after one watch event (SYNC replaces the whole map)."""
    if kind == "SYNC":
        return {pod.name: pod for pod in infos}
    updated = dict(pods)
    for pod in infos:
        if kind == "DELETED":
            updated.pop(pod.name, None)
        else:
            updated[pod.name] = pod
    return updated


def is_routable(pod: PodInfo, pdd_name: str) -> bool:
    return (
        pod.pddeployment == pdd_name
        and pod.role in POOL_ROLES
        and pod.phase == "Running"
        and pod.ready
        and not pod.terminating
        and not pod.draining
        and bool(pod.ip)
    )


def draining_by_role(pods: Mapping[str, PodInfo], pdd_name: str) -> dict[str, int]:
    """Every pool role -> how many of its otherwise routable pods are draining."""
    counts: dict[str, int] = dict.fromkeys(POOL_ROLES, 0)
    for pod in pods.values():
        if pod.draining and pod.role in counts and is_routable(replace(pod, draining=False), pdd_name):
            counts[pod.role] += 1
    return counts


def base_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


def endpoints_by_role(pods: Mapping[str, PodInfo], pdd_name: str, port: int) -> dict[str, list[str]]:
    """Every pool role -> sorted base URLs of its routable pods (empty list when none)."""
    view: dict[str, list[str]] = {role: [] for role in POOL_ROLES}
    for pod in pods.values():
        if is_routable(pod, pdd_name) and pod.role is not None and pod.ip is not None:
            view[pod.role].append(base_url(pod.ip, port))
    return {role: sorted(urls) for role, urls in view.items()}


def endpoints_by_revision(
    pods: Mapping[str, PodInfo], pdd_name: str, port: int
) -> dict[str, dict[str, list[str]]]:
    """Every serving revision with a routable prefill or decode pod -> role -> sorted base URLs.

    A prefill pod and a decode pod are paired only within one revision (`tandem.router.revisions`)."""
    view: dict[str, dict[str, list[str]]] = {}
    for pod in pods.values():
        if is_routable(pod, pdd_name) and pod.role in REVISIONED_ROLES and pod.ip is not None:
            roles = view.setdefault(pod.revision, {role: [] for role in REVISIONED_ROLES})
            roles[pod.role].append(base_url(pod.ip, port))
    return {rev: {role: sorted(urls) for role, urls in roles.items()} for rev, roles in sorted(view.items())}


def pool_key(role: str, revision: str) -> str:
    """The balancer pool of one role of one revision."""
    return f"{role}@{revision}"
