"""Names every part of tandem agrees on: API group, labels, annotations, ports, field manager.

The renderer writes these, the router and the pod runner select by them, the operator reads them.
"""

from __future__ import annotations

from typing import Final, Literal

GROUP: Final = "tandem.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "PDDeployment"
PLURAL: Final = "pddeployments"
SINGULAR: Final = "pddeployment"
SHORT_NAMES: Final = ("pdd",)

FIELD_MANAGER: Final = "tandem-operator"

Role = Literal["prefill", "decode", "colocated", "router"]
POOL_ROLES: Final[tuple[Role, ...]] = ("prefill", "decode", "colocated")

# Labels on every child object and pod template.
LABEL_NAME: Final = "app.kubernetes.io/name"  # always "tandem"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"  # the PDDeployment's name
LABEL_COMPONENT: Final = "app.kubernetes.io/component"  # the role
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"  # always "tandem"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"  # always "tandem-operator"
LABEL_ROLE: Final = "tandem.dev/role"  # prefill | decode | colocated | router
LABEL_PDD: Final = "tandem.dev/pddeployment"  # the PDDeployment's name (selector key)
# The serving revision of a prefill/decode pod (docs/rollout.md, Revisions); absent on the legacy
# revision's pods (the first one, rendered as before revisions existed).
LABEL_REVISION: Final = "tandem.dev/revision"
REVISIONED_ROLES: Final[tuple[Role, ...]] = ("prefill", "decode")

APP_NAME: Final = "tandem"

# Annotations a user (or an Argo CD action) sets on a PDDeployment.
ANNOTATION_AUTOSCALING_PAUSED: Final = "tandem.dev/autoscaling-paused"  # "true" holds every decision
# A rollout command: promote, abort or retry, optionally `/TOKEN` to give the same one again
# (docs/rollout.md); acted on once, echoed in status.rollout.lastCommand.
ANNOTATION_ROLLOUT_COMMAND: Final = "tandem.dev/rollout-command"

# Annotation the operator sets on a pod it is about to remove: the router sends it no new work.
ANNOTATION_DRAINING: Final = "tandem.dev/draining"  # value: RFC 3339 time the drain started

# Pod annotations read by Prometheus' kubernetes_sd relabelling.
ANNOTATION_SCRAPE: Final = "prometheus.io/scrape"
ANNOTATION_SCRAPE_PORT: Final = "prometheus.io/port"
ANNOTATION_SCRAPE_PATH: Final = "prometheus.io/path"

# Ports inside a pod. Every pod has its own IP, so fixed ports never collide.
ENGINE_PORT: Final = 8000  # vLLM's default; /health, /v1/*, /metrics


def api_port_name(rank: int) -> str:
    """A pod's OpenAI API port name: `http` for its first local rank, `http-<i>` for each further
    MultiPortExternal rank (render names them; the revision rollout counts them on live pods)."""
    return "http" if rank == 0 else f"http-{rank}"


NIXL_SIDE_CHANNEL_PORT: Final = 5600  # vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default
ROUTER_PORT: Final = 8080
# Multi-node replicas (LeaderWorkerSet groups, docs/multinode.md); vLLM's own defaults, rendered
# explicitly so the NetworkPolicy can name them. A pod's NIXL side channel of data-parallel rank r
# listens on NIXL_SIDE_CHANNEL_PORT + r (vLLM adds the global rank); with MultiPortExternal a pod's
# local rank i serves the OpenAI API on ENGINE_PORT + i.
DP_RPC_PORT: Final = 29550  # --data-parallel-rpc-port, on the leader (engines' handshake)
MASTER_PORT: Final = 29501  # --master-port: torch.distributed's store on the leader (--nnodes > 1)
DP_SUPERVISOR_PORT: Final = 9256  # --data-parallel-supervisor-port: a pod's aggregated /health

# LeaderWorkerSet (sigs.k8s.io/lws, v1 API): the kind multi-node pools render, the variables its pod
# webhook gives every container, and its annotation for one group per topology domain.
LWS_API_VERSION: Final = "leaderworkerset.x-k8s.io/v1"
LWS_KIND: Final = "LeaderWorkerSet"
LWS_PLURAL: Final = "leaderworkersets"
LWS_LEADER_ADDRESS: Final = "LWS_LEADER_ADDRESS"  # <lws>-<group>.<subdomain>.<namespace>: a DNS name
LWS_GROUP_SIZE: Final = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX: Final = "LWS_WORKER_INDEX"  # 0 on the leader, 1.. on the workers
LWS_EXCLUSIVE_TOPOLOGY: Final = "leaderworkerset.sigs.k8s.io/exclusive-topology"
LWS_WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_KEY_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-key"  # one value per group of a set
LWS_GROUP_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE_ANNOTATION: Final = "leaderworkerset.sigs.k8s.io/size"  # pods of the group
# Kubernetes' own gang scheduling (groupPlacement.gangScheduling: Kubernetes): a PodGroup per group,
# named by tandem's MutatingAdmissionPolicy in each pod's spec.schedulingGroup from this label (the
# leader's PodGroup is its own name, <lws>-<group>; a worker's is its name less "-<worker index>").
POD_GROUP_API_VERSION: Final = "scheduling.k8s.io/v1alpha2"
POD_GROUP_KIND: Final = "PodGroup"
POD_GROUP_PLURAL: Final = "podgroups"
LABEL_POD_GROUP_MEMBER: Final = "tandem.dev/pod-group-member"  # leader | worker
ROUTER_METRICS_PATH: Final = "/metrics"


def selector_labels(pdd_name: str, role: Role) -> dict[str, str]:
    """The labels that select one role's pods of one PDDeployment (stable: never change them)."""
    return {LABEL_PDD: pdd_name, LABEL_ROLE: role}
