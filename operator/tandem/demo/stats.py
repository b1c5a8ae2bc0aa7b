"""Latency samples of replayed requests: percentiles and SLO attainment (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tandem.perf.stats import percentile


@dataclass(frozen=True)
class Sample:
    """One finished request as the client saw it."""

    ok: bool
    ttft_s: float = math.nan
    tpot_s: float = math.nan  # nan for one-token answers
    output_tokens: int = 0
    input_tokens: int = 0
    error: str = ""
    sent_at: float = math.nan  # wall-clock time (epoch seconds) the request was sent
    label: str = ""  # the load phase that sent it
    request_id: str = ""  # the X-Request-Id it was sent with ("": none, the router chose one)


@dataclass
class Tally:
    """Everything measured so far."""

    sent: int = 0
    in_flight: int = 0
    samples: list[Sample] = field(default_factory=list)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def failed(self) -> list[Sample]:
        return [s for s in self.samples if not s.ok]

    def ttft(self, p: float) -> float:
        return percentile([s.ttft_s for s in self.ok], p)

    def tpot(self, p: float) -> float:
        return percentile([s.tpot_s for s in self.ok], p)

    def attainment(self, ttft_slo_s: float, tpot_slo_s: float) -> float:
        """Share of all finished requests that succeeded within both SLOs (nan before the first)."""
        if not self.samples:
            return math.nan
        good = [
            s for s in self.ok if s.ttft_s <= ttft_slo_s and (math.isnan(s.tpot_s) or s.tpot_s <= tpot_slo_s)
        ]
        return len(good) / len(self.samples)

    def tokens(self) -> tuple[int, int]:
        return sum(s.input_tokens for s in self.ok), sum(s.output_tokens for s in self.ok)
