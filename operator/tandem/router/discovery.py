"""Pod events -> the router's view of ready engine endpoints, as a pure reducer.

The watcher (`tandem.kube.pods`) reports ADDED/MODIFIED/DELETED pods and full relists (SYNC);
`apply_pod_event` folds them into a name -> PodInfo map and `endpoints_by_role` turns that map into
the base URLs the balancer chooses from. A pod is routable when it belongs to this PDDeployment,
has a pool role, is Running and Ready, has an IP, is not being deleted (a terminating pod gets
no new requests while it drains) and is not marked draining (`tandem.dev/draining`, set by the
autoscaler on the pod it is about to remove). A member of a multi-node replica (a LeaderWorkerSet
group) is an endpoint only when it serves the API (the leader; a headless worker never) and only
while its whole group is up: every one of the group's pods routable but for serving. One rank down
takes the group's every endpoint out at once, as vLLM's group stops serving with it (the sim
engine's and vLLM's leaders also fail their readiness then). A pod leaving the endpoint set only
stops getting new legs: legs already sent to it (streams, and the KV a decode pod pulls from a
prefill pod) run to their end.
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


def complete_groups(pods: Mapping[str, PodInfo], pdd_name: str) -> set[str]:
    """Groups of a multi-node pool whose every pod (its size's worth) is routable."""
    up: dict[str, int] = {}
    size: dict[str, int] = {}
    for pod in pods.values():
        if pod.group is not None and is_routable(pod, pdd_name):
            up[pod.group] = up.get(pod.group, 0) + 1
            size[pod.group] = pod.group_size
    return {group for group, count in up.items() if count >= size[group]}


def is_endpoint(pod: PodInfo, pdd_name: str, complete: set[str]) -> bool:
    """Routable, serving, and (a group member) with its whole group up."""
    return is_routable(pod, pdd_name) and pod.serves and (pod.group is None or pod.group in complete)


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
    complete = complete_groups(pods, pdd_name)
    for pod in pods.values():
        if is_endpoint(pod, pdd_name, complete) and pod.role is not None and pod.ip is not None:
            view[pod.role].append(base_url(pod.ip, port))
    return {role: sorted(urls) for role, urls in view.items()}


def endpoints_by_revision(
    pods: Mapping[str, PodInfo], pdd_name: str, port: int
) -> dict[str, dict[str, list[str]]]:
    """Every serving revision with a routable prefill or decode pod -> role -> sorted base URLs.

    A prefill pod and a decode pod are paired only within one revision (`tandem.router.revisions`)."""
    view: dict[str, dict[str, list[str]]] = {}
    complete = complete_groups(pods, pdd_name)
    for pod in pods.values():
        if is_endpoint(pod, pdd_name, complete) and pod.role in REVISIONED_ROLES and pod.ip is not None:
            roles = view.setdefault(pod.revision, {role: [] for role in REVISIONED_ROLES})
            roles[pod.role].append(base_url(pod.ip, port))
    return {rev: {role: sorted(urls) for role, urls in roles.items()} for rev, roles in sorted(view.items())}


def pool_key(role: str, revision: str) -> str:
    """The balancer pool of one role of one revision."""
    return f"{role}@{revision}"
