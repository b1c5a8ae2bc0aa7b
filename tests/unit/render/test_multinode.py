"""Multi-node and data-parallel pools (docs/multinode.md): a LeaderWorkerSet group per replica, each
member's `vllm serve` line, probes on the leader, group restart, all-or-nothing placement, GPU type,
per-rank ports in the NetworkPolicy, and the shape `tandem render` prints. That vLLM accepts every
line, and infers each pod's ranks as meant, is tests/unit/render/test_vllm_parser.py's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tandem.api import meta
from tandem.api.models import PDDeployment
from tandem.perf.engine_args import flag_values
from tandem.render import cli, lifecycle, names, render

WIDE_EP = {
    "engine": {"type": "vllm"},
    "prefill": {"nodesPerInstance": 2, "parallelism": {"data": 16, "expert": True}},
    "decode": {"nodesPerInstance": 2, "parallelism": {"data": 16, "expert": True}},
}
MakePdd = Callable[..., PDDeployment]


def _by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["labels"].get(meta.LABEL_ROLE, o["metadata"]["name"]): o
        for o in objects
        if o["kind"] == kind
    }


def _group(pdd: PDDeployment, role: str = "prefill") -> dict[str, Any]:
    lws: dict[str, Any] = _by_kind(render(pdd), meta.LWS_KIND)[role]
    return lws


def _container(lws: dict[str, Any], member: str) -> dict[str, Any]:
    container: dict[str, Any] = lws["spec"]["leaderWorkerTemplate"][f"{member}Template"]["spec"][
        "containers"
    ][0]
    return container


def _flag(command: list[str], flag: str) -> str | None:
    values = flag_values(command, flag)
    assert len(values) <= 1, (flag, values)
    return values[0] if values else None


def test_single_node_pools_stay_statefulsets_and_multi_node_pools_become_groups(make_pdd: MakePdd) -> None:
    pdd = make_pdd({**WIDE_EP, "decode": {"parallelism": {"data": 8, "expert": True}}})
    objects = render(pdd)
    assert set(_by_kind(objects, "StatefulSet")) == {"decode"}
    (lws,) = _by_kind(objects, meta.LWS_KIND).values()
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["metadata"]["ownerReferences"][0]["kind"] == "PDDeployment"
    assert lws["spec"]["replicas"] == 1
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"  # one dead rank restarts the group
    # The headless Service is the group's DNS subdomain: it carries the LeaderWorkerSet's name.
    services = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    assert lws["metadata"]["name"] in services


def test_an_external_pool_leaves_the_group_count_to_its_hpa(make_pdd: MakePdd) -> None:
    pdd = make_pdd({**WIDE_EP, "prefill": {**WIDE_EP["prefill"], "autoscaling": {"external": True}}})
    assert "replicas" not in _group(pdd)["spec"]


def test_leader_and_worker_lines_differ_only_in_rank_addresses_and_headless(make_pdd: MakePdd) -> None:
    lws = _group(make_pdd(WIDE_EP))
    leader, worker = _container(lws, "leader")["command"], _container(lws, "worker")["command"]
    assert _flag(leader, "--data-parallel-size") == _flag(worker, "--data-parallel-size") == "16"
    assert _flag(leader, "--data-parallel-size-local") == "8"
    assert _flag(leader, "--nnodes") == "2"
    assert (_flag(leader, "--node-rank"), _flag(worker, "--node-rank")) == ("0", "$(LWS_WORKER_INDEX)")
    assert _flag(leader, "--data-parallel-address") == _flag(leader, "--master-addr") == "$(POD_IP)"
    assert (
        _flag(worker, "--data-parallel-address") == _flag(worker, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    )
    assert _flag(leader, "--data-parallel-rpc-port") == str(meta.DP_RPC_PORT)
    assert "--enable-expert-parallel" in leader
    assert "--headless" not in leader
    assert "--headless" in worker  # Internal: one endpoint, the leader's
    served = [arg for arg in worker if arg != "--headless"]
    differ = [(a, b) for a, b in zip(leader, served, strict=True) if a != b]
    assert differ == [
        ("0", "$(LWS_WORKER_INDEX)"),
        ("$(POD_IP)", "$(LWS_LEADER_ADDRESS)"),
        ("$(POD_IP)", "$(LWS_LEADER_ADDRESS)"),
    ]


@pytest.mark.parametrize(
    ("parallelism", "nodes", "tp", "leader_flags", "worker_flags", "worker_serves"),
    [
        (
            {"data": 16, "loadBalancing": "Hybrid"},
            2,
            1,
            ["--data-parallel-hybrid-lb"],
            ["--data-parallel-hybrid-lb"],
            True,
        ),
        (
            {"data": 4, "loadBalancing": "External", "expert": True},
            4,
            8,
            ["--data-parallel-rank", "0"],
            ["--data-parallel-rank", "$(LWS_WORKER_INDEX)"],
            True,
        ),
        (
            {"data": 16, "loadBalancing": "MultiPortExternal"},
            2,
            1,
            ["--data-parallel-multi-port-external-lb", "--data-parallel-supervisor-port", "9256"],
            ["--data-parallel-multi-port-external-lb"],
            True,
        ),
        ({"pipeline": 2}, 2, 8, [], ["--headless"], False),
    ],
    ids=["hybrid", "external", "multi-port", "tp-pp"],
)
def test_each_balancing_mode_renders_its_flags_and_serving_pods(
    make_pdd: MakePdd,
    parallelism: dict[str, Any],
    nodes: int,
    tp: int,
    leader_flags: list[str],
    worker_flags: list[str],
    worker_serves: bool,
) -> None:
    pdd = make_pdd(
        {
            "engine": {"type": "vllm"},
            "prefill": {"nodesPerInstance": nodes, "tensorParallelSize": tp, "parallelism": parallelism},
            "decode": {"tensorParallelSize": tp},
        }
    )
    lws = _group(pdd)
    leader, worker = _container(lws, "leader"), _container(lws, "worker")
    for command, flags in ((leader["command"], leader_flags), (worker["command"], worker_flags)):
        joined = " ".join(command)
        assert " ".join(flags) in joined, (flags, joined)
    assert ("--headless" in worker["command"]) is not worker_serves
    assert (
        "readinessProbe" in worker
    ) is worker_serves  # a worker with an endpoint is Ready only when it serves
    assert "livenessProbe" not in worker  # the leader's probes restart the group
    assert "startupProbe" not in worker
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(leader)
    template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert ("annotations" in template["metadata"]) is worker_serves  # a headless worker has no /metrics


def test_multi_port_pods_expose_a_port_per_rank_and_are_probed_through_their_supervisor(
    make_pdd: MakePdd,
) -> None:
    pdd = make_pdd(
        {
            "engine": {"type": "vllm"},
            "decode": {
                "nodesPerInstance": 2,
                "parallelism": {"data": 16, "expert": True, "loadBalancing": "MultiPortExternal"},
            },
        }
    )
    worker = _container(_group(pdd, "decode"), "worker")
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert (ports["http"], ports["http-7"]) == (8000, 8007)
    assert ports["supervisor"] == meta.DP_SUPERVISOR_PORT
    assert worker["readinessProbe"]["httpGet"]["port"] == "supervisor"
    leader = _container(_group(pdd, "decode"), "leader")
    assert leader["livenessProbe"]["httpGet"]["port"] == "supervisor"


def test_gpus_per_pod_shm_and_the_45_minute_start_of_a_group(make_pdd: MakePdd) -> None:
    pdd = make_pdd(WIDE_EP)
    lws = _group(pdd)
    leader = _container(lws, "leader")
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8"  # 16 GPUs over 2 pods
    volumes = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["volumes"]
    assert volumes[0]["emptyDir"]["sizeLimit"] == "32Gi"
    startup = leader["startupProbe"]
    download = lifecycle.DOWNLOAD_STARTUP_MINUTES * 60
    assert startup["periodSeconds"] * startup["failureThreshold"] == 45 * 60 + download  # hf:// downloads
    assert lifecycle.startup_budget_seconds(8, downloads=False) == 40 * 60  # TP8: as before
    assert lifecycle.startup_budget_seconds(256, downloads=False) == 45 * 60


def test_group_placement_names_the_gang_scheduler_or_the_exclusive_topology(make_pdd: MakePdd) -> None:
    def placed(placement: dict[str, str]) -> dict[str, Any]:
        return _group(make_pdd({**WIDE_EP, "prefill": {**WIDE_EP["prefill"], "groupPlacement": placement}}))

    lws = placed({"exclusiveTopology": "example.com/nvlink-domain"})
    assert lws["metadata"]["annotations"] == {
        "leaderworkerset.sigs.k8s.io/exclusive-topology": "example.com/nvlink-domain"
    }
    lws = placed({"schedulerName": "volcano"})
    assert "annotations" not in lws["metadata"]
    for member in ("leader", "worker"):
        assert lws["spec"]["leaderWorkerTemplate"][f"{member}Template"]["spec"]["schedulerName"] == "volcano"
    assert "annotations" not in _group(make_pdd(WIDE_EP))["metadata"]


@pytest.mark.parametrize(
    ("prefill", "replicas", "expected"),
    [
        # spec, the chain's count -> PodGroups <lws>-0.. (an HPA's pool: one per group it may reach)
        ({"replicas": 2}, None, 2),
        ({"replicas": 2}, 3, 3),
        ({"replicas": 1, "autoscaling": {"external": True, "maxReplicas": 3}}, None, 3),
        ({"replicas": 1}, 0, 0),
    ],
)
def test_kubernetes_gang_scheduling_renders_a_pod_group_per_group_and_labels_the_members(
    make_pdd: MakePdd, prefill: dict[str, Any], replicas: int | None, expected: int
) -> None:
    gang = {"groupPlacement": {"gangScheduling": "Kubernetes"}}
    spec: dict[str, Any] = {**WIDE_EP, "prefill": {**WIDE_EP["prefill"], **prefill, **gang}}
    if "autoscaling" in prefill:
        spec |= {"autoscaling": {"enabled": True}, "slo": {"ttftMs": 1000, "tpotMs": 100}}
    objects = render(make_pdd(spec), None if replicas is None else {"prefill": replicas})
    groups = [o for o in objects if o["kind"] == meta.POD_GROUP_KIND]
    if not expected:
        assert groups == []
        return
    lws = _by_kind(objects, meta.LWS_KIND)["prefill"]
    name = lws["metadata"]["name"]
    assert [g["metadata"]["name"] for g in groups] == [f"{name}-{i}" for i in range(expected)]
    for index, group in enumerate(groups):
        assert group["apiVersion"] == "scheduling.k8s.io/v1alpha2"
        assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 2}}}
        assert group["metadata"]["labels"][meta.LABEL_ROLE] == "prefill"
        assert group["metadata"]["labels"][meta.LWS_GROUP_INDEX_LABEL] == str(index)
        assert group["metadata"]["ownerReferences"] == lws["metadata"]["ownerReferences"]
    for member in ("leader", "worker"):
        template = lws["spec"]["leaderWorkerTemplate"][f"{member}Template"]
        assert template["metadata"]["labels"][meta.LABEL_POD_GROUP_MEMBER] == member
        assert "schedulerName" not in template["spec"]
    # The other pool is not gang-scheduled: no PodGroup, no member label.
    decode = _by_kind(objects, meta.LWS_KIND)["decode"]["spec"]["leaderWorkerTemplate"]
    assert meta.LABEL_POD_GROUP_MEMBER not in decode["leaderTemplate"]["metadata"]["labels"]


def test_gpu_type_selects_nodes_by_their_gpu_product(make_pdd: MakePdd) -> None:
    pdd = make_pdd(
        {
            "prefill": {"gpuType": "NVIDIA-H200", "nodeSelector": {"pool": "p"}},
            "decode": {"gpuType": "NVIDIA-H100-80GB-HBM3"},
        }
    )
    pods = {
        role: sts["spec"]["template"]["spec"] for role, sts in _by_kind(render(pdd), "StatefulSet").items()
    }
    assert pods["prefill"]["nodeSelector"] == {"pool": "p", "nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pods["decode"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


SIM_GPU_CASES = [
    # id, engine.env, prefill gpuType, decode gpuType, TANDEM_SIM_GPU of (prefill, decode)
    ("per-pool", [], "NVIDIA-H200", "NVIDIA-A100-SXM4-80GB", ("H200", "A100")),
    ("unset-or-unknown", [], None, "NVIDIA-L4", (None, None)),
    ("the-users-env-wins", [{"name": "TANDEM_SIM_GPU", "value": "B200"}], "NVIDIA-H200", None, ("B200",) * 2),
]


@pytest.mark.parametrize(
    ("env", "prefill_gpu", "decode_gpu", "expected"),
    [c[1:] for c in SIM_GPU_CASES],
    ids=[c[0] for c in SIM_GPU_CASES],
)
def test_sim_engines_run_the_profile_of_their_pools_gpu_type(
    make_pdd: MakePdd,
    env: list[dict[str, str]],
    prefill_gpu: str | None,
    decode_gpu: str | None,
    expected: tuple[str | None, str | None],
) -> None:
    spec: dict[str, Any] = {"engine": {"type": "sim", "env": env}, "prefill": {}, "decode": {}}
    for role, gpu in (("prefill", prefill_gpu), ("decode", decode_gpu)):
        if gpu is not None:
            spec[role]["gpuType"] = gpu
    sets = _by_kind(render(make_pdd(spec)), "StatefulSet")
    for role, want in zip(("prefill", "decode"), expected, strict=True):
        container = sets[role]["spec"]["template"]["spec"]["containers"][0]
        values = [e.get("value") for e in container["env"] if e["name"] == "TANDEM_SIM_GPU"]
        assert values == ([want] if want is not None else []), role


def test_expert_parallel_groups_get_an_all2all_backend_per_role_unless_the_user_chose(
    make_pdd: MakePdd,
) -> None:
    pdd = make_pdd(WIDE_EP)
    assert (
        _flag(_container(_group(pdd, "prefill"), "leader")["command"], "--all2all-backend")
        == "deepep_high_throughput"
    )
    assert (
        _flag(_container(_group(pdd, "decode"), "worker")["command"], "--all2all-backend")
        == "deepep_low_latency"
    )
    chosen = make_pdd(
        {**WIDE_EP, "decode": {**WIDE_EP["decode"], "engineArgs": ["--all2all-backend", "pplx"]}}
    )
    assert _flag(_container(_group(chosen, "decode"), "leader")["command"], "--all2all-backend") == "pplx"
    single = make_pdd({"engine": {"type": "vllm"}, "prefill": {"parallelism": {"data": 8, "expert": True}}})
    (sts,) = [
        o for o in render(single) if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("prefill")
    ]
    assert (
        "--all2all-backend" not in sts["spec"]["template"]["spec"]["containers"][0]["command"]
    )  # NVLink: vLLM's default


def test_network_policy_admits_per_rank_ports_and_a_groups_own_pods(make_pdd: MakePdd) -> None:
    pdd = make_pdd(
        {
            **WIDE_EP,
            "network": {"policy": {"enabled": True}},
            "decode": {
                "nodesPerInstance": 2,
                "parallelism": {"data": 16, "expert": True, "loadBalancing": "MultiPortExternal"},
            },
        }
    )
    (policy,) = [o for o in render(pdd) if o["kind"] == "NetworkPolicy"]
    routers, engines, prometheus, *peers = policy["spec"]["ingress"]
    api = [{"protocol": "TCP", "port": 8000, "endPort": 8007}]  # a port per local rank
    assert routers["ports"] == prometheus["ports"] == api
    ports = {(p["port"], p.get("endPort")) for p in engines["ports"]}
    assert (5600, 5615) in ports  # a NIXL side channel per global data-parallel rank
    assert (8000, 8007) in ports
    assert {(meta.MASTER_PORT, None), (meta.DP_RPC_PORT, None), (meta.DP_SUPERVISOR_PORT, None)} <= ports
    # Within a group vLLM, torch.distributed and NCCL also listen on ports chosen at start: all ports.
    assert peers == [
        {"from": [{"podSelector": {"matchLabels": names.selector(pdd, role)}}]}
        for role in ("prefill", "decode")
    ]
    assert all("ports" not in peer for peer in peers)


def test_a_long_name_is_cut_for_the_group_and_its_service(make_pdd: MakePdd) -> None:
    name = "a" * 42
    pdd = make_pdd(WIDE_EP, name=name)
    lws = _group(pdd)
    assert len(lws["metadata"]["name"]) <= names.MAX_GROUP_NAME
    services = [
        o
        for o in render(pdd)
        if o["kind"] == "Service" and o["metadata"]["labels"][meta.LABEL_ROLE] == "prefill"
    ]
    assert [s["metadata"]["name"] for s in services] == [lws["metadata"]["name"]]
    assert names.workload_name(make_pdd(WIDE_EP, name="short"), "prefill") == "short-prefill"


def test_render_prints_each_pools_shape(make_pdd: MakePdd) -> None:
    pdd = make_pdd({**WIDE_EP, "prefill": {**WIDE_EP["prefill"], "gpuType": "NVIDIA-H200"}})
    group = "LeaderWorkerSet, 1 replica x 2 pods x 8 GPUs = 16 GPUs"
    assert cli.shape_lines(pdd, {"decode": 3}) == [
        f"# demo prefill: {group} (2x8 TP1 DP16 EP Internal NVIDIA-H200)",
        "# demo decode: LeaderWorkerSet, 3 replicas x 2 pods x 8 GPUs = 48 GPUs (2x8 TP1 DP16 EP Internal)",
    ]
    plain = make_pdd({"decode": {"tensorParallelSize": 2}})
    assert (
        cli.shape_lines(plain)[1]
        == "# demo decode: StatefulSet, 1 replica x 1 pod x 2 GPUs = 2 GPUs (1x2 TP2)"
    )


MULTI_PORT = {"data": 4, "loadBalancing": "MultiPortExternal"}


@pytest.mark.parametrize(
    ("pool", "data", "address_flag", "ranks"),
    [
        (
            {"nodesPerInstance": 2, "parallelism": {"data": 2}},
            2,
            "--data-parallel-address",
            1,
        ),  # a rank per pod
        ({"nodesPerInstance": 2, "tensorParallelSize": 16}, 1, "--master-addr", 1),  # one rank over both pods
        (
            {"nodesPerInstance": 2, "parallelism": {"data": 2, "loadBalancing": "External"}},
            2,
            "--data-parallel-address",
            1,
        ),
        ({"nodesPerInstance": 2, "parallelism": MULTI_PORT}, 4, "--data-parallel-address", 2),
    ],
)
def test_the_sim_engine_runs_each_member_of_a_sim_group(
    make_pdd: MakePdd, pool: dict[str, Any], data: int, address_flag: str, ranks: int
) -> None:
    """engine.type sim: every member's line (the LeaderWorkerSet variables expanded as its webhook
    and the kubelet would) is one the sim engine's parser takes, with the group the spec means: the
    ranks each pod serves and, with External or MultiPortExternal, every pod serving its own."""
    from tandem.engine.args import parse_serve_args

    lws = _group(make_pdd({"engine": {"type": "sim"}, "decode": pool}), "decode")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    for member, index in (("leader", 0), ("worker", 1)):
        command = _container(lws, member)["command"]
        assert command[:3] == ["tandem", "engine", "serve"]
        expanded = [
            arg.replace("$(POD_IP)", f"127.20.0.{index + 1}")
            .replace("$(LWS_LEADER_ADDRESS)", "127.20.0.1")
            .replace("$(LWS_WORKER_INDEX)", str(index))
            for arg in command[3:]
        ]
        parsed = parse_serve_args(expanded)
        group = parsed.group
        assert group is not None
        assert (group.nodes, group.node_rank, group.data) == (2, index, data)
        assert group.address == "127.20.0.1"
        external = pool.get("parallelism", {}).get("loadBalancing", "Internal") != "Internal"
        # Internal: the leader is the group's endpoint; External and MultiPortExternal: every pod serves.
        assert group.headless is (member == "worker" and not external)
        assert group.external is external
        assert (parsed.ranks.local, parsed.ranks.first) == (ranks, index * ranks if ranks > 1 else 0)
        assert _flag(command, address_flag) is not None
