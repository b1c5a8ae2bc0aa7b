"""The router's Role grants `get` on its API keys Secret, by name, only when keys are configured."""

from __future__ import annotations

from tandem.render import router

from .conftest import build_pdd


def secret_rules(spec: dict[str, object] | None) -> list[dict[str, object]]:
    role = router.role(build_pdd(spec))
    return [rule for rule in role["rules"] if "secrets" in rule["resources"]]


def test_no_keys_no_secret_access() -> None:
    assert secret_rules(None) == []
    assert secret_rules({"router": {"auth": {"tenantHeader": "X-Team"}}}) == []


def test_keys_secret_readable_by_name_only() -> None:
    rules = secret_rules({"router": {"auth": {"apiKeysSecret": "llm-keys"}}})
    assert rules == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["llm-keys"], "verbs": ["get"]}
    ]
