"""`helm lint` and `helm template` over a matrix of values: RBAC scope, operator flags, security."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.render import CHILD_KINDS, GROUP_KINDS
from tandem.render.admission import pod_group_policy

from .helm import CHART, KUBE_VERSION, Rendered, run_helm, template

NS = "tandem-system"


def operator_container(r: Rendered) -> dict[str, Any]:
    deployment = r.get("Deployment", "tandem", NS)
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def flags(r: Rendered) -> list[str]:
    c = operator_container(r)
    return [*c["command"], *c["args"]]


def rules_grant(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule.get("apiGroups", [])
        and resource in rule.get("resources", [])
        and verb in rule.get("verbs", [])
        and not rule.get("resourceNames")
        for rule in rules
    )


MATRIX: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "namespaced-no-cluster-reads": {"watchNamespaces": ["team-a"], "rbac": {"clusterReadOnly": False}},
    "ha": {"replicaCount": 2, "podDisruptionBudget": {"enabled": True}},
    "no-crds": {"crds": {"install": False, "keep": True}},
    "crds-not-kept": {"crds": {"install": True, "keep": False}},
    "monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}},
                   "workloadPodMonitor": {"enabled": True, "labels": {"release": "prom"}},
                   "service": {"enabled": False}},
    "namespaced-monitoring": {"watchNamespaces": ["team-a"], "workloadPodMonitor": {"enabled": True}},
    "external-sa": {"serviceAccount": {"create": False, "name": "ops"}, "rbac": {"create": False}},
    "digest": {"image": {"repository": "registry.example/tandem", "digest": "sha256:" + "a" * 64,
                         "pullPolicy": "Always"}},
    "prometheus": {"prometheus": {"url": "http://prometheus-operated.monitoring.svc:9090/prom"}},
    "gang": {"gangScheduling": {"admissionPolicy": True}},
    "tuned": {"operator": {"probePort": 9090, "resyncSeconds": 60, "workers": 8, "leaseName": "lead",
                           "unschedulableGraceSeconds": 900,
                           "verbose": True, "extraArgs": ["--foo"],
                           "extraEnv": [{"name": "X", "value": "1"}]}},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_lint_passes(name: str) -> None:
    from .helm import values_args

    args = values_args(MATRIX[name])
    out = run_helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, *args, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_every_object_is_labelled_and_namespaced_where_it_must_be(name: str) -> None:
    r = template(MATRIX[name])
    cluster_scoped = {
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    }
    for obj in r.objects:
        md = obj["metadata"]
        assert md["labels"]["app.kubernetes.io/instance"] == "tandem", md["name"]
        assert md["labels"]["app.kubernetes.io/managed-by"] == "Helm", md["name"]
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in md, md["name"]
        else:
            assert md.get("namespace"), f"{obj['kind']} {md['name']} has no namespace"


def test_defaults_render_a_cluster_wide_operator() -> None:
    r = template()
    assert r.kinds() == sorted(
        ["ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
         "Deployment", "Pod", "Role", "RoleBinding", "Service", "ServiceAccount",
         "Role", "RoleBinding", "ServiceAccount"]  # the `helm test` hook's
    )  # fmt: skip
    argv = flags(r)
    assert argv[:2] == ["tandem", "operator"]
    assert "--probe-host=$(POD_IP)" in argv
    assert f"--lease-namespace={NS}" in argv
    assert "--lease-name=tandem" in argv
    assert "--identity=$(POD_NAME)" in argv
    assert not [a for a in argv if a.startswith("--namespace")]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in operator_container(r)["env"]}
    assert env == {
        "POD_IP": "status.podIP",
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
    }
    role = r.get("ClusterRole", "tandem-operator")
    binding = r.get("ClusterRoleBinding", "tandem-operator")
    assert binding["roleRef"]["name"] == "tandem-operator"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tandem", "namespace": NS}]
    assert rules_grant(role["rules"], "tandem.dev", "pddeployments", "watch")
    assert rules_grant(role["rules"], "apiextensions.k8s.io", "customresourcedefinitions", "watch")
    # Cluster-wide, kopf does not need to list namespaces; leases are never granted cluster-wide.
    assert not rules_grant(role["rules"], "", "namespaces", "list")
    assert not rules_grant(role["rules"], "coordination.k8s.io", "leases", "get")


def test_namespaced_install_has_roles_per_namespace_and_no_cluster_writes() -> None:
    r = template(MATRIX["namespaced"])
    argv = flags(r)
    assert [a for a in argv if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    roles = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in r.of_kind("Role")}
    assert roles == {
        ("team-a", "tandem-operator"),
        ("team-b", "tandem-operator"),
        (NS, "tandem-leader-election"),
        (NS, "tandem-test"),  # the `helm test` hook: get/list pods in the release namespace
    }
    for ns in ("team-a", "team-b"):
        binding = r.get("RoleBinding", "tandem-operator", ns)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tandem", "namespace": NS}]
    assert [b["metadata"]["name"] for b in r.of_kind("ClusterRoleBinding")] == ["tandem-operator-discovery"]
    discovery = r.get("ClusterRole", "tandem-operator-discovery")
    write_verbs = {"create", "update", "patch", "delete", "deletecollection"}
    for rule in discovery["rules"]:
        assert not write_verbs & set(rule["verbs"]), rule
    assert {res for rule in discovery["rules"] for res in rule["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
    }


def test_namespaced_install_can_drop_every_cluster_scoped_permission() -> None:
    r = template(MATRIX["namespaced-no-cluster-reads"])
    assert not r.of_kind("ClusterRoleBinding")
    names = [o["metadata"]["name"] for o in r.of_kind("ClusterRole")]
    assert names == ["tandem-edit", "tandem-view"]  # user-facing aggregated roles only; bound by nobody


def test_leader_election_role_is_the_lease_in_the_release_namespace_only() -> None:
    for values in ({}, MATRIX["namespaced"]):
        r = template(values)
        role = r.get("Role", "tandem-leader-election", NS)
        assert role["rules"] == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update"],
            }
        ]


@pytest.mark.parametrize("name", ["defaults", "namespaced"])
def test_operator_may_manage_every_kind_the_renderer_produces(name: str) -> None:
    r = template(MATRIX[name])
    if name == "defaults":
        rules = r.get("ClusterRole", "tandem-operator")["rules"]
    else:
        rules = r.get("Role", "tandem-operator", "team-a")["rules"]
    for api_version, kind, plural in (*CHILD_KINDS, *GROUP_KINDS):
        group = api_version.split("/")[0] if "/" in api_version else ""
        # list each pass, server-side apply (a patch that may create), prune; exactly these:
        # tests/chart/test_rbac_audit.py checks every grant against the code's calls.
        for verb in ("list", "create", "patch", "delete"):
            assert rules_grant(rules, group, plural, verb), f"{verb} {plural} ({kind}) not granted"
    for resource, verbs in {
        "pods": ("get", "list", "watch", "patch"),
        "secrets": ("get",),
        "events": ("create",),
    }.items():
        for verb in verbs:
            assert rules_grant(rules, "", resource, verb), f"{verb} {resource}"
    assert rules_grant(rules, "tandem.dev", "pddeployments/status", "patch")
    # Least privilege: secrets are read one by one, never listed; pods never deleted, PDDeployments
    # never written.
    assert not rules_grant(rules, "", "secrets", "list")
    assert not rules_grant(rules, "", "pods", "delete")
    assert not rules_grant(rules, "tandem.dev", "pddeployments", "update")
    assert not any("*" in rule["verbs"] or "*" in rule["resources"] for rule in rules)


def test_security_context_is_locked_down() -> None:
    r = template()
    pod = r.get("Deployment", "tandem", NS)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = operator_container(r)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"]
    assert c["resources"]["limits"]
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/tmp"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http-probes"}
    assert c["ports"] == [{"name": "http-probes", "containerPort": 8081, "protocol": "TCP"}]


def test_tuned_values_reach_the_command_line() -> None:
    r = template(MATRIX["tuned"])
    argv = flags(r)
    for flag in ("--probe-port=9090", "--resync-seconds=60", "--workers=8", "--lease-name=lead", "--verbose"):
        assert flag in argv
    assert "--unschedulable-grace-seconds=900" in argv
    assert argv[-1] == "--foo"
    assert {"name": "X", "value": "1"} in operator_container(r)["env"]
    assert operator_container(r)["ports"][0]["containerPort"] == 9090


def test_prometheus_url_reaches_the_command_line_only_when_set() -> None:
    assert not [f for f in flags(template()) if f.startswith("--prometheus-url")]
    argv = flags(template(MATRIX["prometheus"]))
    assert "--prometheus-url=http://prometheus-operated.monitoring.svc:9090/prom" in argv


def test_ha_install_has_two_replicas_and_a_pdb() -> None:
    r = template(MATRIX["ha"])
    assert r.get("Deployment", "tandem", NS)["spec"]["replicas"] == 2
    pdb = r.get("PodDisruptionBudget", "tandem", NS)
    selector = r.get("Deployment", "tandem", NS)["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert "tandem.dev/pddeployment" not in selector  # the operator must not look like a PDDeployment child


def test_the_pod_group_policy_is_installed_on_request_and_is_what_the_operator_expects() -> None:
    """The chart's MutatingAdmissionPolicy for gang-scheduled groups equals the one the dev cluster
    installs (tandem.render.admission), but for the chart's labels; off by default."""
    kinds = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    assert not [o for o in template().objects if o["kind"] in kinds]
    rendered = template(MATRIX["gang"])
    for expected in pod_group_policy():
        got = rendered.get(expected["kind"], expected["metadata"]["name"])
        assert got["apiVersion"] == expected["apiVersion"]
        assert got["spec"] == expected["spec"], expected["kind"]


def test_crd_gating_and_keep_policy() -> None:
    assert not template(MATRIX["no-crds"]).of_kind("CustomResourceDefinition")
    kept = template().get("CustomResourceDefinition", "pddeployments.tandem.dev")
    assert kept["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    dropped = template(MATRIX["crds-not-kept"]).get("CustomResourceDefinition", "pddeployments.tandem.dev")
    assert "annotations" not in dropped["metadata"]


def test_pod_monitor_scrapes_the_probe_port() -> None:
    r = template(MATRIX["monitoring"])
    pm = r.get("PodMonitor", "tandem", NS)
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["labels"]["release"] == "prom"
    assert pm["spec"]["podMetricsEndpoints"] == [
        {
            "port": "http-probes",
            "path": "/metrics",
            "honorLabels": True,
            "interval": "30s",
            "scrapeTimeout": "10s",
        }
    ]
    assert pm["spec"]["namespaceSelector"] == {"matchNames": [NS]}
    assert not r.of_kind("Service")
    assert r.get("Pod", "tandem-test-health", NS)  # the helm test needs no Service


def test_external_service_account_and_no_rbac() -> None:
    r = template(MATRIX["external-sa"])
    assert not r.of_kind("ServiceAccount")
    assert not [o for o in r.objects if o["kind"] in ("Role", "RoleBinding", "ClusterRoleBinding")]
    assert r.get("Deployment", "tandem", NS)["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    assert r.get("Pod", "tandem-test-health", NS)["spec"]["serviceAccountName"] == "ops"


def test_image_digest_wins_over_tag() -> None:
    c = operator_container(template(MATRIX["digest"]))
    assert c["image"] == "registry.example/tandem@sha256:" + "a" * 64
    assert c["imagePullPolicy"] == "Always"
    assert operator_container(template())["image"] == "ghcr.io/tandem-dev/tandem:0.1.0"


def test_helm_test_hook_probes_each_operator_pod() -> None:
    r = template()
    pod = r.get("Pod", "tandem-test-health", NS)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    command = pod["spec"]["containers"][0]["command"]
    assert command[:2] == ["tandem", "probe"]
    selector = command[command.index("--selector") + 1]
    operator_labels = r.get("Deployment", "tandem", NS)["spec"]["selector"]["matchLabels"]
    assert dict(part.split("=") for part in selector.split(",")) == operator_labels
    assert command[command.index("--port") + 1] == "8081"
    sa = pod["spec"]["serviceAccountName"]
    role = r.get("Role", sa, NS)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    binding = r.get("RoleBinding", sa, NS)
    assert binding["subjects"][0]["name"] == sa
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        hook = r.get(kind, sa, NS)["metadata"]["annotations"]
        assert hook["helm.sh/hook"] == "test"
        assert int(hook["helm.sh/hook-weight"]) < 0  # before the pod


def test_release_name_containing_tandem_is_not_repeated() -> None:
    r = template(release="tandem-prod")
    assert r.get("Deployment", "tandem-prod", NS)
    r = template(release="prod")
    assert r.get("Deployment", "prod-tandem", NS)


@pytest.mark.parametrize(
    ("name", "namespaces"), [("monitoring", None), ("namespaced-monitoring", ["team-a"])]
)
def test_the_workload_pod_monitor_scrapes_engines_and_routers_with_the_labels_the_autoscaler_reads(
    name: str, namespaces: list[str] | None
) -> None:
    monitors = [
        o for o in template(MATRIX[name]).of_kind("PodMonitor") if "workloads" in o["metadata"]["name"]
    ]
    assert len(monitors) == 1
    spec = monitors[0]["spec"]
    assert spec["namespaceSelector"] == ({"any": True} if namespaces is None else {"matchNames": namespaces})
    (roles,) = spec["selector"]["matchExpressions"]
    assert roles["key"] == "tandem.dev/role"
    assert sorted(roles["values"]) == ["colocated", "decode", "prefill", "router"]
    # The `http` port of every pod, and each further data-parallel rank's port of a MultiPortExternal
    # pod (`http-<i>`: its own engine's /metrics), kept by name from a target per container port.
    http, ranks = spec["podMetricsEndpoints"]
    assert http["port"] == "http"
    assert "port" not in ranks
    assert ranks["relabelings"][0] == {
        "sourceLabels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "http-[0-9]+",
        "action": "keep",
    }
    for endpoint in (http, ranks):
        assert endpoint["path"] == "/metrics"
        targets = {r["targetLabel"] for r in endpoint["relabelings"] if "targetLabel" in r}
        assert targets == {"tandem_dev_pddeployment", "tandem_dev_role", "tandem_dev_revision"}
