"""`render(pdd, replicas)`: every child object a PDDeployment wants, in apply order.

Pure: no I/O, no clock, no Kubernetes client; plain dicts out. The operator applies the list with
server-side apply and deletes owned children of `CHILD_KINDS` that are not in it.

A pool's objects exist when its desired replicas or its spec replicas are above zero: a pool the
autoscaler or a rollout scaled to zero keeps its StatefulSet (at 0), one that neither the spec nor
a decision wants disappears. A pool whose count is `None` belongs to another controller (an HPA or
KEDA, `autoscaling.external`): its StatefulSet exists and is rendered without `spec.replicas`.
Order: ServiceAccount, Role, RoleBinding, Services, StatefulSets (a multi-node pool's
LeaderWorkerSet in its place), a gang-scheduled multi-node pool's PodGroups, Deployment,
PodDisruptionBudgets, then the engines' NetworkPolicy when `spec.network.policy.enabled`; pools in
the order prefill, decode, colocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import PDDeployment
from tandem.api.status import RevisionRecord
from tandem.render import group, names, network_policy, pool, router

Manifest = names.Manifest

# (apiVersion, kind, plural) of every kind `render` produces.
CHILD_KINDS: Final[tuple[tuple[str, str, str], ...]] = (
    ("v1", "ServiceAccount", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "Role", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    ("v1", "Service", "services"),
    ("apps/v1", "StatefulSet", "statefulsets"),
    ("apps/v1", "Deployment", "deployments"),
    ("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
)
# The kinds of a multi-node pool (`group.py`): its workload, and its PodGroups when gang-scheduled by
# Kubernetes. Not among CHILD_KINDS: an add-on's API (sigs.k8s.io/lws) served only where its CRD is
# installed, and an alpha API served only where its feature gates are on (docs/multinode.md).
GROUP_KINDS: Final[tuple[tuple[str, str, str], ...]] = (
    (meta.LWS_API_VERSION, meta.LWS_KIND, meta.LWS_PLURAL),
    (meta.POD_GROUP_API_VERSION, meta.POD_GROUP_KIND, meta.POD_GROUP_PLURAL),
)


def desired_pools(
    pdd: PDDeployment, replicas: Mapping[str, int | None] | None = None
) -> dict[Role, int | None]:
    """Pools that exist, with their replica counts (`replicas` overrides `spec.<pool>.replicas`).

    A `None` count (the pool is sized by another controller) always exists and stays `None`; without
    `replicas`, that is every pool with `autoscaling.external`. Without `replicas`, a spec with
    `rollout` is rendered at rest, as the operator runs it: the arm `serving.mode` does not use holds
    no pods (a gray rollout starts it when the mode changes; docs/rollout.md).
    """
    idle: tuple[str, ...] = ()
    if replicas is None and pdd.spec.rollout is not None:
        idle = ("colocated",) if pdd.spec.serving.mode.value == "Disaggregated" else ("prefill", "decode")
    result: dict[Role, int | None] = {}
    for role in meta.POOL_ROLES:
        spec_pool = pdd.spec.pool(role)
        spec_replicas = spec_pool.replicas
        external = spec_pool.autoscaling is not None and spec_pool.autoscaling.external
        desired: int | None
        if replicas is None:
            desired = None if external else (0 if role in idle else spec_replicas)
        else:
            desired = replicas.get(role, spec_replicas)
        if desired is None:
            result[role] = None
        elif desired > 0 or spec_replicas > 0:
            result[role] = max(desired, 0)
    return result


def render(
    pdd: PDDeployment,
    replicas: Mapping[str, int | None] | None = None,
    revision: RevisionRecord | None = None,
) -> list[Manifest]:
    """`revision`: the serving revision prefill and decode are rendered as (`status.revisions.current`);
    None renders the legacy one. A previous revision's pair is not rendered: the operator keeps it
    until it has drained (docs/rollout.md, Revisions)."""
    pools = desired_pools(pdd, replicas)
    objects = [
        router.service_account(pdd),
        router.role(pdd),
        router.role_binding(pdd),
        *(pool.headless_service(pdd, role, revision) for role in pools),
        router.service(pdd),
        *(pool.workload(pdd, role, replicas=count, revision=revision) for role, count in pools.items()),
        *(
            pg
            for role, count in pools.items()
            for pg in group.pod_groups(pdd, role, replicas=count, revision=revision)
        ),
        router.deployment(pdd),
        *(pool.disruption_budget(pdd, role, revision) for role in pools),
        router.disruption_budget(pdd),
    ]
    if pdd.spec.network.policy.enabled:
        objects.append(network_policy.network_policy(pdd))
    return [_unshared(obj) for obj in objects]


def _unshared(node: Any) -> Any:
    """A copy in which no dict or list appears twice (copy.deepcopy keeps shared references shared).

    Builders reuse constants and sub-objects; the caller owns, and may mutate, every part it gets,
    and YAML dumps of shared parts would show anchors.
    """
    if isinstance(node, dict):
        return {key: _unshared(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_unshared(value) for value in node]
    return node
