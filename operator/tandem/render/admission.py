"""tandem's MutatingAdmissionPolicy for Kubernetes' own gang scheduling (`groupPlacement.gangScheduling`).

Pure. A LeaderWorkerSet renders one pod template for the leaders of all its groups and one for their
workers, so no template can name a group's PodGroup. This cluster-wide policy does it when each pod is
created: a pod labelled `tandem.dev/pod-group-member` gets `spec.schedulingGroup.podGroupName` = the
group's name, `<lws>-<group index>`: a leader's own name (LeaderWorkerSet's leader StatefulSet names
pods `<lws>-<group index>`), or a worker's name less its last `-<worker index>` (the group's worker
StatefulSet is `<lws>-<group index>`). The operator keeps a PodGroup of that name per group
(`group.pod_groups`). Installed by the chart (`gangScheduling.admissionPolicy`, a test holds its
template equal to this) and by the dev cluster; it needs admissionregistration.k8s.io/v1 (1.36+).
"""

from __future__ import annotations

from typing import Final

from tandem.api import meta
from tandem.render.names import Manifest

POLICY_NAME: Final = "tandem-pod-group"
API_VERSION: Final = "admissionregistration.k8s.io/v1"

# CEL over the pod being created (`object`): the PodGroup of its group, from its name and role.
PODGROUP_NAME: Final = (
    f'object.metadata.labels["{meta.LABEL_POD_GROUP_MEMBER}"] == "leader" ? object.metadata.name : '
    'object.metadata.name.substring(0, object.metadata.name.lastIndexOf("-"))'
)


def pod_group_policy() -> list[Manifest]:
    """The MutatingAdmissionPolicy and its binding (cluster-scoped)."""
    labels = {meta.LABEL_NAME: meta.APP_NAME, meta.LABEL_PART_OF: meta.APP_NAME}
    policy: Manifest = {
        "apiVersion": API_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": dict(labels)},
        "spec": {
            # A pod it cannot name would be scheduled on its own, breaking the group's all-or-nothing.
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                "objectSelector": {
                    "matchExpressions": [
                        {"key": meta.LABEL_POD_GROUP_MEMBER, "operator": "In", "values": ["leader", "worker"]}
                    ]
                },
            },
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {
                        "expression": (
                            "Object{spec: Object.spec{schedulingGroup: Object.spec.schedulingGroup{"
                            f"podGroupName: {PODGROUP_NAME}}}}}}}"
                        )
                    },
                }
            ],
        },
    }
    binding: Manifest = {
        "apiVersion": API_VERSION,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": dict(labels)},
        "spec": {"policyName": POLICY_NAME},
    }
    return [policy, binding]
