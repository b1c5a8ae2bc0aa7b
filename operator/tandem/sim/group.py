"""A replica of a pool as a group of data-parallel ranks, and the router's endpoints into it.

A pool's replica (an *instance*: what the autoscaler, the GPU budget and `replicas` count) is
`parallelism.data` = D ranks, each a vLLM engine (`tandem.sim.replica.Replica`) with the pool's per-rank
profile at its TP; D = 1 is one engine, as before groups. The group holds the instance's GPUs
(`Shape.gpus_per_instance`: TP x PP x D) from its request until its last rank is gone, starts as a unit
(every rank ready at once, after one model load) and drains as a unit (no rank takes a new leg; gone when
every rank's work is done), as a LeaderWorkerSet group or a data-parallel pod does.

Which of its ranks a request reaches follows the pool's `loadBalancing` (docs/multinode.md):
- `Internal`: one endpoint per group (the leader's API server), which sends each request to its rank with
  the fewest requests in flight;
- `Hybrid`: one endpoint per pod, each balancing over its own `ranks_per_pod` ranks the same way;
- `External`, `MultiPortExternal`: one endpoint per rank: the router chooses the rank, among every rank
  of every ready group.
An endpoint that is one rank is the `Replica` itself; one over several ranks is an `Endpoint`, which the
router weighs by the requests and tokens it has sent there (its ranks' together).
"""

from __future__ import annotations

from typing import Final

from tandem.api.shape import Shape
from tandem.sim.layout import Role
from tandem.sim.replica import Replica


class Endpoint:
    """A router endpoint that balances over several ranks (an Internal group's leader, a Hybrid pod)."""

    __slots__ = ("name", "ranks")

    def __init__(self, name: str, ranks: list[Replica]) -> None:
        self.name = name
        self.ranks = ranks

    @property
    def load_requests(self) -> int:
        return sum(r.load_requests for r in self.ranks)

    @property
    def load_tokens(self) -> int:
        return sum(r.load_tokens for r in self.ranks)

    def cost(self) -> float:
        return self.load_requests + self.load_tokens / 512.0

    def choose(self) -> Replica:
        """The rank the endpoint's API server sends the next request to: the fewest requests in flight,
        the lowest rank on a tie (as the sim engine's leader; vLLM's balancer weighs its engines' queues)."""
        return min(self.ranks, key=_in_flight)

    def cached_blocks(self, runs: tuple[tuple[int, int], ...] | None) -> int:
        """What the rank a request sent here now would land on holds (the balancer ignores prefixes)."""
        return self.choose().cached_blocks(runs)


def _in_flight(rank: Replica) -> int:
    return rank.load_requests


Routable = Replica | Endpoint  # what the router chooses among


class Group:
    """One replica of a pool: its ranks, its router endpoints, its GPUs and its life."""

    __slots__ = ("endpoints", "gone_at", "gpus", "live", "name", "ranks", "requested_at", "role", "state")

    def __init__(
        self, name: str, role: Role, ranks: list[Replica], shape: Shape, requested_at: float
    ) -> None:
        self.name = name
        self.role = role
        self.ranks = ranks
        self.endpoints: list[Routable] = endpoints(name, ranks, shape)
        self.gpus = shape.gpus_per_instance
        self.requested_at = requested_at
        self.gone_at = float("inf")
        self.state = ranks[0].state  # every rank starts (or is ready) together
        self.live = len(ranks)  # ranks not gone yet


PER_GROUP: Final = ("Internal",)
PER_POD: Final = ("Hybrid",)


def rank_names(name: str, shape: Shape) -> list[str]:
    """The ranks' names: the group's own for one rank, else `<group>.r<rank>`."""
    if shape.data <= 1:
        return [name]
    return [f"{name}.r{k}" for k in range(shape.data)]


def endpoints(name: str, ranks: list[Replica], shape: Shape) -> list[Routable]:
    """The router's endpoints into a group of `ranks`, by the shape's load-balancing mode."""
    if len(ranks) == 1 or shape.load_balancing not in (*PER_GROUP, *PER_POD):
        return list(ranks)
    if shape.load_balancing in PER_GROUP or shape.nodes <= 1:
        return [Endpoint(name, list(ranks))]
    per_pod = shape.ranks_per_pod
    return [Endpoint(f"{name}.p{p}", ranks[p * per_pod : (p + 1) * per_pod]) for p in range(shape.nodes)]
