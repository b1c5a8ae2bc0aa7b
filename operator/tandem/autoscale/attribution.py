"""Which pool a TTFT miss is charged to, from where the time went (pure).

On the P/D path a client's time to first token is the router's queue, then the prefill leg (the
prefill engine's queue and compute), then the decode leg until its first token (the KV read and the
decode engine's queue and first step). `TtftBreakdown` holds the window's means of those parts, from
the routers' leg timings and the engines' own histograms (`tandem.signals`). Each part has an
unloaded floor that no replica count removes: a prompt's compute alone, the KV read at the link's
modelled rate, one decode step; the router's queue has none. What a part takes beyond its floor is
its excess, and the miss is charged to the part with the largest excess:

- `routerQueue`, all of it, charged to decode: the router holds a request before its prefill leg
  only while every decode pod is near its KV capacity (backpressure);
- `prefillQueue` + `prefillCompute`, the queue plus compute beyond a prompt alone (prompts sharing
  steps), charged to prefill;
- `kvTransfer`, reads beyond the modelled time at `kvTransfer.bandwidthGbps` (a slow or lossy link),
  charged to no pool: more replicas do not speed the link;
- `decodeWait`, the decode leg's first token beyond the read and one step (waiting for KV blocks or a
  slot), charged to decode. Where the decode engines export their own TTFT, the wait is that TTFT
  less their KV read (one scrape of the same pods), and the rest of the leg (the network to the
  engine) counts with the KV transfer: the router's leg and the engines' reads are scraped apart, so
  their difference alone misreads a link that just slowed as decode's wait.

Requests prefilled on their decode pod (spec.router.disaggregation Auto or Threshold,
`TtftBreakdown.local_share` of them) have no prefill leg and no KV read: their whole time to first
token is the decode leg's, and decode did the work, so it counts in `decodeWait` (beyond one decode
step, the local prefill's compute included) and is charged to decode. The parts are each request's
share of the mean TTFT: the prefill leg's and the KV read's means (over the remote requests) and
their floors weigh by the remote share, so that a window of mostly local prefills does not charge
prefill for the few prompts it computed.

The prefill queue and compute are one part when charging (the same pool); the breakdown still shows
which of the two dominates (`cause`). Without any excess the miss is the compute floor itself (prompts
too long for the target), charged to prefill as before. TPOT misses are decode's and are not
attributed here. Without a breakdown (the colocated path, or routers and engines that do not time the
legs) `attribute_ttft` falls back to the older rule: the miss is decode's when decode cannot admit
(requests waiting there, or a KV cache nearly full) while prefill has less than one request queued per
replica, prefill's otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

from tandem.signals import TtftBreakdown

Part = Literal["routerQueue", "prefillQueue", "prefillCompute", "kvTransfer", "decodeWait"]
Cause = Literal[Part, "decodeFull", "prefill"]  # the last two: the fallback rule without a breakdown
Charged = Literal["prefill", "decode"] | None

PARTS: Final[tuple[Part, ...]] = ("routerQueue", "prefillQueue", "prefillCompute", "kvTransfer", "decodeWait")
CHARGED: Final[dict[str, Charged]] = {
    "routerQueue": "decode",
    "prefillQueue": "prefill",
    "prefillCompute": "prefill",
    "kvTransfer": None,
    "decodeWait": "decode",
    "decodeFull": "decode",
    "prefill": "prefill",
}
# Figures' names for the parts' seconds (ScaleDecision.figures, camelCase).
FIGURE: Final[dict[Part, str]] = {
    "routerQueue": "ttftRouterQueueSeconds",
    "prefillQueue": "ttftPrefillQueueSeconds",
    "prefillCompute": "ttftPrefillComputeSeconds",
    "kvTransfer": "ttftKvTransferSeconds",
    "decodeWait": "ttftDecodeWaitSeconds",
}
_NAMES: Final[dict[str, str]] = {
    "routerQueue": "the router's queue (decode backpressure)",
    "prefillQueue": "prefill's queue",
    "prefillCompute": "prefill's compute",
    "kvTransfer": "the KV transfer",
    "decodeWait": "decode's wait for KV room and its first step",
    "decodeFull": "decode (it cannot admit while prefill has no queue)",
    "prefill": "prefill",
}


@dataclass(frozen=True, slots=True)
class Floors:
    """The unloaded time of each part for the window's mean prompt, seconds (from the perf profile)."""

    prefill_compute: float  # one prompt computed alone
    kv_transfer: float  # its KV read at the link's modelled rate
    decode_step: float  # one decode step


@dataclass(frozen=True, slots=True)
class Attribution:
    cause: Cause
    charged: Charged  # the pool a TTFT miss grows (None: no pool, the KV link)
    seconds: dict[Part, float]  # each part's mean, empty without a breakdown
    excess: dict[Part, float]  # each part beyond its floor, empty without a breakdown

    @property
    def name(self) -> str:
        return _NAMES[self.cause]

    def text(self) -> str:
        """e.g. 'TTFT mean 8.4 s: prefill's queue 6.1 s, ...; charged to prefill (prefill's queue)'."""
        if not self.seconds:
            return f"TTFT charged to {self.charged or 'no pool'} ({self.name})"
        parts = ", ".join(f"{_short(part)} {_seconds(value)}" for part, value in self.seconds.items())
        whom = f"charged to {self.charged}" if self.charged else "charged to no pool"
        return f"TTFT parts {parts}; {whom} ({self.name})"


def _short(part: Part) -> str:
    return {
        "routerQueue": "router queue",
        "prefillQueue": "prefill queue",
        "prefillCompute": "prefill compute",
        "kvTransfer": "KV transfer",
        "decodeWait": "decode wait",
    }[part]


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2g} s"


def split(breakdown: TtftBreakdown, floors: Floors) -> tuple[dict[Part, float], dict[Part, float]]:
    """Each part's seconds and its excess over its floor, as shares of the mean TTFT over every P/D
    request (the remote-only parts and their floors weighed by the remote share). A part the engines
    do not time is folded into its neighbour: no prefill queue, the whole leg is compute; no KV read
    time, the modelled read is taken out of the decode leg."""
    remote = breakdown.remote_share
    leg = remote * max(0.0, breakdown.prefill_leg)
    queue = min(leg, remote * max(0.0, breakdown.prefill_queue or 0.0))
    compute = leg - queue
    first = max(0.0, breakdown.decode_first_token)
    kv = breakdown.kv_transfer
    kv_seconds = min(first, remote * max(0.0, kv if kv is not None else floors.kv_transfer))
    wait = first - kv_seconds
    engine_first = breakdown.decode_engine_first_token
    if engine_first is not None:
        # Decode's wait as its engines time it, against the KV read of the same scrape. The router's
        # leg comes from another target, scraped up to an interval apart: while the link changes, one
        # window can hold slow reads the other does not yet, and their difference would charge decode
        # for the link. The leg's time outside the decode engine (the network to it) goes with the
        # KV transfer: no replica count shortens either.
        wait = min(wait, max(0.0, min(first, engine_first) - kv_seconds))
        kv_seconds = first - wait
    seconds: dict[Part, float] = {
        "routerQueue": breakdown.router_queue,
        "prefillQueue": queue,
        "prefillCompute": compute,
        "kvTransfer": kv_seconds,
        "decodeWait": wait,
    }
    excess: dict[Part, float] = {
        "routerQueue": breakdown.router_queue,
        "prefillQueue": queue,
        "prefillCompute": max(0.0, compute - remote * floors.prefill_compute),
        "kvTransfer": 0.0 if kv is None else max(0.0, kv_seconds - remote * floors.kv_transfer),
        "decodeWait": max(0.0, wait - floors.decode_step),
    }
    return seconds, excess


def attribute_ttft(
    breakdown: TtftBreakdown | None, floors: Floors, *, decode_full: bool, prefill_queued: bool
) -> Attribution:
    """The part a TTFT miss is charged to (see the module docstring). `decode_full` and `prefill_queued`
    are the fallback rule's inputs, used only without a usable breakdown."""
    if breakdown is None or not _usable(breakdown):
        cause: Cause = "decodeFull" if decode_full and not prefill_queued else "prefill"
        return Attribution(cause=cause, charged=CHARGED[cause], seconds={}, excess={})
    seconds, excess = split(breakdown, floors)
    # One pool's parts charge together: prefill's queue and compute are both prefill's.
    by_pool = {
        "prefill": excess["prefillQueue"] + excess["prefillCompute"],
        "decode": excess["routerQueue"] + excess["decodeWait"],
        "kv": excess["kvTransfer"],
    }
    # Ties go to prefill, then decode: growing a pool is the safe answer to a miss of unclear cause.
    pool = max(("prefill", "decode", "kv"), key=lambda name: by_pool[name])  # the first of equals
    if by_pool[pool] <= 0:
        part: Part = "prefillCompute"
    elif pool == "prefill":
        part = "prefillQueue" if seconds["prefillQueue"] >= excess["prefillCompute"] else "prefillCompute"
    elif pool == "decode":
        part = "routerQueue" if excess["routerQueue"] >= excess["decodeWait"] else "decodeWait"
    else:
        part = "kvTransfer"
    return Attribution(cause=part, charged=CHARGED[part], seconds=seconds, excess=excess)


def _usable(breakdown: TtftBreakdown) -> bool:
    values = [breakdown.ttft, breakdown.prefill_leg, breakdown.decode_first_token]
    optional = (breakdown.prefill_queue, breakdown.kv_transfer, breakdown.decode_engine_first_token)
    values += [v for v in optional if v is not None]
    share = breakdown.local_share
    return (
        all(math.isfinite(v) and v >= 0 for v in values)
        and breakdown.ttft > 0
        and math.isfinite(share)
        and 0.0 <= share <= 1.0
    )
