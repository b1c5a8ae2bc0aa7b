"""Properties of `render` over generated valid specs: names, selectors, GPUs, ownership, flags, env."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tandem.api.meta import POOL_ROLES
from tandem.api.models import PDDeployment
from tandem.api.rules import OPERATOR_OWNED_FLAGS
from tandem.engine.args import parse_serve_args
from tandem.perf.engine_args import flag_values
from tandem.render import engine_command, render
from tandem.render.command import user_args
from tandem.render.pod import requests_accelerators

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
VAR_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

ARG_GROUPS = (
    ("--block-size", "128"),
    ("--max-num-seqs", "64"),
    ("--shutdown-timeout", "30"),
    ("--enable-chunked-prefill",),
    ("--no-enable-chunked-prefill",),
    ("--max-num-batched-tokens=4096",),
    ("--enforce-eager",),
    ("--kv-cache-dtype", "fp8"),
)
TP = st.sampled_from([1, 2, 4, 8])
SEGMENT = st.from_regex(r"[a-z][-a-z0-9]{0,12}[a-z0-9]", fullmatch=True)
URIS = st.one_of(
    st.builds(
        lambda o, r, rev: f"hf://{o}/{r}" + (f"@{rev}" if rev else ""), SEGMENT, SEGMENT, st.none() | SEGMENT
    ),
    st.builds(lambda c, p: f"pvc://{c}" + (f"/{p}" if p else ""), SEGMENT, st.none() | SEGMENT),
    st.builds(lambda p: f"file:///{p}", SEGMENT),
)


@st.composite
def _shapes(draw: st.DrawFn) -> dict[str, Any]:
    """A pool's parallelism and nodes per replica that a cluster of 8-GPU nodes can run (vLLM only):
    whole data-parallel ranks on each pod, or one rank (DP 1) spanning the pods; every balancing mode
    where it applies."""
    nodes = draw(st.sampled_from([1, 2, 2, 4]))
    if nodes > 1 and draw(st.booleans()):  # one rank spans the pods: multi-node TP/PP
        per_pod = draw(st.sampled_from([2, 4, 8]))
        pipeline = draw(st.sampled_from([1, 2]))
        return {
            "nodesPerInstance": nodes,
            "tensorParallelSize": per_pod * nodes // pipeline,
            "parallelism": {"pipeline": pipeline},
        }
    tp = draw(st.sampled_from([1, 2, 4]))
    pipeline = draw(st.sampled_from([1, 2])) if tp <= 2 else 1
    local = draw(st.sampled_from([n for n in (1, 2, 4, 8) if n * tp * pipeline <= 8]))
    data = local * nodes
    modes = ["Internal"]
    if nodes >= 2 and local >= 2:
        modes.append("Hybrid")
    if local == 1 and data >= 2:
        modes.append("External")
    if local >= 2:
        modes.append("MultiPortExternal")
    parallelism: dict[str, Any] = {"data": data, "pipeline": pipeline}
    if data > 1:
        parallelism["loadBalancing"] = draw(st.sampled_from(modes))
    if data * tp > 1:
        parallelism["expert"] = draw(st.booleans())
    if draw(st.booleans()):
        parallelism["dataLocal"] = local
    return {"nodesPerInstance": nodes, "tensorParallelSize": tp, "parallelism": parallelism}


def _args() -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(ARG_GROUPS), max_size=3, unique=True).map(
        lambda gs: [a for g in gs for a in g]
    )


def _pool(min_replicas: int) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"replicas": st.integers(min_replicas, 4), "tensorParallelSize": TP, "engineArgs": _args()},
        optional={
            "nodeSelector": st.dictionaries(SEGMENT, SEGMENT, max_size=2),
            "tolerations": st.lists(
                st.fixed_dictionaries({"key": SEGMENT, "operator": st.just("Exists")}), max_size=2
            ),
        },
    )


@st.composite
def pddeployments(draw: st.DrawFn) -> PDDeployment:
    mode = draw(st.sampled_from(["Disaggregated", "Colocated"]))
    connector = draw(st.sampled_from(["NixlConnector", "MooncakeConnector", "LMCacheConnectorV1"]))
    engine = draw(
        st.sampled_from(
            [
                {"type": "vllm"},
                {"type": "vllm"},
                {"type": "sim"},
                {"type": "sim", "sim": {"requestAccelerators": True}},
            ]
        )
    )
    pools = {
        role: draw(_pool(1 if (mode == "Colocated") == (role == "colocated") else 0))
        for role in ("prefill", "decode", "colocated")
    }
    if engine["type"] == "vllm":  # parallel shapes on vLLM only (sim groups: test_multinode.py)
        for role in pools:
            if draw(st.booleans()):
                pools[role].update(draw(_shapes()))
    prefill, decode = pools["prefill"], pools["decode"]
    if connector == "NixlConnector":  # decode TP a multiple of prefill TP (both powers of two), decode PP 1
        if "parallelism" in decode:
            assume(decode["parallelism"].get("pipeline", 1) == 1)
        decode["tensorParallelSize"] = max(decode["tensorParallelSize"], prefill["tensorParallelSize"])
    uri = draw(URIS)
    model: dict[str, Any] = {"name": "m", "uri": uri}
    if uri.startswith("hf://") and draw(st.booleans()):
        model["tokenSecretRef"] = {"name": "hf", "key": "token"}
    if draw(st.booleans()):
        model["maxModelLen"] = draw(st.integers(128, 131072))
    document = {
        "metadata": {
            "name": draw(st.from_regex(r"[a-z]([-a-z0-9]{0,40}[a-z0-9])?", fullmatch=True)),
            "namespace": draw(SEGMENT),
            "uid": "uid-1",
        },
        "spec": {
            "model": model,
            "engine": {
                **engine,
                "image": "img:1",
                "extraArgs": draw(_args()),
                "env": draw(
                    st.lists(
                        st.fixed_dictionaries(
                            {"name": st.sampled_from(["UCX_TLS", "A", "B"]), "value": SEGMENT}
                        ),
                        max_size=3,
                    )
                ),
            },
            "kvTransfer": {"connector": connector},
            "network": {"rdma": {"enabled": draw(st.booleans())}, "policy": {"enabled": draw(st.booleans())}},
            "prefill": prefill,
            "decode": decode,
            "colocated": pools["colocated"],
            "router": {"replicas": draw(st.integers(1, 3))},
            "serving": {"mode": mode},
        },
    }
    try:
        return PDDeployment.model_validate(document)
    except ValidationError:
        assume(False)
        raise


REPLICAS = st.none() | st.dictionaries(st.sampled_from(POOL_ROLES), st.integers(0, 5), max_size=3)
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


LWS_VARIABLES = {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"}  # its pod webhook's


def _pod_templates(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(role, pod template) of every workload: a LeaderWorkerSet's leader and worker templates too."""
    templates = []
    for o in objects:
        if o["kind"] in ("StatefulSet", "Deployment"):
            templates.append((o["metadata"]["labels"]["tandem.dev/role"], o["spec"]["template"]))
        elif o["kind"] == "LeaderWorkerSet":
            group = o["spec"]["leaderWorkerTemplate"]
            role = o["metadata"]["labels"]["tandem.dev/role"]
            templates += [(role, group["leaderTemplate"]), (role, group["workerTemplate"])]
    return templates


@PROPERTY
@given(pdd=pddeployments(), replicas=REPLICAS)
def test_names_are_unique_dns_labels_and_labels_are_valid(
    pdd: PDDeployment, replicas: dict[str, int] | None
) -> None:
    objects = render(pdd, replicas)
    keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys))
    for obj in objects:
        name = obj["metadata"]["name"]
        assert len(name) <= 63, name
        assert DNS_LABEL.match(name), name
        for value in obj["metadata"]["labels"].values():
            assert len(value) <= 63, value
            assert LABEL_VALUE.match(value), value
    for _, template in _pod_templates(objects):
        spec = template["spec"]
        for container in spec["containers"]:
            assert all(len(p["name"]) <= 15 for p in container.get("ports", []))
        assert len({v["name"] for v in spec["volumes"]}) == len(spec["volumes"])


@PROPERTY
@given(pdd=pddeployments(), replicas=REPLICAS)
def test_every_object_is_owned_and_namespaced(pdd: PDDeployment, replicas: dict[str, int] | None) -> None:
    for obj in render(pdd, replicas):
        assert obj["metadata"]["namespace"] == pdd.metadata.namespace
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "tandem.dev/v1alpha1",
                "kind": "PDDeployment",
                "name": pdd.metadata.name,
                "uid": pdd.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


@PROPERTY
@given(pdd=pddeployments(), replicas=REPLICAS)
def test_selectors_match_the_pod_template_labels(pdd: PDDeployment, replicas: dict[str, int] | None) -> None:
    objects = render(pdd, replicas)
    labels = {role: template["metadata"]["labels"] for role, template in _pod_templates(objects)}
    for obj in objects:
        if (
            obj["kind"] == "NetworkPolicy"
        ):  # selects every engine pool: tests/unit/render/test_network_policy.py
            continue
        role = obj["metadata"]["labels"]["tandem.dev/role"]
        if obj["kind"] in ("StatefulSet", "Deployment", "PodDisruptionBudget"):
            selector = obj["spec"]["selector"]["matchLabels"]
        elif obj["kind"] == "LeaderWorkerSet":  # selects its pods by its own labels; ours on the templates
            group = obj["spec"]["leaderWorkerTemplate"]
            assert (
                group["leaderTemplate"]["metadata"]["labels"] == group["workerTemplate"]["metadata"]["labels"]
            )
            continue
        elif obj["kind"] == "Service":
            selector = obj["spec"]["selector"]
        else:
            continue
        assert selector.items() <= labels[role].items()
        others = [r for r in labels if r != role]
        assert not any(selector.items() <= labels[other].items() for other in others)


@PROPERTY
@given(pdd=pddeployments(), replicas=REPLICAS)
def test_gpus_per_pod_are_a_replicas_gpus_over_its_pods(
    pdd: PDDeployment, replicas: dict[str, int] | None
) -> None:
    """TP x PP x DP / nodesPerInstance (TP for a plain pool), at most 8, and no more on any pod."""
    for role, template in _pod_templates(render(pdd, replicas)):
        if role == "router":
            assert "nvidia.com/gpu" not in template["spec"]["containers"][0]["resources"]["limits"]
            continue
        pool = pdd.spec.pool(role)
        shape = pool.shape
        resources = template["spec"]["containers"][0]["resources"]
        if not requests_accelerators(pdd):  # a sim pod on CPU (engine.sim.requestAccelerators unset)
            assert not [k for part in resources.values() for k in part if "/" in k]
            continue
        per_pod = int(resources["limits"]["nvidia.com/gpu"])
        assert resources["requests"]["nvidia.com/gpu"] == str(per_pod)
        assert per_pod * shape.nodes == pool.tensor_parallel_size * shape.pipeline * shape.data
        assert per_pod <= 8
        if not shape.multi_node and shape.data == shape.pipeline == 1:
            assert per_pod == pool.tensor_parallel_size


@PROPERTY
@given(pdd=pddeployments())
def test_tandem_never_renders_a_flag_twice_or_one_the_user_set(pdd: PDDeployment) -> None:
    for role in POOL_ROLES:
        command = engine_command(pdd, role)
        given_args = user_args(pdd, role)
        tandem_part = command[: len(command) - len(given_args)]
        assert command[len(tandem_part) :] == given_args
        flags = [a.split("=")[0] for a in tandem_part if a.startswith("--")]
        assert len(flags) == len(set(flags)), flags
        for flag in flags:
            assert not flag_values(given_args, flag), flag
        for flag in OPERATOR_OWNED_FLAGS:
            assert len(flag_values(command, flag)) <= 1, flag


@PROPERTY
@given(pdd=pddeployments(), replicas=REPLICAS)
def test_env_is_unique_and_references_only_earlier_variables(
    pdd: PDDeployment, replicas: dict[str, int] | None
) -> None:
    for _, template in _pod_templates(render(pdd, replicas)):
        container = template["spec"]["containers"][0]
        names = [e["name"] for e in container["env"]]
        assert not [n for n, c in Counter(names).items() if c > 1]
        defined: set[str] = set()
        for entry in container["env"]:
            for ref in VAR_REFERENCE.findall(entry.get("value", "")):
                assert ref in defined, (entry, ref)
            defined.add(entry["name"])
        for arg in container["command"]:  # a LeaderWorkerSet's pods also get its webhook's variables
            assert set(VAR_REFERENCE.findall(arg)) <= defined | LWS_VARIABLES


@PROPERTY
@given(pdd=pddeployments())
def test_grace_period_covers_prestop_and_drain(pdd: PDDeployment) -> None:
    for role, template in _pod_templates(render(pdd)):
        spec = template["spec"]
        container = spec["containers"][0]
        prestop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        drain = [float(v) for v in flag_values(container["command"], "--shutdown-timeout") if v]
        assert spec["terminationGracePeriodSeconds"] >= prestop + (drain[-1] if drain else 0), role


@PROPERTY
@given(pdd=pddeployments())
def test_objects_share_no_mutable_parts(pdd: PDDeployment) -> None:
    seen: set[int] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict | list):
            assert id(node) not in seen, node
            seen.add(id(node))
            for child in node.values() if isinstance(node, dict) else node:
                walk(child)

    objects = render(pdd)
    walk(objects)
    objects[0]["metadata"]["labels"]["x"] = "y"
    assert "x" not in render(pdd)[0]["metadata"]["labels"]


@PROPERTY
@given(pdd=pddeployments())
def test_the_sim_engine_parses_every_rendered_command(pdd: PDDeployment) -> None:
    """Of single-rank pools (the generator gives data-parallel and multi-node shapes to vLLM pools only;
    test_multinode.py parses the sim engine's group lines)."""
    for role in POOL_ROLES:
        shape = pdd.spec.pool(role).shape
        if shape.multi_node or shape.data > 1 or shape.pipeline > 1 or shape.expert:
            assert pdd.spec.engine.type.value == "vllm"
            continue
        command = engine_command(pdd, role)
        args = parse_serve_args(command[3:] if command[0] == "tandem" else command[2:])
        assert args.tensor_parallel_size == pdd.spec.pool(role).tensor_parallel_size
        assert args.served_model_name == (pdd.spec.model.name,)
