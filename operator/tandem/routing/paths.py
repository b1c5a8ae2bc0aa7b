"""Which path a request takes: disaggregated (prefill then decode) or colocated.

Pure. The PDDeployment's serving mode sets the default; a gray weight (the percent of traffic on
P/D, from `status.rollout.weight` while a rollout runs) overrides it; what is actually ready has
the last word: no prefill or decode pod -> colocated when the spec allows it, otherwise a 503.
During a gray split the path is a function of the request id (`draw_for`), so a client that
retries with the same `X-Request-Id` meets the same path, and every router replica agrees.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

Path = Literal["disaggregated", "colocated"]
PATHS: tuple[Path, ...] = ("disaggregated", "colocated")


@dataclass(frozen=True, slots=True)
class Unavailable:
    """No pool can take the request; `message` says which pods are missing, `wanted` the path meant."""

    message: str
    wanted: Path


def disaggregated_share(serving_mode: str | None, rollout_weight: int | None) -> int:
    """Percent of requests meant for P/D. The rollout weight, when set, is the gray split.

    The hook the rollout issue fills: `status.rollout.weight` arrives as `rollout_weight`.
    """
    if rollout_weight is not None:
        return max(0, min(100, rollout_weight))
    return 0 if serving_mode == "Colocated" else 100


def draw_for(request_id: str) -> float:
    """A number in [0, 1), uniform over ids and the same for the same id (in any process)."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def wanted_path(share: int, draw: float) -> Path:
    """The path a request is meant for before readiness has its say (`draw` as in `choose_path`)."""
    return "disaggregated" if draw * 100 < share else "colocated"


def choose_path(
    share: int,
    draw: float,
    *,
    has_prefill: bool,
    has_decode: bool,
    has_colocated: bool,
    colocated_fallback: bool,
) -> Path | Unavailable:
    """The path for one request; `draw` is uniform in [0, 1) (`draw_for` the request's id)."""
    wants_pd = wanted_path(share, draw) == "disaggregated"
    pd_ready = has_prefill and has_decode
    if wants_pd and pd_ready:
        return "disaggregated"
    if not wants_pd and has_colocated:
        return "colocated"
    if wants_pd and has_colocated and colocated_fallback:
        return "colocated"
    if not wants_pd and pd_ready:
        # Colocated wanted but none ready: P/D serves the same model, so use it rather than fail.
        return "disaggregated"
    if wants_pd:
        missing = " and ".join(
            role for role, ready in (("prefill", has_prefill), ("decode", has_decode)) if not ready
        )
        return Unavailable(f"no ready {missing} pod to serve the request", "disaggregated")
    return Unavailable("no ready colocated pod to serve the request", "colocated")
