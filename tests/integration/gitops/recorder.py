"""Records every version of one PDDeployment from a watch, in a background thread."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client, watch

from tandem.api import meta


class Recorder(threading.Thread):
    """Appends each object a watch delivers (ADDED/MODIFIED) to `versions`, in order."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        super().__init__(name=f"record-{name}", daemon=True)
        self.custom = client.CustomObjectsApi(api)
        self.namespace, self.pdd = namespace, name
        self.versions: list[dict[str, Any]] = []
        self._stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rv = ""
        try:
            while not self._stop_event.is_set():
                w = watch.Watch()  # type: ignore[no-untyped-call]
                for event in w.stream(  # type: ignore[no-untyped-call]
                    self.custom.list_namespaced_custom_object,
                    meta.GROUP, meta.VERSION, self.namespace, meta.PLURAL,
                    field_selector=f"metadata.name={self.pdd}",
                    resource_version=rv, timeout_seconds=2,
                ):  # fmt: skip
                    obj = event["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.versions.append(obj)
                    if self._stop_event.is_set():
                        break
        except BaseException as e:  # surfaced by the test
            self.error = e

    def stop(self) -> list[dict[str, Any]]:
        self._stop_event.set()
        self.join(timeout=30)
        if self.error is not None:
            raise self.error
        return self.versions
