"""Helpers for tests that build PDDeployment manifests from a base spec and a patch (unit tests of the
API rules, render and the autoscaler, and the integration tests of validation). Pure.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


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
