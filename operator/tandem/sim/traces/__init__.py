"""Traces for the simulator: readers (`readers`), reshaping (`transform`), ServeGen's curve (`servegen`),
prefix information for prefix caching (`prefix`: Mooncake's hash ids, multi-turn sessions).

The repository's copies live in `traces/` at the top level (see its README for origin and licences).
"""

from tandem.sim.traces.prefix import SessionParams, sessions, with_mooncake_prefix
from tandem.sim.traces.readers import TraceError, read_azure, read_mooncake, read_plain
from tandem.sim.traces.servegen import ServeGenData, aggregate_rate, generate, load
from tandem.sim.traces.transform import repeat, scale_rate, scale_time, spread_ticks, take, window

__all__ = [
    "ServeGenData",
    "SessionParams",
    "TraceError",
    "aggregate_rate",
    "generate",
    "load",
    "read_azure",
    "read_mooncake",
    "read_plain",
    "repeat",
    "scale_rate",
    "scale_time",
    "sessions",
    "spread_ticks",
    "take",
    "window",
    "with_mooncake_prefix",
]
