"""What the demo reads from the cluster while it runs: the PDDeployment, its Events, router pods
and the router's own /metrics. Blocking calls; the demo runs them in a thread."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from tandem.api import meta
from tandem.api.times import parse_rfc3339
from tandem.devcluster import kube

_ENDPOINTS = re.compile(r'^tandem_router_ready_endpoints\{role="(\w+)"\} ([0-9.e+-]+)$', re.M)
_REQUESTS = re.compile(r"^tandem_router_requests_total\{[^}]*\} ([0-9.e+-]+)$", re.M)


@dataclass
class Reader:
    api: client.ApiClient
    namespace: str
    name: str

    def pdd(self) -> dict[str, Any]:
        custom = client.CustomObjectsApi(self.api)
        try:
            response = custom.get_namespaced_custom_object(
                meta.GROUP, meta.VERSION, self.namespace, meta.PLURAL, self.name, _preload_content=False
            )
        except client.ApiException:
            return {}
        return kube.raw(response)

    def events(self) -> list[str]:
        core = client.CoreV1Api(self.api)
        selector = f"involvedObject.name={self.name},involvedObject.kind={meta.KIND}"
        items = kube.raw(
            core.list_namespaced_event(self.namespace, field_selector=selector, _preload_content=False)
        )["items"]
        now = dt.datetime.now(dt.UTC)

        def when(e: dict[str, Any]) -> str:
            return str(e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"])

        lines = []
        for e in sorted(items, key=when):
            age = int(now.timestamp() - parse_rfc3339(when(e)))
            count = f" (x{e['count']})" if (e.get("count") or 1) > 1 else ""
            message = str(e.get("message", ""))
            if len(message) > 110:
                message = message[:107] + "..."
            lines.append(f"{age:>4}s ago  {e.get('type', ''):<7} {e.get('reason', '')}{count}: {message}")
        return lines

    def router_ips(self) -> list[str]:
        return kube.ready_pod_ips(self.api, self.namespace, self.name, "router")


def parse_router_metrics(text: str) -> tuple[dict[str, int], float]:
    """(ready endpoints by role, requests the router finished) from its Prometheus text."""
    endpoints = {role: int(float(value)) for role, value in _ENDPOINTS.findall(text)}
    requests = sum(float(v) for v in _REQUESTS.findall(text))
    return endpoints, requests
