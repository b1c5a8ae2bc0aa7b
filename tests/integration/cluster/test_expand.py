"""The runner's env resolution and `$(VAR)` expansion (pure; no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.devcluster import expand


def test_expand_follows_kubernetes_rules() -> None:
    env = {"A": "1", "B": "two"}
    assert expand.expand("$(A)-$(B)", env) == "1-two"
    assert expand.expand("$(MISSING)", env) == "$(MISSING)"
    assert expand.expand("$$(A)", env) == "$(A)"
    assert expand.expand("cost $5 $(A", env) == "cost $5 $(A"
    assert expand.expand("$()", env) == "$()"


POD: dict[str, Any] = {
    "metadata": {"name": "p0", "namespace": "ns", "uid": "u1", "labels": {"role": "decode"}},
    "spec": {"nodeName": "h100-rdma-0", "serviceAccountName": "default"},
    "status": {"podIP": "127.20.1.5", "hostIP": "127.0.0.1", "podIPs": [{"ip": "127.20.1.5"}]},
}


def _env(container: dict[str, Any]) -> dict[str, str]:
    secrets = {("ns", "tok"): {"token": "s3cret"}}
    cms = {("ns", "cfg"): {"mode": "pd", "level": "debug"}}
    return expand.container_env(
        POD,
        container,
        secret_key=lambda ns, n, k: secrets.get((ns, n), {}).get(k),
        configmap_key=lambda ns, n, k: cms.get((ns, n), {}).get(k),
        secret=lambda ns, n: secrets.get((ns, n)),
        configmap=lambda ns, n: cms.get((ns, n)),
    )


def test_container_env_and_argv() -> None:
    container = {
        "command": ["tandem", "engine", "serve", "m"],
        "args": ["--host", "$(POD_IP)", "--name", "$(NAME).$(NS)", "--tok", "$(TOKEN)", "$(UNSET)"],
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
            {"name": "URL", "value": "http://$(POD_IP):8000"},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": True}}},
        ],
    }
    env = _env(container)
    assert env["POD_IP"] == "127.20.1.5"
    assert env["NODE"] == "h100-rdma-0"
    assert env["HOST"] == "127.0.0.1"
    assert env["ROLE"] == "decode"
    assert env["TOKEN"] == "s3cret"
    assert env["MODE"] == "pd"
    assert env["CFG_level"] == "debug"
    assert env["URL"] == "http://127.20.1.5:8000"
    assert "OPT" not in env
    argv = expand.container_argv(container, env)
    assert argv == [
        "tandem", "engine", "serve", "m",
        "--host", "127.20.1.5", "--name", "p0.ns", "--tok", "s3cret", "$(UNSET)",
    ]  # fmt: skip


def test_missing_secret_is_a_config_error() -> None:
    container = {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]}
    with pytest.raises(expand.ConfigError, match="nope"):
        _env(container)


def test_resource_field_ref() -> None:
    container = {
        "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "2Gi"}, "requests": {"cpu": "1500m"}}
    }
    ref = expand.resource_field_ref
    assert ref(container, {"resource": "limits.nvidia.com/gpu"}) == "8"
    assert ref(container, {"resource": "limits.memory", "divisor": "1Mi"}) == "2048"
    assert ref(container, {"resource": "requests.cpu"}) == "2"
