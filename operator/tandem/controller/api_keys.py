"""Whether the router's API keys Secret (spec.router.auth.apiKeysSecret) exists and can be used.

Only the cluster can tell, so the operator reads the Secret on every pass and reports a problem
naming the Secret and the field (the PDDeployment turns Stalled, reason ConfigError). The router
checks the same itself and refuses every request while it has no usable keys (it fails closed).
"""

from __future__ import annotations

import base64
import binascii

from tandem.api.models import PDDeployment
from tandem.kube.rest import Kind, KubeRest, Obj
from tandem.routing.tenants import KeysError, parse_keys
from tandem.status.derive import PodProblem

FIELD = "spec.router.auth.apiKeysSecret"
SECRET = Kind("v1", "Secret", "secrets")


def keys_problem(secret: Obj | None, name: str) -> str | None:
    """Why the keys Secret cannot be used (None: it can)."""
    if secret is None:
        return f"Secret {name!r} ({FIELD}) not found"
    data: dict[str, str] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            data[key] = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError, TypeError):
            return f"Secret {name!r} ({FIELD}): entry {key!r} is not UTF-8 text"
    try:
        parse_keys(data)
    except KeysError as error:
        return f"Secret {name!r} ({FIELD}): {error}"
    return None


def api_keys_problems(kube: KubeRest, pdd: PDDeployment) -> list[PodProblem]:
    name = pdd.spec.router.auth.api_keys_secret
    if name is None:
        return []
    problem = keys_problem(kube.get(SECRET, pdd.metadata.namespace, name), name)
    return [] if problem is None else [PodProblem("", "", "ConfigError", problem)]
