"""Helpers for tests that build PDDeployment manifests from a base spec and a patch (unit tests of the
API rules, render and the autoscaler, and the integration tests of validation). Pure.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tandem.api import meta


def stored(spec: Mapping[str, Any], *, name: str, namespace: str) -> dict[str, Any]:
    """A PDDeployment around `spec` as the apiserver returns it to the operator (a uid, generation 1,
    resourceVersion 1)."""
    return {
        "apiVersion": meta.API_VERSION,
        "kind": meta.KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": "u1",
            "generation": 1,
            "resourceVersion": "1",
        },
        "spec": dict(spec),
    }


def merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `patch` merged in, recursively for mappings on both sides; both are left unchanged
    (the result holds copies)."""
    out = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
