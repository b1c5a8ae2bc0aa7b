"""What a tandem process reports about itself on its own /metrics, shared by the operator and the
router (two shells that must not import each other). No I/O.
"""

from __future__ import annotations

import asyncio


def running_tasks() -> float:
    """Tasks alive in the running event loop; nan when read outside one (the operator's and the
    router's gauges are read by their /metrics handlers, on their loops)."""
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:
        return float("nan")
