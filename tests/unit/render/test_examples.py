"""The examples: each is a valid PDDeployment whose engine commands the sim engine accepts; the sim
examples fit the dev cluster's fake nodes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import EngineType, PDDeployment
from tandem.engine.args import parse_serve_args
from tandem.engine.config import resolve
from tandem.engine.settings import SimSettings
from tandem.render import render

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
DEV_NODES = ROOT / "e2e" / "nodes" / "h100-rdma.yaml"


def _load(path: Path) -> PDDeployment:
    return PDDeployment.model_validate(yaml.safe_load(path.read_text()))


def _engine_containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The engines of single-node pools. A LeaderWorkerSet's lines (data-parallel, multi-node) are
    vLLM's only: the sim engine runs one rank per pod, and test_vllm_parser.py checks them with vLLM."""
    return [o["spec"]["template"]["spec"]["containers"][0] for o in objects if o["kind"] == "StatefulSet"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_a_valid_pddeployment_with_a_comment_header(example: Path) -> None:
    assert example.read_text().startswith("# ")
    pdd = _load(example)
    assert pdd.kind == "PDDeployment"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_sim_engine_parser_accepts_every_engine_command(example: Path) -> None:
    for container in _engine_containers(render(_load(example))):
        command = container["command"]
        prefix = 3 if command[0] == "tandem" else 2
        parse_serve_args(command[prefix:])


def test_sim_example_starts_on_the_sim_engine_with_its_rendered_env() -> None:
    pdd = _load(ROOT / "examples" / "sim-pd.yaml")
    assert pdd.spec.engine.type is EngineType.sim
    for container in _engine_containers(render(pdd)):
        env = {
            e["name"]: e["value"].replace("$(POD_IP)", "127.0.0.1") for e in container["env"] if "value" in e
        }
        config = resolve(parse_serve_args(container["command"][3:]), SimSettings.from_env(env))
        assert config.sim.kv_bandwidth_gbps == pdd.spec.kv_transfer.bandwidth_gbps
        assert not config.notes  # a known model: no fallback to another architecture


@pytest.mark.parametrize("name", ["sim-pd-autoscaling"])
def test_sim_example_fits_the_dev_cluster(name: str) -> None:
    """At its largest: each autoscaled pool at its maxReplicas (more than maxGPUs allows together).
    Only the sim examples that request accelerators (`engine.sim.requestAccelerators`); the others
    request none and fit any CPU node (tests/unit/render/test_cpu_dry_run.py)."""
    nodes = [n for n in yaml.safe_load_all(DEV_NODES.read_text()) if n]
    pdd = _load(ROOT / "examples" / f"{name}.yaml")
    largest = {
        role: bounds.max_replicas
        for role in ("prefill", "decode", "colocated")
        if (bounds := pdd.spec.pool(role).autoscaling) is not None
    }
    pods = []
    for obj in render(pdd, largest or None):
        if obj["kind"] == "StatefulSet":
            pods += [obj["spec"]["template"]["spec"]] * obj["spec"]["replicas"]
    free = [
        Counter({k: int(v) for k, v in n["status"]["allocatable"].items() if k.count("/") == 1})
        for n in nodes
    ]
    for pod in pods:
        want = Counter(
            {k: int(v) for k, v in pod["containers"][0]["resources"]["limits"].items() if "/" in k}
        )
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        fits = [
            i
            for i, node in enumerate(nodes)
            if all(
                node["metadata"]["labels"].get(e["key"]) in e["values"] for e in terms[0]["matchExpressions"]
            )
            and all(free[i][k] >= v for k, v in want.items())
        ]
        assert fits, f"no dev node fits {want}"
        free[fits[0]] -= want


def test_the_sim_ranks_example_runs_each_rank_of_its_groups_on_the_sim_engine() -> None:
    """sim-pd-dp-ranks.yaml: every member's line of its LeaderWorkerSets (LeaderWorkerSet's variables
    expanded) resolves on the sim engine with its rendered env, to the ranks and ports the spec means:
    prefill pods of 2 MultiPortExternal ranks (ports 8000 and 8001), decode pods of 1 External rank."""
    from tandem.api import meta
    from tandem.engine.ranks import rank_configs

    pdd = _load(ROOT / "examples" / "sim-pd-dp-ranks.yaml")
    groups = {o["metadata"]["labels"][meta.LABEL_ROLE]: o for o in render(pdd) if o["kind"] == meta.LWS_KIND}
    assert sorted(groups) == ["decode", "prefill"]
    want = {"prefill": ([8000, 8001], 2), "decode": ([8000], 1)}  # API ports, ranks per pod
    for role, lws in groups.items():
        template = lws["spec"]["leaderWorkerTemplate"]
        for index, member in enumerate(("leader", "worker")):
            container = template[f"{member}Template"]["spec"]["containers"][0]
            values = {"$(POD_IP)": f"127.0.0.{index + 1}", "$(LWS_LEADER_ADDRESS)": "127.0.0.1"}
            values["$(LWS_WORKER_INDEX)"] = str(index)
            argv = [values.get(a, a) for a in container["command"][3:]]
            env = {e["name"]: values.get(e["value"], e["value"]) for e in container["env"] if "value" in e}
            config = resolve(parse_serve_args(argv), SimSettings.from_env(env))
            ranks = rank_configs(config)
            ports, per_pod = want[role]
            assert [r.args.port for r in ranks] == ports
            assert [r.engine_index for r in ranks] == [index * per_pod + i for i in range(per_pod)]
            declared = [p["containerPort"] for p in container["ports"] if p["name"].startswith("http")]
            assert declared == ports  # every rank's port is declared (and so scraped: http, http-<i>)
