"""The shape of one pool's instance: how many GPUs, pods and data-parallel ranks it has, and where.

Pure arithmetic over the pool's parallelism, the one place it is computed: the models
(`PoolSpec.shape`), the cross-field rules (`rules.py`, over the camelCase dict) and the renderer
read it here. Terms (docs/multinode.md):

- an *instance* (replica) is one vLLM deployment: TP x PP x DP GPUs behind one set of endpoints;
  the autoscaler, the GPU budget and `replicas` count instances;
- it runs on `nodes` pods, one per node, each with the same number of GPUs (at most
  `MAX_GPUS_PER_POD`): GPUs per pod x nodes = TP x PP x DP;
- either each pod holds whole data-parallel ranks (`data_local` of them: data_local x TP x PP =
  GPUs per pod, data_local x nodes = DP), or one rank (DP 1) spans every pod (multi-node TP/PP).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

MAX_GPUS_PER_POD: Final = 8
LOAD_BALANCING_MODES: Final = ("Internal", "Hybrid", "External", "MultiPortExternal")
# Which pods of an instance serve the OpenAI API, by load-balancing mode (docs/multinode.md).
SERVING_WORKERS: Final[dict[str, bool]] = {
    "Internal": False,
    "Hybrid": True,
    "External": True,
    "MultiPortExternal": True,
}


@dataclass(frozen=True)
class Shape:
    """One pool's parallelism (defaults: a single-GPU, single-pod instance)."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    data_local: int | None = None
    expert: bool = False
    load_balancing: str = "Internal"  # one of LOAD_BALANCING_MODES
    nodes: int = 1

    @classmethod
    def of_pool(cls, pool: Mapping[str, Any]) -> Shape:
        """The shape of a pool given as its camelCase dict (missing keys take the API's defaults)."""
        par: Mapping[str, Any] = pool.get("parallelism") or {}
        local = par.get("dataLocal")
        return cls(
            tensor=int(pool.get("tensorParallelSize", 1)),
            pipeline=int(par.get("pipeline", 1)),
            data=int(par.get("data", 1)),
            data_local=None if local is None else int(local),
            expert=bool(par.get("expert", False)),
            load_balancing=str(par.get("loadBalancing", "Internal")),
            nodes=int(pool.get("nodesPerInstance", 1)),
        )

    @property
    def gpus_per_rank(self) -> int:
        """GPUs of one data-parallel rank: TP x PP."""
        return self.tensor * self.pipeline

    @property
    def gpus_per_instance(self) -> int:
        """TP x PP x DP: what `maxGPUs`, the autoscaler and status count per replica."""
        return self.gpus_per_rank * self.data

    @property
    def gpus_per_pod(self) -> int:
        """GPUs each pod of the instance requests (the instance's GPUs spread evenly over its pods)."""
        return self.gpus_per_instance // max(self.nodes, 1)

    @property
    def multi_node(self) -> bool:
        """More than one pod per instance: a LeaderWorkerSet group instead of a StatefulSet pod."""
        return self.nodes > 1

    @property
    def rank_spans_pods(self) -> bool:
        """One data-parallel rank spread over every pod (multi-node TP/PP, DP 1)."""
        return self.multi_node and self.data == 1 and self.gpus_per_rank > self.gpus_per_pod

    @property
    def ranks_per_pod(self) -> int:
        """Data-parallel ranks each pod runs (vLLM --data-parallel-size-local); 1 when a rank spans pods."""
        if self.rank_spans_pods:
            return 1
        return self.data // max(self.nodes, 1)

    @property
    def workers_serve(self) -> bool:
        """Whether the group's worker pods serve the OpenAI API too (not only the leader)."""
        return self.data > 1 and SERVING_WORKERS.get(self.load_balancing, False)

    @property
    def metrics_pods(self) -> int:
        """Pods of one instance with their own engine metrics (scraped by Prometheus): every pod when
        the workers serve, else the leader alone, whose API server reports every rank of the instance
        (vLLM's front end counts each engine it balances over, labelled `engine`)."""
        return self.nodes if self.workers_serve else 1

    @property
    def ports_per_pod(self) -> int:
        """OpenAI API ports each serving pod has: one per local rank with MultiPortExternal, else one."""
        return self.ranks_per_pod if self.load_balancing == "MultiPortExternal" and self.data > 1 else 1

    @property
    def metrics_targets(self) -> int:
        """Scrape targets of one instance: each pod with engine metrics on each of its API ports (a
        MultiPortExternal pod's ranks each on their own port, with their own engine's series). What the
        autoscaler counts as reporting, so a rank whose port fails to scrape leaves its pool partial."""
        return self.metrics_pods * self.ports_per_pod

    def summary(self, gpu_type: str | None = None) -> str:
        """A one-line description for status, printer columns and `tandem render`, e.g.
        `2x8 TP1 DP16 EP Internal` (pods x GPUs per pod, then the parallelism that is not 1)."""
        parts = [f"{self.nodes}x{self.gpus_per_pod}", f"TP{self.tensor}"]
        if self.pipeline > 1:
            parts.append(f"PP{self.pipeline}")
        if self.data > 1:
            parts.append(f"DP{self.data}")
        if self.expert:
            parts.append("EP")
        if self.data > 1:
            parts.append(self.load_balancing)
        if gpu_type:
            parts.append(gpu_type)
        return " ".join(parts)
