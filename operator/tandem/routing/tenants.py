"""Who sent a request: an API key from the keys Secret, or the trusted tenant header.

Pure. The keys Secret maps each tenant to its keys: one data entry per tenant, named after it,
holding one or more keys, one a line (blank lines and surrounding blanks ignored), so

    kubectl create secret generic llm-keys --from-literal=team-a=sk-a1 --from-literal=team-b=sk-b1

gives two tenants; a second line under an entry adds a key (rotation without downtime). The router
keeps only SHA-256 digests of the keys. The tenant's *label* (metrics, buckets) is its name when
spec.router.tenants lists it, `default` when no tenant is named (no keys and no header), and
`other` for any other name: the label's cardinality is bounded by the spec.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from tandem.api.models import TENANT_NAME_PATTERN

DEFAULT_TENANT: Final = "default"
OTHER_TENANT: Final = "other"
DEFAULT_TENANT_HEADER: Final = "X-Tenant"
MIN_KEY_LENGTH: Final = 8
_TENANT: Final = re.compile(TENANT_NAME_PATTERN)


class KeysError(ValueError):
    """The keys Secret cannot be used; the message names the entry."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys(data: Mapping[str, str]) -> dict[bytes, str]:
    """The keys Secret's (decoded) data as key digest -> tenant; raises `KeysError` naming the entry."""
    if not data:
        raise KeysError("has no entries (one per tenant: tenant name -> its API keys, one a line)")
    out: dict[bytes, str] = {}
    for tenant, value in sorted(data.items()):
        if not _TENANT.match(tenant) or len(tenant) > 63:
            raise KeysError(f"entry {tenant!r}: a tenant name is letters, digits, '-', '_' and '.'")
        keys = [line.strip() for line in value.splitlines() if line.strip()]
        if not keys:
            raise KeysError(f"entry {tenant!r} holds no key")
        for key in keys:
            if len(key) < MIN_KEY_LENGTH or any(c.isspace() for c in key):
                raise KeysError(
                    f"entry {tenant!r}: a key is at least {MIN_KEY_LENGTH} characters without blanks"
                )
            digest = _digest(key)
            if digest in out and out[digest] != tenant:
                raise KeysError(f"entry {tenant!r}: a key of it is also a key of {out[digest]!r}")
            out[digest] = tenant
    return out


@dataclass(frozen=True, slots=True)
class Unauthorized:
    message: str


@dataclass
class Tenancy:
    """How requests are attributed; `keys` is None until the Secret has been read."""

    keys_required: bool = False
    header: str = DEFAULT_TENANT_HEADER.lower()  # lower-cased, as the front stores headers
    configured: frozenset[str] = frozenset()
    keys: dict[bytes, str] | None = None
    keys_error: str | None = None  # why the last read of the keys failed, while it does
    _labels: dict[str, str] = field(default_factory=dict)

    def configure(self, *, keys_required: bool, header: str, tenants: Iterable[str]) -> None:
        self.keys_required = keys_required
        self.header = header.lower()
        self.configured = frozenset(tenants)
        self._labels = {}
        if not keys_required:
            self.keys = None
            self.keys_error = None

    @property
    def ready(self) -> bool:
        """False while keys are required but not loaded: the router then serves nobody (fails closed)."""
        return not self.keys_required or self.keys is not None

    def label(self, tenant: str) -> str:
        found = self._labels.get(tenant)
        if found is None:
            found = tenant if tenant == DEFAULT_TENANT or tenant in self.configured else OTHER_TENANT
            if len(self._labels) < 4096:  # a memo, bounded against header values sprayed by a client
                self._labels[tenant] = found
        return found

    def identify(self, headers: Mapping[str, str]) -> str | Unauthorized:
        """The tenant of a request, from its lower-cased headers."""
        if not self.keys_required:
            named = headers.get(self.header, "").strip()
            return named if named else DEFAULT_TENANT
        authorization = headers.get("authorization", "")
        scheme, _, key = authorization.strip().partition(" ")
        if not authorization:
            return Unauthorized(
                "You didn't provide an API key. Provide it in the Authorization header (Bearer <key>)."
            )
        if scheme.lower() != "bearer" or not key.strip():
            return Unauthorized("The Authorization header must be `Bearer <key>`.")
        tenant = (self.keys or {}).get(_digest(key.strip()))
        if tenant is None:
            return Unauthorized("Incorrect API key provided.")
        return tenant
