"""What a simulation returns: per-request records (columns, cheap for a million requests), a time series
(one row per scrape) and a summary with the figures of `reference/autoscaler-evaluation.md`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from tandem.sim.windows import PATH_NAMES

REFUSED = -1  # path code of a request no pool could take (a 503 from the router)


class RequestRecord(NamedTuple):
    request: int  # its index in the trace
    arrival: float
    path: str | None  # None: refused
    ttft: float | None  # seconds; None when refused
    tpot: float | None  # None when refused or with one output token
    within_slo: bool
    preemptions: int


@dataclass(slots=True)
class RequestRecords:
    """Columns indexed by request (trace order). `first`/`finished` are NaN for refused requests."""

    arrival: array[float]
    output_tokens: array[int]
    path: array[int]  # 0 disaggregated, 1 colocated, REFUSED
    first: array[float]
    finished: array[float]
    preemptions: array[int]
    ttft_slo: float
    tpot_slo: float

    def __len__(self) -> int:
        return len(self.arrival)

    def ttft(self, i: int) -> float | None:
        return None if self.path[i] == REFUSED else self.first[i] - self.arrival[i]

    def tpot(self, i: int) -> float | None:
        out = self.output_tokens[i]
        if self.path[i] == REFUSED or out <= 1:
            return None
        return (self.finished[i] - self.first[i]) / (out - 1)

    def within_slo(self, i: int) -> bool:
        ttft = self.ttft(i)
        if ttft is None or ttft > self.ttft_slo:
            return False
        tpot = self.tpot(i)
        return tpot is None or tpot <= self.tpot_slo

    def __getitem__(self, i: int) -> RequestRecord:
        code = self.path[i]
        return RequestRecord(
            request=i,
            arrival=self.arrival[i],
            path=None if code == REFUSED else PATH_NAMES[code],
            ttft=self.ttft(i),
            tpot=self.tpot(i),
            within_slo=self.within_slo(i),
            preemptions=self.preemptions[i],
        )


class TickSample(NamedTuple):
    """One scrape: the load and latency of the window ending here, and the cluster's size now."""

    time: float
    arrival_rate: float  # requests/s arriving over the window
    finished_rate: float
    replicas: dict[str, int]  # by role: replicas holding GPUs (starting, ready or draining)
    ready: dict[str, int]
    gpus: int
    ttft_p90: float  # NaN without requests in the window
    tpot_p90: float


class Summary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int
    finished: int
    refused: int
    within_slo: int
    attainment: float  # within SLO / all requests (refused ones count as misses)
    ttft_attainment: float
    tpot_attainment: float
    duration_seconds: float  # virtual time from 0 to the last event
    gpu_hours: float
    goodput_per_gpu_hour: float  # within-SLO requests per GPU-hour
    scale_actions: int  # pool size changes applied from the policy's decisions
    peak_gpus: int
    mean_gpus: float
    preemptions: int
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tpot_p50: float
    tpot_p90: float
    tpot_p99: float
    # by role: prompt tokens looked up in and found in the replicas' prefix caches (vLLM's
    # prefix_cache_queries / _hits), and GPU-hours spent computing steps (busy time x TP)
    prefix_queries: dict[str, int] = {}
    prefix_hits: dict[str, int] = {}
    busy_gpu_hours: dict[str, float] = {}
    # P/D requests by the reason of spec.router.disaggregation's choice (SimConfig.disaggregation;
    # empty under Always)
    prefill_choices: dict[str, int] = {}
    # SimConfig.bidirectional_kv: prompt tokens prefill replicas read back from decode replicas
    pulled_back_tokens: int = 0


@dataclass(slots=True)
class SimResult:
    records: RequestRecords
    series: list[TickSample]
    summary: Summary
