"""Helpers for tests against the dev cluster: polling, pod listing, a pod the runner can run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client

from tandem.devcluster import kube

T = TypeVar("T")


def eventually(fn: Callable[[], T | None], *, timeout: float = 90, what: str = "condition") -> T:
    """Polls `fn` every half second until it returns something truthy, and returns that."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except Exception as e:
            last = e
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last error: {last!r}")


def pods(core: client.CoreV1Api, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    """The namespace's pods as plain dicts (camelCase, as the API sends them)."""
    resp = core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    return list(kube.raw(resp)["items"])


def runner_test_pod(name: str, *extra: str, port: int = 9400, **meta: Any) -> dict[str, Any]:
    """A pod the runner runs: `tandem dev testserver` on the pod IP, Ready when /health answers."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": "tandem:dev",
                    "command": ["tandem", "dev", "testserver"],
                    "args": ["--host", "$(POD_IP)", "--port", str(port), *extra],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    "ports": [{"name": "http", "containerPort": port}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
                }
            ],
        },
    }
