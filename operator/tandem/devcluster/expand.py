"""What a kubelet does to a container before it starts it: env resolution and `$(VAR)` expansion.

Pure functions over plain pod dicts (camelCase, as the API returns them); Secret and ConfigMap
reads are passed in as callables.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.utils.quantity import parse_quantity

# (namespace, name, key) -> value, or None when the object or key does not exist.
KeyLookup = Callable[[str, str, str], str | None]
# (namespace, name) -> all data of the object, or None when it does not exist.
ObjectLookup = Callable[[str, str], dict[str, str] | None]


class ConfigError(ValueError):
    """The container's env cannot be resolved (kubelet: CreateContainerConfigError)."""


def expand(text: str, mapping: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: `$$` is a literal `$`; unknown or unclosed references stay."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "$" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(mapping[name] if name in mapping and name else text[i : end + 1])
            i = end + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: Mapping[str, Any], path: str) -> str:
    """The value of a downward-API `fieldRef.fieldPath` for `pod`."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.hostIPs": ",".join(x["ip"] for x in status.get("hostIPs") or []),
        "status.podIPs": ",".join(x["ip"] for x in status.get("podIPs") or []),
    }
    if path in simple:
        return str(simple[path] or "")
    m = _SUBSCRIPT.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise ConfigError(f"unsupported fieldRef.fieldPath {path!r}")


def resource_field_ref(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """`resourceFieldRef`: the container's limit (else request) divided by the divisor, rounded up."""
    kind, _, res = str(ref["resource"]).partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(res)
    if value is None and kind == "limits":
        value = (resources.get("requests") or {}).get(res)
    if value is None:
        return "0"
    divisor = parse_quantity(str(ref.get("divisor") or "1"))  # type: ignore[no-untyped-call]
    amount = parse_quantity(str(value))  # type: ignore[no-untyped-call]
    return str(math.ceil(amount / divisor))


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    secret_key: KeyLookup,
    configmap_key: KeyLookup,
    secret: ObjectLookup,
    configmap: ObjectLookup,
) -> dict[str, str]:
    """The container's environment, in the kubelet's order: envFrom, then env (later wins)."""
    ns = str(pod.get("metadata", {}).get("namespace", "default"))
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        prefix = str(src.get("prefix") or "")
        ref = src.get("configMapRef") or src.get("secretRef")
        if ref is None:
            continue
        data = (configmap if "configMapRef" in src else secret)(ns, ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise ConfigError(
                f"{'configmap' if 'configMapRef' in src else 'secret'} {ref['name']!r} not found"
            )
        for k, v in data.items():
            env[prefix + k] = v
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(str(item.get("value") or ""), env)
            continue
        vf = item["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_ref(pod, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            env[name] = resource_field_ref(container, vf["resourceFieldRef"])
        elif "secretKeyRef" in vf or "configMapKeyRef" in vf:
            is_secret = "secretKeyRef" in vf
            ref = vf["secretKeyRef" if is_secret else "configMapKeyRef"]
            value = (secret_key if is_secret else configmap_key)(ns, ref["name"], ref["key"])
            if value is None:
                if ref.get("optional"):
                    continue
                kind = "secret" if is_secret else "configmap"
                raise ConfigError(f"{kind} {ref['name']!r} key {ref['key']!r} not found")
            env[name] = value
        else:
            raise ConfigError(f"env {name!r}: unsupported valueFrom {sorted(vf)}")
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expanded from the container's env."""
    return [expand(str(a), env) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
