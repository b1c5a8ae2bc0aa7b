"""The operator at a small fleet scale, so a regression of bench/operator_scale.py fails CI.

Compressed settings (the bench runs 100 PDDeployments on 1,000 nodes): a cluster of this module's
own without the pod runner (KWOK makes every pod Ready, routers too; no processes), 50 fake GPU
nodes, 10 vLLM PDDeployments in two namespaces, the operator resyncing every 5 s. Checks that every
PDDeployment reaches Ready=True at its generation, and that a steady state of 15 s (two resyncs and
more: every PDDeployment passes at least twice) makes no write at all, by the apiserver's own
`apiserver_request_total` (every client, PDDeployments, their child kinds and Events) and by the
operator's own write counter; and no read either: the passes read the watch caches
(`tandem.kube.informer`): the operator's own request counter shows no GET but its leader lease's,
and the apiserver serves no GET or LIST of the children or pods in the window (every client: the
metric has no user-agent label, so this bounds the operator's) and fewer reads than passes in all;
the apiserver's audit log (`up(audit=True)`), which records each request's user agent, shows no
request from the operator's process in the window but its Lease's and watches re-opened.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tandem.api.meta import LABEL_PDD
from tandem.controller.main import CHILD_WATCHES, OPTIONAL_WATCHES, build_cache
from tandem.devcluster import cluster as devcluster
from tandem.devcluster import fleet, kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.layout import ClusterDir
from tandem.devcluster.testing import OperatorProcess, eventually, metric_total
from tandem.kube.informer import Discovery, Informer, Store
from tandem.kube.rest import PDDEPLOYMENT, USER_AGENT, Kind, KubeError, KubeRest

pytestmark = pytest.mark.cluster

NODES = 50
DEPLOYMENTS = 10
NAMESPACES = ("scale-a", "scale-b")
RESYNC_SECONDS = 5
STEADY_SECONDS = 15.0
PDB = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
CRD = Path(__file__).parents[3] / "crds" / "pddeployment.yaml"


@pytest.fixture(scope="module")
def fleet_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    cdir = ClusterDir(tmp_path_factory.mktemp("fleet-cluster"))
    try:
        state = devcluster.up(cdir, pod_runner=False, owner_pid=os.getpid(), audit=True)
    except devcluster.ClusterError as e:
        pytest.fail(f"dev cluster did not start: {e}", pytrace=False)
    try:
        handle = ClusterHandle.from_dir(cdir.path, owned=True)
        api = handle.api_client()
        try:
            fleet.create(api, fleet.fleet_nodes(NODES, state.pod_octet))
            eventually(
                lambda: fleet.untaint(api) >= 0 and fleet.ready_count(api) == NODES,
                timeout=180,
                what=f"{NODES} nodes schedulable",
                interval=2,
            )
            # The node controller's RegisteredNode Events come late: not in the steady window.
            eventually(
                lambda: fleet.registered_count(api) == NODES,
                timeout=180,
                interval=2,
                what="the nodes' RegisteredNode Events",
            )
            kube.apply_crd(api, yaml.safe_load(CRD.read_text()), timeout=180)
            for ns in NAMESPACES:
                handle.kubectl("create", "namespace", ns)
        finally:
            kube.close(api)
        yield handle
    finally:
        devcluster.down(cdir)


def _ready_at_generation(cluster: ClusterHandle) -> int:
    items = json.loads(cluster.kubectl("get", "pdd", "-A", "-o", "json").stdout)["items"]
    ready = 0
    for item in items:
        status = item.get("status") or {}
        conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
        if (
            conds.get("Ready") == "True"
            and status.get("observedGeneration") == item["metadata"]["generation"]
        ):
            ready += 1
    return ready


@pytest.fixture(scope="module")
def fleet_operator(
    fleet_cluster: ClusterHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("scale-operator") / "operator.log"
    operator = OperatorProcess(
        fleet_cluster, ["--lease-namespace", "default", "--resync-seconds", str(RESYNC_SECONDS)], log
    )
    try:
        operator.wait_leader(timeout=90)
        yield operator
    finally:
        operator.stop()


def _own_reads(metrics: str) -> float:
    """The operator's GETs (gets and lists) by its own request counter, but two fixed costs that are
    no pass's: its leader lease's, and the discovery document of LeaderWorkerSet's group-version
    (resource "discovery"), a kind this cluster does not serve (no LWS CRD without the pod runner):
    one GET every 30 s, shared by every namespace's informer, to pick up a CRD installed later.
    The kind's list is not one of them: an absent kind is listed again only once discovery serves it."""
    name = "tandem_operator_api_requests_total"
    fixed = sum(
        metric_total(metrics, name, method="GET", resource=resource) for resource in ("leases", "discovery")
    )
    return metric_total(metrics, name, method="GET") - fixed


def test_converges_and_then_writes_nothing(
    fleet_cluster: ClusterHandle, fleet_operator: OperatorProcess
) -> None:
    for n, ns in enumerate(NAMESPACES):
        docs = [fleet.pddeployment(f"scale-{i}", ns) for i in range(n, DEPLOYMENTS, len(NAMESPACES))]
        fleet_cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))
    started = time.monotonic()
    eventually(
        lambda: _ready_at_generation(fleet_cluster) == DEPLOYMENTS,
        timeout=180,
        interval=2,
        what=f"{DEPLOYMENTS} PDDeployments Ready=True at their generation",
    )
    print(f"converged in {time.monotonic() - started:.1f} s")
    time.sleep(5)  # the last passes' writes land; then a steady window
    metrics = fleet_operator.metrics()
    passes_before = metric_total(metrics, "tandem_operator_reconciles_total")
    own_before = metric_total(metrics, "tandem_operator_api_writes_total")
    own_reads_before = _own_reads(metrics)
    audit_log = ClusterDir(fleet_cluster.dir).audit_log
    audit_from = fleet.audit_offset(audit_log)
    text = fleet_cluster.kubectl("get", "--raw", "/metrics").stdout
    writes_before, reads_before = fleet.apiserver_writes(text), fleet.apiserver_reads(text)
    time.sleep(STEADY_SECONDS)
    text = fleet_cluster.kubectl("get", "--raw", "/metrics").stdout
    writes_after, reads_after = fleet.apiserver_writes(text), fleet.apiserver_reads(text)
    metrics = fleet_operator.metrics()
    passes = metric_total(metrics, "tandem_operator_reconciles_total") - passes_before
    own = metric_total(metrics, "tandem_operator_api_writes_total") - own_before
    assert passes >= 2 * DEPLOYMENTS, f"only {passes:.0f} passes in the steady window: it saw nothing"
    assert own == 0, f"the operator wrote {own:.0f} times in a steady state"
    delta = writes_after - writes_before
    assert not delta, f"apiserver writes in a steady state: {dict(delta)}"
    reads = reads_after - reads_before
    own_reads = _own_reads(metrics) - own_reads_before
    # The apiserver's audit log has each request's user agent: the operator's REST client
    # (informers included) and kopf's (its PDDeployment watch), in the operator's process.
    by_operator = fleet.audit_requests(audit_log, audit_from, USER_AGENT)
    by_kopf = fleet.audit_requests(audit_log, audit_from, "kopf")
    print(f"audited in the window: operator {dict(by_operator)}, kopf {dict(by_kopf)}")
    # Watches are audited when they end (each informer's every 300 s): a fixed cost, not a pass's.
    not_lease = {
        k: v
        for k, v in (by_operator + by_kopf).items()
        if not k.endswith(" leases") and not k.startswith("watch ")
    }
    assert not not_lease, (
        f"the operator's requests in a steady state, as the apiserver audited them: {not_lease}"
    )
    print(f"steady: {passes:.0f} passes, apiserver reads {dict(reads) or 0}, operator's own {own_reads:.0f}")
    assert own_reads == 0, f"the operator read {own_reads:.0f} times (GET, not its lease) in a steady state"
    # The apiserver's count is every client's. It saw GETs of PDDeployments in this window (7 to 11
    # in the runs so far) that the audit log attributes to kube-controller-manager (the garbage
    # collector checking the children's owners, most likely), none to the operator. The children
    # and pods, which each pass used to list, must see no read at all.
    children = {k: v for k, v in reads.items() if not k.endswith(" pddeployments")}
    assert not children, f"apiserver reads of children or pods in a steady state: {children}"
    assert sum(reads.values()) < passes, f"more apiserver reads than passes: {dict(reads)}"
    assert "Traceback" not in fleet_operator.log_text()


def test_children_edited_or_deleted_by_hand_are_restored(
    fleet_cluster: ClusterHandle, fleet_operator: OperatorProcess
) -> None:
    """With passes' applies in parallel, drift is still corrected: a StatefulSet scaled by hand
    (a watch event) and a Service deleted by hand (found by the next resync)."""
    ns = NAMESPACES[0]
    fleet_cluster.kubectl("scale", "-n", ns, "statefulset/scale-0-decode", "--replicas=3")
    fleet_cluster.kubectl("delete", "-n", ns, "service/scale-0-router")

    def restored() -> bool:
        sts = json.loads(fleet_cluster.kubectl("get", "-n", ns, "sts/scale-0-decode", "-o", "json").stdout)
        svc = fleet_cluster.kubectl("get", "-n", ns, "service/scale-0-router", check=False)
        return bool(sts["spec"]["replicas"] == 1 and svc.returncode == 0)

    eventually(restored, timeout=120, interval=2, what="the StatefulSet and Service restored")


def test_namespaced_caches_hold_what_the_api_lists(
    fleet_cluster: ClusterHandle, fleet_operator: OperatorProcess
) -> None:
    """The operator's informers as a namespace-scoped operator builds them (one per kind and
    namespace, one store per kind) against the real apiserver: once synced, each kind's store holds
    exactly what a list of each namespace returns (an optional kind the cluster does not serve, none),
    and a child deleted by hand leaves the cache by its watch event."""
    api = fleet_cluster.api_client()
    rest = KubeRest(api)
    events: list[tuple[str, str]] = []
    cache = build_cache(rest, list(NAMESPACES), lambda kind, t, o: events.append((t, o["metadata"]["name"])))
    cache.start()
    try:
        assert cache.wait_synced(60), "the caches did not list"
        discovery = Discovery(rest)
        for kind in (PDDEPLOYMENT, *CHILD_WATCHES):
            # The apiserver's discovery documents say what its lists say (served or 404).
            assert discovery.serves(kind) == cache.served(kind), kind.plural
            selector = "" if kind == PDDEPLOYMENT else LABEL_PDD
            if kind in OPTIONAL_WATCHES and not cache.served(kind):
                # LeaderWorkerSets on a cluster without their CRD: synced, empty, and the API agrees.
                assert cache.stores[kind.plural].names() == [], kind.plural
                with pytest.raises(KubeError) as refused:
                    rest.list(kind, NAMESPACES[0], selector)
                assert refused.value.status == 404
                continue
            listed = sorted(
                (o["metadata"]["namespace"], o["metadata"]["name"])
                for ns in NAMESPACES
                for o in rest.list(kind, ns, selector)
            )
            assert cache.stores[kind.plural].names() == listed, kind.plural
        ns = NAMESPACES[1]
        name = next(n for space, n in cache.stores[PDB.plural].names() if space == ns)
        fleet_cluster.kubectl("delete", "-n", ns, f"poddisruptionbudget/{name}", "--wait=false")
        eventually(
            lambda: ("DELETED", name) in events,
            timeout=60,
            interval=1,
            what="the deletion's watch event",
        )
        # The operator restores it (its own informers saw the same event): the cache follows.
        eventually(
            lambda: cache.get(PDB, ns, name) is not None,
            timeout=120,
            interval=2,
            what="the PodDisruptionBudget restored and back in the cache",
        )
    finally:
        cache.stop()
        kube.close(api)


WIDGETS = Kind("pickup.tandem.dev/v1", "Widget", "widgets")
WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.pickup.tandem.dev"},
    "spec": {
        "group": "pickup.tandem.dev",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


def test_an_optional_kind_installed_later_is_asked_by_discovery_and_then_listed(
    fleet_cluster: ClusterHandle,
) -> None:
    """An optional kind's informer on the real apiserver before its CRD exists: synced, absent, and
    asking only the group-version's discovery document (404) each retry, no list; once the CRD is
    installed, discovery serves it, the informer lists and watches, and a new object reaches it."""
    api = fleet_cluster.api_client()
    rest = KubeRest(api)
    ns = NAMESPACES[0]
    store = Store()
    informer = Informer(
        rest,
        WIDGETS,
        ns,
        store,
        optional=True,
        absent_retry_seconds=1.0,
        discovery=Discovery(rest, ttl_seconds=1.0),
    )
    informer.start()
    try:
        assert informer.synced.wait(60), "an absent kind's informer must sync (empty)"
        assert informer.absent
        eventually(
            lambda: rest.requests[("GET", "discovery")] >= 3, timeout=60, what="three discovery requests"
        )
        assert rest.requests[("GET", WIDGETS.plural)] == 1, "an absent kind is not listed again"
        fleet_cluster.kubectl("apply", "-f", "-", input=json.dumps(WIDGET_CRD))
        fleet_cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.pickup.tandem.dev"
        )
        eventually(lambda: not informer.absent, timeout=60, what="the informer to list the served kind")
        widget = {
            "apiVersion": WIDGETS.api_version,
            "kind": "Widget",
            "metadata": {"name": "w", "namespace": ns},
        }
        fleet_cluster.kubectl("apply", "-f", "-", input=json.dumps(widget))
        eventually(lambda: store.get(ns, "w") is not None, timeout=60, what="the new Widget in the cache")
    finally:
        informer.stop()
        fleet_cluster.kubectl("delete", "crd/widgets.pickup.tandem.dev", "--wait=false", check=False)
        kube.close(api)
