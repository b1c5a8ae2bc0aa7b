"""The slow-link fault: `Faults.kv_bandwidth_factor` and how the two ends' factors combine."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from tandem.engine.settings import Faults, SimSettings
from tandem.engine.sidechannel import link_factor


@pytest.mark.parametrize(
    ("own", "peer", "expected"),
    [
        (1.0, None, 1.0),  # an older reader sends no factor
        (1.0, 1.0, 1.0),
        (0.25, None, 0.25),  # the prefill end is slow
        (1.0, 0.1, 0.1),  # the decode end is slow
        (0.5, 0.2, 0.2),  # both: the slower end bounds the link
        (0.2, 0.5, 0.2),
        (0.5, "0.25", 0.25),
        (0.5, "fast", 0.5),  # garbage from the peer counts as a healthy end
        (0.5, 0.0, 0.5),
        (0.5, -1, 0.5),
        (0.5, 7, 0.5),
        (0.5, math.nan, 0.5),
        (0.5, [0.1], 0.5),
    ],
)
def test_link_factor(own: float, peer: Any, expected: float) -> None:
    assert link_factor(own, peer) == expected


def test_the_factor_is_off_by_default_and_bounded() -> None:
    assert Faults().kv_bandwidth_factor == 1.0
    assert Faults().merged({"kv_bandwidth_factor": 0.1}).kv_bandwidth_factor == 0.1
    for bad in (0, -0.5, 1.01):
        with pytest.raises(ValidationError):
            Faults().merged({"kv_bandwidth_factor": bad})


def test_the_factor_can_be_set_from_the_start() -> None:
    settings = SimSettings.from_env({"TANDEM_SIM_FAULTS": '{"kv_bandwidth_factor": 0.05}'})
    assert settings.faults.kv_bandwidth_factor == 0.05
