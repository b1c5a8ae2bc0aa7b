"""A multi-node pool's LeaderWorkerSet (sigs.k8s.io/lws v1): one group of pods per replica.

Pure. A pool with `nodesPerInstance > 1` runs each replica (instance) as a LeaderWorkerSet group of
that many pods, one per node: the leader (worker index 0, the rank-0 node that serves the API
unless the balancing mode gives every pod an endpoint) and `nodesPerInstance - 1` workers, each with
the exact `vllm serve` line of its member (`command.parallel_args`). What the object says:

- `size`: pods per group; `replicas`: groups (left out when an HPA or KEDA owns them, as for a
  StatefulSet). Its scale subresource counts groups.
- `restartPolicy: RecreateGroupOnPodRestart`: a rank that dies (container restart or pod loss)
  takes the group down and LeaderWorkerSet recreates all its pods together, as vLLM's ranks cannot
  rejoin a running group.
- `startupPolicy: LeaderCreated`: workers are created with the leader, not after it is Ready (the
  leader's engines become ready only once every worker's ranks have joined).
- All-or-nothing placement: LeaderWorkerSet alone creates a group's pods together but schedules them
  one by one, so a half-placed group can hold GPUs while it waits. `groupPlacement.schedulerName`
  hands the pods to a gang scheduler (Volcano: the LeaderWorkerSet controller, with
  `gangSchedulingManagement.schedulerProvider: volcano`, gives each group a PodGroup of minMember =
  size), and `groupPlacement.exclusiveTopology` renders LeaderWorkerSet's
  `leaderworkerset.sigs.k8s.io/exclusive-topology` annotation (a group's pods in one domain of that
  node label, one group per domain). `groupPlacement.gangScheduling: Kubernetes` uses Kubernetes' own
  gang scheduling instead: `pod_groups` renders a scheduling.k8s.io PodGroup per group (gang
  minCount = size), and the pod templates carry `LABEL_POD_GROUP_MEMBER`, from which tandem's
  MutatingAdmissionPolicy names the group's PodGroup in each pod's `spec.schedulingGroup`.
  docs/multinode.md.
- The group's DNS subdomain is the pool's headless Service (`pool.headless_service`, named as the
  LeaderWorkerSet, publishing not-ready pods), so LeaderWorkerSet creates none of its own and
  `LWS_LEADER_ADDRESS` (`<lws>-<group>.<lws>.<namespace>`) resolves while the group starts.
"""

from __future__ import annotations

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import PDDeployment
from tandem.api.status import RevisionRecord
from tandem.render import names, pod

Manifest = names.Manifest

RESTART_POLICY = "RecreateGroupOnPodRestart"
STARTUP_POLICY = "LeaderCreated"


def leaderworkerset(
    pdd: PDDeployment, role: Role, *, replicas: int | None, revision: RevisionRecord | None = None
) -> Manifest:
    """The pool's LeaderWorkerSet; `replicas=None` leaves `spec.replicas` out (another controller sets it)."""
    pool = pdd.spec.pool(role)
    metadata = names.object_meta(pdd, role, revision)
    metadata["name"] = names.workload_name(pdd, role, revision)
    placement = pool.group_placement
    if placement is not None and placement.exclusive_topology is not None:
        metadata["annotations"] = {meta.LWS_EXCLUSIVE_TOPOLOGY: placement.exclusive_topology}
    spec: Manifest = {} if replicas is None else {"replicas": replicas}
    spec |= {
        "startupPolicy": STARTUP_POLICY,
        "leaderWorkerTemplate": {
            "size": pool.nodes_per_instance,
            "restartPolicy": RESTART_POLICY,
            "leaderTemplate": pod.pod_template(pdd, role, revision, member="leader"),
            "workerTemplate": pod.pod_template(pdd, role, revision, member="worker"),
        },
    }
    return {"apiVersion": meta.LWS_API_VERSION, "kind": meta.LWS_KIND, "metadata": metadata, "spec": spec}


def pod_groups(
    pdd: PDDeployment, role: Role, *, replicas: int | None, revision: RevisionRecord | None = None
) -> list[Manifest]:
    """One PodGroup per group (`<lws>-<group index>`, the name tandem's admission policy gives the
    group's pods), for a gang-scheduled multi-node pool; none otherwise. With `replicas=None` (an HPA
    or KEDA sizes the pool) there is one for each group the pool may reach: `autoscaling.maxReplicas`.
    A PodGroup with no pods holds nothing; a group recreated (a rank failed, a new template) is placed
    all together again."""
    pool = pdd.spec.pool(role)
    if not pool.shape.multi_node or not pod.gang_scheduled(pdd, role):
        return []
    if replicas is None:
        replicas = pool.autoscaling.max_replicas if pool.autoscaling is not None else pool.replicas
    workload = names.workload_name(pdd, role, revision)
    result = []
    for index in range(replicas):
        metadata = names.object_meta(pdd, role, revision)
        metadata["name"] = f"{workload}-{index}"
        metadata["labels"][meta.LWS_GROUP_INDEX_LABEL] = str(index)
        spec = {"schedulingPolicy": {"gang": {"minCount": pool.nodes_per_instance}}}
        result.append(
            {
                "apiVersion": meta.POD_GROUP_API_VERSION,
                "kind": meta.POD_GROUP_KIND,
                "metadata": metadata,
                "spec": spec,
            }
        )
    return result
