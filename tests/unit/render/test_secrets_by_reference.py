"""Secrets only by reference: no API field takes a secret's value, and no rendered object carries one.

- The CRD schema: every property whose name speaks of a secret, token, password, credential or API
  key is a reference (a Secret's name, a list of names, or `{name, key}`), never a free value.
- Rendered objects (every example, plus a spec with a token, pull secrets and an env var from a
  Secret): no Secret object; the token reaches the engine as `valueFrom.secretKeyRef`; no env var
  with a secret-like name has a literal value; a marker planted as the Secret's content (which the
  operator never reads) appears nowhere.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeployment
from tandem.render import render

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "crds" / "pddeployment.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SECRETISH = re.compile(r"secret|token|password|passwd|credential|api_?keys?", re.IGNORECASE)
# Properties that merely count or describe tokens (prompt/generation tokens), not credentials.
NOT_CREDENTIALS = re.compile(r"[a-z]Tokens|^tokens|PerToken|TokenBurst")
MARKER = "hf_SECRET_VALUE_4c1d"


def _properties(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    for name, sub in (schema.get("properties") or {}).items():
        found.append((f"{path}.{name}", sub))
        found += _properties(sub, f"{path}.{name}")
    if "items" in schema:
        found += _properties(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += _properties(schema["additionalProperties"], f"{path}{{}}")
    return found


def _is_reference(name: str, schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "object":  # {name, key} or a secretKeyRef-like selector
        return {"name"} <= set(schema.get("properties") or {}) and "value" not in (
            schema.get("properties") or {}
        )
    if kind == "array":  # names of Secrets
        return name.endswith("Secrets") and (schema.get("items") or {}).get("type") == "string"
    if kind == "string":  # the name of a Secret
        return name.endswith(("Secret", "SecretName")) or "Secret in the namespace" in schema.get(
            "description", ""
        )
    return False


def test_no_api_field_takes_a_secret_value() -> None:
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    checked = []
    for path, sub in _properties(schema, "spec"):
        name = path.rsplit(".", 1)[-1].rstrip("[]{}")
        if not SECRETISH.search(name) or NOT_CREDENTIALS.search(name):
            continue
        checked.append(path)
        assert _is_reference(name, sub), f"{path} looks like it holds a secret's value: {sub}"
    assert {"spec.model.tokenSecretRef", "spec.engine.imagePullSecrets"} <= set(checked), checked


def _spec_with_secrets() -> PDDeployment:
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-pd-nixl.yaml").read_text())
    doc["metadata"]["namespace"] = "ns"
    engine = doc["spec"]["engine"]
    engine["imagePullSecrets"] = ["registry-creds"]
    engine["env"] = [
        *engine.get("env", []),
        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}},
    ]
    doc["spec"]["router"] = {**doc["spec"].get("router", {}), "imagePullSecrets": ["router-creds"]}
    return PDDeployment.model_validate(doc)


def _templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a workload: a LeaderWorkerSet's leader and worker templates too."""
    spec = obj.get("spec") or {}
    group = spec.get("leaderWorkerTemplate") or {}
    return [t for t in (spec.get("template"), group.get("leaderTemplate"), group.get("workerTemplate")) if t]


def _env_vars(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for obj in objects:
        for template in _templates(obj):
            for container in template["spec"]["containers"]:
                found += container.get("env", [])
    return found


@pytest.mark.parametrize(
    "pdd",
    [PDDeployment.model_validate(yaml.safe_load(p.read_text())) for p in EXAMPLES] + [_spec_with_secrets()],
    ids=[p.stem for p in EXAMPLES] + ["token-pull-secrets-env-from-secret"],
)
def test_rendered_objects_carry_no_secret_value(pdd: PDDeployment) -> None:
    objects = render(pdd)
    assert not [o for o in objects if o["kind"] == "Secret"]
    for env in _env_vars(objects):
        if SECRETISH.search(env["name"]):
            assert "value" not in env, f"{env['name']} has a literal value"
            assert "secretKeyRef" in env["valueFrom"], env
    token = pdd.spec.model.token_secret_ref
    hf = [e for e in _env_vars(objects) if e["name"] == "HF_TOKEN"]
    if token is not None:
        assert hf
        assert all(
            e == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}}
            for e in hf
        )
    else:
        assert not hf
    assert MARKER not in json.dumps(objects)
