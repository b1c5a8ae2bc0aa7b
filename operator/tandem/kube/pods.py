"""Watching one PDDeployment's pods and the PDDeployment itself, for the router.

Two daemon threads run the synchronous `kubernetes` client: one lists then watches the pods that
carry the PDDeployment's selector labels, one lists then watches the PDDeployment object. Each
hands plain frozen records (`PodInfo`, `PddInfo`) to callbacks; a full relist is reported as one
`SYNC` event so the receiver can replace its view. Errors never stop a watcher: it backs off
(doubling, capped) and relists, and the receiver keeps its last view meanwhile.

The `kubernetes` package is imported only inside the threads, so importing this module (for the
records and their pure converters) stays cheap.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tandem.api.meta import (
    ANNOTATION_DRAINING,
    GROUP,
    LABEL_PDD,
    LABEL_REVISION,
    LABEL_ROLE,
    LWS_GROUP_KEY_LABEL,
    LWS_SIZE_ANNOTATION,
    LWS_WORKER_INDEX_LABEL,
    PLURAL,
    POOL_ROLES,
    VERSION,
)
from tandem.rollout.state import TARGET_SERVING

log = logging.getLogger(__name__)

PodEventKind = Literal["ADDED", "MODIFIED", "DELETED", "SYNC"]


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The part of a Pod the router routes by."""

    name: str
    pddeployment: str | None
    role: str | None
    ip: str | None
    phase: str | None
    ready: bool
    terminating: bool
    draining: bool = False  # annotated tandem.dev/draining: finishes its work, takes no new requests
    revision: str = ""  # the tandem.dev/revision label: the pod's serving revision ("" = legacy)
    # A member of a multi-node replica (a LeaderWorkerSet group): its group's key, its size, and
    # whether this pod serves the API (the leader; a worker only when it declares the http port;
    # a headless worker does not).
    group: str | None = None
    group_size: int = 1
    serves: bool = True
    # OpenAI API ports the pod serves from the engine port up: 1, or MultiPortExternal's one per local
    # data-parallel rank (its containers declare `http` and `http-1` .. `http-<n-1>`: ports 8000 + i).
    api_ports: int = 1


@dataclass(frozen=True, slots=True)
class PddInfo:
    """The part of a PDDeployment the router reads."""

    name: str
    serving_mode: str | None  # status.mode (in effect), else spec.serving.mode: Disaggregated | Colocated
    rollout_weight: int | None  # percent of traffic on P/D from status.rollout (weight and target)
    model_name: str | None  # spec.model.name: the served model name
    max_model_len: int | None  # spec.model.maxModelLen
    slo_ttft_ms: int | None = None  # spec.slo.ttftMs (set together with tpot, or neither)
    slo_tpot_ms: int | None = None  # spec.slo.tpotMs
    # (revision key, percent of P/D requests) from status.revisions, current first; key "" = legacy.
    revisions: tuple[tuple[str, int], ...] | None = None
    # spec.router's auth, tenants and admission (camelCase, as in the object): the gateway's settings.
    router_gateway: Mapping[str, Any] | None = None
    rollout_tenants: tuple[str, ...] = ()  # spec.rollout.tenants: sent to the target arm first
    # status.rollout.target while the target takes traffic (Shifting, Paused, Promoted): every request
    # of spec.rollout.tenants goes there, at any weight (0 in the tenants stage).
    rollout_target: str | None = None
    # The same for a revision rollout (status.revisions.rollout): the current revision takes them.
    revision_rollout_serving: bool = False
    # spec.router.metrics.{input,output}LengthBuckets: length bucket bounds (tokens); None: defaults.
    input_length_buckets: tuple[int, ...] | None = None
    output_length_buckets: tuple[int, ...] | None = None
    concurrency_buckets: tuple[int, ...] | None = None  # spec.router.metrics.concurrencyBuckets
    # spec.router.prefixAware (camelCase, as in the object); None: not set.
    prefix_aware: Mapping[str, Any] | None = None
    prefill_policy: str | None = None  # spec.router.prefillPolicy; None: not set
    # spec.router.disaggregation (camelCase), its mode replaced by the one in effect when the operator
    # says (status.disaggregation.mode: a mode change moves through the rollout); None: not set.
    disaggregation: Mapping[str, Any] | None = None
    # A disaggregation rollout in progress (status.disaggregation.rollout): its target mode and the
    # percent of P/D requests on it.
    disaggregation_target: str | None = None
    disaggregation_weight: int = 0
    # That rollout's target takes traffic (Shifting, Paused): every request of spec.rollout.tenants is
    # decided by it, at any weight (0 included: the tenants stage).
    disaggregation_tenants_first: bool = False


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    value: Any = obj
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def pod_info_from(obj: Mapping[str, Any]) -> PodInfo:
    """A `PodInfo` from a Pod in its JSON (camelCase) form."""
    labels = _get(obj, "metadata", "labels") or {}
    annotations = _get(obj, "metadata", "annotations") or {}
    conditions = _get(obj, "status", "conditions") or []
    ready = any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )
    return PodInfo(
        name=str(_get(obj, "metadata", "name") or ""),
        pddeployment=labels.get(LABEL_PDD),
        role=labels.get(LABEL_ROLE),
        ip=_get(obj, "status", "podIP") or None,
        phase=_get(obj, "status", "phase"),
        ready=ready,
        terminating=_get(obj, "metadata", "deletionTimestamp") is not None,
        draining=isinstance(annotations, Mapping) and ANNOTATION_DRAINING in annotations,
        revision=str(labels.get(LABEL_REVISION) or ""),
        group=labels.get(LWS_GROUP_KEY_LABEL),
        group_size=_size(annotations),
        serves=labels.get(LWS_WORKER_INDEX_LABEL) in (None, "0") or _declares_http(obj),
        api_ports=_api_ports(obj),
    )


def _size(annotations: Any) -> int:
    value = annotations.get(LWS_SIZE_ANNOTATION) if isinstance(annotations, Mapping) else None
    return int(value) if isinstance(value, str) and value.isdigit() else 1


def _declares_http(obj: Mapping[str, Any]) -> bool:
    """Whether the pod's containers declare the engine's `http` port (a group worker that serves)."""
    containers = _get(obj, "spec", "containers") or []
    return any(
        isinstance(port, Mapping) and port.get("name") == "http"
        for container in containers
        if isinstance(container, Mapping)
        for port in container.get("ports") or []
    )


def _api_ports(obj: Mapping[str, Any]) -> int:
    """How many consecutive API ports the pod serves: `http` and each `http-<i>` it declares."""
    names = {
        str(port.get("name"))
        for container in _get(obj, "spec", "containers") or []
        if isinstance(container, Mapping)
        for port in container.get("ports") or []
        if isinstance(port, Mapping)
    }
    count = 1
    while f"http-{count}" in names:
        count += 1
    return count


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_MODES = ("Disaggregated", "Colocated")


def _pd_weight(obj: Mapping[str, Any]) -> int | None:
    """Percent of requests on P/D from `status.rollout` (its weight is the target arm's)."""
    weight = _int_or_none(_get(obj, "status", "rollout", "weight"))
    if weight is None:
        return None
    target = _get(obj, "status", "rollout", "target")
    return 100 - weight if target == "Colocated" else weight


def _revision_key(record: Any) -> str | None:
    if not isinstance(record, Mapping) or not isinstance(record.get("id"), str):
        return None
    return "" if record.get("legacy") else str(record["id"])


def _revisions(obj: Mapping[str, Any]) -> tuple[tuple[str, int], ...] | None:
    """(revision key, percent of P/D requests) from `status.revisions`, current first."""
    current = _revision_key(_get(obj, "status", "revisions", "current"))
    if current is None:
        return None
    weight = _int_or_none(_get(obj, "status", "revisions", "weight"))
    weight = 100 if weight is None else max(0, min(100, weight))
    previous = _revision_key(_get(obj, "status", "revisions", "previous"))
    if previous is None or previous == current:
        return ((current, 100),)
    return ((current, weight), (previous, 100 - weight))


def pdd_info_from(obj: Mapping[str, Any]) -> PddInfo:
    """A `PddInfo` from a PDDeployment object.

    The serving mode is the one in effect (`status.mode`, written by the operator), not the spec's:
    a mode change moves traffic only once the operator says so (after the new arm is ready, or
    step by step under `spec.rollout`). Before the operator's first status, the spec's."""
    mode = _get(obj, "status", "mode")
    if mode not in _MODES:
        mode = _get(obj, "spec", "serving", "mode")
    model = _get(obj, "spec", "model", "name")
    ttft_ms = _int_or_none(_get(obj, "spec", "slo", "ttftMs"))
    tpot_ms = _int_or_none(_get(obj, "spec", "slo", "tpotMs"))
    has_slo = ttft_ms is not None and tpot_ms is not None
    target, weight = _disaggregation_rollout(obj)
    return PddInfo(
        name=str(_get(obj, "metadata", "name") or ""),
        serving_mode=mode if isinstance(mode, str) else None,
        rollout_weight=_pd_weight(obj),
        model_name=model if isinstance(model, str) else None,
        max_model_len=_int_or_none(_get(obj, "spec", "model", "maxModelLen")),
        slo_ttft_ms=ttft_ms if has_slo else None,
        slo_tpot_ms=tpot_ms if has_slo else None,
        revisions=_revisions(obj),
        router_gateway=_gateway_settings(obj),
        rollout_tenants=tuple(t for t in _get(obj, "spec", "rollout", "tenants") or () if isinstance(t, str)),
        rollout_target=_rollout_target(obj),
        revision_rollout_serving=_serving(_get(obj, "status", "revisions", "rollout")),
        input_length_buckets=_int_list(_get(obj, "spec", "router", "metrics", "inputLengthBuckets")),
        output_length_buckets=_int_list(_get(obj, "spec", "router", "metrics", "outputLengthBuckets")),
        concurrency_buckets=_int_list(_get(obj, "spec", "router", "metrics", "concurrencyBuckets")),
        prefix_aware=_mapping(_get(obj, "spec", "router", "prefixAware")),
        prefill_policy=_str_or_none(_get(obj, "spec", "router", "prefillPolicy")),
        disaggregation=_disaggregation(obj),
        disaggregation_target=target,
        disaggregation_weight=weight,
        disaggregation_tenants_first=target is not None
        and _serving(_get(obj, "status", "disaggregation", "rollout")),
    )


def _disaggregation_rollout(obj: Mapping[str, Any]) -> tuple[str | None, int]:
    """(target mode, weight) of a disaggregation rollout moving traffic; (None, 0) otherwise."""
    rollout = _get(obj, "status", "disaggregation", "rollout")
    target, weight = _get(rollout or {}, "target"), _int_or_none(_get(rollout or {}, "weight"))
    if not isinstance(target, str) or weight is None or _get(rollout or {}, "phase") in _SETTLED:
        return None, 0
    return target, max(0, min(100, weight))


_SETTLED = ("Promoted", "RolledBack")  # a rollout record that no longer splits traffic


def _disaggregation(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """spec.router.disaggregation with the mode in effect (status.disaggregation.mode) when set."""
    spec = _mapping(_get(obj, "spec", "router", "disaggregation"))
    mode = _get(obj, "status", "disaggregation", "mode")
    if isinstance(mode, str):
        return {**(spec or {}), "mode": mode}
    return spec


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _mapping(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


def _int_list(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return tuple(value)


def _gateway_settings(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    router = _get(obj, "spec", "router")
    if not isinstance(router, Mapping):
        return None
    return {key: router[key] for key in ("auth", "tenants", "admission") if key in router}


def _serving(record: Any) -> bool:
    """Whether a rollout record (`status.rollout`, `status.revisions.rollout`) is in a phase where its
    target takes traffic."""
    return isinstance(record, Mapping) and record.get("phase") in TARGET_SERVING


def _rollout_target(obj: Mapping[str, Any]) -> str | None:
    record = _get(obj, "status", "rollout")
    target = _get(obj, "status", "rollout", "target")
    return str(target) if _serving(record) and target in _MODES else None


def pod_label_selector(pdd_name: str) -> str:
    return f"{LABEL_PDD}={pdd_name},{LABEL_ROLE} in ({','.join(POOL_ROLES)})"


def _kubernetes(module: str) -> Any:
    """A `kubernetes` submodule, untyped on purpose: the records above are the typed surface."""
    return importlib.import_module(f"kubernetes.{module}")


def _api_client() -> Any:
    client, config = _kubernetes("client"), _kubernetes("config")

    kubeconfig = os.environ.get("KUBECONFIG")
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not kubeconfig:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    # Read KUBECONFIG now: the client library fixes its default path when it is first imported.
    return config.new_client_from_config(config_file=kubeconfig)


class _Backoff:
    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum, self.delay = initial, maximum, initial

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.delay = self.initial


class PddWatcher:
    """Watches one PDDeployment's pods and object; calls back from its own threads."""

    def __init__(
        self,
        namespace: str,
        pdd_name: str,
        on_pods: Callable[[PodEventKind, list[PodInfo]], None],
        on_pdd: Callable[[PddInfo | None], None],
        *,
        watch_timeout_s: int = 60,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 15.0,
    ) -> None:
        self.namespace = namespace
        self.pdd_name = pdd_name
        self._on_pods = on_pods
        self._on_pdd = on_pdd
        self._watch_timeout_s = watch_timeout_s
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for target, name in ((self._run_pods, "pods"), (self._run_pdd, "pddeployment")):
            thread = threading.Thread(target=target, name=f"tandem-watch-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()

    def _loop(self, what: str, once: Callable[[Any], None]) -> None:
        backoff = _Backoff(*self._backoff)
        api_client: Any = None
        while not self._stop.is_set():
            try:
                if api_client is None:
                    api_client = _api_client()
                once(api_client)
                backoff.reset()
            except Exception as error:  # any failure: keep the last view, back off, relist
                delay = backoff.next()
                log.warning("watch of %s failed (%s); retrying in %.1fs", what, error, delay)
                self._stop.wait(delay)

    def _run_pods(self) -> None:
        self._loop("pods", self._watch_pods)

    def _run_pdd(self) -> None:
        self._loop("pddeployment", self._watch_pdd)

    def _watch_pods(self, api_client: Any) -> None:
        client, watch = _kubernetes("client"), _kubernetes("watch")
        core = client.CoreV1Api(api_client)
        selector = pod_label_selector(self.pdd_name)
        listing = core.list_namespaced_pod(self.namespace, label_selector=selector, _request_timeout=15)
        pods = [pod_info_from(api_client.sanitize_for_serialization(p)) for p in listing.items]
        self._on_pods("SYNC", pods)
        version = listing.metadata.resource_version
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                core.list_namespaced_pod,
                self.namespace,
                label_selector=selector,
                resource_version=version,
                timeout_seconds=self._watch_timeout_s,
                allow_watch_bookmarks=True,
                _request_timeout=self._watch_timeout_s + 15,
            )
            for event in stream:
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise RuntimeError(f"watch error: {event.get('raw_object')}")
                raw = obj if isinstance(obj, dict) else api_client.sanitize_for_serialization(obj)
                version = _get(raw, "metadata", "resourceVersion") or version
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._on_pods(kind, [pod_info_from(raw)])
                if self._stop.is_set():
                    return

    def _watch_pdd(self, api_client: Any) -> None:
        client, watch = _kubernetes("client"), _kubernetes("watch")
        custom = client.CustomObjectsApi(api_client)
        selector = f"metadata.name={self.pdd_name}"
        listing = custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, field_selector=selector, _request_timeout=15
        )
        listing = dict(listing)
        items = listing.get("items") or []
        self._on_pdd(pdd_info_from(items[0]) if items else None)
        version = _get(listing, "metadata", "resourceVersion")
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                field_selector=selector,
                resource_version=version,
                timeout_seconds=self._watch_timeout_s,
                allow_watch_bookmarks=True,
                _request_timeout=self._watch_timeout_s + 15,
            )
            for event in stream:
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise RuntimeError(f"watch error: {event.get('raw_object')}")
                version = _get(obj, "metadata", "resourceVersion") or version
                if kind in ("ADDED", "MODIFIED"):
                    self._on_pdd(pdd_info_from(obj))
                elif kind == "DELETED":
                    self._on_pdd(None)
                if self._stop.is_set():
                    return
