"""Generates the PDDeployment CustomResourceDefinition from the pydantic models.

pydantic's JSON schema is rewritten into a Kubernetes structural schema: `$ref`s inlined,
`anyOf [X, null]` collapsed to X, titles and `additionalProperties: false` dropped, int-or-string
marked, nulls dropped from defaults, and the CEL rules of `rules.py` attached. `tandem crd` prints
it; `crds/pddeployment.yaml` is its output.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from tandem.api import meta, rules
from tandem.api.models import PDDeploymentSpec
from tandem.api.status import PDDeploymentStatus

Schema = dict[str, Any]

_DROP_KEYS = {"title", "$defs"}
_EXCLUSIVE_BOUNDS = {"exclusiveMinimum": "minimum", "exclusiveMaximum": "maximum"}


def _resolve(node: Any, defs: dict[str, Schema]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = _resolve(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return {**target, **_resolve(extra, defs)}
    return {k: _resolve(v, defs) for k, v in node.items()}


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _structural(node: Schema) -> Schema:
    """Rewrite one resolved pydantic schema node (recursively) into structural form."""
    node = dict(node)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        if node.get("x-kubernetes-int-or-string"):
            return {k: v for k, v in node.items() if k not in _DROP_KEYS}
        non_null = [alt for alt in any_of if alt.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"cannot express anyOf {any_of!r} structurally")
        merged = {**non_null[0], **{k: v for k, v in node.items() if k != "default" or v is not None}}
        return _structural(merged)
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "additionalProperties":
            if value is False:
                continue
            out[key] = _structural(value)
        elif key == "properties":
            out[key] = {name: _structural(prop) for name, prop in value.items()}
        elif key == "items":
            out[key] = _structural(value)
        elif key == "default":
            if value is None:
                continue
            out[key] = _without_nulls(value)
        elif key == "const":
            out["enum"] = [value]
        elif key in _EXCLUSIVE_BOUNDS and not isinstance(value, bool):
            # JSON Schema 2020-12 (pydantic) gives the bound; OpenAPI v3.0 (Kubernetes) a flag on it.
            out[_EXCLUSIVE_BOUNDS[key]] = value
            out[key] = True
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def model_schema(model: type[Any]) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(_resolve(raw, defs))


# A field read `self.a.b.c` (group 1: ".a.b.c"); group 2 is set where the last name is a method call
# (`self.a.steps.all(...)`, `self.a.uri.matches(...)`), not a field.
_READ = re.compile(r"\bself((?:\.[A-Za-z_]\w*)+)(\s*\()?")
_GUARD = re.compile(r"^!has\(self((?:\.[A-Za-z_]\w*)+)\) \|\| ")
_PATH_NAMES = re.compile(r"\.([A-Za-z_]\w*)")


def _object_depth(schema: Schema, path: Sequence[str]) -> int:
    """How many leading names of `path` are nested object properties of `schema` (not a map's keys, not a
    list's items)."""
    node = schema
    for depth, name in enumerate(path):
        child = (node.get("properties") or {}).get(name)
        if not isinstance(child, dict) or child.get("type") != "object" or "properties" not in child:
            return depth
        node = child
    return len(path)


def _common_prefix(paths: Sequence[Sequence[str]]) -> tuple[str, ...]:
    prefix: list[str] = []
    for names in zip(*paths, strict=False):
        if any(name != names[0] for name in names):
            break
        prefix.append(names[0])
    return tuple(prefix)


def _reads_under(cel: str, limit: Sequence[str], spec: Schema) -> tuple[str, ...]:
    """The deepest object under `spec` that holds every field `cel` reads, no deeper than `limit`."""
    parents = []
    for match in _READ.finditer(cel):
        names = match.group(1).split(".")[1:]
        if match.group(2):
            names = names[:-1]
        parents.append(names[:-1])
    prefix = _common_prefix([*parents, list(limit)])
    return prefix[: _object_depth(spec, prefix)]


def place_rule(cel: str, field_path: str, spec: Schema) -> tuple[tuple[str, ...], str, str]:
    """Where under `spec` a spec rule is evaluated: (the path of the object it moves to, its CEL and its
    fieldPath relative to that object; fieldPath "" when it names the object itself).

    The apiserver evaluates every rule of a PDDeployment on every write, its status patches included (the
    spec unchanged), and each field a rule reads costs it a copy of the parent object's property schemas
    (kube-apiserver 1.36's `model.Structural.Properties`, about 60% of the rules' time in a CPU profile).
    A rule that reads only `spec.prefill`'s fields is cheaper on `spec.prefill` (`self.parallelism.data`
    rather than `self.prefill.parallelism.data`): same refusal, same message, same field named. A leading
    `!has(self.X) || ` guard is dropped when the rule moves to X itself or under it (a rule on X runs only
    where X is set)."""
    limit = [*_PATH_NAMES.findall(field_path.split("[", 1)[0])]
    guard = _GUARD.match(cel)
    path: tuple[str, ...] = ()
    body = cel
    if guard:
        guarded = tuple(guard.group(1).split(".")[1:])
        unguarded = cel[guard.end() :]
        under = _reads_under(unguarded, limit, spec)
        if under[: len(guarded)] == guarded:
            path, body = under, unguarded
    if not path:
        path, body = _reads_under(cel, limit, spec), cel
    if not path:
        return (), cel, field_path
    dotted = "".join(f".{name}" for name in path)
    moved = re.sub(rf"\bself{re.escape(dotted)}(?=\.[A-Za-z_])", "self", body)
    return path, moved, field_path[len(dotted) :]


def _status_schema() -> Schema:
    status = model_schema(PDDeploymentStatus)
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    # Defaulted on read, so a PDDeployment the operator has not seen yet shows observedGeneration 0
    # (kstatus: InProgress) rather than no status at all (kstatus: Current).
    status["default"] = {}
    return status


def spec_schema(place_rules: bool = True) -> Schema:
    """The spec's schema with each rule of `rules.SPEC_RULES` on the deepest object it reads (`place_rule`),
    in `SPEC_RULES`' order on each object; with `place_rules` False, every rule on spec itself (as before
    the placement; bench/crd_write_cost.py compares the two)."""
    spec = model_schema(PDDeploymentSpec)
    for rule in rules.SPEC_RULES:
        if place_rules:
            path, cel, field_path = place_rule(rule.cel, rule.field_path, spec)
        else:
            path, cel, field_path = (), rule.cel, rule.field_path
        node = spec
        for name in path:
            node = node["properties"][name]
        placed: Schema = {"rule": cel, "message": rule.message, "reason": rule.reason}
        if field_path:
            placed["fieldPath"] = field_path
        node.setdefault("x-kubernetes-validations", []).append(placed)
    return spec


def crd(place_rules: bool = True) -> Schema:
    """The whole CustomResourceDefinition object (`place_rules`: see `spec_schema`)."""
    printer_columns = [
        {"name": "Mode", "type": "string", "jsonPath": ".status.mode"},
        {"name": "Prefill", "type": "string", "jsonPath": ".status.pools.prefill.ready"},
        {"name": "Decode", "type": "string", "jsonPath": ".status.pools.decode.ready"},
        {"name": "Colocated", "type": "string", "jsonPath": ".status.pools.colocated.ready", "priority": 1},
        # A replica's shape (pods x GPUs per pod, parallelism; docs/multinode.md): -o wide.
        {"name": "Prefill Shape", "type": "string", "jsonPath": ".status.pools.prefill.shape", "priority": 1},
        {"name": "Decode Shape", "type": "string", "jsonPath": ".status.pools.decode.shape", "priority": 1},
        {
            "name": "Colocated Shape",
            "type": "string",
            "jsonPath": ".status.pools.colocated.shape",
            "priority": 1,
        },
        {"name": "Autoscaling", "type": "string", "jsonPath": ".status.autoscaling.mode", "priority": 1},
        {"name": "Max GPUs", "type": "integer", "jsonPath": ".spec.maxGPUs", "priority": 1},
        {"name": "Rollout", "type": "string", "jsonPath": ".status.rollout.phase"},
        {"name": "Weight", "type": "integer", "jsonPath": ".status.rollout.weight", "priority": 1},
        # A revision change of the P/D pair (its own rollout under spec.rollout): -o wide.
        {"name": "Revision", "type": "string", "jsonPath": ".status.revisions.current.id", "priority": 1},
        {
            "name": "Rev Rollout",
            "type": "string",
            "jsonPath": ".status.revisions.rollout.phase",
            "priority": 1,
        },
        {"name": "Rev Weight", "type": "integer", "jsonPath": ".status.revisions.weight", "priority": 1},
        # spec.router.disaggregation's mode in effect (status.disaggregation; absent: Always): -o wide.
        {
            "name": "Disaggregation",
            "type": "string",
            "jsonPath": ".status.disaggregation.mode",
            "priority": 1,
        },
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    root: Schema = {
        "type": "object",
        "description": "PDDeployment serves one model on vLLM with separate prefill and decode pools.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # Declared so that the name rule's fieldPath resolves: its refusals name metadata.name.
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": spec_schema(place_rules),
            "status": _status_schema(),
        },
        "x-kubernetes-validations": [
            {
                "rule": rules.NAME_RULE.cel,
                "message": rules.NAME_RULE.message,
                "reason": rules.NAME_RULE.reason,
                "fieldPath": rules.NAME_RULE.field_path,
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{meta.PLURAL}.{meta.GROUP}",
            "labels": {meta.LABEL_PART_OF: meta.APP_NAME},
        },
        "spec": {
            "group": meta.GROUP,
            "names": {
                "kind": meta.KIND,
                "listKind": f"{meta.KIND}List",
                "plural": meta.PLURAL,
                "singular": meta.SINGULAR,
                "shortNames": list(meta.SHORT_NAMES),
                "categories": ["tandem"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": meta.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `tandem crd` from operator/tandem/api; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


def main(argv: Sequence[str]) -> int:
    if argv:
        print("usage: tandem crd  (prints the CRD YAML)", file=sys.stderr)
        return 2
    sys.stdout.write(crd_yaml())
    return 0
