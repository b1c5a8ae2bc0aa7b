"""The discrete-event cluster simulator, in virtual time, and the trace readers. Pure: no clock, and no
I/O beyond the trace readers reading the file they are given.

- `requests`: `Request`, one request of a trace.
- `layout`: pools of replicas (`ReplicaSpec`, `PoolSpec`, `Layout`), the `SLO`, `SimConfig`.
- `replica`: one vLLM V1 engine (continuous batching, chunked prefill, KV capacity, preemption), with runs
  of decode steps in closed form.
- `group`: a replica as a group of `parallelism.data` engines (ranks), and the router's endpoints into it.
- `cluster`: the event loop, the router's choices, KV transfer, scaling; `simulate(...)`.
- `windows`: Prometheus-like counters, histograms and gauges over a sliding window; `histogram_quantile`.
- `observe`: those windows as the autoscaler's `Snapshot`.
- `policy`: the `Policy` protocol the simulator calls every interval; `StaticPolicy`.
- `results`: per-request records, the time series, the `Summary`.
- `traces`: readers (Azure 2023, Mooncake, plain CSV/JSONL), scaling and windows, the ServeGen generator.
"""

from tandem.sim.cluster import simulate
from tandem.sim.layout import SLO, Layout, PoolSpec, ReplicaSpec, SimConfig
from tandem.sim.policy import Policy, ScheduledPolicy, StaticPolicy
from tandem.sim.requests import Request
from tandem.sim.results import RequestRecord, RequestRecords, SimResult, Summary, TickSample

__all__ = [
    "SLO",
    "Layout",
    "Policy",
    "PoolSpec",
    "ReplicaSpec",
    "Request",
    "RequestRecord",
    "RequestRecords",
    "ScheduledPolicy",
    "SimConfig",
    "SimResult",
    "StaticPolicy",
    "Summary",
    "TickSample",
    "simulate",
]
