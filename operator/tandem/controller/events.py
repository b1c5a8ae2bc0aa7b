"""Posts Kubernetes Events about a PDDeployment (what the operator did, and what went wrong).

In the operator, Events are posted off the pass (like client-go's recorder): a pass hands them to a
few poster threads and goes on, so two or three Event creates per pass do not lengthen it. Past
`max_pending` unposted Events, new ones are dropped and counted (client-go drops past 1,000 queued);
at shutdown what is queued is posted for up to `CLOSE_GRACE_SECONDS`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from tandem.api.times import rfc3339
from tandem.kube.rest import KubeError, KubeRest, Obj

log = logging.getLogger(__name__)

COMPONENT = "tandem-operator"


MAX_PENDING_EVENTS = 1000
CLOSE_GRACE_SECONDS = 10.0


class EventRecorder:
    """Creates core/v1 Events; a failure to post one is logged, never raised. With `posters`, the
    creates run on that many background threads (`close` waits for the queued ones); without, in
    the caller's thread."""

    def __init__(self, kube: KubeRest, posters: int = 0, max_pending: int = MAX_PENDING_EVENTS) -> None:
        self.kube = kube
        self.host = os.environ.get("POD_NAME", "") or os.uname().nodename
        self._pool = (
            ThreadPoolExecutor(max_workers=posters, thread_name_prefix="tandem-events") if posters else None
        )
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._close_by = math.inf  # queued Events picked up after this (monotonic) time are dropped
        self.closing = threading.Event()  # set once `close` has begun
        self.dropped = 0

    def close(self, grace_seconds: float = CLOSE_GRACE_SECONDS) -> None:
        """Posts what is queued, for at most `grace_seconds` (what is still queued then is dropped:
        an unreachable apiserver does not hold a shutdown), then stops the posters."""
        if self._pool is not None:
            self._close_by = time.monotonic() + grace_seconds
            self.closing.set()
            self._pool.shutdown(wait=True)

    def normal(self, obj: Obj, reason: str, message: str) -> None:
        self._post(obj, "Normal", reason, message)

    def warning(self, obj: Obj, reason: str, message: str) -> None:
        self._post(obj, "Warning", reason, message)

    def post(self, obj: Obj, kind: str, reason: str, message: str) -> None:
        """An Event of type `kind` (Normal or Warning)."""
        self._post(obj, kind, reason, message)

    def _post(self, obj: Obj, kind: str, reason: str, message: str) -> None:
        event = self._event(obj, kind, reason, message)
        if self._pool is None:
            self._create(event)
            return
        with self._lock:
            if self._pending >= self._max_pending:
                self.dropped += 1
                dropped = self.dropped
            else:
                self._pending += 1
                dropped = 0
        if dropped:
            if dropped == 1 or dropped % 100 == 0:
                log.warning("%d Events dropped: %d already waiting to be posted", dropped, self._max_pending)
            return
        try:
            self._pool.submit(self._create_queued, event)
        except RuntimeError:  # closed: a pass still running at shutdown posts its own
            self._create_queued(event)

    def _create_queued(self, event: Obj) -> None:
        try:
            if time.monotonic() > self._close_by:
                with self._lock:
                    self.dropped += 1
                return
            self._create(event)
        except Exception:  # nobody waits on a poster's result: said here or never
            log.exception("could not post event %s/%s", event["reason"], event["involvedObject"]["name"])
        finally:
            with self._lock:
                self._pending -= 1

    def _event(self, obj: Obj, kind: str, reason: str, message: str) -> Obj:
        md = obj.get("metadata", {})
        namespace = md.get("namespace", "default")
        now = rfc3339(time.time())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{md.get('name', 'unknown')}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": md.get("name"),
                "namespace": namespace,
                "uid": md.get("uid"),
                "resourceVersion": md.get("resourceVersion"),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT, "host": self.host},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.host,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return event

    def _create(self, event: Obj) -> None:
        try:
            self.kube.create_event(event["metadata"]["namespace"], event)
        except KubeError as exc:
            # A namespace being deleted takes the object and its Events with it: nothing is lost.
            level = logging.DEBUG if exc.namespace_terminating else logging.WARNING
            log.log(
                level, "could not post event %s/%s: %s", event["reason"], event["involvedObject"]["name"], exc
            )
