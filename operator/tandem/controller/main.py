"""`tandem operator`: watch caches feed a keyed work queue; the leader reconciles from it.

Informers (`tandem.kube.informer`) list and watch PDDeployments and every child kind and the Pods
that carry a PDDeployment's label, keep them in memory, and enqueue the owning PDDeployment's key on
each change (no stored state of the operator's own, no finalizers, so uninstalling the operator never
leaves objects stuck). A worker pops keys, takes the object from the cache and runs one
`Reconciler` pass in a thread, which reads the children from the caches too: a steady-state pass
makes no request. kopf runs the process and watches PDDeployments only to forget a deleted one's
queued key. A resync enqueues every cached PDDeployment periodically, and on winning leadership.
Passes that are not yet converged ask to be requeued after a delay, and so
do autoscaled PDDeployments, for their next decision (`spec.autoscaling.intervalSeconds`) or to
check a drain: the autoscaler runs inside the pass, so only the leader decides.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import kopf
from aiohttp import web

from tandem.api import meta
from tandem.api.times import rfc3339
from tandem.controller import handover, metrics
from tandem.controller.autoscaler import Autoscaler
from tandem.controller.events import EventRecorder
from tandem.controller.leader import LeaderElector
from tandem.controller.reconcile import Reconciler
from tandem.controller.workqueue import WorkQueue
from tandem.kube.informer import Cache, EventType, Handler, strip_managed_fields
from tandem.kube.rest import PDDEPLOYMENT, POD, Kind, KubeError, KubeRest, Obj, load_api_client
from tandem.metrics import PrometheusReader
from tandem.render.desired import CHILD_KINDS, GROUP_KINDS
from tandem.status.derive import UNSCHEDULABLE_GRACE_SECONDS

log = logging.getLogger("tandem.operator")

Key = tuple[str, str]  # (namespace, name)

MAX_ERROR_BACKOFF_SECONDS = 300.0
CHILD_EVENT_DELAY_SECONDS = 1.0  # --child-event-delay-seconds' default
EVENT_POSTERS = 4  # threads posting Events off the passes
MAX_CHILD_EVENT_DELAY_SECONDS = 60.0
MAX_UNSCHEDULABLE_GRACE_SECONDS = 86400.0
CACHE_SYNC_RETRY_SECONDS = 1.0  # a key popped before the caches' first lists: again this much later
# What the operator watches into its caches: the PDDeployments, and the children and pods that carry
# a PDDeployment's label (`tandem.dev/pddeployment`), indexed by it. LeaderWorkerSets (multi-node
# pools) are optional: a cluster without their CRD has an empty, synced cache of them (`Cache.served`).
OPTIONAL_WATCHES: tuple[Kind, ...] = tuple(Kind(*group) for group in GROUP_KINDS)
CHILD_WATCHES: tuple[Kind, ...] = (*(Kind(*child) for child in CHILD_KINDS), *OPTIONAL_WATCHES, POD)


def build_cache(kube: KubeRest, namespaces: Sequence[str | None], on_event: Handler | None) -> Cache:
    """The informers of the operator's objects (not started), in every watched namespace (or all)."""
    cache = Cache()
    cache.add(kube, PDDEPLOYMENT, namespaces, on_event, transform=strip_managed_fields)  # nothing reads them
    for kind in CHILD_WATCHES:
        cache.add(
            kube,
            kind,
            namespaces,
            on_event,
            label_selector=meta.LABEL_PDD,
            index_label=meta.LABEL_PDD,
            # Only a StatefulSet's or LeaderWorkerSet's managedFields are read (the replicas hand-over),
            # and of them only who holds spec.replicas: the caches keep that much, nothing of the others'.
            transform=(
                handover.trim_managed_fields
                if kind.kind in ("StatefulSet", meta.LWS_KIND)
                else strip_managed_fields
            ),
            optional=kind in OPTIONAL_WATCHES,
        )
    kube.on_written = cache.written
    kube.on_deleted = cache.deleted
    return cache


class Runtime:
    """The operator's moving parts, shared by the kopf handlers and the worker."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        namespaces = self.namespaces()
        watches = len(namespaces) * (1 + len(CHILD_WATCHES))
        # One connection per thread that may call at once: passes, their parallel calls, Event
        # posters, leases, and one per informer's open watch.
        self.kube = KubeRest(
            load_api_client(pool_size=args.workers + args.api_parallelism + EVENT_POSTERS + 4 + watches)
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cache = build_cache(self.kube, namespaces, self._cache_event)
        self.autoscaler = Autoscaler(self.kube, args.prometheus_url, reader_for=PrometheusReader)
        self.api_pool = ThreadPoolExecutor(max_workers=args.api_parallelism, thread_name_prefix="tandem-api")
        self.reconciler = Reconciler(
            self.kube,
            EventRecorder(self.kube, posters=EVENT_POSTERS),
            self.autoscaler,
            api_pool=self.api_pool,
            unschedulable_grace_seconds=args.unschedulable_grace_seconds,
            cache=self.cache,
        )
        self.queue: WorkQueue[Key] = WorkQueue()
        self.failures: dict[Key, int] = {}
        self.health = metrics.Health(max_silence=max(120.0, args.resync_seconds * 2))
        identity = args.identity or f"{socket.gethostname()}-{os.getpid()}"
        self.elector = LeaderElector(
            self.kube, args.lease_namespace, args.lease_name, identity, duration=args.lease_duration_seconds
        )
        self._writes_seen: dict[tuple[str, str], int] = {}
        self._requests_seen: dict[tuple[str, str], int] = {}

    def enqueue(self, namespace: str | None, name: str | None, delay: float = 0.0) -> None:
        if namespace and name:
            self.queue.add((namespace, name), delay)
            metrics.QUEUE_DEPTH.set(len(self.queue))

    def namespaces(self) -> list[str | None]:
        return list(self.args.namespace) or [None]

    def start_cache(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.cache.start()

    def _cache_event(self, kind: Kind, event_type: EventType, obj: Obj) -> None:
        """An informer's event (from its thread): the owning PDDeployment's key to the queue."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._enqueue_owner, kind, event_type, obj)

    def _enqueue_owner(self, kind: Kind, event_type: EventType, obj: Obj) -> None:
        md = obj.get("metadata") or {}
        namespace, name = md.get("namespace"), md.get("name")
        if kind == PDDEPLOYMENT:
            if event_type == "DELETED":
                if namespace and name:
                    self.queue.forget((namespace, name))
            else:
                self.enqueue(namespace, name)
            return
        # A PDDeployment's pods and workloads change in bursts (created, scheduled, running, ready;
        # their controllers' status): one pass a little later sees the whole burst.
        owner = (md.get("labels") or {}).get(meta.LABEL_PDD)
        self.enqueue(namespace, owner, self.args.child_event_delay_seconds)

    def _export_writes(self) -> None:
        for (verb, kind), count in list(self.kube.writes.items()):
            seen = self._writes_seen.get((verb, kind), 0)
            if count > seen:
                metrics.API_WRITES.labels(verb=verb, kind=kind).inc(count - seen)
                self._writes_seen[(verb, kind)] = count
        for (method, resource), count in list(self.kube.requests.items()):
            seen = self._requests_seen.get((method, resource), 0)
            if count > seen:
                metrics.API_REQUESTS.labels(method=method, resource=resource).inc(count - seen)
                self._requests_seen[(method, resource)] = count

    async def work(self) -> None:
        while True:
            key = await self.queue.get()
            metrics.QUEUE_DEPTH.set(len(self.queue))
            self.health.beat()
            try:
                if self.elector.is_leader:
                    await self._pass(key)
            finally:
                self.queue.done(key)
                self._export_writes()

    async def _pass(self, key: Key) -> None:
        namespace, name = key
        started = time.monotonic()
        if not self.cache.synced():  # popped before the first lists: the cache cannot answer yet
            self.queue.add(key, CACHE_SYNC_RETRY_SECONDS)
            return
        try:
            body = self.cache.get(PDDEPLOYMENT, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                self.failures.pop(key, None)
                self.autoscaler.forget(namespace, name)
                self.reconciler.rollouts.forget(namespace, name)
                self.reconciler.kv_transport.forget(namespace, name)
                metrics.forget_status(namespace, name)
                return
            instant = datetime.now(UTC)
            now = rfc3339(instant.timestamp())
            result = await asyncio.to_thread(self.reconciler.reconcile, body, now, instant.timestamp())
        except Exception as exc:
            failures = self.failures[key] = self.failures.get(key, 0) + 1
            delay = min(MAX_ERROR_BACKOFF_SECONDS, 2.0**failures)
            reason = "api" if isinstance(exc, KubeError) else type(exc).__name__
            metrics.RECONCILES.labels(result="error").inc()
            metrics.RECONCILE_ERRORS.labels(reason=reason).inc()
            log.exception("reconcile %s/%s failed; retrying in %.0fs", namespace, name, delay)
            self.queue.add(key, delay)
            return
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        self.failures.pop(key, None)
        metrics.RECONCILES.labels(result="conflict" if result.conflict else result.phase or "unknown").inc()
        if result.conflict:
            log.info("%s/%s changed during the pass; reconciling it again", namespace, name)
        if result.applied or result.deleted or result.status_written:
            log.info(
                "%s/%s: phase %s; applied %s; deleted %s; status %s",
                namespace,
                name,
                result.phase,
                result.applied or "-",
                result.deleted or "-",
                "written" if result.status_written else "unchanged",
            )
        if result.requeue_after is not None:
            self.queue.add(key, result.requeue_after)

    async def resync(self) -> None:
        """Enqueue every PDDeployment now and then, and at once on becoming leader."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.elector.became_leader.wait(), self.args.resync_seconds)
            self.health.beat()
            if not self.elector.is_leader:
                continue
            # From the cache: its informers relist whenever a watch cannot resume (410 Gone).
            if not self.cache.synced():
                log.warning("resync: the caches have not listed everything yet")
            for namespace, name in self.cache.stores[PDDEPLOYMENT.plural].names():
                self.enqueue(namespace, name)
            if self.elector.became_leader.is_set():
                self.elector.became_leader.clear()

    async def leadership(self) -> None:
        task = asyncio.create_task(self.elector.run())
        while not task.done():
            metrics.LEADER.set(1 if self.elector.is_leader else 0)
            await asyncio.sleep(1)
        await task


def build_registry(runtime: Runtime) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.event(meta.GROUP, meta.VERSION, meta.PLURAL, registry=registry)  # type: ignore[arg-type]
    async def pddeployment_event(event: dict[str, Any], namespace: str, name: str, **_: Any) -> None:
        # Enqueueing is the informers' (`Runtime._enqueue_owner`): a pass started from this watch
        # could find the cache one version behind. A deleted object's queued key is forgotten.
        if event.get("type") == "DELETED":
            runtime.queue.forget((namespace, name))

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # kopf's own readers: no second client library in memory for its watches.
        info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
        return info

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # tandem posts its own Events
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.error_backoffs = [1, 2, 5, 10, 20, 30]

    return registry


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tandem operator", description="Run the PDDeployment operator.")
    parser.add_argument("--namespace", "-n", action="append", default=[], help="watch only these namespaces")
    parser.add_argument("--probe-host", default="127.0.0.1", help="address of /healthz and /metrics")
    parser.add_argument("--probe-port", type=int, default=8081)
    parser.add_argument("--resync-seconds", type=float, default=300.0, help="periodic full resync")
    parser.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    parser.add_argument("--lease-name", default="tandem-operator")
    parser.add_argument(
        "--lease-duration-seconds",
        type=float,
        default=30.0,
        help="how long a lease lasts without renewal (the leader renews every third of it)",
    )
    parser.add_argument("--identity", default=os.environ.get("POD_NAME", ""), help="leader election identity")
    parser.add_argument("--workers", type=int, default=16, help="PDDeployments reconciled in parallel")
    parser.add_argument(
        "--api-parallelism",
        type=int,
        default=16,
        help="API calls of passes in flight at once (a pass's reads and its applies run in parallel)",
    )
    parser.add_argument(
        "--child-event-delay-seconds",
        type=float,
        default=CHILD_EVENT_DELAY_SECONDS,
        help="a pod or workload event reconciles its PDDeployment this much later (the first event's "
        "time holds), so one pass sees a burst of changes; 0: at once",
    )
    parser.add_argument(
        "--unschedulable-grace-seconds",
        type=float,
        default=UNSCHEDULABLE_GRACE_SECONDS,
        help="a pod unschedulable this long stalls its PDDeployment (Stalled=True Unschedulable, phase "
        "Degraded); until then it is progressing. Longer than new nodes take to join where a cluster "
        "autoscaler adds them",
    )
    parser.add_argument(
        "--prometheus-url",
        default=os.environ.get("TANDEM_PROMETHEUS_URL", ""),
        help="Prometheus the autoscaler reads when spec.autoscaling.prometheus.url is unset "
        "(env TANDEM_PROMETHEUS_URL)",
    )
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(list(argv))
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.api_parallelism < 1:
        parser.error("--api-parallelism must be at least 1")
    if args.resync_seconds < 5:
        parser.error("--resync-seconds must be at least 5")
    if not 0 <= args.unschedulable_grace_seconds <= MAX_UNSCHEDULABLE_GRACE_SECONDS:
        parser.error(f"--unschedulable-grace-seconds must be from 0 to {MAX_UNSCHEDULABLE_GRACE_SECONDS:g}")
    if not 0 <= args.child_event_delay_seconds <= MAX_CHILD_EVENT_DELAY_SECONDS:
        parser.error(f"--child-event-delay-seconds must be from 0 to {MAX_CHILD_EVENT_DELAY_SECONDS:g}")
    return args


async def run(args: argparse.Namespace) -> None:
    # Passes run in threads (asyncio.to_thread): one per worker, not the default min(32, cpus + 4).
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=args.workers + 4, thread_name_prefix="tandem-pass")
    )
    runtime = Runtime(args)
    runtime.start_cache()
    registry = build_registry(runtime)
    app = metrics.make_app(runtime.health)
    web_runner = web.AppRunner(app, access_log=None)
    await web_runner.setup()
    await web.TCPSite(web_runner, args.probe_host, args.probe_port).start()
    log.info("probes on http://%s:%d/healthz and /metrics", args.probe_host, args.probe_port)
    tasks = [
        *(asyncio.create_task(runtime.work()) for _ in range(args.workers)),
        asyncio.create_task(runtime.resync()),
        asyncio.create_task(runtime.leadership()),
    ]
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=list(args.namespace),
        )
    finally:
        runtime.cache.stop()
        for task in tasks:
            task.cancel()
        await asyncio.to_thread(runtime.reconciler.events.close)
        await web_runner.cleanup()


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kopf").setLevel(logging.INFO if args.verbose else logging.WARNING)
    asyncio.run(run(args))
    return 0
