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

Endpoints are data-parallel ranks where the pods serve them one by one: a pod that declares
several API ports (MultiPortExternal: `http`, `http-1`, ... for ports 8000 + local rank) is one
endpoint per port, so the balancer and the prefix index choose the rank; a pod of `External`
balancing (one rank, port 8000) or `Hybrid` (its own ranks behind port 8000) is one endpoint, and an
`Internal` group is its leader. Each `Endpoint` carries its pod and group (`endpoint_list`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

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


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One routable API server: a pod's port (one data-parallel rank, or what the pod balances itself)."""

    url: str
    role: str
    revision: str
    pod: str
    group: str | None  # the LeaderWorkerSet group key of a multi-node replica's member
    local_rank: int  # the pod's API port index: 8000 + local_rank (MultiPortExternal's local rank)


def endpoint_list(pods: Mapping[str, PodInfo], pdd_name: str, port: int) -> list[Endpoint]:
    """Every routable endpoint: one per API port of each pod that serves, its group whole (by URL)."""
    complete = complete_groups(pods, pdd_name)
    found: list[Endpoint] = []
    for pod in pods.values():
        if not is_endpoint(pod, pdd_name, complete) or pod.role is None or pod.ip is None:
            continue
        for local_rank in range(max(1, pod.api_ports)):
            url = base_url(pod.ip, port + local_rank)
            found.append(Endpoint(url, pod.role, pod.revision, pod.name, pod.group, local_rank))
    return sorted(found, key=lambda endpoint: endpoint.url)


def endpoints_by_role(pods: Mapping[str, PodInfo], pdd_name: str, port: int) -> dict[str, list[str]]:
    """Every pool role -> sorted base URLs of its routable endpoints (empty list when none)."""
    view: dict[str, list[str]] = {role: [] for role in POOL_ROLES}
    for endpoint in endpoint_list(pods, pdd_name, port):
        view[endpoint.role].append(endpoint.url)
    return view


def endpoints_by_revision(
    pods: Mapping[str, PodInfo], pdd_name: str, port: int
) -> dict[str, dict[str, list[str]]]:
    """Every serving revision with a routable prefill or decode endpoint -> role -> sorted base URLs.

    A prefill endpoint and a decode endpoint are paired only within one revision
    (`tandem.router.revisions`)."""
    view: dict[str, dict[str, list[str]]] = {}
    for endpoint in endpoint_list(pods, pdd_name, port):
        if endpoint.role in REVISIONED_ROLES:
            roles = view.setdefault(endpoint.revision, {role: [] for role in REVISIONED_ROLES})
            roles[endpoint.role].append(endpoint.url)
    return {rev: roles for rev, roles in sorted(view.items())}


def pool_key(role: str, revision: str) -> str:
    """The balancer pool of one role of one revision."""
    return f"{role}@{revision}"
