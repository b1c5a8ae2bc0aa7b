"""Posts Kubernetes Events about a PDDeployment (what the operator did, and what went wrong)."""

from __future__ import annotations

import logging
import os
import time
import uuid

from tandem.api.times import rfc3339
from tandem.kube.rest import KubeError, KubeRest, Obj

log = logging.getLogger(__name__)

COMPONENT = "tandem-operator"


class EventRecorder:
    """Creates core/v1 Events; a failure to post one is logged, never raised."""

    def __init__(self, kube: KubeRest) -> None:
        self.kube = kube
        self.host = os.environ.get("POD_NAME", "") or os.uname().nodename

    def normal(self, obj: Obj, reason: str, message: str) -> None:
        self._post(obj, "Normal", reason, message)

    def warning(self, obj: Obj, reason: str, message: str) -> None:
        self._post(obj, "Warning", reason, message)

    def post(self, obj: Obj, kind: str, reason: str, message: str) -> None:
        """An Event of type `kind` (Normal or Warning)."""
        self._post(obj, kind, reason, message)

    def _post(self, obj: Obj, kind: str, reason: str, message: str) -> None:
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
        try:
            self.kube.create_event(namespace, event)
        except KubeError as exc:
            # A namespace being deleted takes the object and its Events with it: nothing is lost.
            level = logging.DEBUG if exc.namespace_terminating else logging.WARNING
            log.log(level, "could not post event %s/%s: %s", reason, md.get("name"), exc)
