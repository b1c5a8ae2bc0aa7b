"""Kubernetes' time stamps (metav1.Time): RFC 3339 in UTC to the second, as `2026-12-01T22:30:00Z`.

The one formatter and the one parser every floor uses (status, Events, leases, decisions, the tools
that read them). Pure: the time is an argument.
"""

from __future__ import annotations

import datetime as dt


def rfc3339(epoch: float) -> str:
    """`epoch` (seconds) as Kubernetes writes a time: UTC, whole seconds, `Z`."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    """Epoch seconds of an RFC 3339 time (`Z` or an offset; fractions kept); ValueError if it is not one."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
