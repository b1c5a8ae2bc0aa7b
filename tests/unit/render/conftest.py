"""Fixtures for render tests: `make_pdd(**spec_overrides)` builds a valid PDDeployment from a base spec."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tandem.api.models import PDDeployment
from tandem.api.testing import merge

BASE_SPEC: dict[str, Any] = {
    "model": {"name": "llama-8b", "uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
}


def build_pdd(
    spec: dict[str, Any] | None = None, *, name: str = "demo", namespace: str = "ns"
) -> PDDeployment:
    return PDDeployment.model_validate(
        {
            "apiVersion": "tandem.dev/v1alpha1",
            "kind": "PDDeployment",
            "metadata": {"name": name, "namespace": namespace, "uid": "uid-1"},
            "spec": merge(BASE_SPEC, spec or {}),
        }
    )


@pytest.fixture(scope="session")
def make_pdd() -> Callable[..., PDDeployment]:
    return build_pdd
