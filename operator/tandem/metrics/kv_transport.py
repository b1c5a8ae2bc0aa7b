"""Is the KV transport as fast as the link it was given? Reads the engines' NIXL metrics.

vLLM's NIXL connector records, on the engine that READs the KV (decode), one observation per
successful transfer in `vllm:nixl_xfer_time_seconds` (its duration) and `vllm:nixl_bytes_transferred`
(its size), and counts `vllm:nixl_num_failed_transfers` (reference 3.4). Over a window this module
reads their increases (`queries.KV_QUERIES`) and derives:

- `transfers` (successful + failed), `failed_transfers`, `failure_rate` (None without a transfer);
- the effective bandwidth of the transfers above a minimum size, against the configured link.

Why a minimum size: a small transfer is latency-bound (post, notification, a few descriptors), so its
bytes over its time says nothing about the link. Prometheus histograms do not pair a transfer's
size with its time, so the window's large transfers are bounded, not filtered (`judge`):

1. The minimum is rounded UP to a bucket bound B of the bytes histogram (powers of 4 from 2 KiB):
   the judged transfers are the `n_large` transfers over B, all truly over the minimum.
2. Their bytes: at least `n_large x B`, and at least the window's bytes minus what the small
   transfers can hold (each at most its bucket's upper bound); at most the window's bytes minus
   the small ones' lower bounds.
3. Their time, from the duration histogram: the small transfers took at least as long as the
   `n_small` fastest and the large ones at most as long as the `n_large` slowest, so the large
   ones took at most `min(seconds - fastest(n_small) by lower bounds, slowest(n_large) by upper
   bounds)`: with the least bytes, the FLOOR of their bandwidth, which holds with no assumption.
   If a transfer's time grows with its size (latency + bytes / link: one link), the large
   transfers ARE the slowest, so they took at least `max(seconds - fastest(n_small) by upper
   bounds, slowest(n_large) by lower bounds)`: with the most bytes, the CEILING. With no small
   transfer in the window both are exact and equal.

`effective_gbps` is the ceiling (the most the evidence allows), so a reading below a threshold
is proven slow: a degraded verdict is never an artefact of small transfers. Fewer than
`min_judged_transfers` large transfers, or a ceiling the buckets cannot bound (small transfers in
the histogram's +Inf duration bucket), give None: not judged.

Limits: transfers to several decode pods are summed, so a window mixing a fast and a slow pod
reads as their bytes-weighted mix (and may break the ceiling's one-link assumption; the floor
still holds). On real vLLM with tensor parallelism each rank observes its own READ of its own slice
[derived from the connector's per-worker stats], so the figure is per rank; `bandwidthGbps` is the
link each READ runs over. The sim engine observes one READ per pull at the pod's link.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from tandem.api.models import EngineType, KVTransferSpec, PDDeploymentSpec
from tandem.metrics.queries import Result, kv_transport_queries
from tandem.metrics.reader import QueryRunner

MIN_JUDGED_TRANSFERS: Final = 5  # large transfers a window needs before its bandwidth is judged
_BITS_PER_GBIT: Final = 1e9 / 8.0

Buckets = Sequence[tuple[float, float]]  # (upper bound `le`, cumulative count), any order


@dataclass(frozen=True, slots=True)
class BandwidthJudgement:
    judged_transfers: float  # transfers over `judged_above_bytes`
    judged_above_bytes: float | None  # the bucket bound the minimum was rounded up to; None: none
    effective_gbps: float | None  # ceiling of the judged transfers' bandwidth; None: not judged
    effective_gbps_floor: float | None  # floor (holds without the one-link assumption)
    reason: str  # why not judged, or "" when judged


@dataclass(frozen=True, slots=True)
class KvTransportReading:
    """One PDDeployment's KV transport over `window_seconds` ending at `observed_at`."""

    observed_at: float
    window_seconds: float
    transfers: float = 0.0  # KV transfers in the window, successful and failed (extrapolated)
    failed_transfers: float = 0.0
    failure_rate: float | None = None  # failed / transfers; None: no transfer
    judged_transfers: float = 0.0  # successful transfers over `judged_above_bytes`
    judged_above_bytes: float | None = None
    effective_gbps: float | None = None  # at most this fast (see the module docstring)
    effective_gbps_floor: float | None = None  # at least this fast
    link_gbps: float = 0.0  # what the link should give (spec.kvTransfer.bandwidthGbps, sim-scaled)
    bandwidth_ratio: float | None = None  # effective_gbps / link_gbps; None: nothing large enough
    nixl_metrics: bool = False  # some engine pod exports NIXL metrics at all
    not_judged: str = ""  # why bandwidth_ratio is None (when it is)
    missing: tuple[str, ...] = ()  # queries that failed: "name: error"


# --- pure arithmetic ------------------------------------------------------------------------------


def _cumulative(buckets: Buckets) -> list[tuple[float, float]]:
    """Sorted by bound, counts made non-decreasing (increase() extrapolates each series alone)."""
    out: list[tuple[float, float]] = []
    running = 0.0
    for le, count in sorted((le, c) for le, c in buckets if not math.isnan(le) and math.isfinite(c)):
        running = max(running, count)
        out.append((le, running))
    return out


def _bins(cumulative: list[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """(lower bound, upper bound, count) per bucket, from the bottom."""
    out: list[tuple[float, float, float]] = []
    previous_le = previous_count = 0.0
    for le, count in cumulative:
        if count > previous_count:
            out.append((previous_le, le, count - previous_count))
        previous_le, previous_count = le, count
    return out


def _extreme(bins: list[tuple[float, float, float]], n: float) -> tuple[float, float]:
    """(least, most) total duration of `n` transfers taken from the first bins on; inf when the
    bins hold fewer than `n` or an upper bound taken is +Inf."""
    least = most = 0.0
    left = n
    for lower, upper, count in bins:
        if left <= 1e-9:
            break
        take = min(left, count)
        least += take * lower
        most += take * upper
        left -= take
    return (least, math.inf) if left > 1e-9 else (least, most)


def judge(
    *,
    transfers: float,
    bytes_sum: float,
    seconds_sum: float,
    bytes_buckets: Buckets,
    seconds_buckets: Buckets,
    min_judged_bytes: float,
    min_judged_transfers: float = MIN_JUDGED_TRANSFERS,
) -> BandwidthJudgement:
    """The bandwidth of a window's successful transfers over `min_judged_bytes` (module docstring)."""
    sizes = _cumulative(bytes_buckets)
    bound = next((le for le, _ in sizes if le >= min_judged_bytes and math.isfinite(le)), None)
    if transfers <= 0 or seconds_sum <= 0 or bytes_sum <= 0:
        return BandwidthJudgement(0.0, bound, None, None, "no KV transfer in the window")
    if bound is None:
        return BandwidthJudgement(0.0, None, None, None, "minimum size above the histogram's buckets")
    total = sizes[-1][1] if sizes and math.isinf(sizes[-1][0]) else transfers
    small_bytes_least = small_bytes_most = 0.0
    n_small, previous_le, previous_count = 0.0, 0.0, 0.0
    for le, count in sizes:
        if le > bound:
            break
        in_bucket = count - previous_count
        small_bytes_least += in_bucket * previous_le
        small_bytes_most += in_bucket * le
        n_small, previous_le, previous_count = count, le, count
    n_large = max(0.0, total - n_small)
    if n_large < min_judged_transfers:
        return BandwidthJudgement(
            n_large,
            bound,
            None,
            None,
            f"{n_large:.0f} transfer(s) over {_size(bound)} in the window,"
            f" fewer than {min_judged_transfers:g}",
        )
    bytes_least = max(n_large * bound, bytes_sum - small_bytes_most)
    bytes_most = max(bytes_least, bytes_sum - small_bytes_least)
    durations = _bins(_cumulative(seconds_buckets))
    fastest_least, fastest_most = _extreme(durations, n_small)
    slowest_least, slowest_most = _extreme(durations[::-1], n_large)
    # Any n_small transfers took at least the n_small fastest, any n_large at most the n_large
    # slowest: so the large ones took at most this, with no assumption ...
    seconds_most = min(seconds_sum - fastest_least, slowest_most)
    # ... and, when time grows with size (they ARE the slowest), at least this.
    seconds_least = max(seconds_sum - fastest_most, slowest_least)
    if seconds_most <= 0:  # inconsistent answers (series scraped apart): nothing to divide by
        return BandwidthJudgement(n_large, bound, None, None, "transfer durations inconsistent")
    floor = bytes_least / seconds_most / _BITS_PER_GBIT
    if seconds_least <= 0:
        return BandwidthJudgement(
            n_large, bound, None, floor, "small transfers' durations unbounded by the histogram"
        )
    ceiling = bytes_most / seconds_least / _BITS_PER_GBIT
    return BandwidthJudgement(n_large, bound, ceiling, floor, "")


def reading_from(
    results: Mapping[str, Result],
    errors: Mapping[str, str],
    *,
    now: float,
    window_seconds: float,
    link_gbps: float,
    min_judged_bytes: float,
    min_judged_transfers: float = MIN_JUDGED_TRANSFERS,
) -> KvTransportReading:
    """The reading from recorded answers of `kv_transport_queries` (by name) and failed queries."""
    missing = tuple(f"{name}: {error}" for name, error in sorted(errors.items()))
    base = KvTransportReading(observed_at=now, window_seconds=window_seconds, link_gbps=link_gbps)
    if missing:
        return dataclasses.replace(base, missing=missing, not_judged="queries failed")
    if _scalar(results.get("kv_series", [])) <= 0:
        return dataclasses.replace(base, not_judged="no engine exports NIXL metrics")
    ok = _scalar(results.get("kv_transfers", []))
    failed = _scalar(results.get("kv_failed", []))
    attempts = ok + failed
    judgement = judge(
        transfers=ok,
        bytes_sum=_scalar(results.get("kv_bytes", [])),
        seconds_sum=_scalar(results.get("kv_seconds", [])),
        bytes_buckets=_buckets(results.get("kv_bytes_buckets", [])),
        seconds_buckets=_buckets(results.get("kv_seconds_buckets", [])),
        min_judged_bytes=min_judged_bytes,
        min_judged_transfers=min_judged_transfers,
    )
    effective = judgement.effective_gbps
    return dataclasses.replace(
        base,
        nixl_metrics=True,
        transfers=attempts,
        failed_transfers=failed,
        failure_rate=failed / attempts if attempts > 0 else None,
        judged_transfers=judgement.judged_transfers,
        judged_above_bytes=judgement.judged_above_bytes,
        effective_gbps=effective,
        effective_gbps_floor=judgement.effective_gbps_floor,
        bandwidth_ratio=effective / link_gbps if effective is not None and link_gbps > 0 else None,
        not_judged=judgement.reason,
    )


def reference_link_gbps(spec: PDDeploymentSpec) -> float:
    """The bandwidth a healthy link gives: `spec.kvTransfer.bandwidthGbps`; a sim engine runs every
    modelled latency TANDEM_SIM_TIME_SCALE times slower (its KV transfers too), so its link is that
    many times slower (a time scale of 0, "as fast as the CPU allows", is judged at the spec's)."""
    link = float(spec.kv_transfer.bandwidth_gbps)
    if spec.engine.type is EngineType.sim:
        for var in spec.engine.env:
            if var.name == "TANDEM_SIM_TIME_SCALE" and var.value:
                with contextlib.suppress(ValueError):
                    scale = float(var.value)
                    if math.isfinite(scale) and scale > 0:
                        link /= scale
    return link


# --- I/O ------------------------------------------------------------------------------------------


def read_kv_transport(
    reader: QueryRunner,
    namespace: str,
    pdd_name: str,
    window_seconds: float,
    now: float,
    *,
    spec: PDDeploymentSpec | None = None,
    revision: str | None = None,
) -> KvTransportReading:
    """One PDDeployment's KV transport over `window_seconds` ending at `now` (unix seconds).

    `spec` gives the link (`reference_link_gbps`) and the minimum judged size
    (`kvTransfer.minJudgedTransferBytes`); without it, the API's defaults. `revision`: only that
    serving revision's pods ("" for the legacy revision). Never raises: failed queries are named in
    `missing` (then nothing is judged)."""
    kv = spec.kv_transfer if spec is not None else KVTransferSpec()
    link = reference_link_gbps(spec) if spec is not None else float(kv.bandwidth_gbps)
    results, errors = reader.run(kv_transport_queries(namespace, pdd_name, window_seconds, revision), now)
    return reading_from(
        results,
        errors,
        now=now,
        window_seconds=window_seconds,
        link_gbps=link,
        min_judged_bytes=float(kv.min_judged_transfer_bytes),
    )


# --- helpers --------------------------------------------------------------------------------------


def _scalar(result: Result) -> float:
    """The value of a one-sample answer (an aggregate without `by`); 0 for none, NaN as 0."""
    total = 0.0
    for sample in result:
        with contextlib.suppress(KeyError, IndexError, TypeError, ValueError):
            value = float(sample["value"][1])
            if math.isfinite(value):
                total += value
    return total


def _buckets(result: Result) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for sample in result:
        with contextlib.suppress(KeyError, IndexError, TypeError, ValueError):
            le = float((sample.get("metric") or {})["le"])  # "+Inf" parses as inf
            value = float(sample["value"][1])
            if math.isfinite(value):
                out.append((le, value))
    return out


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"
