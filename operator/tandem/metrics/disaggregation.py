"""A disaggregation-mode rollout's analysis window from Prometheus: the P/D requests the new mode
chose for against those the mode in effect chose for, over the same interval, as a `judge.Window`.

The routers count every finished P/D request by the mode of `spec.router.disaggregation` that chose
where to prefill it (`tandem_router_disaggregation_requests_total{mode, prefill, code}`, within both
SLO targets `..._requests_within_slo_total{mode, prefill}`) and time its successful ones
(`tandem_router_disaggregation_ttft_seconds`, `..._tpot_seconds`, by `mode` and `prefill`); the arms
sum over `prefill`. Both arms run on the same pods, so their KV transport is not told apart: it is
not judged here (a mode rollout and the steady-state fall-back judge it). The queries and the read
are `metrics/arms.py`'s, shared with the mode and revision rollouts.
"""

from __future__ import annotations

from typing import Final

from tandem.metrics.arms import Arm, ArmSeries, read_arm_window
from tandem.metrics.queries import DEFAULT_QUANTILE
from tandem.metrics.reader import QueryRunner
from tandem.rollout.judge import Window

MODES: Final = ArmSeries(
    prefix="disaggregation",
    label="mode",
    requests="tandem_router_disaggregation_requests_total",
    within_slo="tandem_router_disaggregation_requests_within_slo_total",
    ttft="tandem_router_disaggregation_ttft_seconds",
    tpot="tandem_router_disaggregation_tpot_seconds",
    what="P/D requests of each disaggregation mode",
)


def read_mode_window(
    reader: QueryRunner,
    namespace: str,
    pdd_name: str,
    *,
    target: str,
    baseline: str,
    window_seconds: float,
    now: float,
    slo_set: bool,
    quantile: float = DEFAULT_QUANTILE,
) -> Window:
    """`target`/`baseline`: the new mode and the mode in effect (the routers' `mode` label)."""
    return read_arm_window(
        reader,
        MODES,
        namespace,
        pdd_name,
        target=Arm(target),
        baseline=Arm(baseline),
        window_seconds=window_seconds,
        now=now,
        slo_set=slo_set,
        quantile=quantile,
    )
