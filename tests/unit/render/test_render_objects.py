"""What `render` produces: which objects exist, pod plumbing per role, the router and its RBAC."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tandem.api.models import PDDeployment
from tandem.render import CHILD_KINDS, render

MakePdd = Callable[..., PDDeployment]
Obj = dict[str, Any]


def _by_key(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def _sts(objects: list[Obj], role: str) -> Obj:
    return _by_key(objects)[("StatefulSet", f"demo-{role}")]


def _container(objects: list[Obj], role: str) -> Obj:
    container: Obj = _sts(objects, role)["spec"]["template"]["spec"]["containers"][0]
    return container


def _env(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_disaggregated_renders_prefill_decode_and_router_in_apply_order(make_pdd: MakePdd) -> None:
    objects = render(make_pdd())
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ServiceAccount", "demo-router"),
        ("Role", "demo-router"),
        ("RoleBinding", "demo-router"),
        ("Service", "demo-prefill"),
        ("Service", "demo-decode"),
        ("Service", "demo-router"),
        ("StatefulSet", "demo-prefill"),
        ("StatefulSet", "demo-decode"),
        ("Deployment", "demo-router"),
        ("PodDisruptionBudget", "demo-prefill"),
        ("PodDisruptionBudget", "demo-decode"),
        ("PodDisruptionBudget", "demo-router"),
    ]
    kinds = {(o["apiVersion"], o["kind"]) for o in objects}
    optional = {("networking.k8s.io/v1", "NetworkPolicy")}  # with spec.network.policy.enabled only
    assert kinds | optional == {(api_version, kind) for api_version, kind, _ in CHILD_KINDS}


@pytest.mark.parametrize(
    ("spec_replicas", "decided", "want"),
    [
        pytest.param({"colocated": 0}, None, {"prefill": 1, "decode": 1}, id="spec only"),
        pytest.param(
            {"colocated": 0},
            {"colocated": 2},
            {"prefill": 1, "decode": 1, "colocated": 2},
            id="rollout adds colocated",
        ),
        pytest.param(
            {"colocated": 3},
            {"colocated": 0},
            {"prefill": 1, "decode": 1, "colocated": 0},
            id="scaled to zero stays",
        ),
        pytest.param(
            {"colocated": 0}, {"prefill": 4}, {"prefill": 4, "decode": 1}, id="autoscaler sizes prefill"
        ),
    ],
)
def test_pool_objects_follow_decided_and_spec_replicas(
    make_pdd: MakePdd, spec_replicas: dict[str, int], decided: dict[str, int] | None, want: dict[str, int]
) -> None:
    pdd = make_pdd({role: {"replicas": n} for role, n in spec_replicas.items()})
    objects = render(pdd, decided)
    got = {
        o["metadata"]["labels"]["tandem.dev/role"]: o["spec"]["replicas"]
        for o in objects
        if o["kind"] == "StatefulSet"
    }
    assert got == want
    services = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    assert services == {f"demo-{role}" for role in want} | {"demo-router"}


def test_pd_pools_on_rdma_get_devices_ipc_lock_affinity_and_nixl_env(make_pdd: MakePdd) -> None:
    objects = render(make_pdd({"prefill": {"tensorParallelSize": 2}, "decode": {"tensorParallelSize": 4}}))
    for role, peer, tp in (("prefill", "decode", "2"), ("decode", "prefill", "4")):
        pod = _sts(objects, role)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": tp, "rdma/hca": "1"}
        assert container["resources"]["requests"] == container["resources"]["limits"]
        assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "network.tandem.dev/rdma", "operator": "In", "values": ["true"]}
                    ]
                }
            ]
        }
        assert pod["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {
                        "matchLabels": {"tandem.dev/pddeployment": "demo", "tandem.dev/role": peer}
                    },
                    "topologyKey": "network.tandem.dev/fabric",
                },
            }
        ]
        env = _env(container)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$(POD_IP)"
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
        assert env["UCX_TLS"] == "rc,ud,sm,self,cuda_copy"
        assert [p["name"] for p in container["ports"]] == ["http", "nixl"]


def test_without_rdma_pd_pools_get_no_devices_or_node_affinity_and_ucx_over_tcp(make_pdd: MakePdd) -> None:
    objects = render(make_pdd({"network": {"rdma": {"enabled": False}}}))
    pod = _sts(objects, "decode")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "securityContext" not in container
    assert "nodeAffinity" not in pod["affinity"]
    assert _env(container)["UCX_TLS"] == "tcp,sm,self,cuda_copy"


def test_colocated_pool_has_no_kv_plumbing(make_pdd: MakePdd) -> None:
    pdd = make_pdd(
        {
            "serving": {"mode": "Colocated"},
            "prefill": {"replicas": 0},
            "decode": {"replicas": 0},
            "colocated": {"replicas": 1},
        }
    )
    objects = render(pdd)
    pod = _sts(objects, "colocated")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "affinity" not in pod
    assert "securityContext" not in container
    assert [p["name"] for p in container["ports"]] == ["http"]
    assert not any(name.startswith(("VLLM_NIXL", "UCX_")) for name in _env(container))
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "StatefulSet"} == {"demo-colocated"}


def test_pool_resources_node_selector_and_tolerations_are_kept(make_pdd: MakePdd) -> None:
    pdd = make_pdd(
        {
            "decode": {
                "resources": {"requests": {"cpu": 4, "memory": "32Gi"}, "limits": {"memory": "64Gi"}},
                "nodeSelector": {"pool": "gpu"},
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
                ],
            }
        }
    )
    pod = _sts(render(pdd), "decode")["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1", "rdma/hca": "1"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "1", "rdma/hca": "1"},
    }
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]


def test_user_env_comes_last_and_replaces_tandem_defaults(make_pdd: MakePdd) -> None:
    pdd = make_pdd(
        {
            "engine": {
                "env": [
                    {"name": "UCX_NET_DEVICES", "value": "mlx5_0:1"},
                    {"name": "EXTRA", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                ]
            }
        }
    )
    env = _container(render(pdd), "prefill")["env"]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names))
    assert env[-2:] == [
        {"name": "UCX_NET_DEVICES", "value": "mlx5_0:1"},
        {"name": "EXTRA", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    ]


def test_hf_token_and_sim_bandwidth_reach_the_engine(make_pdd: MakePdd) -> None:
    pdd = make_pdd(
        {
            "model": {"tokenSecretRef": {"name": "hf", "key": "token"}},
            "engine": {"type": "sim"},
            "kvTransfer": {"bandwidthGbps": 25},
        }
    )
    env = _env(_container(render(pdd), "decode"))
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["TANDEM_SIM_KV_BANDWIDTH_GBPS"] == "25"


def test_probes_allow_minutes_of_model_load(make_pdd: MakePdd) -> None:
    def startup_seconds(pdd: PDDeployment, role: str) -> int:
        probe = _container(render(pdd), role)["startupProbe"]
        assert probe["httpGet"] == {"path": "/health", "port": "http"}
        return int(probe["periodSeconds"] * probe["failureThreshold"])

    local = {"model": {"uri": "pvc://weights/llama"}}
    assert startup_seconds(make_pdd(local), "decode") == 10 * 60
    assert startup_seconds(make_pdd({**local, "decode": {"tensorParallelSize": 8}}), "decode") == 40 * 60
    assert startup_seconds(make_pdd(), "decode") == 30 * 60  # hf:// downloads first


def test_shm_is_memory_backed_and_grows_with_tp(make_pdd: MakePdd) -> None:
    objects = render(make_pdd({"prefill": {"tensorParallelSize": 1}, "decode": {"tensorParallelSize": 8}}))
    for role, size in (("prefill", "8Gi"), ("decode", "32Gi")):
        volumes = _sts(objects, role)["spec"]["template"]["spec"]["volumes"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}} in volumes


def test_router_deployment_runs_the_router_for_this_pddeployment(make_pdd: MakePdd) -> None:
    objects = _by_key(render(make_pdd({"router": {"replicas": 3, "image": "example.org/tandem:1"}})))
    deployment = objects[("Deployment", "demo-router")]
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "example.org/tandem:1"
    assert container["command"] == [
        "tandem", "router", "--namespace", "$(POD_NAMESPACE)", "--pddeployment", "demo",
        "--host", "$(POD_IP)", "--port", "8080",
    ]  # fmt: skip
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == "demo-router"
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8080",
        "prometheus.io/path": "/metrics",
    }
    service = objects[("Service", "demo-router")]
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]


def test_router_may_only_read_pods_and_its_own_pddeployment(make_pdd: MakePdd) -> None:
    objects = _by_key(render(make_pdd()))
    assert objects[("Role", "demo-router")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["tandem.dev"],
            "resources": ["pddeployments"],
            "resourceNames": ["demo"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    binding = objects[("RoleBinding", "demo-router")]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "demo-router",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-router", "namespace": "ns"}]


def test_headless_services_publish_not_ready_pods(make_pdd: MakePdd) -> None:
    service = _by_key(render(make_pdd()))[("Service", "demo-decode")]
    assert service["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {"tandem.dev/pddeployment": "demo", "tandem.dev/role": "decode"},
        "ports": [
            {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"},
            {"name": "nixl", "port": 5600, "targetPort": "nixl", "protocol": "TCP"},
        ],
    }


def test_image_pull_settings_come_from_the_engine_spec(make_pdd: MakePdd) -> None:
    pdd = make_pdd({"engine": {"imagePullPolicy": "Always", "imagePullSecrets": ["registry"]}})
    pod = _sts(render(pdd), "prefill")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["containers"][0]["imagePullPolicy"] == "Always"


@pytest.mark.parametrize(
    ("router", "secrets", "policy"),
    [
        ({}, None, "IfNotPresent"),
        (
            {"imagePullPolicy": "Always", "imagePullSecrets": ["router-registry"]},
            [{"name": "router-registry"}],
            "Always",
        ),
    ],
)
def test_router_image_pull_settings_are_its_own(
    make_pdd: MakePdd, router: dict[str, object], secrets: list[dict[str, str]] | None, policy: str
) -> None:
    pdd = make_pdd({"engine": {"imagePullSecrets": ["engine-registry"]}, "router": router})
    pod = _by_key(render(pdd))[("Deployment", "demo-router")]["spec"]["template"]["spec"]
    assert pod.get("imagePullSecrets") == secrets  # the engine's secret is not the router's
    assert pod["containers"][0]["imagePullPolicy"] == policy


def test_render_is_deterministic(make_pdd: MakePdd) -> None:
    assert render(make_pdd()) == render(make_pdd())


def test_the_router_accepts_its_rendered_command(make_pdd: MakePdd) -> None:
    from tandem.router.main import parse_args

    deployment = _by_key(render(make_pdd()))[("Deployment", "demo-router")]
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["tandem", "router"]
    config = parse_args(command[2:])
    assert config.pddeployment == "demo"
    assert config.port == 8080
