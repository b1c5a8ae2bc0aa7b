"""Watch caches (informers) of the operator's objects: list once, then watch, and answer reads
from memory.

One `Informer` per (kind, namespace), namespace `None` for a cluster-wide operator, runs in a
daemon thread: it lists the kind (with its label selector), replaces its `Store` with the list,
then watches from the list's resourceVersion with bookmarks, applying each event. A watch that
ends (its `timeoutSeconds`, an apiserver restart, a dropped connection) is opened again from the
last resourceVersion seen; one the apiserver refuses as too old (410 Gone, as an HTTP status or an
ERROR event) relists, and the replace reports what changed meanwhile, deletions included, so
nothing missed while disconnected stays in the cache. Failures back off (doubling, capped).

An optional kind (an add-on's custom resource, LeaderWorkerSet) may not be served at all: a list
the apiserver answers 404 leaves the store empty, counts as synced (every other cache keeps
answering) and marks the kind absent (`Cache.served`). Every `ABSENT_RETRY_SECONDS` the informer
asks the kind's group-version discovery document (`Discovery`) whether it is served now, and lists
again once it is, so a CRD installed later is picked up. The informers of one kind in every watched
namespace share that answer: one discovery GET per group-version per period, not one list per
namespace.

Each change is handed to `on_event(kind, type, object)` from the informer's thread: the operator
enqueues the owning PDDeployment, as a controller's informer does.

Reads right after the operator's own writes: `KubeRest` hands every object a write returns to
`Cache.written`, which stores it when it is newer than the cached one (resourceVersions compared as
the integers etcd makes them; an opaque one always replaces). The watch event of that write then
changes nothing. A pass therefore never compares its desired state with a version older than its
own last write, which would re-apply it (a write loop) or patch status with a stale version (409).
Nor is that event handed on: a watch event whose version the store already holds exactly is the
echo of the operator's own write, and a pass for it would find nothing new (one extra pass per
status patch and per applied child, when a fleet converges).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, NamedTuple

from tandem.kube.rest import Kind, KubeError, KubeRest, Obj

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Handler = Callable[[Kind, EventType, Obj], None]
Key = tuple[str, str]  # (namespace, name)

WATCH_TIMEOUT_SECONDS = 300  # the apiserver ends a watch after this; it is opened again at once
ABSENT_RETRY_SECONDS = 30.0  # an optional kind not served: listed again this much later


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def is_older(candidate: str, stored: str) -> bool:
    """Whether `candidate` is older than `stored`, or the same version. resourceVersions are opaque
    by contract but etcd revisions in practice: compared as integers when both are; otherwise the
    candidate is taken as newer (it replaces)."""
    if not candidate or not stored:
        return False
    try:
        return int(candidate) <= int(stored)
    except ValueError:
        return False


def copy_tree(value: Any) -> Any:
    """A copy of a JSON tree (dicts, lists, scalars), as `copy.deepcopy` makes one, about five
    times faster: no memo, no other types. A steady pass spent most of its time in deepcopy."""
    if isinstance(value, dict):
        return {key: copy_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_tree(item) for item in value]
    return value


def strip_managed_fields(obj: Obj) -> Obj:
    """A transform for kinds whose managedFields no reader needs (pods): less memory per object."""
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


class _Entry(NamedTuple):
    """A stored object: its resourceVersion and index label value, and the object as compact JSON."""

    version: str
    label: str | None
    text: str


class Store:
    """Objects of one kind by (namespace, name), indexed by the value of one label. Thread-safe;
    reads return fresh objects, so a caller may change what it gets.

    Each object is held as compact JSON text and decoded on read: a decoded API object takes about
    six times its JSON size in Python objects (29 KiB for a 5 KiB pod), which at a thousand
    PDDeployments was most of the operator's memory; and `json.loads` in C makes the copy a read
    must return faster than copying the decoded tree."""

    def __init__(self, index_label: str = "", transform: Callable[[Obj], Obj] | None = None) -> None:
        self._index_label = index_label
        self._transform = transform
        self._lock = threading.Lock()
        self._objects: dict[Key, _Entry] = {}
        self._index: dict[Key, set[str]] = {}  # (namespace, label value) -> names

    def __len__(self) -> int:
        return len(self._objects)

    @staticmethod
    def key_of(obj: Mapping[str, Any]) -> Key:
        md = obj.get("metadata") or {}
        return str(md.get("namespace") or ""), str(md.get("name") or "")

    def _label(self, obj: Mapping[str, Any]) -> str | None:
        if not self._index_label:
            return None
        value = ((obj.get("metadata") or {}).get("labels") or {}).get(self._index_label)
        return str(value) if value is not None else None

    def _put(self, key: Key, obj: Obj) -> None:
        self._drop(key)
        label = self._label(obj)
        self._objects[key] = _Entry(resource_version(obj), label, json.dumps(obj, separators=(",", ":")))
        if label is not None:
            self._index.setdefault((key[0], label), set()).add(key[1])

    def _drop(self, key: Key) -> _Entry | None:
        old = self._objects.pop(key, None)
        if old is not None and old.label is not None:
            names = self._index.get((key[0], old.label))
            if names is not None:
                names.discard(key[1])
                if not names:
                    del self._index[(key[0], old.label)]
        return old

    def _prepare(self, obj: Obj) -> Obj:
        return self._transform(obj) if self._transform is not None else obj

    def upsert(self, obj: Obj) -> bool:
        """Store `obj` unless the stored version is the same or newer (a watch event that lags the
        operator's own write, already stored from the write's answer). Whether the store changed."""
        key = self.key_of(obj)
        with self._lock:
            old = self._objects.get(key)
            if old is not None and is_older(resource_version(obj), old.version):
                return False
            self._put(key, self._prepare(obj))
            return True

    def holds(self, obj: Mapping[str, Any]) -> bool:
        """Whether the stored object has exactly `obj`'s resourceVersion: a watch event that echoes
        the operator's own write, already stored from the write's answer."""
        version = resource_version(obj)
        with self._lock:
            entry = self._objects.get(self.key_of(obj))
            return bool(version) and entry is not None and entry.version == version

    def remove(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            old = self._drop((namespace, name))
        return _decode(old) if old is not None else None

    def replace(self, items: Iterable[Obj], namespace: str | None = None) -> list[tuple[EventType, Obj]]:
        """The store's objects in `namespace` (all of them: None) become `items` (a fresh list of
        that namespace; one store holds a kind's informers of every watched namespace); what changed,
        as events: objects gone since the last view are DELETED, new ones ADDED, others at another
        version MODIFIED."""
        fresh = {self.key_of(obj): obj for obj in items}
        changes: list[tuple[EventType, Obj]] = []
        with self._lock:
            scope = [k for k in self._objects if namespace is None or k[0] == namespace]
            for key in [k for k in scope if k not in fresh]:
                gone = self._drop(key)
                if gone is not None:
                    changes.append(("DELETED", _decode(gone)))
            for key, obj in fresh.items():
                old = self._objects.get(key)
                if old is None:
                    changes.append(("ADDED", obj))
                elif old.version != resource_version(obj):
                    changes.append(("MODIFIED", obj))
                else:
                    continue
                self._put(key, self._prepare(obj))
        return changes

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            entry = self._objects.get((namespace, name))
        return _decode(entry) if entry is not None else None

    def by_label(self, namespace: str, value: str) -> list[Obj]:
        """Objects in `namespace` whose index label has `value`, in name order."""
        with self._lock:
            names = sorted(self._index.get((namespace, value), ()))
            entries = [self._objects[(namespace, n)] for n in names]
        return [_decode(entry) for entry in entries]

    def names(self) -> list[Key]:
        """Every stored object's (namespace, name), sorted."""
        with self._lock:
            return sorted(self._objects)


def _decode(entry: _Entry) -> Obj:
    obj: Obj = json.loads(entry.text)
    return obj


class Discovery:
    """Whether the apiserver serves a kind now, by its group-version's discovery document (`GET
    /apis/<group>/<version>`, answered 404 while no CRD defines the group-version): one GET per
    group-version per `ttl_seconds`, whichever informer asks; the others get the same answer."""

    def __init__(
        self,
        kube: KubeRest,
        ttl_seconds: float = ABSENT_RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self._lock = threading.Lock()  # held while asking: who waits gets the fresh answer
        self._resources: dict[str, tuple[float, frozenset[str]]] = {}  # group-version -> (at, plurals)

    def serves(self, kind: Kind) -> bool:
        with self._lock:
            now = self.clock()
            known = self._resources.get(kind.api_version)
            if known is None or now - known[0] >= self.ttl_seconds:
                known = (now, self._ask(kind))
                self._resources[kind.api_version] = known
            return kind.plural in known[1]

    def _ask(self, kind: Kind) -> frozenset[str]:
        try:
            document = self.kube.request("GET", kind.group_version_path)
        except KubeError as exc:
            if exc.status == 404:
                return frozenset()
            raise
        resources = document.get("resources") or []
        return frozenset(str(r.get("name", "")) for r in resources if isinstance(r, dict))


class Informer:
    """List, then watch, one kind in one namespace (or all), into a `Store`."""

    def __init__(
        self,
        kube: KubeRest,
        kind: Kind,
        namespace: str | None,
        store: Store,
        on_event: Handler | None = None,
        label_selector: str = "",
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
        backoff: tuple[float, float] = (0.5, 30.0),
        optional: bool = False,
        absent_retry_seconds: float = ABSENT_RETRY_SECONDS,
        discovery: Discovery | None = None,
    ) -> None:
        self.kube = kube
        self.optional = optional
        self.absent_retry_seconds = absent_retry_seconds
        # An absent kind's way back: asked each retry before listing again (None: list each retry).
        self.discovery = discovery
        self.absent = False  # an optional kind the apiserver does not serve (its last list: 404)
        self.kind = kind
        self.namespace = namespace
        self.store = store
        self.on_event = on_event
        self.label_selector = label_selector
        self.watch_timeout_seconds = watch_timeout_seconds
        self.backoff = backoff
        self.synced = threading.Event()
        self.relists = 0  # lists after the first (410 Gone): for tests and logs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return f"{self.kind.plural}@{self.namespace or '*'}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"tandem-informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _emit(self, event_type: EventType, obj: Obj) -> None:
        if self.on_event is not None:
            try:
                self.on_event(self.kind, event_type, obj)
            except Exception:  # a handler's bug must not stop the cache
                log.exception("informer %s: event handler failed", self.name)

    def _list(self) -> str:
        try:
            items, version = self.kube.list_with_version(self.kind, self.namespace, self.label_selector)
        except KubeError as exc:
            if not (self.optional and exc.status == 404):
                raise
            if not self.absent:
                log.info(
                    "informer %s: the kind is not served (no CRD); asked again every %.0fs",
                    self.name,
                    self.absent_retry_seconds,
                )
            self.absent = True
            for event_type, obj in self.store.replace([], self.namespace):
                self._emit(event_type, obj)
            self.synced.set()
            raise
        self.absent = False
        for event_type, obj in self.store.replace(items, self.namespace):
            self._emit(event_type, obj)
        self.synced.set()
        return version

    def _watch(self, version: str) -> str | None:
        """Watch from `version` until the watch ends; the last version seen, or None to relist."""
        query = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout_seconds),
        }
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        for event in self.kube.watch(self.kind, self.namespace, query, self.watch_timeout_seconds + 30):
            if self._stop.is_set():
                return version
            if event.type == "ERROR":
                code = int(event.object.get("code") or 0)
                if code == 410:
                    return None
                raise KubeError(
                    code, str(event.object.get("reason", "")), str(event.object.get("message", ""))
                )
            version = resource_version(event.object) or version
            if event.type == "BOOKMARK":
                continue
            event.object.setdefault("apiVersion", self.kind.api_version)
            event.object.setdefault("kind", self.kind.kind)
            if event.type == "DELETED":
                namespace, name = Store.key_of(event.object)
                self.store.remove(namespace, name)
                self._emit("DELETED", event.object)
            elif event.type in ("ADDED", "MODIFIED"):
                # The echo of the operator's own write is not news: the pass that wrote it saw it (a
                # status patch is conditional on the version the pass read). An older event still
                # is: a child's apply answers a version that includes changes no pass has seen yet.
                echo = self.store.holds(event.object)
                self.store.upsert(event.object)
                if not echo:
                    self._emit("MODIFIED" if event.type == "MODIFIED" else "ADDED", event.object)
        return version

    def _run(self) -> None:
        version: str | None = None
        delay = self.backoff[0]
        while not self._stop.is_set():
            try:
                if version is None:
                    if self.absent and self.discovery is not None and not self.discovery.serves(self.kind):
                        self._stop.wait(self.absent_retry_seconds)
                        continue
                    if self.synced.is_set():
                        self.relists += 1
                        log.info("informer %s: relisting", self.name)
                    version = self._list()
                opened = time.monotonic()
                version = self._watch(version)
                if time.monotonic() - opened < 1.0:  # ended at once (an apiserver shutting down):
                    self._stop.wait(delay)  # not a tight loop of watch requests
                    delay = min(delay * 2, self.backoff[1])
                else:
                    delay = self.backoff[0]
            except KubeError as exc:
                if self._stop.is_set():
                    return
                if exc.status == 410 or (self.optional and exc.status == 404 and not self.absent):
                    version = None  # a 404 watch: the CRD was removed; the list says so
                    continue
                if self.absent:
                    version = None
                    self._stop.wait(self.absent_retry_seconds)
                    continue
                log.warning("informer %s: %s; again in %.1fs", self.name, exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self.backoff[1])
            except Exception as exc:  # connection refused, reset, a timeout: keep the cache, retry
                if self._stop.is_set():
                    return
                log.warning("informer %s: %s: %s; again in %.1fs", self.name, type(exc).__name__, exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self.backoff[1])


class Cache:
    """The operator's informers: one store per kind, one informer per (kind, namespace)."""

    def __init__(self) -> None:
        self.stores: dict[str, Store] = {}  # by Kind.plural
        self.informers: list[Informer] = []
        self.discovery: Discovery | None = None  # shared by the optional kinds' informers

    def add(
        self,
        kube: KubeRest,
        kind: Kind,
        namespaces: Iterable[str | None],
        on_event: Handler | None,
        *,
        label_selector: str = "",
        index_label: str = "",
        transform: Callable[[Obj], Obj] | None = None,
        optional: bool = False,
    ) -> None:
        """Watch `kind` in `namespaces`; `optional`: a kind the cluster may not serve (see the module)."""
        store = self.stores.setdefault(kind.plural, Store(index_label, transform))
        if optional and self.discovery is None:
            self.discovery = Discovery(kube)
        for namespace in namespaces:
            self.informers.append(
                Informer(
                    kube,
                    kind,
                    namespace,
                    store,
                    on_event,
                    label_selector,
                    optional=optional,
                    discovery=self.discovery if optional else None,
                )
            )

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()

    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self.informers)

    def wait_synced(self, timeout: float | None = None) -> bool:
        return all(informer.synced.wait(timeout) for informer in self.informers)

    def watches(self, kind: Kind) -> bool:
        return kind.plural in self.stores

    def served(self, kind: Kind) -> bool:
        """Whether the apiserver serves `kind`, as its informers' last lists found (an optional
        kind's CRD may be missing)."""
        return not any(i.absent for i in self.informers if i.kind.plural == kind.plural)

    def get(self, kind: Kind, namespace: str, name: str) -> Obj | None:
        return self.stores[kind.plural].get(namespace, name)

    def by_label(self, kind: Kind, namespace: str, value: str) -> list[Obj]:
        return self.stores[kind.plural].by_label(namespace, value)

    def written(self, kind: Kind, obj: Obj) -> None:
        """An object a write returned: stored when newer than the cached one (write-through)."""
        store = self.stores.get(kind.plural)
        if store is not None and obj.get("metadata"):
            obj.setdefault("apiVersion", kind.api_version)
            obj.setdefault("kind", kind.kind)
            store.upsert(copy_tree(obj))

    def deleted(self, kind: Kind, namespace: str, name: str) -> None:
        store = self.stores.get(kind.plural)
        if store is not None:
            store.remove(namespace, name)
