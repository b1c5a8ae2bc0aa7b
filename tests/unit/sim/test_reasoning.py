"""The decode-heavy mix (`tandem.sim.traces.reasoning`): a trace's arrivals and prompts kept, its outputs
drawn log-uniform in the reasoning range, reproducibly."""

from __future__ import annotations

import math

import pytest

from tandem.sim import Request
from tandem.sim.traces.reasoning import REASONING_OUTPUT_TOKENS, reasoning_mix

BASE = [Request(i * 0.5, 100 + i, 20, tenant="t") for i in range(4000)]


@pytest.mark.parametrize(("low", "high"), [REASONING_OUTPUT_TOKENS, (1, 1), (500, 600), (1024, 1024)])
def test_outputs_are_within_the_range_and_the_rest_is_kept(low: int, high: int) -> None:
    mixed = reasoning_mix(BASE, low, high, seed=3)
    assert len(mixed) == len(BASE)
    assert all(low <= r.output_tokens <= high for r in mixed)
    assert [r._replace(output_tokens=0) for r in mixed] == [r._replace(output_tokens=0) for r in BASE]


def test_the_draw_is_log_uniform_and_seeded() -> None:
    mixed = reasoning_mix(BASE, seed=7)
    assert mixed == reasoning_mix(BASE, seed=7)
    assert mixed != reasoning_mix(BASE, seed=8)
    outs = [r.output_tokens for r in mixed]
    low, high = REASONING_OUTPUT_TOKENS
    # log-uniform: each factor of 2 (1-2k, 2-4k, 4-8k) holds about a third of the requests
    for start in (1024, 2048, 4096):
        share = sum(start <= n < 2 * start for n in outs) / len(outs)
        assert share == pytest.approx(1 / 3, abs=0.03), start
    mean = sum(outs) / len(outs)
    assert mean == pytest.approx((high - low) / math.log(high / low), rel=0.03)


@pytest.mark.parametrize(("low", "high"), [(0, 10), (10, 5)])
def test_a_bad_range_is_refused(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="low <= high"):
        reasoning_mix(BASE, low, high)
