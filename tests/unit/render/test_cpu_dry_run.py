"""`engine.type: sim` on a plain CPU cluster: sim pods request no GPU or RDMA device (and so get no
RDMA node affinity, no GPU toleration, no IPC_LOCK) unless `engine.sim.requestAccelerators` asks
for them as vLLM pods do; router pods take nodeSelector/tolerations and prefer nodes without GPUs;
every example applies into the current namespace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeployment
from tandem.render import render

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BASE: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "PDDeployment",
    "metadata": {"name": "dry", "namespace": "ns"},
    "spec": {
        "model": {"name": "m", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"type": "sim", "image": "ghcr.io/tandem-dev/tandem:0.1.0"},
        "prefill": {"replicas": 1, "tensorParallelSize": 2},
        "decode": {"replicas": 1, "tensorParallelSize": 2},
        "colocated": {"replicas": 1},
    },
}


def _pdd(engine: dict[str, Any] | None = None, **spec: Any) -> PDDeployment:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    doc["spec"]["engine"].update(engine or {})
    doc["spec"].update(spec)
    return PDDeployment.model_validate(doc)


def _engine_pods(pdd: PDDeployment) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["labels"]["tandem.dev/role"]: o["spec"]["template"]["spec"]
        for o in render(pdd)
        if o["kind"] == "StatefulSet"
    }


def _router_pod(pdd: PDDeployment) -> dict[str, Any]:
    (deployment,) = [o for o in render(pdd) if o["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def _devices(pod: dict[str, Any]) -> set[str]:
    resources = pod["containers"][0]["resources"]
    return {k for part in ("requests", "limits") for k in resources[part] if "/" in k}


@pytest.mark.parametrize(
    ("engine", "accelerators"),
    [
        ({}, False),
        ({"sim": {}}, False),
        ({"sim": {"requestAccelerators": False}}, False),
        ({"sim": {"requestAccelerators": True}}, True),
        ({"type": "vllm", "image": "vllm/vllm-openai:v0.27.1"}, True),
    ],
    ids=["sim-default", "sim-empty", "sim-false", "sim-requested", "vllm"],
)
def test_sim_pods_request_accelerators_only_when_asked(engine: dict[str, Any], accelerators: bool) -> None:
    pods = _engine_pods(_pdd(engine))
    assert set(pods) == {"prefill", "decode", "colocated"}
    for role, pod in pods.items():
        container = pod["containers"][0]
        rdma = role in ("prefill", "decode") and accelerators
        want = ({"nvidia.com/gpu"} if accelerators else set()) | ({"rdma/hca"} if rdma else set())
        assert _devices(pod) == want, role
        if accelerators:
            assert container["resources"]["limits"]["nvidia.com/gpu"] == ("2" if rdma else "1")
        assert ("nodeAffinity" in pod.get("affinity", {})) is rdma, role
        assert (container.get("securityContext") == {"capabilities": {"add": ["IPC_LOCK"]}}) is rdma, role
        gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        assert (gpu_toleration in pod.get("tolerations", [])) is accelerators, role


def test_the_sim_command_line_is_the_same_either_way() -> None:
    cpu = _engine_pods(_pdd())
    accelerated = _engine_pods(_pdd({"sim": {"requestAccelerators": True}}))
    for role, pod in cpu.items():
        assert pod["containers"][0]["command"] == accelerated[role]["containers"][0]["command"]
        assert pod["containers"][0]["env"] == accelerated[role]["containers"][0]["env"]


def test_a_cpu_sim_pod_keeps_the_users_tolerations_and_node_selector() -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "sim", "effect": "NoSchedule"}
    pdd = _pdd(
        prefill={"replicas": 1, "tolerations": [toleration], "nodeSelector": {"pool": "cpu"}},
        decode={"replicas": 1},
    )
    pods = _engine_pods(pdd)
    assert pods["prefill"]["tolerations"] == [toleration]
    assert pods["prefill"]["nodeSelector"] == {"pool": "cpu"}
    assert "tolerations" not in pods["decode"]


def test_router_prefers_nodes_without_gpus_and_takes_selector_and_tolerations() -> None:
    plain = _router_pod(_pdd())
    preferred = plain["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [
        {
            "weight": 100,
            "preference": {
                "matchExpressions": [
                    {"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"},
                    {"key": "nvidia.com/gpu.count", "operator": "DoesNotExist"},
                ]
            },
        }
    ]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in plain["affinity"]["nodeAffinity"]
    assert "nodeSelector" not in plain
    assert "tolerations" not in plain
    toleration = {"key": "role", "operator": "Equal", "value": "edge", "effect": "NoSchedule"}
    router = {"replicas": 1, "nodeSelector": {"role": "edge"}, "tolerations": [toleration]}
    placed = _router_pod(_pdd(router=router))
    assert placed["nodeSelector"] == {"role": "edge"}
    assert placed["tolerations"] == [toleration]


def test_dev_cluster_gpu_nodes_carry_a_label_the_router_avoids() -> None:
    """The preference is not empty talk on the dev cluster: its GPU nodes carry one of the labels and
    its CPU node none."""
    keys = {"nvidia.com/gpu.present", "nvidia.com/gpu.count"}
    for path in sorted((ROOT / "e2e" / "nodes").glob("*.yaml")):
        for node in (n for n in yaml.safe_load_all(path.read_text()) if n):
            has_gpus = int(node["status"]["allocatable"].get("nvidia.com/gpu", "0")) > 0
            assert bool(keys & set(node["metadata"]["labels"])) is has_gpus, node["metadata"]["name"]


def test_sim_settings_need_the_sim_engine() -> None:
    with pytest.raises(ValueError, match=r"spec.engine.sim is only used with spec.engine.type sim"):
        _pdd({"type": "vllm", "image": "vllm/vllm-openai:v0.27.1", "sim": {"requestAccelerators": True}})


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_applies_into_the_current_namespace(example: Path) -> None:
    for doc in yaml.safe_load_all(example.read_text()):
        assert "namespace" not in (doc.get("metadata") or {}), f"{example.name} hard-codes a namespace"
    readme = (ROOT / "examples" / "README.md").read_text()
    assert "namespace" in readme


def test_both_sim_paths_have_a_golden_example() -> None:
    """One example of each choice, so both render paths are pinned by a golden file."""
    sims = {
        p.stem: PDDeployment.model_validate(yaml.safe_load(p.read_text()))
        for p in EXAMPLES
        if yaml.safe_load(p.read_text())["spec"]["engine"].get("type") == "sim"
    }
    choices = {
        name: pdd.spec.engine.sim is not None and pdd.spec.engine.sim.request_accelerators
        for name, pdd in sims.items()
    }
    assert choices.get("sim-pd") is False
    assert choices.get("sim-pd-autoscaling") is True
    for name in ("sim-pd", "sim-pd-autoscaling"):
        assert (ROOT / "tests" / "unit" / "render" / "golden" / f"{name}.yaml").exists()
