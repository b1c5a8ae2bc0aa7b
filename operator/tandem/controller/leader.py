"""Leader election on a coordination.k8s.io Lease, so that two operator replicas never act at once.

`decide` is the pure rule; `LeaderElector` runs it against the API. Only the leader reconciles;
a follower keeps watching and takes over when the leader's lease lapses. Renewals are writes to
the Lease only, never to PDDeployments or their children.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from tandem.api.times import parse_rfc3339
from tandem.kube.rest import Kind, KubeError, KubeRest, Obj

log = logging.getLogger(__name__)

LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases")

Action = Literal["acquire", "renew", "follow"]


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    renewed_at: float  # seconds since the epoch
    duration: float


def decide(record: LeaseRecord | None, me: str, now: float) -> Action:
    if record is None or not record.holder:
        return "acquire"
    if record.holder == me:
        return "renew"
    if now > record.renewed_at + record.duration:
        return "acquire"
    return "follow"


def _micro_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: str | None) -> float:
    if not text:
        return 0.0
    return parse_rfc3339(text)


def lease_record(lease: Obj | None) -> LeaseRecord | None:
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or "",
        renewed_at=_parse_time(spec.get("renewTime")),
        duration=float(spec.get("leaseDurationSeconds") or 0),
    )


class LeaderElector:
    def __init__(
        self, kube: KubeRest, namespace: str, name: str, identity: str, duration: float = 30.0
    ) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.duration = duration
        self.is_leader = False
        self.became_leader = asyncio.Event()

    def _try_once(self, now: float) -> bool:
        lease = self.kube.get(LEASE, self.namespace, self.name)
        action = decide(lease_record(lease), self.identity, now)
        if action == "follow":
            return False
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "renewTime": _micro_time(now),
        }
        if lease is None:
            body: Obj = {
                "apiVersion": LEASE.api_version,
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": _micro_time(now), "leaseTransitions": 0},
            }
            self.kube.request("POST", LEASE.collection(self.namespace), body=body)
            return True
        old = lease.get("spec") or {}
        if action == "acquire":
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(old.get("leaseTransitions") or 0) + 1
        lease["spec"] = {**old, **spec}
        self.kube.request("PUT", LEASE.path(self.namespace, self.name), body=lease)  # resourceVersion guards
        return True

    def _release(self) -> None:
        lease = self.kube.get(LEASE, self.namespace, self.name)
        if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
            lease["spec"]["holderIdentity"] = ""
            self.kube.request("PUT", LEASE.path(self.namespace, self.name), body=lease)

    async def run(self) -> None:
        try:
            await self._loop()
        finally:
            if self.is_leader:  # hand over at once instead of making a successor wait out the lease
                self.is_leader = False
                with contextlib.suppress(KubeError):
                    self._release()

    async def _loop(self) -> None:
        while True:
            try:
                leading = await asyncio.to_thread(self._try_once, datetime.now(UTC).timestamp())
            except KubeError as exc:
                log.warning("leader election: %s", exc)
                leading = False
            if leading and not self.is_leader:
                log.info("became leader as %s", self.identity)
                self.became_leader.set()
            if not leading and self.is_leader:
                log.warning("lost leadership")
                self.became_leader.clear()
            self.is_leader = leading
            await asyncio.sleep(self.duration / 3 if leading else self.duration / 6)
