"""The router's objects: Deployment, Service, ServiceAccount, Role, RoleBinding, PodDisruptionBudget.

Pure. The router discovers ready engine pods by watching Pods and reads its own PDDeployment, so
its Role grants exactly get/list/watch on those two (the PDDeployment by name), and `get` on the
API keys Secret (by name) when spec.router.auth.apiKeysSecret is set. It runs as a
non-root user with a read-only root filesystem; it writes nothing but temporary files. Its pod meets
the restricted Pod Security Standard (docs/security.md). Router pods take the spec's nodeSelector and
tolerations and prefer nodes without GPUs: a router needs CPU only.
"""

from __future__ import annotations

from typing import Any

from tandem.api import meta
from tandem.api.models import PDDeployment
from tandem.render import lifecycle, names

Manifest = names.Manifest
ROLE: meta.Role = "router"
CONTAINER_NAME = "router"
SERVICE_PORT = 80
NONROOT_UID = 65532  # the conventional "nonroot" user of distroless images
# Labels NVIDIA's GPU feature discovery puts on GPU nodes (the dev cluster's fake ones carry gpu.count).
GPU_NODE_LABELS = ("nvidia.com/gpu.present", "nvidia.com/gpu.count")
NO_GPU_WEIGHT = 100
# The router streams decode answers back; on SIGTERM it may still be relaying them.
ROUTER_GRACE_SECONDS = (
    lifecycle.PRESTOP_SECONDS + lifecycle.STREAM_DRAIN_SECONDS + lifecycle.EXIT_MARGIN_SECONDS
)


def router_command(pdd: PDDeployment) -> list[str]:
    return [
        "tandem",
        "router",
        "--namespace",
        "$(POD_NAMESPACE)",
        "--pddeployment",
        pdd.metadata.name,
        "--host",
        "$(POD_IP)",
        "--port",
        str(meta.ROUTER_PORT),
    ]


def _probe(path: str, period: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": 3,
    }


def _container(pdd: PDDeployment) -> dict[str, Any]:
    router = pdd.spec.router
    return {
        "name": CONTAINER_NAME,
        "image": router.image,
        "imagePullPolicy": router.image_pull_policy,
        "command": router_command(pdd),
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
        "ports": [{"name": "http", "containerPort": meta.ROUTER_PORT, "protocol": "TCP"}],
        "resources": {
            "requests": {key: str(value) for key, value in router.resources.requests.items()},
            "limits": {key: str(value) for key, value in router.resources.limits.items()},
        },
        # /ready: the router has listed its pods; /health: the process answers.
        "readinessProbe": _probe("/ready", 5),
        "livenessProbe": _probe("/health", 10),
        "lifecycle": {"preStop": {"sleep": {"seconds": lifecycle.PRESTOP_SECONDS}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def affinity() -> dict[str, Any]:
    """Prefer nodes that carry none of the GPU node labels: GPUs are for engines."""
    expressions = [{"key": key, "operator": "DoesNotExist"} for key in GPU_NODE_LABELS]
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": NO_GPU_WEIGHT, "preference": {"matchExpressions": expressions}}
            ]
        }
    }


def deployment(pdd: PDDeployment) -> Manifest:
    router = pdd.spec.router
    pod_spec: dict[str, Any] = {
        "serviceAccountName": names.child_name(pdd, ROLE),
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": ROUTER_GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NONROOT_UID,
            "runAsGroup": NONROOT_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": affinity(),
        "containers": [_container(pdd)],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if router.node_selector:
        pod_spec["nodeSelector"] = dict(router.node_selector)
    if router.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in router.tolerations]
    if pdd.spec.router.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in pdd.spec.router.image_pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": names.object_meta(pdd, ROLE),
        "spec": {
            "replicas": pdd.spec.router.replicas,
            "selector": {"matchLabels": names.selector(pdd, ROLE)},
            # Keep every ready router serving while a new one starts.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {
                    "labels": names.labels(pdd, ROLE),
                    "annotations": names.scrape_annotations(meta.ROUTER_PORT, meta.ROUTER_METRICS_PATH),
                },
                "spec": pod_spec,
            },
        },
    }


def service(pdd: PDDeployment) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.object_meta(pdd, ROLE),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector(pdd, ROLE),
            "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def service_account(pdd: PDDeployment) -> Manifest:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": names.object_meta(pdd, ROLE)}


def role(pdd: PDDeployment) -> Manifest:
    read = ["get", "list", "watch"]
    rules: list[dict[str, Any]] = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": read},
        {
            "apiGroups": [meta.GROUP],
            "resources": [meta.PLURAL],
            "resourceNames": [pdd.metadata.name],
            "verbs": read,
        },
    ]
    keys = pdd.spec.router.auth.api_keys_secret
    if keys is not None:  # the router reads its API keys itself, that one Secret only
        rules.append({"apiGroups": [""], "resources": ["secrets"], "resourceNames": [keys], "verbs": ["get"]})
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": names.object_meta(pdd, ROLE),
        "rules": rules,
    }


def role_binding(pdd: PDDeployment) -> Manifest:
    name = names.child_name(pdd, ROLE)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": names.object_meta(pdd, ROLE),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": pdd.metadata.namespace}],
    }


def disruption_budget(pdd: PDDeployment) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": names.object_meta(pdd, ROLE),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector(pdd, ROLE)}},
    }
