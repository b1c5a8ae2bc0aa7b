"""The operator against the real control plane: examples converge, edits converge, deletion cleans up,
problems show in status, and a steady state writes nothing."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeployment
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess
from tandem.render import render

EXAMPLES = sorted((Path(__file__).parents[3] / "examples").glob("*.yaml"))


def _multi_node(path: Path) -> bool:
    spec = yaml.safe_load(path.read_text())["spec"]
    return any(
        (spec.get(role) or {}).get("nodesPerInstance", 1) > 1 for role in ("prefill", "decode", "colocated")
    )


# Multi-node examples render LeaderWorkerSets: the dev cluster runs LeaderWorkerSet's controller for
# them (started on first use, `devcluster.start_lws`).
CONVERGING = [pytest.param(p, id=p.stem) for p in EXAMPLES]
RDMA_LABEL = "network.tandem.dev/rdma"
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE"}
OWNED_RESOURCES = {
    "pddeployments",
    "statefulsets",
    "deployments",
    "services",
    "poddisruptionbudgets",
    "serviceaccounts",
    "roles",
    "rolebindings",
}


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


def get(cluster: ClusterHandle, namespace: str, *what: str) -> dict[str, Any]:
    result = cluster.kubectl("get", "-n", namespace, *what, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def condition(pdd: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (pdd.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def load_example(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc["metadata"].pop("namespace", None)  # each test has its own namespace
    return doc


def create_referenced_secrets(cluster: ClusterHandle, namespace: str, doc: dict[str, Any]) -> None:
    spec = doc["spec"]
    token = spec["model"].get("tokenSecretRef")
    if token:
        cluster.kubectl(
            "create",
            "secret",
            "generic",
            token["name"],
            "-n",
            namespace,
            f"--from-literal={token['key']}=hf_test",
        )
    uri = spec["model"]["uri"]
    if uri.startswith("pvc://"):  # a statically bound volume: there is no provisioner here
        claim = uri.removeprefix("pvc://").split("/", 1)[0]
        volume = f"{namespace}-{claim}"
        objects = [
            {"apiVersion": "v1", "kind": "PersistentVolume",
             "metadata": {"name": volume, "labels": {"tandem.dev/test": "true"}},
             "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                      "hostPath": {"path": "/models"}, "claimRef": {"namespace": namespace, "name": claim}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": claim, "namespace": namespace},
             "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": volume,
                      "resources": {"requests": {"storage": "1Ti"}}}},
        ]  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    for name in spec["engine"].get("imagePullSecrets", []):
        cluster.kubectl(
            "create", "secret", "docker-registry", name, "-n", namespace,
            "--docker-server=registry.invalid", "--docker-username=u", "--docker-password=p",
        )  # fmt: skip


def apply_example(cluster: ClusterHandle, namespace: str, path: Path) -> dict[str, Any]:
    doc = load_example(path)
    create_referenced_secrets(cluster, namespace, doc)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
    return get(cluster, namespace, "pdd", doc["metadata"]["name"])


def is_ready(cluster: ClusterHandle, namespace: str, name: str) -> dict[str, Any] | None:
    """The PDDeployment once Ready for its generation; fails at once if it is Stalled instead."""
    pdd = get(cluster, namespace, "pdd", name)
    stalled = condition(pdd, "Stalled")
    assert stalled.get("status") != "True", f"{name} stalled: {stalled}"
    ready = condition(pdd, "Ready")
    gen = pdd.get("metadata", {}).get("generation")
    if ready.get("status") == "True" and pdd["status"].get("observedGeneration") == gen:
        return pdd
    return None


@pytest.fixture
def test_volumes(cluster: ClusterHandle) -> Iterator[None]:
    """PersistentVolumes a test made are cluster-scoped: remove them when it ends."""
    yield
    cluster.kubectl("delete", "pv", "-l", "tandem.dev/test=true", "--wait=false", check=False)


WORKLOADS = ("StatefulSet", "LeaderWorkerSet")


@pytest.mark.usefixtures("test_volumes")
@pytest.mark.parametrize("example", CONVERGING)
def test_example_converges_and_children_match_render(
    cluster: ClusterHandle,
    operator: OperatorProcess,
    namespace: str,
    example: Path,
    request: pytest.FixtureRequest,
) -> None:
    if _multi_node(example):
        request.getfixturevalue("lws")  # the LeaderWorkerSet controller, started on first use
    wait_for(
        "earlier test namespaces to be gone",
        lambda: no_namespace_terminating(cluster),
        timeout=300,
        interval=2,
    )
    started = time.monotonic()
    live = apply_example(cluster, namespace, example)
    name = live["metadata"]["name"]
    model = PDDeployment.from_object({**live, "metadata": {**live["metadata"], "namespace": namespace}})
    expected = render(model)
    kinds = sorted({obj["kind"].lower() for obj in expected})

    def children() -> set[tuple[str, str]]:
        items = get(cluster, namespace, ",".join(kinds), "-l", f"tandem.dev/pddeployment={name}")
        return {(i["kind"], i["metadata"]["name"]) for i in items.get("items", [])}

    want = {(obj["kind"], obj["metadata"]["name"]) for obj in expected}
    wait_for("all children", lambda: children() >= want, timeout=120)
    created_after = time.monotonic() - started
    pdd = wait_for("Ready=True", lambda: is_ready(cluster, namespace, name), timeout=300)
    ready_after = time.monotonic() - started
    print(f"\n{example.stem}: children created {created_after:.1f}s, Ready {ready_after:.1f}s after apply")
    assert children() == want

    for obj in expected:
        if obj["kind"] not in WORKLOADS:
            continue
        sts = get(cluster, namespace, obj["kind"].lower(), obj["metadata"]["name"])
        assert sts["spec"]["replicas"] == obj["spec"]["replicas"]
        if obj["kind"] == "StatefulSet":
            templates = [(sts["spec"]["template"], obj["spec"]["template"])]
        else:  # the leader's and the workers' command lines
            group, want_group = sts["spec"]["leaderWorkerTemplate"], obj["spec"]["leaderWorkerTemplate"]
            assert group["size"] == want_group["size"]
            templates = [(group[t], want_group[t]) for t in ("leaderTemplate", "workerTemplate")]
        for live_template, want_template in templates:
            live_container = live_template["spec"]["containers"][0]
            want_container = want_template["spec"]["containers"][0]
            assert live_container["command"] + live_container.get("args", []) == want_container[
                "command"
            ] + want_container.get("args", [])
        assert sts["metadata"]["ownerReferences"][0]["uid"] == live["metadata"]["uid"]

    pools = pdd["status"]["pools"]
    # The rendered sizes: the spec's, except that an example with `rollout` is at rest (the arm its
    # serving mode does not use holds no pods).
    rendered = {
        obj["metadata"]["labels"]["tandem.dev/role"]: obj["spec"]["replicas"]
        for obj in expected
        if obj["kind"] in WORKLOADS
    }
    for role in ("prefill", "decode", "colocated"):
        spec_pool = live["spec"].get(role) or {}
        assert rendered.get(role, 0) <= spec_pool.get("replicas", 0)
        assert pools[role]["desiredReplicas"] == rendered.get(role, 0)
        assert pools[role]["readyReplicas"] == rendered.get(role, 0)
        # GPUs of whole replicas (a multi-node pool's: every pod of every group).
        assert pools[role]["gpus"] == rendered.get(role, 0) * model.spec.pool(role).gpus_per_instance
        # The sizing chain's last stage that changed the count: none (the source's) or the idle arm's.
        at_rest = rendered.get(role, 0) == spec_pool.get("replicas", 0)
        assert pools[role]["limitedBy"] == (pools[role]["source"] if at_rest else "rolloutArm")
    assert condition(pdd, "Stalled")["status"] == "False"
    assert condition(pdd, "Available")["status"] == "True"
    assert pdd["status"]["phase"] == "Healthy"

    # Pods that request accelerators (vLLM, or sim with engine.sim.requestAccelerators) land on GPU
    # nodes, P/D ones on RDMA nodes; sim pods without the choice request none (any CPU node will do).
    engine = live["spec"]["engine"]
    accelerators = engine.get("type", "vllm") != "sim" or (engine.get("sim") or {}).get("requestAccelerators")
    nodes = {n["metadata"]["name"]: n for n in get(cluster, "", "nodes").get("items", [])}
    pods = get(cluster, namespace, "pods", "-l", f"tandem.dev/pddeployment={name}")["items"]
    for pod in pods:
        role = pod["metadata"]["labels"]["tandem.dev/role"]
        node = nodes[pod["spec"]["nodeName"]]
        limits = pod["spec"]["containers"][0]["resources"].get("limits", {})
        if role == "router":  # prefers nodes without GPUs: the dev cluster's CPU node
            assert "nvidia.com/gpu" not in node["status"]["allocatable"], pod["metadata"]["name"]
        if role == "router" or not accelerators:
            assert not {"nvidia.com/gpu", "rdma/hca"} & set(limits), pod["metadata"]["name"]
            continue
        if role in ("prefill", "decode") and live["spec"].get("network", {}).get("rdma", {}).get(
            "enabled", True
        ):
            assert node["metadata"]["labels"].get(RDMA_LABEL) == "true", (
                pod["metadata"]["name"],
                node["metadata"]["name"],
            )
        assert int(node["status"]["allocatable"].get("nvidia.com/gpu", "0")) > 0


SIM_EXAMPLE = Path(__file__).parents[3] / "examples" / "sim-pd.yaml"


def test_unschedulable_shows_in_status(
    cluster: ClusterHandle, operator: OperatorProcess, namespace: str
) -> None:
    doc = load_example(SIM_EXAMPLE)
    doc["metadata"]["name"] = "too-big"
    doc["spec"]["engine"]["sim"] = {"requestAccelerators": True}  # the fake GPUs run out
    doc["spec"]["decode"] = {**doc["spec"].get("decode", {}), "replicas": 5, "tensorParallelSize": 8}
    doc["spec"]["prefill"] = {**doc["spec"].get("prefill", {}), "tensorParallelSize": 8}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))

    def stalled() -> dict[str, Any] | None:
        pdd = get(cluster, namespace, "pdd", "too-big")
        return pdd if condition(pdd, "Stalled").get("status") == "True" else None

    pdd = wait_for("Stalled=True", stalled, timeout=180)
    stalled_cond = condition(pdd, "Stalled")
    assert stalled_cond["reason"] == "Unschedulable"
    assert "nvidia.com/gpu" in stalled_cond["message"] or "Insufficient" in stalled_cond["message"]
    assert condition(pdd, "Ready")["status"] == "False"
    assert pdd["status"]["phase"] == "Degraded"

    def warned() -> bool:
        events = get(cluster, namespace, "events", "--field-selector", "involvedObject.name=too-big")["items"]
        return any(e["reason"] == "Unschedulable" and e["type"] == "Warning" for e in events)

    wait_for("the Unschedulable Warning Event", warned, timeout=60)  # posted off the pass


def test_sim_runs_on_a_node_without_gpus(
    cluster: ClusterHandle, operator: OperatorProcess, namespace: str
) -> None:
    """CPU dry run: the sim example, every pod pinned to the dev cluster's CPU-only node (no GPU or
    RDMA resource at all), becomes Ready; its engines request no accelerator."""
    cpu_nodes = [
        n["metadata"]["name"]
        for n in get(cluster, "", "nodes")["items"]
        if "nvidia.com/gpu" not in n["status"]["allocatable"] and "rdma/hca" not in n["status"]["allocatable"]
    ]
    assert cpu_nodes, "the dev cluster has no CPU-only node"
    doc = load_example(SIM_EXAMPLE)
    assert "sim" not in doc["spec"]["engine"]  # the example as users get it
    pin = {"kubernetes.io/hostname": cpu_nodes[0]}
    for role in ("prefill", "decode", "router"):
        doc["spec"][role] = {**doc["spec"].get(role, {}), "nodeSelector": pin}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
    name = doc["metadata"]["name"]
    wait_for("Ready=True on the CPU node", lambda: is_ready(cluster, namespace, name), timeout=300)
    pods = get(cluster, namespace, "pods", "-l", f"tandem.dev/pddeployment={name}")["items"]
    assert {p["metadata"]["labels"]["tandem.dev/role"] for p in pods} == {"prefill", "decode", "router"}
    for pod in pods:
        assert pod["spec"]["nodeName"] == cpu_nodes[0], pod["metadata"]["name"]
        resources = pod["spec"]["containers"][0]["resources"]
        assert not [k for part in resources.values() for k in part if "/" in k], resources


def test_missing_image_pull_secret_shows_in_status(
    cluster: ClusterHandle, operator: OperatorProcess, namespace: str
) -> None:
    doc = load_example(SIM_EXAMPLE)
    doc["metadata"]["name"] = "no-secret"
    doc["spec"]["engine"]["imagePullSecrets"] = ["registry-creds"]
    doc["spec"]["router"]["imagePullSecrets"] = ["router-creds"]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))

    def stalled_on(secret: str) -> Callable[[], dict[str, Any] | None]:
        def check() -> dict[str, Any] | None:
            pdd = get(cluster, namespace, "pdd", "no-secret")
            stalled = condition(pdd, "Stalled")
            return pdd if stalled.get("status") == "True" and secret in stalled.get("message", "") else None

        return check

    def create_secret(name: str) -> None:
        cluster.kubectl(
            "create", "secret", "docker-registry", name, "-n", namespace,
            "--docker-server=registry.invalid", "--docker-username=u", "--docker-password=p",
        )  # fmt: skip

    pdd = wait_for("Stalled=True on the engine's secret", stalled_on("registry-creds"), timeout=120)
    assert condition(pdd, "Stalled")["reason"] == "ConfigError"
    assert "spec.engine.imagePullSecrets" in condition(pdd, "Stalled")["message"]
    create_secret("registry-creds")
    pdd = wait_for("Stalled=True on the router's secret", stalled_on("router-creds"), timeout=150)
    assert "spec.router.imagePullSecrets" in condition(pdd, "Stalled")["message"]
    create_secret("router-creds")
    wait_for(
        "Stalled=False once both secrets exist",
        lambda: condition(get(cluster, namespace, "pdd", "no-secret"), "Stalled").get("status") == "False",
        timeout=150,
    )


def test_spec_edit_converges_and_delete_collects(
    cluster: ClusterHandle, operator: OperatorProcess, namespace: str
) -> None:
    live = apply_example(cluster, namespace, SIM_EXAMPLE)
    name = live["metadata"]["name"]
    wait_for("Ready=True", lambda: is_ready(cluster, namespace, name), timeout=300)
    decode = live["spec"]["decode"]["replicas"]
    cluster.kubectl(
        "patch",
        "-n",
        namespace,
        "pdd",
        name,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"decode": {"replicas": decode + 1}}}),
    )
    pdd = wait_for("Ready=True after the edit", lambda: is_ready(cluster, namespace, name), timeout=300)
    assert pdd["status"]["pools"]["decode"]["ready"] == f"{decode + 1}/{decode + 1}"
    assert get(cluster, namespace, "statefulset", f"{name}-decode")["spec"]["replicas"] == decode + 1

    cluster.kubectl("delete", "-n", namespace, "pdd", name, "--wait=true", "--timeout=60s")
    wait_for(
        "children garbage-collected",
        lambda: (
            not get(
                cluster,
                namespace,
                "statefulsets,deployments,services",
                "-l",
                f"tandem.dev/pddeployment={name}",
            ).get("items", [True])
        ),
        timeout=120,
    )


def no_namespace_terminating(cluster: ClusterHandle) -> bool:
    """Earlier tests' namespaces hold GPUs and delete objects until they are gone."""
    items = get(cluster, "", "namespaces").get("items", [])
    return not any(ns["status"].get("phase") == "Terminating" for ns in items)


def apiserver_writes(cluster: ClusterHandle) -> dict[str, float]:
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("verb") in WRITE_VERBS and labels.get("resource") in OWNED_RESOURCES:
            key = f"{labels['verb']} {labels['resource']}/{labels.get('subresource', '')}"
            totals[key] = totals.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def operator_counter(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def operator_reads(text: str) -> dict[str, float]:
    """The operator's GET requests by resource (`tandem_operator_api_requests_total`), less its lease's."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tandem_operator_api_requests_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if labels.get("method") == "GET" and labels.get("resource") != "leases":
                totals[labels["resource"]] = totals.get(labels["resource"], 0.0) + float(
                    line.rsplit(" ", 1)[1]
                )
    return totals


def test_steady_state_writes_nothing(
    lws: ClusterHandle, cluster: ClusterHandle, operator: OperatorProcess, namespace: str
) -> None:
    # `lws`: LeaderWorkerSet's CRD served, as the multi-node examples above need it (without it, the
    # operator's LeaderWorkerSet informer lists again now and then to notice it installed: reads).
    live = apply_example(cluster, namespace, SIM_EXAMPLE)
    name = live["metadata"]["name"]
    wait_for("Ready=True", lambda: is_ready(cluster, namespace, name), timeout=300)
    # earlier tests' namespaces delete their objects meanwhile
    wait_for(
        "earlier test namespaces to be gone",
        lambda: no_namespace_terminating(cluster),
        timeout=300,
        interval=2,
    )
    time.sleep(5)  # let the last status write and its watch event settle
    before_api = apiserver_writes(cluster)
    before_metrics = operator.metrics()
    window = 45.0  # more than two resync periods of the test operator (20 s)
    time.sleep(window)
    after_api = apiserver_writes(cluster)
    after_metrics = operator.metrics()
    passes = operator_counter(after_metrics, "tandem_operator_reconciles_total") - operator_counter(
        before_metrics, "tandem_operator_reconciles_total"
    )
    assert passes >= 2, "the operator must have reconciled during the window for this test to mean anything"
    writes = {
        k: after_api.get(k, 0) - before_api.get(k, 0)
        for k in after_api
        if after_api.get(k, 0) != before_api.get(k, 0)
    }
    operator_writes = operator_counter(after_metrics, "tandem_operator_api_writes_total") - operator_counter(
        before_metrics, "tandem_operator_api_writes_total"
    )
    # Reads: the passes take the PDDeployment, its children and pods from the watch caches; the
    # operator's own counter (the apiserver's has no user-agent label, and other tests' clients
    # share this cluster) shows no GET in the window but its leader lease's, and the Secrets a spec
    # names (read by name each pass: the operator may not list or watch Secrets; other tests'
    # PDDeployments in this cluster name some).
    reads = {
        k: v - operator_reads(before_metrics).get(k, 0.0)
        for k, v in operator_reads(after_metrics).items()
        if v != operator_reads(before_metrics).get(k, 0.0)
    }
    print(
        f"\nsteady state over {window:.0f}s: {passes:.0f} reconcile passes, apiserver writes {writes or 0}, "
        f"the operator's reads {reads or 0}"
    )
    assert writes == {}
    assert operator_writes == 0
    assert {k: v for k, v in reads.items() if k != "secrets"} == {}
