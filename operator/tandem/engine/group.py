"""A multi-node replica of the sim engine: the pods of one LeaderWorkerSet group acting as one vLLM
instance, with the minimal behaviour of vLLM's data-parallel (or multi-node tensor-parallel) ranks
that a controller and a router can observe (docs/multinode.md, "The sim engine as a group").

- The leader (node rank 0) listens where the group meets (`--data-parallel-address` and
  `--data-parallel-rpc-port`, or `--master-addr` and `--master-port` for one rank spanning the pods);
  each worker connects, says its node rank and the address of its engine, and keeps the connection.
  A worker retries until the leader listens (vLLM's ranks wait for the rendezvous likewise).
- The group is formed once every worker has joined; until then the leader's /health answers 503, so
  the leader (the group's readiness) is Ready only when every rank is (vLLM's API server starts
  serving only after every engine of the group has completed its handshake).
- Once formed, a member whose connection ends (its process died, its pod is gone) takes the group
  down: the leader and every worker exit with status 1, as vLLM's engines do when a collective with
  a dead rank fails. LeaderWorkerSet (RecreateGroupOnPodRestart) then recreates every pod of the
  group, and the group forms again. A member that hangs (SIGSTOP: its connection stays open) does
  the same after the group timeout (`TANDEM_SIM_GROUP_TIMEOUT_SECONDS`): each worker pings the leader
  a few times per timeout and the leader answers; silence for the whole timeout on either side
  breaks the group, as a hung rank's collectives eventually fail the others.
- External and MultiPortExternal balancing: every rank serves its own API (its pod's port, or
  `--port` + local rank: `ranks.py`); the leader balances nothing, the router chooses the rank.
- Data parallelism (one rank per pod, Internal balancing): the leader's API server sends each
  request to the rank with the fewest requests in flight, its own engine or a worker's (over HTTP to
  the worker's port, which no one else uses), as vLLM's internal load balancer spreads requests over
  the group's engines by their queues. Multi-node TP (data 1): the leader's engine is the instance;
  the workers only belong to it.

- Metrics: a data-parallel leader's /metrics holds every rank's series, its own as `engine="0"` and
  each worker's (read from the worker's /metrics at the scrape) as `engine="<node rank>"`, as vLLM's
  API server reports each engine it balances over; a headless worker is not scraped. So a pool's
  signals summed over its pods count every rank once (`merge_expositions`).

Not simulated: collectives' timing (a hung rank is noticed only at the group timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Coroutine
from typing import Any

from tandem.engine.args import GroupArgs

log = logging.getLogger(__name__)

_ENGINE_LABEL = 'engine="0"'


def _relabel(sample: str, rank: int) -> str:
    """One exposition sample line with its `engine` label set to `rank`."""
    label = f'engine="{rank}"'
    name, brace, rest = sample.partition("{")
    if brace:
        if _ENGINE_LABEL in rest:
            return name + "{" + rest.replace(_ENGINE_LABEL, label, 1)
        return name + "{" + label + "," + rest
    name, _, value = sample.partition(" ")
    return name + "{" + label + "} " + value


def _families(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """Prometheus text exposition by metric family (in order): its comment lines and its samples."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    current = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                current = parts[2]
            families.setdefault(current, ([], []))[0].append(line)
        else:
            families.setdefault(current, ([], []))[1].append(line)
    return families


def merge_expositions(own: str, ranks: dict[int, str]) -> str:
    """The leader's exposition (`engine="0"`) with every other rank's samples in their families,
    labelled `engine="<rank>"` (text format: a family's samples stay together under its HELP/TYPE)."""
    merged = _families(own)
    for rank, text in sorted(ranks.items()):
        for family, (comments, samples) in _families(text).items():
            merged.setdefault(family, (comments, []))[1].extend(_relabel(sample, rank) for sample in samples)
    lines = [line for comments, samples in merged.values() for line in (*comments, *samples)]
    return "\n".join(lines) + "\n"


JOIN_RETRY_SECONDS = 0.5
HEARTBEATS_PER_TIMEOUT = 4  # a worker's pings within one group timeout


class Group:
    """This pod's membership of its group; `failed` is set (with `reason`) when the group breaks."""

    def __init__(self, spec: GroupArgs, engine_url: str, timeout_s: float = 30.0) -> None:
        self.spec = spec
        self.timeout_s = timeout_s  # silence on a member's connection that breaks the group
        self.engine_url = engine_url  # this pod's engine, as the leader reaches it
        self.members: dict[int, str] = {}  # the leader's view: node rank -> engine URL (workers)
        self.joined = False  # a worker's view: the leader accepted it
        self.failed = asyncio.Event()
        self.reason = ""
        self.in_flight: dict[int, int] = dict.fromkeys(range(spec.nodes), 0)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def formed(self) -> bool:
        """Every rank is in: the leader has every worker; a worker has been accepted."""
        if self.spec.leader:
            return len(self.members) == self.spec.nodes - 1
        return self.joined

    def fail(self, reason: str) -> None:
        if not self.failed.is_set():
            self.reason = reason
            self.failed.set()

    async def start(self) -> None:
        if self.spec.leader:
            self._server = await asyncio.start_server(
                self._member, host=self.spec.address, port=self.spec.port
            )
        else:
            self._spawn(self._join())

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the leader --------------------------------------------------------------------------------

    async def _member(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        rank = -1
        try:
            hello = json.loads(await reader.readline() or b"{}")
            rank, url = int(hello.get("rank", -1)), str(hello.get("url", ""))
            if not 0 < rank < self.spec.nodes or rank in self.members or self.formed:
                writer.write(b'{"ok": false}\n')
                await writer.drain()
                rank = -1
                return
            self.members[rank] = url
            writer.write(b'{"ok": true}\n')
            await writer.drain()
            log.info("group: node rank %d joined (%d/%d)", rank, len(self.members) + 1, self.spec.nodes)
            # Until the member's end (its process exited, its pod went) or its silence (it hangs).
            while await asyncio.wait_for(reader.readline(), self.timeout_s):
                writer.write(b"pong\n")
                await writer.drain()
        except TimeoutError:
            self.fail(
                f"node rank {rank} has not answered for {self.timeout_s:g}s: it hangs, so this group's "
                "collectives cannot continue"
            )
        except (OSError, ValueError) as exc:
            log.info("group: member connection error: %s", exc)
        finally:
            writer.close()
            if rank > 0:
                self.fail(
                    f"node rank {rank} left the group: its engine died, so this group's cannot continue"
                )

    def rank_urls(self) -> dict[int, str]:
        """The other ranks' engines a data-parallel leader reports (none for multi-node TP)."""
        internal = self.spec.leader and self.spec.data > 1 and not self.spec.external
        return dict(self.members) if internal else {}

    def pick(self) -> tuple[int, str | None]:
        """The rank for the next request (the fewest in flight, the lowest rank on a tie) and its
        engine's URL (None: this pod's own engine)."""
        ranks = [0, *sorted(self.members)] if self.spec.data > 1 else [0]
        rank = min(ranks, key=lambda r: (self.in_flight[r], r))
        return rank, (self.members[rank] if rank else None)

    # -- a worker ----------------------------------------------------------------------------------

    async def _join(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.spec.address, self.spec.port)
                break
            except OSError:
                await asyncio.sleep(JOIN_RETRY_SECONDS)
        self._writers.append(writer)
        hello = {"rank": self.spec.node_rank, "url": self.engine_url}
        writer.write(json.dumps(hello).encode() + b"\n")
        await writer.drain()
        answer = json.loads(await reader.readline() or b"{}")
        if not answer.get("ok"):
            self.fail(
                f"the leader at {self.spec.address}:{self.spec.port} refused node rank {self.spec.node_rank}"
            )
            return
        self.joined = True
        log.info(
            "group: joined the leader at %s:%d as node rank %d",
            self.spec.address,
            self.spec.port,
            self.spec.node_rank,
        )
        self._spawn(self._ping(writer))
        try:
            while await asyncio.wait_for(reader.readline(), self.timeout_s):
                pass
        except TimeoutError:
            self.fail(
                f"the group's leader has not answered for {self.timeout_s:g}s: it hangs, so this rank's "
                "collectives cannot continue"
            )
        except OSError:
            pass
        self.fail("the group's leader is gone: its engine died, so this rank's cannot continue")

    async def _ping(self, writer: asyncio.StreamWriter) -> None:
        """A worker's heartbeat: a line to the leader (answered by one) a few times per deadline."""
        with contextlib.suppress(OSError):
            while True:
                writer.write(b"ping\n")
                await writer.drain()
                await asyncio.sleep(self.timeout_s / HEARTBEATS_PER_TIMEOUT)
