"""The serving process's own work on each request before the scheduler sees it (the sim engine's
TANDEM_SIM_REQUEST_LATENCY_SECONDS), done one request at a time.

vLLM's OpenAI server is one asyncio process: parsing a request, building its sampling parameters and
handing it to the engine core is CPU work that does not overlap with another request's. So N requests
arriving together reach the scheduler one `work` apart, not all after one `work`.
"""

from __future__ import annotations


class IngressQueue:
    """First come, first served over one serving process's time."""

    def __init__(self) -> None:
        self._free_at = float("-inf")

    def admit(self, now: float, work: float) -> float:
        """Seconds from `now` until a request arriving then, needing `work` seconds of the serving
        process, is handed on: its own work, after the work of those admitted before it."""
        start = max(now, self._free_at)
        self._free_at = start + work
        return self._free_at - now
