"""Pod DNS names for the pod runner's processes: `<hostname>.<subdomain>.<namespace>[.svc[.cluster.local]]`.

A cluster's DNS gives a pod with `spec.hostname` and `spec.subdomain` (a StatefulSet's pods, and so
LeaderWorkerSet's) an A record under its headless Service. The dev cluster has no cluster DNS and
its pods are local processes on loopback IPs, so the pod runner resolves such names itself: before
it starts a container's process it replaces each one in the env values and the expanded command
line with the pod's IP (LeaderWorkerSet's `LWS_LEADER_ADDRESS`, `<lws>-<group>.<lws>.<namespace>`,
becomes the leader pod's 127.x address, and so does `$(LWS_LEADER_ADDRESS)` in the args).

Only names in the pod's own namespace are looked at, and only those whose subdomain some pod of the
namespace has: other dotted words (versions, model names) are left alone. A name whose pod does
not exist yet, or has no IP yet, is an error (`expand.ConfigError`): the runner retries the start
with backoff, as a process would retry its DNS lookup.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from tandem.devcluster.expand import ConfigError

_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
POD_NAME = re.compile(
    rf"(?<![A-Za-z0-9.-])({_LABEL})\.({_LABEL})\.({_LABEL})(?:\.svc(?:\.cluster\.local)?)?(?![A-Za-z0-9.-])"
)


def candidates(text: str, namespace: str) -> list[re.Match[str]]:
    """The matches in `text` that may name a pod of `namespace`."""
    return [m for m in POD_NAME.finditer(text) if m.group(3) == namespace]


def _hostname(pod: dict[str, Any]) -> str:
    spec = pod.get("spec") or {}
    return str(spec.get("hostname") or pod["metadata"]["name"])


def resolve(texts: Sequence[str], namespace: str, list_pods: Callable[[], list[dict[str, Any]]]) -> list[str]:
    """`texts` with each pod DNS name of `namespace` replaced by that pod's IP. `list_pods` (the
    namespace's pods, as API dicts) is called once, and only when some text has a candidate."""
    if not any(candidates(t, namespace) for t in texts):
        return list(texts)
    pods = [p for p in list_pods() if not (p.get("metadata") or {}).get("deletionTimestamp")]
    subdomains = {(p.get("spec") or {}).get("subdomain") for p in pods} - {None, ""}

    def replace(m: re.Match[str]) -> str:
        host, subdomain = m.group(1), m.group(2)
        if m.group(3) != namespace or subdomain not in subdomains:
            return m.group(0)
        for pod in pods:
            if (pod.get("spec") or {}).get("subdomain") == subdomain and _hostname(pod) == host:
                ip = (pod.get("status") or {}).get("podIP")
                if ip:
                    return str(ip)
                raise ConfigError(f"{m.group(0)}: pod {pod['metadata']['name']} has no IP yet")
        raise ConfigError(f"{m.group(0)}: no pod {host} under subdomain {subdomain} (yet)")

    return [POD_NAME.sub(replace, t) for t in texts]
