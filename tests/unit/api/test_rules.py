"""Each validation rule refuses its counter-example with a message that names the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tandem.api import rules
from tandem.api.models import PDDeployment, PDDeploymentSpec

CASES = yaml.safe_load((Path(__file__).parents[2] / "data" / "invalid-specs.yaml").read_text())


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def test_base_spec_is_valid() -> None:
    spec = PDDeploymentSpec.model_validate(CASES["base"])
    assert rules.spec_violations(spec.model_dump(by_alias=True, mode="json")) == []


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["id"] for c in CASES["cases"]])
def test_models_refuse_with_the_rule_message(case: dict[str, Any]) -> None:
    obj = {
        "metadata": {"name": case.get("name", "llama")},
        "spec": merge(CASES["base"], case.get("spec", {})),
    }
    with pytest.raises(ValidationError) as info:
        PDDeployment.model_validate(obj)
    assert case["message"] in str(info.value)


def test_every_rule_has_a_counter_example() -> None:
    messages = [c["message"] for c in CASES["cases"]]
    for rule in (*rules.SPEC_RULES, rules.NAME_RULE):
        assert any(rule.message.startswith(m) or m in rule.message for m in messages), rule.message


@pytest.mark.parametrize(
    ("uri", "valid"),
    [
        ("hf://meta-llama/Llama-3.1-8B-Instruct", True),
        ("hf://meta-llama/Llama-3.1-8B-Instruct@main", True),
        ("hf://just-a-name", False),
        ("pvc://models", True),
        ("pvc://models/llama/8b", True),
        ("pvc://Models/x", False),
        ("file:///models/llama", True),
        ("file://relative", False),
        ("https://example.invalid/model", False),
    ],
)
def test_model_uri_schemes(uri: str, valid: bool) -> None:
    spec = merge(CASES["base"], {"model": {"uri": uri}})
    if valid:
        PDDeploymentSpec.model_validate(spec)
    else:
        with pytest.raises(ValidationError, match=r"spec\.model\.uri must be"):
            PDDeploymentSpec.model_validate(spec)
