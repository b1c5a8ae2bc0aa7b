"""Cross-field validation rules: one source for the CRD's CEL and for the pydantic models.

Each rule carries its CEL expression (evaluated by the apiserver at admission, with `self` the
`spec` object in its camelCase form) and a Python predicate over the same camelCase dict, with one
message that names the field. The models call `spec_violations`; `crdgen` emits the CEL; a test
applies each rule's counter-example to a real apiserver and checks the message comes back.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

POOLS: Final = ("prefill", "decode", "colocated")
VALID_TP: Final = (1, 2, 4, 8)

# Longest child suffix is "-colocated" (10). A StatefulSet's name must leave room for the
# 11-character controller-revision-hash suffix inside a 63-character label value: 63 - 11 - 10 = 42.
MAX_NAME_LENGTH: Final = 42
NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# Flags whose value the operator derives from the spec; setting them by hand would contradict it.
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
)

GPU_RESOURCE: Final = "nvidia.com/gpu"
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


def _cel_no_owned_flags(list_expr: str) -> str:
    flags = ", ".join(f"'{flag}'" for flag in OPERATOR_OWNED_FLAGS)
    return f"{list_expr}.all(a, ![{flags}].exists(f, a == f || a.startsWith(f + '=')))"


def _pool(spec: Spec, role: str) -> Spec:
    pool: Spec = spec.get(role) or {}
    return pool


def _tp(spec: Spec, role: str) -> int:
    return int(_pool(spec, role).get("tensorParallelSize", 1))


def _replicas(spec: Spec, role: str) -> int:
    return int(_pool(spec, role).get("replicas", 0))


def _resource_keys(spec: Spec, role: str) -> set[str]:
    res: Spec = _pool(spec, role).get("resources") or {}
    return set(res.get("requests") or {}) | set(res.get("limits") or {})


def _rdma_resource(spec: Spec) -> str:
    return str(((spec.get("network") or {}).get("rdma") or {}).get("resourceName", "rdma/hca"))


def _pool_rules(role: str) -> list[Rule]:
    return [
        Rule(
            cel=f"self.{role}.tensorParallelSize in [1, 2, 4, 8]",
            message=f"spec.{role}.tensorParallelSize must be a power of two no greater than 8 (1, 2, 4 or 8)",
            field_path=f".{role}.tensorParallelSize",
            check=lambda s: _tp(s, role) in VALID_TP,
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
                f"come from spec.{role}.tensorParallelSize and RDMA devices from spec.network.rdma.perPod"
            ),
            field_path=f".{role}.resources",
            check=lambda s: not ({GPU_RESOURCE, _rdma_resource(s)} & _resource_keys(s, role)),
            reason="FieldValueForbidden",
        ),
    ]


SPEC_RULES: Final[tuple[Rule, ...]] = (
    *[rule for role in POOLS for rule in _pool_rules(role)],
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
            or _tp(s, "decode") % _tp(s, "prefill") == 0
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
