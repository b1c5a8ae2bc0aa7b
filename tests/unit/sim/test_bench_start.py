"""`bench/autoscale.py --start NP+MD`: every dynamic policy from a layout of the user's choosing instead of
static peak's (docs/autoscaling.md, "Relaxing only under load", measures tandem from several)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tandem.devcluster.testing import load_file

ROOT = Path(__file__).resolve().parents[3]


def _bench() -> ModuleType:
    return load_file("bench_autoscale_start", ROOT / "bench" / "autoscale.py")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5P+1D", {"prefill": 5, "decode": 1}),
        ("12p+3d", {"prefill": 12, "decode": 3}),
        (" 1P + 1D ", {"prefill": 1, "decode": 1}),
    ],
)
def test_a_start_layout_parses(text: str, expected: dict[str, int]) -> None:
    assert _bench().parse_start(text) == expected


@pytest.mark.parametrize("text", ["", "5P", "5P+0D", "0P+1D", "14C", "5D+1P", "-1P+2D", "5P+1D+2C"])
def test_a_bad_start_layout_is_refused_with_the_option_named(text: str) -> None:
    with pytest.raises(ValueError, match="--start"):
        _bench().parse_start(text)


def test_main_refuses_a_bad_start_before_running_anything(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _bench().main(["--quick", "--start", "7C"])
    assert exited.value.code == 2
    assert "--start '7C'" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_dynamic_policies_start_from_the_given_layout() -> None:
    bench = _bench()
    start = {"prefill": 1, "decode": 1}
    outcomes = bench.run_all([bench.QUICK], [bench.STATIC_PEAK, bench.TANDEM], 1, start)
    by_policy = {o.policy: o for o in outcomes}
    assert by_policy[bench.TANDEM].note == "from 1P+1D"
    assert by_policy[bench.STATIC_PEAK].extra["layout"] != start  # the search still runs, from its guess
