"""The SLO autoscaler: pure decisions from a `Snapshot` of metrics (no I/O, no clock)."""
