"""A small typed REST layer over the official `kubernetes` client for the operator.

The operator handles every kind generically (plain dicts in, plain dicts out), so it talks to
paths rather than to the generated per-kind APIs: get, list by label, server-side apply, delete,
status merge-patch and event creation. Calls are synchronous; the controller runs them in a
thread. Every write is counted in `writes`, and every request in `requests` (by method and
resource), which the operator exports as metrics.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import kubernetes

from tandem.api import meta

Obj = dict[str, Any]
Objs = list[Obj]  # a name that the method `KubeRest.list` does not shadow

USER_AGENT = "tandem-operator/0.1.0"


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (0 for a connection failure), `causes` the
    reasons of the Status's `details.causes`."""

    def __init__(self, status: int, reason: str, message: str, causes: tuple[str, ...] = ()) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes

    @property
    def namespace_terminating(self) -> bool:
        """A create refused because its namespace is being deleted: the apiserver's 403 with the
        `NamespaceTerminating` cause. Nothing in that namespace can be created again."""
        return self.status == 403 and "NamespaceTerminating" in self.causes


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the API."""

    api_version: str
    kind: str
    plural: str

    @property
    def group_version_path(self) -> str:
        """The discovery document of the kind's group-version: `/apis/apps/v1`, `/api/v1`."""
        return f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"

    def collection(self, namespace: str | None) -> str:
        base = self.group_version_path
        return f"{base}/namespaces/{namespace}/{self.plural}" if namespace else f"{base}/{self.plural}"

    def path(self, namespace: str, name: str) -> str:
        return f"{self.collection(namespace)}/{name}"


PDDEPLOYMENT = Kind(meta.API_VERSION, meta.KIND, meta.PLURAL)
POD = Kind("v1", "Pod", "pods")
EVENT = Kind("v1", "Event", "events")


def resource_of(path: str) -> str:
    """The resource a request path names: `/apis/apps/v1/namespaces/ns/statefulsets/x/status`
    -> `statefulsets/status`, `/api/v1/pods` -> `pods`; a group-version's own path (its discovery
    document, `/apis/apps/v1`) -> `discovery`."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if "namespaces" in parts:
        at = parts.index("namespaces")
        rest = parts[at + 2 :]
        if not rest:  # a namespace itself
            return "namespaces"
    else:
        rest = parts[3:] if parts[:1] == ["apis"] else parts[2:]
    if not rest:
        return "discovery"
    return f"{rest[0]}/{rest[2]}" if len(rest) > 2 else rest[0]


def load_api_client(pool_size: int = 0) -> Any:
    """An ApiClient from the in-cluster service account, else from KUBECONFIG / ~/.kube/config.

    `pool_size`: connections kept open for concurrent calls (the client's default, 5 per CPU, when
    0); a call beyond it opens and then drops a connection of its own, a TLS handshake each time.
    """
    configuration = kubernetes.client.Configuration()
    if pool_size:
        configuration.connection_pool_maxsize = pool_size
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    client = kubernetes.client.ApiClient(configuration)
    client.user_agent = USER_AGENT
    return client


# Characters YAML does not allow unescaped (its printable set, YAML 1.2 5.1).
_NOT_YAML_PRINTABLE = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def apply_body(obj: Obj) -> bytes:
    """An apply patch as the apiserver reads it (YAML, of which JSON is a subset). json.dumps' ASCII
    output writes a character beyond the BMP (an emoji in an image name, say) as a surrogate pair of
    \\u escapes, which YAML refuses; its UTF-8 output carries control characters YAML refuses too.
    So: UTF-8, with only the characters YAML cannot carry escaped (all in the BMP, none a surrogate)."""
    text = json.dumps(obj, ensure_ascii=False)
    return _NOT_YAML_PRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode()


def decode_body(status: int, raw: bytes) -> Obj:
    """A response's body as the JSON object the apiserver sends. Anything else (an HTML error page
    from a proxy or load balancer in front of the apiserver, a truncated body) is a KubeError that
    quotes its start, so a pass fails as on any refused call instead of with a JSONDecodeError."""
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        return data
    start = raw[:300].decode("utf-8", "replace")
    raise KubeError(status, "InvalidResponse", f"the response is not a JSON object: {start!r}")


@dataclass
class WatchEvent:
    """One event of a watch: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR, and its object."""

    type: str
    object: Obj


def parse_watch_lines(chunks: Iterable[bytes]) -> Iterator[WatchEvent]:
    """Watch events from a response body's chunks: one JSON object a line, split anywhere."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                data = json.loads(line)
                yield WatchEvent(str(data.get("type", "")), data.get("object") or {})
    if pending.strip():
        data = json.loads(pending)
        yield WatchEvent(str(data.get("type", "")), data.get("object") or {})


class KubeRest:
    """Generic, thread-safe calls against one apiserver."""

    def __init__(self, api_client: Any, field_manager: str = meta.FIELD_MANAGER) -> None:
        self._client = api_client
        self._field_manager = field_manager
        self._lock = threading.Lock()
        self.writes: Counter[tuple[str, str]] = Counter()  # (verb, kind) -> count
        self.requests: Counter[tuple[str, str]] = Counter()  # (method, resource) -> count
        # Write-through to watch caches (`tandem.kube.informer.Cache`): every object a write
        # returns, and every object deleted.
        self.on_written: Callable[[Kind, Obj], None] | None = None
        self.on_deleted: Callable[[Kind, str, str], None] | None = None

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, str] | None = None,
        body: Obj | bytes | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Obj:
        with self._lock:
            self.requests[(method, resource_of(path))] += 1
        if query:
            path = f"{path}?{urlencode(query)}"
        headers = {"Accept": "application/json", "Content-Type": content_type}
        serialized = self._client.param_serialize(
            method=method, resource_path=path, header_params=headers, auth_settings=["BearerToken"]
        )
        _method, url, header_params, _body, _post = serialized
        try:
            response = self._client.call_api(
                method, url, header_params=header_params, body=body, _request_timeout=timeout
            )
            raw = response.read()
            status = int(response.status)
        except kubernetes.client.exceptions.ApiException as exc:
            raw = exc.body or b""
            status = int(exc.status or 0)
        except Exception as exc:  # connection refused, TLS failure, timeout
            raise KubeError(0, type(exc).__name__, str(exc)) from exc
        data = decode_body(status, raw)
        if status >= 400:
            details = data.get("details")
            causes = details.get("causes") if isinstance(details, dict) else None
            raise KubeError(
                status,
                str(data.get("reason", "")),
                str(data.get("message", raw[:300].decode("utf-8", "replace"))),
                tuple(str(c.get("reason", "")) for c in causes or [] if isinstance(c, dict)),
            )
        return data

    def _count(self, verb: str, kind: str) -> None:
        with self._lock:
            self.writes[(verb, kind)] += 1

    def _written(self, kind: Kind, obj: Obj) -> Obj:
        if self.on_written is not None:
            self.on_written(kind, obj)
        return obj

    def _stream(self, method: str, path: str, query: dict[str, str], timeout: float) -> Iterator[bytes]:
        """A streamed response's body, chunk by chunk (a watch)."""
        with self._lock:
            self.requests[("WATCH", resource_of(path))] += 1
        url_path = f"{path}?{urlencode(query)}"
        headers = {"Accept": "application/json"}
        _m, url, header_params, _b, _p = self._client.param_serialize(
            method=method, resource_path=url_path, header_params=headers, auth_settings=["BearerToken"]
        )
        try:
            response = self._client.call_api(
                method, url, header_params=header_params, _request_timeout=(10, timeout)
            )
        except kubernetes.client.exceptions.ApiException as exc:
            raw = exc.body or b""
            data = decode_body(int(exc.status or 0), raw if isinstance(raw, bytes) else str(raw).encode())
            raise KubeError(
                int(exc.status or 0), str(data.get("reason", "")), str(data.get("message", ""))
            ) from exc
        except Exception as exc:  # connection refused, TLS failure, timeout
            raise KubeError(0, type(exc).__name__, str(exc)) from exc
        raw_response = response.response
        status = int(response.status)
        try:
            if status >= 400:
                data = decode_body(status, raw_response.read())
                raise KubeError(status, str(data.get("reason", "")), str(data.get("message", "")))
            yield from raw_response.stream(amt=None, decode_content=False)
        finally:
            raw_response.release_conn()

    def get(self, kind: Kind, namespace: str, name: str) -> Obj | None:
        try:
            return self.request("GET", kind.path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: Kind, namespace: str | None, label_selector: str = "") -> list[Obj]:
        query = {"labelSelector": label_selector} if label_selector else None
        items: list[Obj] = self.request("GET", kind.collection(namespace), query).get("items", [])
        for item in items:  # list items come without their type
            item.setdefault("apiVersion", kind.api_version)
            item.setdefault("kind", kind.kind)
        return items

    def list_with_version(
        self, kind: Kind, namespace: str | None, label_selector: str = ""
    ) -> tuple[Objs, str]:
        """A list and its resourceVersion, from which a watch starts (`watch`)."""
        query = {"labelSelector": label_selector} if label_selector else None
        data = self.request("GET", kind.collection(namespace), query)
        items: Objs = data.get("items") or []
        for item in items:
            item.setdefault("apiVersion", kind.api_version)
            item.setdefault("kind", kind.kind)
        return items, str((data.get("metadata") or {}).get("resourceVersion") or "")

    def watch(
        self, kind: Kind, namespace: str | None, query: dict[str, str], timeout: float
    ) -> Iterator[WatchEvent]:
        """The events of a watch of `kind` (`query`: resourceVersion, labelSelector, timeoutSeconds...),
        as `WatchEvent`s, until the apiserver ends it."""
        yield from parse_watch_lines(self._stream("GET", kind.collection(namespace), query, timeout))

    def apply(self, kind: Kind, obj: Obj, field_manager: str | None = None) -> Obj:
        """Server-side apply, taking over conflicting fields.

        Under the operator's field manager unless `field_manager` names another one (the hand-over
        of a pool's replicas to an HPA keeps `spec.replicas` owned by a second manager).
        """
        self._count("apply", kind.kind)
        md = obj["metadata"]
        query = {"fieldManager": field_manager or self._field_manager, "force": "true"}
        body = apply_body(obj)
        return self._written(
            kind,
            self.request(
                "PATCH", kind.path(md["namespace"], md["name"]), query, body, "application/apply-patch+yaml"
            ),
        )

    def annotate(self, kind: Kind, namespace: str, name: str, annotations: dict[str, str | None]) -> Obj:
        """Merge-patch an object's annotations; a `None` value removes that annotation."""
        self._count("patch", kind.kind)
        return self._written(
            kind,
            self.request(
                "PATCH",
                kind.path(namespace, name),
                {"fieldManager": self._field_manager},
                {"metadata": {"annotations": annotations}},
                "application/merge-patch+json",
            ),
        )

    def delete(self, kind: Kind, namespace: str, name: str, uid: str | None = None) -> None:
        """Delete in the background (children go by garbage collection); a uid guards against races."""
        self._count("delete", kind.kind)
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", kind.path(namespace, name), body=body)
        except KubeError as exc:
            if exc.status not in (404, 409):
                raise
            if exc.status == 409:  # another object of that name now (the uid precondition)
                return
        if self.on_deleted is not None:
            self.on_deleted(kind, namespace, name)

    def patch_status(
        self, kind: Kind, namespace: str, name: str, status: Obj, resource_version: str | None = None
    ) -> Obj:
        """Merge-patch `status` (a `None` value removes a field).

        With `resource_version`, the patch applies only to that version of the object: a write by
        anyone else since it was read fails with 409 Conflict instead of being overwritten.
        """
        self._count("patch-status", kind.kind)
        body: Obj = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self._written(
            kind,
            self.request(
                "PATCH",
                kind.path(namespace, name) + "/status",
                {"fieldManager": self._field_manager},
                body,
                "application/merge-patch+json",
            ),
        )

    def create_event(self, namespace: str, event: Obj) -> None:
        self._count("create", "Event")
        self.request("POST", EVENT.collection(namespace), body=event)
