"""Cross-field validation rules: one source for the CRD's CEL and for the pydantic models.

Each rule carries its CEL expression (evaluated by the apiserver at admission, with `self` the
`spec` object in its camelCase form) and a Python predicate over the same camelCase dict, with one
message that names the field. The models call `spec_violations`; `crdgen` emits the CEL, moving each
rule onto the deepest object it reads (`crdgen.place_rule`: cheaper for the apiserver, same message and
field); a test applies each rule's counter-example to a real apiserver and checks the message comes back.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from tandem.api.shape import MAX_GPUS_PER_POD, Shape

POOLS: Final = ("prefill", "decode", "colocated")
VALID_TP: Final = (1, 2, 4, 8)
# Tensor parallelism of one rank spread over several pods (multi-node TP): at most 8 GPUs per node.
SPANNING_TP: Final = (16, 32, 64)

# Longest child suffix is "-colocated" (10). A StatefulSet's name must leave room for the
# 11-character controller-revision-hash suffix inside a 63-character label value: 63 - 11 - 10 = 42.
MAX_NAME_LENGTH: Final = 42
NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# Flags whose value the operator derives from the spec; setting them by hand would contradict it.
# The parallelism and multi-node flags come from spec.<pool>.parallelism and nodesPerInstance (and
# the LeaderWorkerSet group's addresses), with vLLM's short aliases.
OPERATOR_OWNED_FLAGS: Final = (
    "--host",
    "--port",
    "--model",
    "--tensor-parallel-size",
    "-tp",
    "--served-model-name",
    "--max-model-len",
    "--kv-transfer-config",
    "--revision",
    "--pipeline-parallel-size",
    "-pp",
    "--data-parallel-size",
    "-dp",
    "--data-parallel-size-local",
    "-dpl",
    "--data-parallel-rank",
    "-dpn",
    "--data-parallel-start-rank",
    "-dpr",
    "--data-parallel-address",
    "-dpa",
    "--data-parallel-rpc-port",
    "-dpp",
    "--data-parallel-backend",
    "-dpb",
    "--data-parallel-hybrid-lb",
    "-dph",
    "--data-parallel-external-lb",
    "-dpe",
    "--data-parallel-multi-port-external-lb",
    "-dpm",
    "--data-parallel-supervisor-port",
    "--enable-expert-parallel",
    "--no-enable-expert-parallel",
    "-ep",
    "--nnodes",
    "-n",
    "--node-rank",
    "-r",
    "--master-addr",
    "--master-port",
    "--headless",
)

GPU_RESOURCE: Final = "nvidia.com/gpu"
# Just the scheme and a non-empty rest: users run Prometheus anywhere, in-cluster addresses included.
PROMETHEUS_URL_PATTERN: Final = r"^https?://[^\s]+$"
MODEL_URI_PATTERN: Final = (
    r"^(hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(@[-A-Za-z0-9_.]+)?"
    r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^ ]*)?"
    r"|file:///[^ ]+)$"
)

Spec = dict[str, Any]


@dataclass(frozen=True)
class Rule:
    """One validation rule. `field_path` is relative to `spec` (CEL fieldPath syntax)."""

    cel: str
    message: str
    field_path: str
    check: Callable[[Spec], bool]
    reason: str = "FieldValueInvalid"


def _owned_flag(arg: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for flag in OPERATOR_OWNED_FLAGS)


def _cel_string(value: str) -> str:
    """A CEL string literal of `value` (backslashes and quotes escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_no_owned_flags(list_expr: str) -> str:
    flags = ", ".join(f"'{flag}'" for flag in OPERATOR_OWNED_FLAGS)
    return f"{list_expr}.all(a, ![{flags}].exists(f, a == f || a.startsWith(f + '=')))"


def _pool(spec: Spec, role: str) -> Spec:
    pool: Spec = spec.get(role) or {}
    return pool


def _tp(spec: Spec, role: str) -> int:
    return int(_pool(spec, role).get("tensorParallelSize", 1))


def _shape(spec: Spec, role: str) -> Shape:
    return Shape.of_pool(_pool(spec, role))


def _instance_gpus(spec: Spec, role: str) -> int:
    """GPUs of one replica of `role`: TP x PP x DP (`tandem.api.shape`)."""
    return _shape(spec, role).gpus_per_instance


def _cel_instance_gpus(role: str) -> str:
    par = f"self.{role}.parallelism"
    return f"self.{role}.tensorParallelSize * {par}.pipeline * {par}.data"


def _replicas(spec: Spec, role: str) -> int:
    return int(_pool(spec, role).get("replicas", 0))


def _autoscaling(spec: Spec, role: str) -> Spec | None:
    """The pool's `autoscaling` block, or None when the pool has a fixed size."""
    block: Spec | None = _pool(spec, role).get("autoscaling")
    return block


def _min_replicas(spec: Spec, role: str) -> int:
    """The fewest replicas the pool can have: autoscaling.minReplicas, or replicas when fixed."""
    block = _autoscaling(spec, role)
    return _replicas(spec, role) if block is None else int(block.get("minReplicas", 1))


def _descent_within_window(scale_down: Spec) -> bool:
    descent = scale_down.get("descentStabilizationSeconds")
    return descent is None or descent <= scale_down.get("stabilizationSeconds", 600)


def _autoscaling_enabled(spec: Spec) -> bool:
    return bool((spec.get("autoscaling") or {}).get("enabled", False))


def _serving_mode(spec: Spec) -> str:
    return str((spec.get("serving") or {}).get("mode", "Disaggregated"))


def _gpus(spec: Spec, replicas: Callable[[Spec, str], int]) -> int:
    return sum(replicas(spec, role) * _instance_gpus(spec, role) for role in POOLS)


def _cel_gpus(replicas: Callable[[str], str]) -> str:
    return " + ".join(f"{replicas(role)} * {_cel_instance_gpus(role)}" for role in POOLS)


ARMS: Final = (("prefill", "decode"), ("colocated",))  # P/D, colocated


def _arm_gpus(spec: Spec, arm: tuple[str, ...], replicas: Callable[[Spec, str], int]) -> int:
    return sum(replicas(spec, role) * _instance_gpus(spec, role) for role in arm)


def _one_each(spec: Spec, arm: tuple[str, ...]) -> int:
    return sum(_instance_gpus(spec, role) for role in arm if _replicas(spec, role) >= 1)


def _gpus_needed(spec: Spec) -> int:
    """GPUs `spec.maxGPUs` must cover. Without spec.rollout every pool at its size (a cut-over keeps
    the old arm until the new one is ready). With it the arms trade capacity (the operator keeps the
    total within maxGPUs, the arm that gives way shrinking first, never below one replica per pool):
    the peak is one arm at its size beside one replica per pool of the other (a rollout's start, a
    rollback), or P/D at its size beside the old revision's pair at one replica per pool."""
    if spec.get("rollout") is None:
        return max(_gpus(spec, _replicas), _gpus(spec, _min_replicas))
    pd, colocated = ARMS
    need = 0
    for replicas in (_replicas, _min_replicas):
        need = max(
            need,
            _arm_gpus(spec, pd, replicas) + _one_each(spec, colocated),
            _arm_gpus(spec, colocated, replicas) + _one_each(spec, pd),
            _arm_gpus(spec, pd, replicas) + _one_each(spec, pd),
        )
    return need


def _cel_traded(replicas: Callable[[str], str]) -> str:
    """The rollout half of the maxGPUs rule in CEL (as `_gpus_needed`)."""
    pd, colocated = ARMS

    def arm(roles: tuple[str, ...]) -> str:
        return " + ".join(f"{replicas(role)} * {_cel_instance_gpus(role)}" for role in roles)

    def ones(roles: tuple[str, ...]) -> str:
        return " + ".join(f"(self.{role}.replicas >= 1 ? {_cel_instance_gpus(role)} : 0)" for role in roles)

    pairs = ((pd, colocated), (colocated, pd), (pd, pd))
    return " && ".join(f"{arm(a)} + {ones(b)} <= self.maxGPUs" for a, b in pairs)


def _cel_min_replicas(role: str) -> str:
    return f"(has(self.{role}.autoscaling) ? self.{role}.autoscaling.minReplicas : self.{role}.replicas)"


def _prometheus_url(spec: Spec) -> str | None:
    url = ((spec.get("autoscaling") or {}).get("prometheus") or {}).get("url")
    return None if url is None else str(url)


def _resource_keys(spec: Spec, role: str) -> set[str]:
    res: Spec = _pool(spec, role).get("resources") or {}
    return set(res.get("requests") or {}) | set(res.get("limits") or {})


def _rdma_resource(spec: Spec) -> str:
    return str(((spec.get("network") or {}).get("rdma") or {}).get("resourceName", "rdma/hca"))


def _pool_rules(role: str) -> list[Rule]:
    return [
        Rule(
            cel=(
                f"self.{role}.tensorParallelSize in {list(VALID_TP)} || "
                f"(self.{role}.tensorParallelSize in {list(SPANNING_TP)} && "
                f"self.{role}.tensorParallelSize <= {MAX_GPUS_PER_POD} * self.{role}.nodesPerInstance)"
            ),
            message=(
                f"spec.{role}.tensorParallelSize must be a power of two no greater than 8 (1, 2, 4 or 8), "
                f"or up to 8 x spec.{role}.nodesPerInstance (16, 32 or 64) when one rank spans nodes"
            ),
            field_path=f".{role}.tensorParallelSize",
            check=lambda s: (
                _tp(s, role) in VALID_TP
                or (_tp(s, role) in SPANNING_TP and _tp(s, role) <= MAX_GPUS_PER_POD * _shape(s, role).nodes)
            ),
        ),
        Rule(
            cel=_cel_no_owned_flags(f"self.{role}.engineArgs"),
            message=(
                f"spec.{role}.engineArgs must not set flags tandem derives from the spec "
                f"({', '.join(OPERATOR_OWNED_FLAGS)})"
            ),
            field_path=f".{role}.engineArgs",
            check=lambda s: not any(_owned_flag(a) for a in _pool(s, role).get("engineArgs") or []),
            reason="FieldValueForbidden",
        ),
        Rule(
            cel=(
                f"!('{GPU_RESOURCE}' in self.{role}.resources.requests) && "
                f"!('{GPU_RESOURCE}' in self.{role}.resources.limits) && "
                f"!(self.network.rdma.resourceName in self.{role}.resources.requests) && "
                f"!(self.network.rdma.resourceName in self.{role}.resources.limits)"
            ),
            message=(
                f"spec.{role}.resources must not set {GPU_RESOURCE} or the RDMA resource: GPUs per replica "
                f"come from spec.{role}.tensorParallelSize and parallelism (GPUs per pod) and RDMA devices "
                "from spec.network.rdma.perPod"
            ),
            field_path=f".{role}.resources",
            check=lambda s: not ({GPU_RESOURCE, _rdma_resource(s)} & _resource_keys(s, role)),
            reason="FieldValueForbidden",
        ),
    ]


GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"  # GPU Feature Discovery's node label


def _lb_rule(role: str, mode: str, cel_ok: str, check: Callable[[Shape], bool], needs: str) -> Rule:
    """A load-balancing mode's needs (the data-parallel size of 1 is the rule before's)."""
    par = f"self.{role}.parallelism"
    return Rule(
        cel=f"{par}.loadBalancing != '{mode}' || {par}.data == 1 || ({cel_ok})",
        message=f"spec.{role}.parallelism.loadBalancing {mode} {needs}",
        field_path=f".{role}.parallelism.loadBalancing",
        check=lambda s: (shape := _shape(s, role)).load_balancing != mode or shape.data == 1 or check(shape),
    )


def _sim_rules(role: str) -> list[Rule]:
    """What the sim engine (`engine.type: sim`) runs of a pool's parallelism, one rule per field: data
    parallelism as one rank per pod balanced by the group's leader (Internal), one rank per pod
    serving itself (External), or several ranks per pod each on its own port (MultiPortExternal);
    no pipeline stages, no expert parallelism, no Hybrid balancing (docs/multinode.md)."""
    par = f"self.{role}.parallelism"
    nodes = f"self.{role}.nodesPerInstance"
    sim = "self.engine.type != 'sim'"

    def off(s: Spec) -> bool:
        return (s.get("engine") or {}).get("type") != "sim"

    return [
        Rule(
            cel=f"{sim} || {par}.pipeline == 1",
            message=(
                f"spec.{role}.parallelism.pipeline must be 1 with spec.engine.type sim (the sim engine "
                "models no pipeline stages)"
            ),
            field_path=f".{role}.parallelism.pipeline",
            check=lambda s: off(s) or _shape(s, role).pipeline == 1,
            reason="FieldValueForbidden",
        ),
        Rule(
            cel=f"{sim} || !{par}.expert",
            message=(
                f"spec.{role}.parallelism.expert must be false with spec.engine.type sim (the sim engine "
                "models no expert parallelism)"
            ),
            field_path=f".{role}.parallelism.expert",
            check=lambda s: off(s) or not _shape(s, role).expert,
            reason="FieldValueForbidden",
        ),
        Rule(
            cel=f"{sim} || {par}.loadBalancing != 'Hybrid'",
            message=(
                f"spec.{role}.parallelism.loadBalancing Hybrid is not simulated: with spec.engine.type sim "
                "use Internal, External or MultiPortExternal"
            ),
            field_path=f".{role}.parallelism.loadBalancing",
            check=lambda s: off(s) or _shape(s, role).load_balancing != "Hybrid",
            reason="FieldValueForbidden",
        ),
        Rule(
            cel=f"{sim} || {par}.loadBalancing != 'Internal' || {par}.data == 1 || {par}.data == {nodes}",
            message=(
                f"spec.{role}.parallelism.data with spec.engine.type sim and loadBalancing Internal must be "
                f"1 or spec.{role}.nodesPerInstance (the sim engine's leader balances one rank per pod; "
                "several ranks per pod: loadBalancing MultiPortExternal)"
            ),
            field_path=f".{role}.parallelism.data",
            check=lambda s: (
                off(s)
                or (shape := _shape(s, role)).load_balancing != "Internal"
                or shape.data in (1, shape.nodes)
            ),
            reason="FieldValueForbidden",
        ),
    ]


def _shape_rules(role: str) -> list[Rule]:
    """A pool's parallelism and nodes per replica: shapes a cluster of <= 8-GPU nodes can run."""
    pool = f"self.{role}"
    par = f"{pool}.parallelism"
    nodes = f"{pool}.nodesPerInstance"
    gpus = _cel_instance_gpus(role)
    return [
        Rule(
            cel=f"({gpus}) % {nodes} == 0 && ({gpus}) / {nodes} <= {MAX_GPUS_PER_POD}",
            message=(
                f"spec.{role}.nodesPerInstance must split a replica's GPUs (tensorParallelSize x "
                "parallelism.pipeline x parallelism.data) evenly into pods of at most 8 GPUs each (one pod "
                "per node)"
            ),
            field_path=f".{role}.nodesPerInstance",
            check=lambda s: (
                (shape := _shape(s, role)).nodes >= 1
                and shape.gpus_per_instance % shape.nodes == 0
                and shape.gpus_per_pod <= MAX_GPUS_PER_POD
            ),
        ),
        Rule(
            cel=f"{par}.data == 1 || {par}.data % {nodes} == 0",
            message=(
                f"spec.{role}.parallelism.data must be 1 (one rank spanning the pods) or a multiple of "
                f"spec.{role}.nodesPerInstance (whole data-parallel ranks on every pod)"
            ),
            field_path=f".{role}.parallelism.data",
            check=lambda s: (shape := _shape(s, role)).data == 1 or shape.data % max(shape.nodes, 1) == 0,
        ),
        Rule(
            cel=f"!has({par}.dataLocal) || {par}.dataLocal * {nodes} == {par}.data",
            message=(
                f"spec.{role}.parallelism.dataLocal (data-parallel ranks per pod) times "
                f"spec.{role}.nodesPerInstance must equal spec.{role}.parallelism.data, so that dataLocal x "
                "tensorParallelSize x parallelism.pipeline are the GPUs per pod (unset: derived)"
            ),
            field_path=f".{role}.parallelism.dataLocal",
            check=lambda s: (
                (shape := _shape(s, role)).data_local is None or shape.data_local * shape.nodes == shape.data
            ),
        ),
        Rule(
            cel=f"!{par}.expert || {par}.data * {pool}.tensorParallelSize > 1",
            message=(
                f"spec.{role}.parallelism.expert needs spec.{role}.parallelism.data or "
                f"spec.{role}.tensorParallelSize above 1 (experts are sharded over data x tensor ranks)"
            ),
            field_path=f".{role}.parallelism.expert",
            check=lambda s: not (shape := _shape(s, role)).expert or shape.data * shape.tensor > 1,
        ),
        Rule(
            cel=f"{par}.loadBalancing == 'Internal' || {par}.data > 1",
            message=(
                f"spec.{role}.parallelism.loadBalancing other than Internal needs "
                f"spec.{role}.parallelism.data above 1 (it spreads requests over data-parallel ranks)"
            ),
            field_path=f".{role}.parallelism.loadBalancing",
            check=lambda s: (shape := _shape(s, role)).load_balancing == "Internal" or shape.data > 1,
        ),
        _lb_rule(
            role,
            "Hybrid",
            f"{nodes} >= 2 && {par}.data / {nodes} >= 2",
            lambda shape: shape.nodes >= 2 and shape.data // shape.nodes >= 2,
            f"(an endpoint per pod) needs spec.{role}.nodesPerInstance of at least 2 and at least 2 "
            "data-parallel ranks per pod (parallelism.data / nodesPerInstance); on one pod use Internal, "
            "with one rank per pod External",
        ),
        _lb_rule(
            role,
            "External",
            f"{par}.data == {nodes}",
            lambda shape: shape.data == shape.nodes,
            f"(an endpoint per rank) needs one data-parallel rank per pod: spec.{role}.parallelism.data "
            f"equal to spec.{role}.nodesPerInstance (several ranks per pod: MultiPortExternal)",
        ),
        _lb_rule(
            role,
            "MultiPortExternal",
            f"{par}.data / {nodes} >= 2",
            lambda shape: shape.data // max(shape.nodes, 1) >= 2,
            "(a port per rank, a supervisor per pod) needs at least 2 data-parallel ranks per pod "
            "(parallelism.data / nodesPerInstance; one rank per pod: External)",
        ),
        *_sim_rules(role),
        Rule(
            cel=(
                f"!has({pool}.gpuType) || !('{GPU_PRODUCT_LABEL}' in {pool}.nodeSelector) || "
                f"{pool}.nodeSelector['{GPU_PRODUCT_LABEL}'] == {pool}.gpuType"
            ),
            message=(
                f"spec.{role}.gpuType and spec.{role}.nodeSelector['{GPU_PRODUCT_LABEL}'] must agree "
                "(set one of them)"
            ),
            field_path=f".{role}.gpuType",
            check=lambda s: (
                (gpu := _pool(s, role).get("gpuType")) is None
                or (_pool(s, role).get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL, gpu) == gpu
            ),
        ),
        Rule(
            cel=f"!has({pool}.groupPlacement) || {nodes} > 1",
            message=(
                f"spec.{role}.groupPlacement needs spec.{role}.nodesPerInstance above 1 (it places the pods "
                "of a multi-node replica together)"
            ),
            field_path=f".{role}.groupPlacement",
            check=lambda s: _pool(s, role).get("groupPlacement") is None or _shape(s, role).nodes > 1,
            reason="FieldValueForbidden",
        ),
        Rule(
            cel=(
                f"!has({pool}.groupPlacement) || !has({pool}.groupPlacement.gangScheduling) || "
                f"!has({pool}.groupPlacement.schedulerName)"
            ),
            message=(
                f"spec.{role}.groupPlacement.gangScheduling (Kubernetes' own, in the default scheduler) and "
                f"spec.{role}.groupPlacement.schedulerName (another scheduler's gang) exclude each other"
            ),
            field_path=f".{role}.groupPlacement.gangScheduling",
            check=lambda s: (
                not (
                    (placement := _pool(s, role).get("groupPlacement") or {}).get("gangScheduling")
                    and placement.get("schedulerName")
                )
            ),
            reason="FieldValueForbidden",
        ),
        Rule(
            cel=(
                f"!has({pool}.groupPlacement) || !has({pool}.groupPlacement.exclusiveTopology) || "
                f"!(has({pool}.groupPlacement.gangScheduling) || has({pool}.groupPlacement.schedulerName))"
            ),
            message=(
                f"spec.{role}.groupPlacement.exclusiveTopology cannot be combined with gang scheduling "
                "(gangScheduling or schedulerName): LeaderWorkerSet creates a group's workers only once its "
                "leader has a node, and a gang's leader waits for its workers, so no group would start"
            ),
            field_path=f".{role}.groupPlacement.exclusiveTopology",
            check=lambda s: (
                not (
                    (placement := _pool(s, role).get("groupPlacement") or {}).get("exclusiveTopology")
                    and (placement.get("gangScheduling") or placement.get("schedulerName"))
                )
            ),
            reason="FieldValueForbidden",
        ),
    ]


# The pools each serving mode sends traffic to: their autoscaler may never take them to zero.
SERVING_POOLS: Final = {"prefill": "Disaggregated", "decode": "Disaggregated", "colocated": "Colocated"}


def _autoscaling_rules(role: str) -> list[Rule]:
    block = f"self.{role}.autoscaling"
    mode = SERVING_POOLS[role]

    def bounded(s: Spec) -> bool:
        a = _autoscaling(s, role)
        return a is None or a.get("minReplicas", 1) <= _replicas(s, role) <= a.get("maxReplicas", 8)

    return [
        Rule(
            cel=f"!has({block}) || {block}.minReplicas <= {block}.maxReplicas",
            message=(
                f"spec.{role}.autoscaling.minReplicas must not be greater than "
                f"spec.{role}.autoscaling.maxReplicas"
            ),
            field_path=f".{role}.autoscaling.minReplicas",
            check=lambda s: (
                (a := _autoscaling(s, role)) is None or a.get("minReplicas", 1) <= a.get("maxReplicas", 8)
            ),
        ),
        Rule(
            cel=(
                f"!has({block}) || ({block}.minReplicas <= self.{role}.replicas && "
                f"self.{role}.replicas <= {block}.maxReplicas)"
            ),
            message=(
                f"spec.{role}.replicas must be within spec.{role}.autoscaling.minReplicas and maxReplicas "
                "(with autoscaling it is the pool's initial size)"
            ),
            field_path=f".{role}.replicas",
            check=bounded,
        ),
        Rule(
            cel=f"!has({block}) || {block}.external || self.autoscaling.enabled",
            message=(
                f"spec.{role}.autoscaling needs spec.autoscaling.enabled: true, or "
                f"spec.{role}.autoscaling.external: true to hand the pool to an HPA or KEDA (to hold the "
                "autoscaler without removing bounds: annotation tandem.dev/autoscaling-paused=true)"
            ),
            field_path=f".{role}.autoscaling",
            check=lambda s: (
                (a := _autoscaling(s, role)) is None or bool(a.get("external")) or _autoscaling_enabled(s)
            ),
        ),
        Rule(
            cel=f"self.serving.mode != '{mode}' || !has({block}) || {block}.minReplicas >= 1",
            message=(
                f"spec.{role}.autoscaling.minReplicas must be at least 1 when spec.serving.mode is {mode}"
            ),
            field_path=f".{role}.autoscaling.minReplicas",
            check=lambda s: (
                _serving_mode(s) != mode
                or (a := _autoscaling(s, role)) is None
                or a.get("minReplicas", 1) >= 1
            ),
        ),
    ]


def _rollout(spec: Spec) -> Spec | None:
    block: Spec | None = spec.get("rollout")
    return block


def _strictly_increasing(weights: list[int]) -> bool:
    return all(b > a for a, b in itertools.pairwise(weights))


def _router_metrics(spec: Spec, field: str) -> list[int]:
    bounds = ((spec.get("router") or {}).get("metrics") or {}).get(field) or []
    return [int(b) for b in bounds]


def _length_bucket_rule(field: str) -> Rule:
    """spec.router.metrics.<field>: the routers' length bucket bounds, strictly increasing."""
    bounds = f"self.router.metrics.{field}"
    return Rule(
        cel=f"{bounds}.isSorted() && {bounds}.all(a, {bounds}.exists_one(b, b == a))",
        message=f"spec.router.metrics.{field} must be strictly increasing",
        field_path=f".router.metrics.{field}",
        check=lambda s: _strictly_increasing(_router_metrics(s, field)),
    )


def _rollout_weights(spec: Spec) -> list[int]:
    return [int(step.get("weight", 0)) for step in (_rollout(spec) or {}).get("steps") or []]


def _rollout_window(spec: Spec) -> int:
    return int(((_rollout(spec) or {}).get("analysis") or {}).get("windowSeconds", 60))


def _autoscaling_interval(spec: Spec) -> int:
    return int((spec.get("autoscaling") or {}).get("intervalSeconds", 30))


ROLLOUT_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        cel=(
            "!has(self.rollout) || (self.rollout.steps.map(s, s.weight).isSorted() && "
            "self.rollout.steps.all(a, self.rollout.steps.exists_one(b, b.weight == a.weight)))"
        ),
        message="spec.rollout.steps[*].weight must be strictly increasing (each step above the one before)",
        field_path=".rollout.steps",
        check=lambda s: _rollout(s) is None or _strictly_increasing(_rollout_weights(s)),
    ),
    Rule(
        cel=(
            "!has(self.rollout) || !self.autoscaling.enabled || "
            "self.rollout.analysis.windowSeconds >= self.autoscaling.intervalSeconds"
        ),
        message=(
            "spec.rollout.analysis.windowSeconds must be at least spec.autoscaling.intervalSeconds "
            "(a window shorter than the interval metrics are read at judges stale or partial data)"
        ),
        field_path=".rollout.analysis.windowSeconds",
        check=lambda s: (
            _rollout(s) is None
            or not _autoscaling_enabled(s)
            or _rollout_window(s) >= _autoscaling_interval(s)
        ),
    ),
    # Every rollout needs the P/D arm: a serving-mode rollout moves traffic to or from it, a
    # disaggregation-mode or revision rollout splits it. The colocated arm is needed only to move
    # between serving modes, which `spec.serving.mode` Colocated's own rule already requires: a
    # P/D-only deployment (spec.colocated.replicas 0) rolls its disaggregation mode and revisions.
    Rule(
        cel="!has(self.rollout) || (self.prefill.replicas >= 1 && self.decode.replicas >= 1)",
        message=(
            "spec.rollout needs the P/D arm: spec.prefill.replicas and spec.decode.replicas must each be "
            "at least 1 (the full size of the arm; spec.colocated.replicas may be 0 on a P/D-only "
            "deployment, whose rollouts are of spec.router.disaggregation.mode and serving revisions)"
        ),
        field_path=".rollout",
        check=lambda s: _rollout(s) is None or (_replicas(s, "prefill") >= 1 and _replicas(s, "decode") >= 1),
        reason="FieldValueRequired",
    ),
)


def _router(spec: Spec) -> Spec:
    block: Spec = spec.get("router") or {}
    return block


def _tenants(spec: Spec) -> list[Spec]:
    return list(_router(spec).get("tenants") or [])


def _admission(spec: Spec) -> Spec:
    block: Spec = _router(spec).get("admission") or {}
    return block


def _disaggregation(spec: Spec) -> Spec:
    block: Spec = _router(spec).get("disaggregation") or {}
    return block


def _auto_only_rule(knob: str) -> Rule:
    return Rule(
        cel=(
            f"!has(self.router.disaggregation) || !has(self.router.disaggregation.{knob}) || "
            "self.router.disaggregation.mode == 'Auto'"
        ),
        message=f"spec.router.disaggregation.{knob} is only used with mode Auto",
        field_path=f".router.disaggregation.{knob}",
        check=lambda s: _disaggregation(s).get(knob) is None or _disaggregation(s).get("mode") == "Auto",
        reason="FieldValueForbidden",
    )


def _burst_without_rate(limits: Spec | None, burst: str, rate: str) -> bool:
    return limits is not None and limits.get(burst) is not None and limits.get(rate) is None


# (burst field, the rate it needs) of spec.router's TenantLimits.
_LIMIT_PAIRS: Final = (("requestBurst", "requestsPerSecond"), ("promptTokenBurst", "promptTokensPerSecond"))


def _limit_rules(burst: str, rate: str) -> list[Rule]:
    def default_ok(s: Spec) -> bool:
        return not _burst_without_rate(_admission(s).get("defaultLimits"), burst, rate)

    def tenants_ok(s: Spec) -> bool:
        return not any(_burst_without_rate(t.get("limits"), burst, rate) for t in _tenants(s))

    default = "self.router.admission.defaultLimits"
    return [
        Rule(
            cel=f"!has({default}) || !has({default}.{burst}) || has({default}.{rate})",
            message=f"spec.router.admission.defaultLimits.{burst} needs {rate} (the refill rate)",
            field_path=f".router.admission.defaultLimits.{burst}",
            check=default_ok,
            reason="FieldValueRequired",
        ),
        Rule(
            cel=(
                f"self.router.tenants.all(t, !has(t.limits) || !has(t.limits.{burst}) || "
                f"has(t.limits.{rate}))"
            ),
            message=f"spec.router.tenants[*].limits.{burst} needs {rate} (the refill rate)",
            field_path=".router.tenants",
            check=tenants_ok,
            reason="FieldValueRequired",
        ),
    ]


ROUTER_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        cel="self.router.tenants.all(a, self.router.tenants.exists_one(b, b.name == a.name))",
        message="spec.router.tenants[*].name must be unique",
        field_path=".router.tenants",
        check=lambda s: len({t.get("name") for t in _tenants(s)}) == len(_tenants(s)),
    ),
    Rule(
        cel="self.router.tenants.all(t, t.name != 'other')",
        message="spec.router.tenants[*].name must not be `other` (the label of tenants not listed)",
        field_path=".router.tenants",
        check=lambda s: all(t.get("name") != "other" for t in _tenants(s)),
        reason="FieldValueForbidden",
    ),
    *[rule for burst, rate in _LIMIT_PAIRS for rule in _limit_rules(burst, rate)],
    Rule(
        cel=(
            "!has(self.router.admission.longPrompts) || !has(self.model.maxModelLen) || "
            "self.router.admission.longPrompts.minTokens < self.model.maxModelLen"
        ),
        message=(
            "spec.router.admission.longPrompts.minTokens must be below spec.model.maxModelLen "
            "(no prompt could reach it)"
        ),
        field_path=".router.admission.longPrompts.minTokens",
        check=lambda s: (
            (long := _admission(s).get("longPrompts")) is None
            or (limit := (s.get("model") or {}).get("maxModelLen")) is None
            or int(long.get("minTokens", 0)) < int(limit)
        ),
    ),
    Rule(
        cel="!has(self.rollout) || self.rollout.steps[0].weight > 0 || size(self.rollout.tenants) > 0",
        message=(
            "spec.rollout.steps[0].weight 0 is the tenants stage; it needs spec.rollout.tenants "
            "(the tenants sent to the target arm first)"
        ),
        field_path=".rollout.steps",
        check=lambda s: (
            (r := _rollout(s)) is None or (_rollout_weights(s) or [1])[0] > 0 or bool(r.get("tenants"))
        ),
    ),
    Rule(
        cel=(
            "!has(self.router.disaggregation) || self.router.disaggregation.mode != 'Threshold' || "
            "has(self.router.disaggregation.thresholdTokens)"
        ),
        message="spec.router.disaggregation.thresholdTokens is required with mode Threshold",
        field_path=".router.disaggregation.thresholdTokens",
        check=lambda s: (
            _disaggregation(s).get("mode") != "Threshold"
            or _disaggregation(s).get("thresholdTokens") is not None
        ),
        reason="FieldValueRequired",
    ),
    Rule(
        cel=(
            "!has(self.router.disaggregation) || !has(self.router.disaggregation.thresholdTokens) || "
            "self.router.disaggregation.mode == 'Threshold'"
        ),
        message="spec.router.disaggregation.thresholdTokens is only used with mode Threshold",
        field_path=".router.disaggregation.thresholdTokens",
        check=lambda s: (
            _disaggregation(s).get("thresholdTokens") is None or _disaggregation(s).get("mode") == "Threshold"
        ),
        reason="FieldValueForbidden",
    ),
    *(_auto_only_rule(knob) for knob in ("maxLocalTokens", "maxLocalPrefills")),
    Rule(
        cel="!has(self.rollout) || self.rollout.tenants.all(n, self.router.tenants.exists(t, t.name == n))",
        message="spec.rollout.tenants must name tenants of spec.router.tenants",
        field_path=".rollout.tenants",
        check=lambda s: (
            _rollout(s) is None
            or all(
                n in {t.get("name") for t in _tenants(s)} for n in (_rollout(s) or {}).get("tenants") or []
            )
        ),
    ),
)


SPEC_RULES: Final[tuple[Rule, ...]] = (
    *[rule for role in POOLS for rule in _pool_rules(role)],
    *[rule for role in POOLS for rule in _shape_rules(role)],
    *[rule for role in POOLS for rule in _autoscaling_rules(role)],
    Rule(
        cel=(
            "!has(self.autoscaling.scaleDown.descentStabilizationSeconds) || "
            "self.autoscaling.scaleDown.descentStabilizationSeconds <= "
            "self.autoscaling.scaleDown.stabilizationSeconds"
        ),
        message=(
            "spec.autoscaling.scaleDown.descentStabilizationSeconds must not be greater than "
            "spec.autoscaling.scaleDown.stabilizationSeconds"
        ),
        field_path=".autoscaling.scaleDown.descentStabilizationSeconds",
        check=lambda s: _descent_within_window((s.get("autoscaling") or {}).get("scaleDown") or {}),
    ),
    Rule(
        cel=(
            "self.kvTransfer.connector != 'NixlConnector' || "
            "self.decode.tensorParallelSize % self.prefill.tensorParallelSize == 0"
        ),
        message=(
            "spec.decode.tensorParallelSize must be a multiple of spec.prefill.tensorParallelSize "
            "(and not smaller) with the NixlConnector"
        ),
        field_path=".decode.tensorParallelSize",
        check=lambda s: (
            (s.get("kvTransfer") or {}).get("connector", "NixlConnector") != "NixlConnector"
            # a prefill TP of 0 (refused by its own rule) is no divisor: not a multiple, not a crash
            or (_tp(s, "prefill") != 0 and _tp(s, "decode") % _tp(s, "prefill") == 0)
        ),
    ),
    Rule(
        cel="self.kvTransfer.connector != 'NixlConnector' || self.decode.parallelism.pipeline == 1",
        message=(
            "spec.decode.parallelism.pipeline must be 1 with the NixlConnector (vLLM's NIXL connector "
            "cannot receive KV into a pipeline-parallel decode; spread decode over nodes with "
            "tensorParallelSize or parallelism.data instead)"
        ),
        field_path=".decode.parallelism.pipeline",
        check=lambda s: (
            (s.get("kvTransfer") or {}).get("connector", "NixlConnector") != "NixlConnector"
            or _shape(s, "decode").pipeline == 1
        ),
    ),
    Rule(
        cel=(
            "self.serving.mode != 'Disaggregated' || "
            "(self.prefill.replicas >= 1 && self.decode.replicas >= 1)"
        ),
        message=(
            "spec.prefill.replicas and spec.decode.replicas must be at least 1 when "
            "spec.serving.mode is Disaggregated"
        ),
        field_path=".serving.mode",
        check=lambda s: (
            (s.get("serving") or {}).get("mode", "Disaggregated") != "Disaggregated"
            or (_replicas(s, "prefill") >= 1 and _replicas(s, "decode") >= 1)
        ),
    ),
    Rule(
        cel="self.serving.mode != 'Colocated' || self.colocated.replicas >= 1",
        message="spec.colocated.replicas must be at least 1 when spec.serving.mode is Colocated",
        field_path=".serving.mode",
        check=lambda s: (s.get("serving") or {}).get("mode") != "Colocated" or _replicas(s, "colocated") >= 1,
    ),
    Rule(
        cel="!self.autoscaling.enabled || has(self.slo)",
        message=(
            "spec.autoscaling.enabled requires spec.slo "
            "(the TTFT and TPOT targets the autoscaler sizes pools for)"
        ),
        field_path=".slo",
        check=lambda s: not _autoscaling_enabled(s) or s.get("slo") is not None,
        reason="FieldValueRequired",
    ),
    Rule(
        cel=(
            "!has(self.maxGPUs) || (has(self.rollout) ? "
            f"({_cel_traded(lambda role: f'self.{role}.replicas')} && {_cel_traded(_cel_min_replicas)}) : "
            f"({_cel_gpus(lambda role: f'self.{role}.replicas')} <= self.maxGPUs && "
            f"{_cel_gpus(_cel_min_replicas)} <= self.maxGPUs))"
        ),
        message=(
            "spec.maxGPUs must be at least the GPUs the pools request at their initial size and at their "
            "autoscaling minimum (the sum over pools of replicas, or autoscaling.minReplicas, times the GPUs "
            "of a replica, tensorParallelSize x parallelism.pipeline x parallelism.data; with spec.rollout, "
            "where the arms trade capacity: the largest of either arm plus one replica per pool of the "
            "other, and P/D plus one replica per P/D pool)"
        ),
        field_path=".maxGPUs",
        check=lambda s: s.get("maxGPUs") is None or _gpus_needed(s) <= int(s["maxGPUs"]),
    ),
    Rule(
        cel=(
            "!has(self.autoscaling.prometheus.url) || "
            f"self.autoscaling.prometheus.url.matches({_cel_string(PROMETHEUS_URL_PATTERN)})"
        ),
        message="spec.autoscaling.prometheus.url must be an http:// or https:// URL",
        field_path=".autoscaling.prometheus.url",
        check=lambda s: (
            (url := _prometheus_url(s)) is None or re.match(PROMETHEUS_URL_PATTERN, url) is not None
        ),
    ),
    Rule(
        cel="self.engine.image.size() > 0",
        message="spec.engine.image must not be empty",
        field_path=".engine.image",
        check=lambda s: bool((s.get("engine") or {}).get("image")),
        reason="FieldValueRequired",
    ),
    Rule(
        cel="self.router.image.size() > 0",
        message="spec.router.image must not be empty",
        field_path=".router.image",
        check=lambda s: bool((s.get("router") or {}).get("image")),
        reason="FieldValueRequired",
    ),
    Rule(
        cel=_cel_no_owned_flags("self.engine.extraArgs"),
        message=(
            "spec.engine.extraArgs must not set flags tandem derives from the spec "
            f"({', '.join(OPERATOR_OWNED_FLAGS)})"
        ),
        field_path=".engine.extraArgs",
        check=lambda s: not any(_owned_flag(a) for a in (s.get("engine") or {}).get("extraArgs") or []),
        reason="FieldValueForbidden",
    ),
    Rule(
        cel="self.engine.env.all(e, !(has(e.value) && has(e.valueFrom)))",
        message="spec.engine.env: an entry may set value or valueFrom, not both",
        field_path=".engine.env",
        check=lambda s: (
            not any(
                e.get("value") is not None and e.get("valueFrom") is not None
                for e in (s.get("engine") or {}).get("env") or []
            )
        ),
    ),
    Rule(
        cel=f"self.model.uri.matches('{MODEL_URI_PATTERN}')",
        message="spec.model.uri must be hf://org/repo[@revision], pvc://claim[/path] or file:///path",
        field_path=".model.uri",
        check=lambda s: re.match(MODEL_URI_PATTERN, str((s.get("model") or {}).get("uri", ""))) is not None,
    ),
    Rule(
        cel="!has(self.model.tokenSecretRef) || self.model.uri.startsWith('hf://')",
        message="spec.model.tokenSecretRef is only used with an hf:// spec.model.uri",
        field_path=".model.tokenSecretRef",
        check=lambda s: (
            (s.get("model") or {}).get("tokenSecretRef") is None
            or str((s.get("model") or {}).get("uri", "")).startswith("hf://")
        ),
        reason="FieldValueForbidden",
    ),
    Rule(
        cel="!has(self.engine.sim) || self.engine.type == 'sim'",
        message="spec.engine.sim is only used with spec.engine.type sim",
        field_path=".engine.sim",
        check=lambda s: (
            (s.get("engine") or {}).get("sim") is None or (s.get("engine") or {}).get("type") == "sim"
        ),
        reason="FieldValueForbidden",
    ),
    *ROLLOUT_RULES,
    *(
        _length_bucket_rule(field)
        for field in ("inputLengthBuckets", "outputLengthBuckets", "concurrencyBuckets")
    ),
    *ROUTER_RULES,
)

NAME_RULE: Final = Rule(
    cel=f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{NAME_PATTERN}')",
    message=(
        f"metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter) "
        f"of at most {MAX_NAME_LENGTH} characters, so that every child object's name fits"
    ),
    field_path=".metadata.name",
    check=lambda m: (
        len(str(m.get("name", ""))) <= MAX_NAME_LENGTH
        and re.match(NAME_PATTERN, str(m.get("name", ""))) is not None
    ),
)


def spec_violations(spec: Spec) -> list[str]:
    """Messages of every rule the camelCase spec breaks (empty when valid)."""
    return [rule.message for rule in SPEC_RULES if not rule.check(spec)]


def name_violations(name: str) -> list[str]:
    return [] if NAME_RULE.check({"name": name}) else [NAME_RULE.message]
