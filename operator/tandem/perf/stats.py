"""Order statistics of latency samples: the one nearest-rank percentile every figure uses (the
simulator's summary, `tandem advise`, the demo's and the e2e tests' client-side TTFT and TPOT, the
benches). Pure.

Nearest rank, not interpolation: the figure is a value that was measured, and the q-quantile of n
values is the ceil(q n)-th smallest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-quantile (`q` in [0, 1]) of values sorted ascending; nan for none."""
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def percentile(values: Iterable[float], p: float) -> float:
    """The nearest-rank `p`-th percentile (`p` in [0, 100]) of the values that are not nan; nan for none."""
    return nearest_rank(sorted(v for v in values if not math.isnan(v)), p / 100)
