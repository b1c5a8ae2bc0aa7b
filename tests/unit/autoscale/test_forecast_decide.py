"""The forecast inside decide(): ordering ahead on a ramp, the SLO loop as the guard, a sooner
scale-down when forecast and load agree, its state in status, and the API knob."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from pydantic import ValidationError

from tandem.api.status import AutoscalingStatus
from tandem.autoscale.decide import Decision, decide
from tandem.autoscale.knobs import KNOBS, Knobs

if TYPE_CHECKING:
    from conftest import Kit, Loop

FORECAST = {"autoscaling": {"forecast": {"enabled": True, "horizonSeconds": 300}}}


def test_off_by_default_keeps_no_state(kit: Kit, make_loop: type[Loop]) -> None:
    loop = make_loop(kit)
    for decision in loop.run(600, prefill=3.0, decode=2.0):
        assert "forecastDemand" not in decision.pools["prefill"].figures
    assert loop.state.pools.prefill.forecast is None
    assert loop.state.pools.decode.forecast is None


def _ramp(loop: Loop, passes: int) -> list[int]:
    """Prefill load rising by a tenth of a replica's worth per pass (0.2 per minute)."""
    targets = []
    for i in range(passes):
        targets.append(loop.step(prefill=1.0 + 0.1 * i, decode=1.0).pools["prefill"].target)
    return targets


def test_a_ramp_is_ordered_one_load_ahead(kit: Kit, make_loop: type[Loop]) -> None:
    on, off = make_loop(kit.with_spec(**FORECAST)), make_loop(kit)
    ahead, behind = _ramp(on, 40), _ramp(off, 40)
    assert all(a >= b for a, b in zip(ahead, behind, strict=True))
    # 300 s ahead at 0.2 replicas/minute is a replica more once the trend is learnt
    assert sum(ahead) >= sum(behind) + 20
    drove = [d.pools["prefill"] for d in on.decisions if d.pools["prefill"].figures.get("forecastDrove")]
    assert drove
    assert "one model load ahead" in drove[-1].reason
    assert drove[-1].figures["forecastHorizonSeconds"] == 300.0


def test_the_slo_loop_stays_the_guard(kit: Kit, make_loop: type[Loop]) -> None:
    """Falling load (the forecast says less) with TTFT missed on a busy pool: still one more replica."""
    loop = make_loop(kit.with_spec(**FORECAST, prefill={"replicas": 4}))
    for i in range(10):
        loop.step(prefill=3.9 - 0.05 * i, decode=1.0)
    current = loop.size("prefill")
    decision = loop.step(prefill=3.4, decode=1.0, ttft=0.9, attainment=0.8)
    assert (
        decision.pools["prefill"].figures["forecastDemand"]
        < decision.pools["prefill"].figures["arrivingPromptTokensPerSecond"]
    )
    assert decision.pools["prefill"].target == current + 1


SOONER = Knobs(forecast_down_share=0.5)


def _step(loop: Loop, knobs: Knobs = SOONER, **load: float) -> Decision:
    """`loop.step` with `knobs` (the sooner scale-down is a knob, off by default)."""
    sizes = {role: (loop.size(role), loop.size(role)) for role in ("prefill", "decode")}
    decision = decide(
        loop.kit.spec, loop.kit.snapshot(loop.now, sizes=sizes, **load), loop.state, loop.now, knobs=knobs
    )
    loop.state = decision.state
    loop.decisions.append(decision)
    loop.now += loop.kit.spec.autoscaling.interval_seconds
    return decision


def _first_down(loop: Loop, high: float, low: float, knobs: Knobs = SOONER) -> tuple[int, str]:
    for _ in range(20):
        _step(loop, knobs, prefill=high, decode=1.0)
    start = loop.size("prefill")
    for i in range(30):
        decision = _step(loop, knobs, prefill=low, decode=1.0)
        if decision.pools["prefill"].target < start:
            return i, decision.pools["prefill"].reason
    return 30, ""


def test_scale_down_sooner_when_forecast_and_load_agree(kit: Kit, make_loop: type[Loop]) -> None:
    on_pass, on_reason = _first_down(make_loop(kit.with_spec(**FORECAST)), 4.5, 2.5)
    off_pass, _ = _first_down(make_loop(kit), 4.5, 2.5)
    default_pass, _ = _first_down(make_loop(kit.with_spec(**FORECAST)), 4.5, 2.5, KNOBS)
    assert off_pass * 30 >= 300  # the whole window without the forecast
    assert default_pass >= off_pass  # never sooner at the default share (1: measured, docs/autoscaling.md)
    assert 150 <= on_pass * 30 < 300  # half of it at share 0.5 (once the forecast has caught up)
    assert "scale-down window x0.5" in on_reason


def test_no_sooner_scale_down_while_the_forecast_rises(kit: Kit, make_loop: type[Loop]) -> None:
    """An oversized pool under a climbing load: once the trend is learnt (four minutes; the trend's time
    constant is five), the forecast one load ahead is above the load, so the window stays whole."""
    loop = make_loop(kit.with_spec(**FORECAST, prefill={"replicas": 8}))
    for i in range(24):
        _step(loop, prefill=1.0 + 0.1 * i, decode=1.0)
    later = [d.pools["prefill"] for d in loop.decisions[8:]]
    assert any(p.recommendation < p.current for p in later)  # a scale-down was wanted
    assert not any("scale-down window x0.5" in p.reason for p in later)


def test_state_survives_a_restart(kit: Kit, make_loop: type[Loop]) -> None:
    """The forecast's state is in status: written, read back by a new operator, the same decision."""
    spec = kit.with_spec(**FORECAST)
    loop = make_loop(spec)
    _ramp(loop, 20)
    stored = loop.state.model_dump(mode="json", by_alias=True, exclude_none=True)
    restored = AutoscalingStatus.model_validate(stored)
    assert restored == loop.state
    snapshot = spec.snapshot(loop.now, sizes={"prefill": (4, 4), "decode": (2, 2)}, prefill=3.0, decode=1.0)
    assert decide(spec.spec, snapshot, restored, loop.now) == decide(
        spec.spec, snapshot, loop.state, loop.now
    )
    forecast = loop.state.pools.prefill.forecast
    assert forecast is not None
    assert forecast.updated_at is not None
    assert len(forecast.model_dump_json(by_alias=True, exclude_none=True)) < 2000


def test_horizon_is_the_measured_start_to_ready_time(kit: Kit, make_loop: type[Loop]) -> None:
    loop = make_loop(kit.with_spec(**FORECAST))
    loop.step(prefill=1.0, decode=1.0)
    for _ in range(4):  # 2 prefill pods starting for 4 passes (120 s)
        loop.step(prefill=1.0, decode=1.0, sizes={"prefill": (4, 2), "decode": (2, 2)})
    decision = loop.step(prefill=1.0, decode=1.0, sizes={"prefill": (4, 4), "decode": (2, 2)})
    forecast = loop.state.pools.prefill.forecast
    assert forecast is not None
    assert forecast.load_seconds == 120.0
    assert decision.pools["decode"].figures["forecastHorizonSeconds"] == 300.0  # decode started nothing
    later = loop.step(prefill=1.0, decode=1.0, sizes={"prefill": (4, 4), "decode": (2, 2)})
    assert later.pools["prefill"].figures["forecastHorizonSeconds"] == 120.0


@pytest.mark.parametrize(
    ("forecast", "field"),
    [
        ({"seasonPeriodSeconds": 60}, "seasonPeriodSeconds"),
        ({"horizonSeconds": 7200}, "horizonSeconds"),
        ({"enabled": True, "horizon": 60}, "horizon"),  # unknown fields are refused
    ],
)
def test_knob_validation_names_the_field(kit: Kit, forecast: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        kit.with_spec(autoscaling={"forecast": forecast})
