"""The router's histogram buckets, shared with the cluster simulator (`tandem.sim`). Pure constants,
and `token_buckets`, vLLM's token-count series (the sim engine's and the simulator's prompt histograms).

A quantile the simulator computes from its own histograms matches what `histogram_quantile` makes
of the router's only if both use the same bounds. They are vLLM's plus bounds around common SLO
targets (TTFT 200 ms .. 3 s, TPOT 20 .. 80 ms), so a quantile near a target is not interpolated
across a wide bucket.
"""

from __future__ import annotations

from typing import Final

# vLLM's TTFT buckets (reference §3.2) cut below 1 ms too, for the router's own overhead.
# SLO bounds added: 0.2, 0.3, 0.4, 0.6, 0.8, 1.5, 2.0, 3.0.
TTFT_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.6, 0.75, 0.8, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
# vLLM's ITL buckets cut below 10 ms too; SLO bounds added: 0.02, 0.03, 0.04, 0.06, 0.08.
ITL_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.08, 0.1, 0.15,
    0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
TPOT_BUCKETS: Final = ITL_BUCKETS
E2E_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
)  # fmt: skip
LEG_BUCKETS: Final = TTFT_BUCKETS

# The histograms split by length bucket, tenant and model carry fewer bounds (their series multiply):
# the SLO-relevant part of the series above, without the sub-25 ms router-overhead bounds.
BUCKETED_TTFT_BUCKETS: Final = (
    0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
BUCKETED_TPOT_BUCKETS: Final = (
    0.005, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
)  # fmt: skip
BUCKETED_ITL_BUCKETS: Final = BUCKETED_TPOT_BUCKETS

# Length buckets (tokens): the P/D checklist's input split 0-1K, 1K-4K, 4K-16K, 16K+ (K = 1024), and
# an output split of the same shape. Configurable per PDDeployment (spec.router.metrics).
DEFAULT_INPUT_LENGTH_BOUNDS: Final = (1024, 4096, 16384)
DEFAULT_OUTPUT_LENGTH_BOUNDS: Final = (128, 512, 2048)
# Concurrency buckets (requests in flight at one router on the request's path when it arrived, itself
# included): 1-3, 4-15, 16-63, 64-255, 256+ (labels 0-4, 4-16, ...). Configurable the same way.
DEFAULT_CONCURRENCY_BOUNDS: Final = (4, 16, 64, 256)


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series up to max_model_len (its prompt/generation token histograms' buckets)."""
    out: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        scale *= 10


__all__ = [
    "BUCKETED_ITL_BUCKETS",
    "BUCKETED_TPOT_BUCKETS",
    "BUCKETED_TTFT_BUCKETS",
    "DEFAULT_CONCURRENCY_BOUNDS",
    "DEFAULT_INPUT_LENGTH_BOUNDS",
    "DEFAULT_OUTPUT_LENGTH_BOUNDS",
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "LEG_BUCKETS",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
    "token_buckets",
]
