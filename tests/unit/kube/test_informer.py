"""The watch caches' logic without a cluster: the store's index and replace, resourceVersion order,
the watch stream's parsing, and an informer's list/watch/relist against a scripted KubeRest."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from tandem.kube.informer import (
    Cache,
    Discovery,
    EventType,
    Informer,
    Store,
    copy_tree,
    is_older,
    strip_managed_fields,
)
from tandem.kube.rest import Kind, KubeError, Obj, WatchEvent, parse_watch_lines

STS = Kind("apps/v1", "StatefulSet", "statefulsets")
LABEL = "tandem.dev/pddeployment"


def obj(name: str, rv: str, owner: str = "a", ns: str = "ns", **extra: Any) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": {LABEL: owner}},
        **extra,
    }


def test_is_older_compares_etcd_revisions_as_integers() -> None:
    assert is_older("9", "10")  # not as strings
    assert is_older("10", "10")
    assert not is_older("11", "10")
    assert not is_older("abc", "10")  # opaque: taken as newer
    assert not is_older("", "10")


def test_store_indexes_by_label_and_reads_are_copies() -> None:
    store = Store(LABEL)
    store.upsert(obj("a-prefill", "1"))
    store.upsert(obj("a-decode", "2"))
    store.upsert(obj("b-decode", "3", owner="b"))
    store.upsert(obj("a-other-ns", "4", ns="other"))
    assert [o["metadata"]["name"] for o in store.by_label("ns", "a")] == ["a-decode", "a-prefill"]
    assert [o["metadata"]["name"] for o in store.by_label("other", "a")] == ["a-other-ns"]
    got = store.get("ns", "a-decode")
    assert got is not None
    got["metadata"]["name"] = "changed"
    assert store.by_label("ns", "a")[0]["metadata"]["name"] == "a-decode"
    # A relabelled object moves in the index; a removed one leaves it.
    store.upsert(obj("a-decode", "5", owner="b"))
    assert [o["metadata"]["name"] for o in store.by_label("ns", "b")] == ["a-decode", "b-decode"]
    store.remove("ns", "a-prefill")
    assert store.by_label("ns", "a") == []
    assert len(store) == 3


def test_an_older_or_equal_version_never_replaces_a_newer_one() -> None:
    """The operator's own write is stored from its answer; the watch event of an earlier version,
    arriving late, must not take the cache back (the next pass would re-apply: a write loop)."""
    store = Store(LABEL)
    assert store.upsert(obj("x", "10", spec={"replicas": 2}))
    assert not store.upsert(obj("x", "9", spec={"replicas": 1}))
    assert not store.upsert(obj("x", "10", spec={"replicas": 1}))
    stored = store.get("ns", "x")
    assert stored is not None
    assert stored["spec"] == {"replicas": 2}
    assert store.upsert(obj("x", "11", spec={"replicas": 3}))


def test_replace_reports_what_changed_while_disconnected() -> None:
    store = Store(LABEL)
    for o in (obj("kept", "1"), obj("changed", "2"), obj("gone", "3")):
        store.upsert(o)
    changes = store.replace([obj("kept", "1"), obj("changed", "7"), obj("new", "8")])
    assert sorted((t, o["metadata"]["name"]) for t, o in changes) == [
        ("ADDED", "new"),
        ("DELETED", "gone"),
        ("MODIFIED", "changed"),
    ]
    assert store.names() == [("ns", "changed"), ("ns", "kept"), ("ns", "new")]
    assert store.by_label("ns", "a")[0]["metadata"]["resourceVersion"] == "7"


def test_replace_of_one_namespace_leaves_the_others() -> None:
    """A namespace-scoped operator watching several namespaces: one store per kind, one informer
    per namespace; one informer's (re)list must not drop the other namespaces' objects."""
    store = Store(LABEL)
    store.upsert(obj("x", "1", ns="team-a"))
    store.upsert(obj("y", "2", ns="team-b"))
    changes = store.replace([obj("z", "3", ns="team-b")], "team-b")
    assert sorted((t, o["metadata"]["name"]) for t, o in changes) == [("ADDED", "z"), ("DELETED", "y")]
    assert store.names() == [("team-a", "x"), ("team-b", "z")]


def test_copy_tree_copies_as_deepcopy_does() -> None:
    tree = {"a": [{"b": 1}, [2, "c"]], "d": None, "e": {"f": 1.5, "g": True}}
    copied = copy_tree(tree)
    assert copied == copy.deepcopy(tree)
    copied["a"][0]["b"] = 9
    copied["a"][1].append(3)
    copied["e"]["f"] = 0
    assert tree == {"a": [{"b": 1}, [2, "c"]], "d": None, "e": {"f": 1.5, "g": True}}


def test_transform_drops_managed_fields() -> None:
    store = Store(LABEL, strip_managed_fields)
    store.upsert(obj("p", "1") | {"metadata": {"name": "p", "namespace": "ns", "managedFields": [{}]}})
    stored = store.get("ns", "p")
    assert stored is not None
    assert "managedFields" not in stored["metadata"]


def test_watch_lines_split_anywhere() -> None:
    events = [
        {"type": "ADDED", "object": {"metadata": {"name": "a"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "5"}}},
        {"type": "ERROR", "object": {"code": 410}},
    ]
    body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)]
    parsed = list(parse_watch_lines(chunks))
    assert [e.type for e in parsed] == ["ADDED", "BOOKMARK", "ERROR"]
    assert parsed[2].object == {"code": 410}


NOT_SERVED = KubeError(404, "NotFound", "the server could not find the requested resource")


class ScriptedKube:
    """A KubeRest with scripted lists and watches: each list answers the next of `lists`, each
    watch the next of `watches` (a list of events, or an exception to raise)."""

    def __init__(
        self,
        lists: list[tuple[list[Obj], str] | Exception],
        watches: list[Iterable[WatchEvent] | Exception],
    ) -> None:
        self.lists = lists
        self.watches = watches
        self.watched_from: list[str] = []
        self.done = threading.Event()
        self.discovered: list[str] = []  # the discovery documents asked for, in order
        self.served_after = 0  # discovery documents answered 404 before the kind is served

    def request(self, method: str, path: str) -> Obj:
        assert method == "GET"
        self.discovered.append(path)
        if len(self.discovered) <= self.served_after:
            raise NOT_SERVED
        return {"kind": "APIResourceList", "resources": [{"name": STS.plural}, {"name": "others"}]}

    def list_with_version(
        self, kind: Kind, namespace: str | None, label_selector: str = ""
    ) -> tuple[list[Obj], str]:
        assert label_selector == LABEL
        step = self.lists.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def watch(
        self, kind: Kind, namespace: str | None, query: dict[str, str], timeout: float
    ) -> Iterator[WatchEvent]:
        self.watched_from.append(query["resourceVersion"])
        assert query["allowWatchBookmarks"] == "true"
        if not self.watches:
            self.done.set()
            threading.Event().wait(0.05)  # the informer's loop is stopped by the test
            return iter(())
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        return iter(step)


def run_informer(
    kube: ScriptedKube,
    optional: bool = False,
    store: Store | None = None,
    field: str = "name",
    discovery: Discovery | None = None,
) -> tuple[Store, list[tuple[EventType, str]], Informer]:
    """Plays `kube`'s script through an informer; each event it hands on as (type, `field` of the
    object's metadata)."""
    store = store if store is not None else Store(LABEL)
    seen: list[tuple[EventType, str]] = []
    informer = Informer(
        kube,  # type: ignore[arg-type]
        STS,
        "ns",
        store,
        lambda _kind, t, o: seen.append((t, o["metadata"][field])),
        label_selector=LABEL,
        backoff=(0.01, 0.01),
        optional=optional,
        absent_retry_seconds=0.01,
        discovery=discovery,
    )
    informer.start()
    assert kube.done.wait(10), "the informer did not play its script"
    informer.stop()
    return store, seen, informer


def test_informer_lists_watches_resumes_and_relists_on_410() -> None:
    kube = ScriptedKube(
        lists=[([obj("a", "1"), obj("b", "2")], "2"), ([obj("a", "6"), obj("c", "7")], "7")],
        watches=[
            [
                WatchEvent("MODIFIED", obj("a", "3")),
                WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "4"}}),
            ],
            KubeError(0, "ConnectionRefusedError", "apiserver down"),  # a restart: resume from 4
            [WatchEvent("ERROR", {"code": 410, "reason": "Expired", "message": "too old"})],  # relist
        ],
    )
    store, seen, informer = run_informer(kube)
    assert kube.watched_from[:4] == ["2", "4", "4", "7"]
    assert informer.relists == 1
    # b was deleted while the watch could not resume: the relist's replace says so.
    assert seen == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
        ("MODIFIED", "a"),
        ("ADDED", "c"),
    ]
    assert store.names() == [("ns", "a"), ("ns", "c")]


def test_the_echo_of_the_operators_own_write_is_not_handed_on() -> None:
    """A watch event whose version the cache already holds from a write's answer enqueues nothing;
    an older one still does (the write was applied on top of a change no pass has seen)."""
    store = Store(LABEL)

    def watch_after_a_write() -> Iterator[WatchEvent]:
        store.upsert(obj("a", "5"))  # the operator's apply, stored from its answer
        yield WatchEvent("MODIFIED", obj("a", "4"))  # another client's change, under the apply
        yield WatchEvent("MODIFIED", obj("a", "5"))  # the apply's echo
        yield WatchEvent("MODIFIED", obj("a", "6"))

    kube = ScriptedKube(lists=[([obj("a", "1")], "1")], watches=[watch_after_a_write()])
    _, seen, _ = run_informer(kube, store=store, field="resourceVersion")
    assert seen == [("ADDED", "1"), ("MODIFIED", "4"), ("MODIFIED", "6")]
    stored = store.get("ns", "a")
    assert stored is not None
    assert stored["metadata"]["resourceVersion"] == "6"


def test_informer_relists_on_an_http_410() -> None:
    kube = ScriptedKube(
        lists=[([obj("a", "1")], "1"), ([], "9")],
        watches=[KubeError(410, "Gone", "too old resource version")],
    )
    store, seen, _ = run_informer(kube)
    assert seen == [("ADDED", "a"), ("DELETED", "a")]
    assert len(store) == 0


def test_cache_write_through_keeps_the_newest() -> None:
    cache = Cache()
    kube = ScriptedKube([], [])
    cache.add(kube, STS, ["ns"], None, index_label=LABEL)  # type: ignore[arg-type]
    store = cache.stores[STS.plural]
    store.upsert(obj("x", "5"))
    written = obj("x", "8", spec={"replicas": 2})
    del written["apiVersion"], written["kind"]
    cache.written(STS, written)
    got = cache.get(STS, "ns", "x")
    assert got is not None
    assert got["spec"] == {"replicas": 2}
    assert got["kind"] == "StatefulSet"
    cache.written(STS, obj("x", "7"))  # an answer older than the cache: ignored
    assert cache.by_label(STS, "ns", "a")[0]["metadata"]["resourceVersion"] == "8"
    cache.deleted(STS, "ns", "x")
    assert cache.get(STS, "ns", "x") is None
    cache.written(Kind("v1", "Event", "events"), {"metadata": {"name": "e"}})  # not cached: nothing


@pytest.mark.parametrize("synced", [False, True])
def test_cache_synced_needs_every_informer(synced: bool) -> None:
    cache = Cache()
    kube = ScriptedKube([], [])
    cache.add(kube, STS, ["a", "b"], None)  # type: ignore[arg-type]
    cache.informers[0].synced.set()
    if synced:
        cache.informers[1].synced.set()
    assert cache.synced() is synced
    assert cache.wait_synced(0.01) is synced


def test_an_optional_kind_not_served_is_synced_empty_and_listed_again() -> None:
    """LeaderWorkerSets where the CRD is missing: the cache syncs (empty, the kind absent), the
    other caches keep answering, and a CRD installed later is listed (and no longer absent)."""
    kube = ScriptedKube(lists=[NOT_SERVED, NOT_SERVED, ([obj("a", "3")], "3")], watches=[])
    store, seen, informer = run_informer(kube, optional=True)
    assert informer.synced.is_set()
    assert not informer.absent
    assert seen == [("ADDED", "a")]
    assert store.names() == [("ns", "a")]


def test_discovery_is_asked_once_per_period_for_every_informer_of_the_kind() -> None:
    """An absent kind's informers in three namespaces share one Discovery: one GET of the
    group-version's document per period answers them all, and another kind of the group too."""
    clock = [0.0]
    kube = ScriptedKube(lists=[], watches=[])
    kube.served_after = 2
    cache = Cache()
    cache.add(kube, STS, ["a", "b", "c"], None, label_selector=LABEL, index_label=LABEL, optional=True)  # type: ignore[arg-type]
    discovery = cache.discovery
    assert discovery is not None
    assert all(informer.discovery is discovery for informer in cache.informers)
    discovery.clock = lambda: clock[0]
    other = Kind(STS.api_version, "Other", "others")
    assert [discovery.serves(STS) for _ in cache.informers] == [False] * 3
    assert not discovery.serves(other)
    assert len(kube.discovered) == 1, "asked again within the period"
    clock[0] += discovery.ttl_seconds
    assert not discovery.serves(STS)
    clock[0] += discovery.ttl_seconds
    assert discovery.serves(STS)
    assert discovery.serves(other)
    assert not discovery.serves(Kind(STS.api_version, "Missing", "missings"))
    assert kube.discovered == [STS.group_version_path] * 3


def test_an_absent_kind_is_listed_again_only_once_discovery_serves_it() -> None:
    kube = ScriptedKube(lists=[NOT_SERVED, ([obj("a", "5")], "5")], watches=[])
    kube.served_after = 2
    discovery = Discovery(kube, ttl_seconds=0.0)  # type: ignore[arg-type]
    _store, seen, informer = run_informer(kube, optional=True, discovery=discovery)
    assert kube.lists == [], "the informer did not list once the kind was served"
    assert len(kube.discovered) == 3, "two answers of not served, then served: no list in between"
    assert not informer.absent
    assert seen == [("ADDED", "a")]


def test_a_removed_crd_empties_the_optional_kinds_store() -> None:
    kube = ScriptedKube(
        lists=[([obj("a", "1")], "1"), NOT_SERVED, NOT_SERVED],
        watches=[KubeError(404, "NotFound", "gone")],
    )
    cache = Cache()
    cache.add(kube, STS, ["ns"], None, label_selector=LABEL, index_label=LABEL, optional=True)  # type: ignore[arg-type]
    informer = cache.informers[0]
    informer.absent_retry_seconds = 0.01
    informer.start()
    deadline = threading.Event()
    for _ in range(500):
        if not kube.lists:
            break
        deadline.wait(0.01)
    informer.stop()
    assert not kube.lists, "the informer did not list again after the 404 watch"
    assert informer.absent
    assert not cache.served(STS)
    assert len(cache.stores[STS.plural]) == 0


def test_a_required_kind_not_served_never_syncs() -> None:
    informer = Informer(
        ScriptedKube([NOT_SERVED] * 50, []),
        STS,
        "ns",
        Store(LABEL),
        label_selector=LABEL,
        backoff=(0.01, 0.01),
    )  # type: ignore[arg-type]
    informer.start()
    assert not informer.synced.wait(0.2)
    informer.stop()
    assert not informer.absent


def test_the_store_holds_what_was_stored_exactly_and_apart_from_the_callers_object() -> None:
    store = Store(LABEL)
    original = obj("a-prefill", "7")
    original["spec"] = {
        "ratio": 0.1,
        "big": 2**63,
        "text": "caf\u00e9 \U0001f600",
        "none": None,
        "list": [1, {}],
    }
    expected = copy.deepcopy(original)
    store.upsert(original)
    original["spec"]["list"].append("changed after the upsert")  # the store kept its own form
    original["metadata"]["labels"][LABEL] = "b"
    assert store.get("ns", "a-prefill") == expected
    assert store.by_label("ns", "a") == [expected]
    assert store.by_label("ns", "b") == []
    assert store.remove("ns", "a-prefill") == expected
