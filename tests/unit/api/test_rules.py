"""Each validation rule refuses its counter-example with a message that names the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tandem.api import rules
from tandem.api.models import PDDeployment, PDDeploymentSpec
from tandem.api.testing import merge

CASES = yaml.safe_load((Path(__file__).parents[2] / "data" / "invalid-specs.yaml").read_text())


def messages(case: dict[str, Any]) -> list[str]:
    """A case's expected message fragments (`message` is one string or a list of them)."""
    message = case["message"]
    return [message] if isinstance(message, str) else list(message)


def test_base_spec_is_valid() -> None:
    spec = PDDeploymentSpec.model_validate(CASES["base"])
    assert rules.spec_violations(spec.model_dump(by_alias=True, mode="json")) == []


@pytest.mark.parametrize("case", CASES["valid"], ids=[c["id"] for c in CASES["valid"]])
def test_models_accept_the_valid_cases(case: dict[str, Any]) -> None:
    spec = PDDeploymentSpec.model_validate(merge(CASES["base"], case["spec"]))
    assert rules.spec_violations(spec.model_dump(by_alias=True, mode="json")) == []


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["id"] for c in CASES["cases"]])
def test_models_refuse_with_the_rule_message(case: dict[str, Any]) -> None:
    obj = {
        "metadata": {"name": case.get("name", "llama")},
        "spec": merge(CASES["base"], case.get("spec", {})),
    }
    with pytest.raises(ValidationError) as info:
        PDDeployment.model_validate(obj)
    for message in messages(case):
        assert message in str(info.value)


def test_every_rule_has_a_counter_example() -> None:
    messages = [c["message"] for c in CASES["cases"] if isinstance(c["message"], str)]
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


def rule(message_start: str) -> rules.Rule:
    (found,) = [r for r in rules.SPEC_RULES if r.message.startswith(message_start)]
    return found


BASE_DUMP = PDDeploymentSpec.model_validate(CASES["base"]).model_dump(by_alias=True, mode="json")
SLO = {"slo": {"ttftMs": 500, "tpotMs": 50, "attainmentPercent": 95.0}}
ON = {"autoscaling": {**BASE_DUMP["autoscaling"], "enabled": True}}


def bounds(minimum: int, maximum: int, external: bool = False) -> dict[str, Any]:
    return {"minReplicas": minimum, "maxReplicas": maximum, "external": external}


# (rule's message start, patch merged into the base spec's full camelCase dump, the rule holds)
PREDICATES = [
    ("spec.decode.autoscaling.minReplicas must not", {}, True),
    ("spec.decode.autoscaling.minReplicas must not", {"decode": {"autoscaling": bounds(2, 2)}}, True),
    ("spec.decode.autoscaling.minReplicas must not", {"decode": {"autoscaling": bounds(3, 2)}}, False),
    (
        "spec.prefill.autoscaling.minReplicas must not",
        {"prefill": {"autoscaling": {"minReplicas": 9}}},
        False,
    ),
    ("spec.prefill.replicas must be within", {}, True),
    ("spec.prefill.replicas must be within", {"prefill": {"replicas": 1, "autoscaling": bounds(1, 4)}}, True),
    ("spec.prefill.replicas must be within", {"prefill": {"replicas": 4, "autoscaling": bounds(1, 4)}}, True),
    (
        "spec.prefill.replicas must be within",
        {"prefill": {"replicas": 5, "autoscaling": bounds(1, 4)}},
        False,
    ),
    (
        "spec.prefill.replicas must be within",
        {"prefill": {"replicas": 1, "autoscaling": bounds(2, 4)}},
        False,
    ),
    ("spec.colocated.replicas must be within", {"colocated": {"autoscaling": bounds(0, 2)}}, True),
    ("spec.colocated.replicas must be within", {"colocated": {"autoscaling": bounds(1, 2)}}, False),
    ("spec.decode.autoscaling needs", {}, True),
    ("spec.decode.autoscaling needs", {"decode": {"autoscaling": bounds(1, 4)}}, False),
    ("spec.decode.autoscaling needs", {"decode": {"autoscaling": bounds(1, 4)}, **ON}, True),
    ("spec.decode.autoscaling needs", {"decode": {"autoscaling": bounds(1, 4, external=True)}}, True),
    ("spec.prefill.autoscaling needs", {"decode": {"autoscaling": bounds(1, 4)}}, True),
    (
        "spec.decode.autoscaling.minReplicas must be at least 1",
        {"decode": {"autoscaling": bounds(0, 4)}},
        False,
    ),
    (
        "spec.decode.autoscaling.minReplicas must be at least 1",
        {"decode": {"autoscaling": bounds(1, 4)}},
        True,
    ),
    (
        "spec.decode.autoscaling.minReplicas must be at least 1",
        {"decode": {"replicas": 0}},
        True,
    ),  # other rule
    (
        "spec.decode.autoscaling.minReplicas must be at least 1",
        {"serving": {"mode": "Colocated"}, "decode": {"autoscaling": bounds(0, 4)}},
        True,
    ),
    (
        "spec.prefill.autoscaling.minReplicas must be at least 1",
        {"prefill": {"autoscaling": bounds(0, 4, external=True)}},
        False,
    ),
    (
        "spec.colocated.autoscaling.minReplicas must be at least 1",
        {"colocated": {"autoscaling": bounds(0, 1)}},
        True,
    ),
    (
        "spec.colocated.autoscaling.minReplicas must be at least 1",
        {"serving": {"mode": "Colocated"}, "colocated": {"autoscaling": bounds(0, 1)}},
        False,
    ),
    ("spec.autoscaling.enabled requires spec.slo", {}, True),
    ("spec.autoscaling.enabled requires spec.slo", ON, False),
    ("spec.autoscaling.enabled requires spec.slo", {**ON, **SLO}, True),
    ("spec.autoscaling.enabled requires spec.slo", SLO, True),
    ("spec.maxGPUs must be at least", {}, True),
    ("spec.maxGPUs must be at least", {"maxGPUs": 2}, True),
    ("spec.maxGPUs must be at least", {"maxGPUs": 1}, False),
    ("spec.maxGPUs must be at least", {"maxGPUs": 9, "decode": {"tensorParallelSize": 8}}, True),
    ("spec.maxGPUs must be at least", {"maxGPUs": 8, "decode": {"tensorParallelSize": 8}}, False),
    ("spec.maxGPUs must be at least", {"maxGPUs": 3, "colocated": {"replicas": 2}}, False),
    ("spec.maxGPUs must be at least", {"maxGPUs": 4, "colocated": {"replicas": 2}}, True),
    # The minimums: a pool below its autoscaling minimum (another rule's breach) still counts at the minimum.
    ("spec.maxGPUs must be at least", {"maxGPUs": 2, "decode": {"autoscaling": bounds(3, 4)}}, False),
    (
        "spec.maxGPUs must be at least",
        {"maxGPUs": 4, "decode": {"replicas": 3, "autoscaling": bounds(1, 4)}},
        True,
    ),
    (
        "spec.maxGPUs must be at least",
        {"maxGPUs": 3, "decode": {"replicas": 3, "autoscaling": bounds(1, 4)}},
        False,
    ),
    ("spec.autoscaling.prometheus.url must be", {}, True),
    (
        "spec.autoscaling.prometheus.url must be",
        {"autoscaling": {"prometheus": {"url": "http://p:9090"}}},
        True,
    ),
    (
        "spec.autoscaling.prometheus.url must be",
        {"autoscaling": {"prometheus": {"url": "https://prometheus.example/api/prom"}}},
        True,
    ),
    (
        "spec.autoscaling.prometheus.url must be",
        {"autoscaling": {"prometheus": {"url": "http://127.0.0.1:9090"}}},
        True,
    ),
    (
        "spec.autoscaling.prometheus.url must be",
        {"autoscaling": {"prometheus": {"url": "prometheus:9090"}}},
        False,
    ),
    ("spec.autoscaling.prometheus.url must be", {"autoscaling": {"prometheus": {"url": "ftp://p"}}}, False),
    ("spec.autoscaling.prometheus.url must be", {"autoscaling": {"prometheus": {"url": "http://"}}}, False),
    (
        "spec.autoscaling.prometheus.url must be",
        {"autoscaling": {"prometheus": {"url": "http://a b"}}},
        False,
    ),
]


@pytest.mark.parametrize(("message", "patch", "holds"), PREDICATES)
def test_autoscaling_predicates(message: str, patch: dict[str, Any], holds: bool) -> None:
    assert rule(message).check(merge(BASE_DUMP, patch)) is holds


@pytest.mark.parametrize("role", rules.POOLS)
def test_every_pool_has_the_autoscaling_rules(role: str) -> None:
    for start in (
        f"spec.{role}.autoscaling.minReplicas must not be greater",
        f"spec.{role}.replicas must be within",
        f"spec.{role}.autoscaling needs spec.autoscaling.enabled",
        f"spec.{role}.autoscaling.minReplicas must be at least 1 when spec.serving.mode is",
    ):
        assert rule(start).field_path.startswith(f".{role}.")


def test_cel_string_literals_escape_backslashes_and_quotes() -> None:
    assert rules._cel_string(r"^a\s'b$") == r"'^a\\s\'b$'"


def test_docs_list_every_autoscaling_message() -> None:
    """docs/autoscaling.md ("The API") quotes each autoscaling rule's message, with `<pool>` for the pool."""
    docs = (Path(__file__).parents[3] / "docs" / "autoscaling.md").read_text()
    for r in rules.SPEC_RULES:
        if any(word in r.message for word in ("autoscaling", "maxGPUs", "spec.slo")):
            generic = r.message
            for role in rules.POOLS:
                generic = generic.replace(f"spec.{role}.", "spec.<pool>.")
            assert r.message in docs or generic in docs, r.message


# engine.type sim (the base spec's): the parallelism the sim engine runs, one rule per field refused.
# (colocated pool patch, the field paths of every rule the spec breaks; colocated: no NIXL TP rule)
SIM_SHAPES = [
    ({}, []),
    ({"nodesPerInstance": 2, "parallelism": {"data": 2}}, []),  # Internal, a rank per pod
    ({"nodesPerInstance": 2, "tensorParallelSize": 16}, []),  # one rank over both pods
    ({"nodesPerInstance": 2, "parallelism": {"data": 2, "loadBalancing": "External"}}, []),
    ({"nodesPerInstance": 2, "parallelism": {"data": 4, "loadBalancing": "MultiPortExternal"}}, []),
    (
        {
            "nodesPerInstance": 2,
            "tensorParallelSize": 2,
            "parallelism": {"data": 8, "loadBalancing": "MultiPortExternal"},
        },
        [],
    ),
    ({"parallelism": {"data": 2, "loadBalancing": "MultiPortExternal"}}, []),  # one pod, two ports
    ({"parallelism": {"pipeline": 2}}, [".colocated.parallelism.pipeline"]),
    (
        {"nodesPerInstance": 2, "parallelism": {"data": 2, "expert": True, "loadBalancing": "External"}},
        [".colocated.parallelism.expert"],
    ),
    (
        {"nodesPerInstance": 2, "parallelism": {"data": 4, "loadBalancing": "Hybrid"}},
        [".colocated.parallelism.loadBalancing"],
    ),
    (
        {"nodesPerInstance": 2, "parallelism": {"data": 4}},
        [".colocated.parallelism.data"],
    ),  # Internal, 2 a pod
    ({"parallelism": {"data": 2}}, [".colocated.parallelism.data"]),
    (
        {"nodesPerInstance": 2, "parallelism": {"data": 4, "pipeline": 2, "loadBalancing": "Hybrid"}},
        [".colocated.parallelism.pipeline", ".colocated.parallelism.loadBalancing"],
    ),
]


@pytest.mark.parametrize(("pool", "fields"), SIM_SHAPES)
def test_sim_pool_shapes(pool: dict[str, Any], fields: list[str]) -> None:
    spec = merge(BASE_DUMP, {"colocated": {"replicas": 1, **pool}})
    assert [r.field_path for r in rules.SPEC_RULES if not r.check(spec)] == fields
    # The same shapes with vLLM: only the sim engine's rules refused them.
    vllm = merge(spec, {"engine": {"type": "vllm"}})
    assert [r.field_path for r in rules.SPEC_RULES if not r.check(vllm)] == []
