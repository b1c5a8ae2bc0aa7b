"""The pure parts of bench/real_fidelity.py: request sets, per-run figures, medians of runs, the table."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import ModuleType

import pytest

from tandem.devcluster.testing import load_file

BENCH = Path(__file__).resolve().parents[3] / "bench" / "real_fidelity.py"


def _load() -> ModuleType:
    return load_file("real_fidelity_bench", BENCH)


rf = _load()
NAN = math.nan


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        # nearest rank: p50 of 4 values is the 2nd, p90 the 4th
        (
            [rf.Sample(0.010, 0.005, 8), rf.Sample(0.020, 0.006, 8), rf.Sample(0.030, 0.007, 8),
             rf.Sample(0.040, 0.008, 8)],
            {"ttft_p50": 20.0, "ttft_p90": 40.0, "tpot_p50": 6.0, "tpot_p90": 8.0},
        ),
        # failed requests are left out; a one-token answer has a TTFT but no TPOT
        (
            [rf.Sample(0.010, NAN, 1), rf.Sample(NAN, NAN, 0, "HTTP 500"), rf.Sample(0.030, 0.004, 8)],
            {"ttft_p50": 10.0, "ttft_p90": 30.0, "tpot_p50": 4.0, "tpot_p90": 4.0},
        ),
        # nothing answered: every figure NaN
        ([rf.Sample(NAN, NAN, 0, "no token")], dict.fromkeys(rf.FIGURES, NAN)),
    ],
)  # fmt: skip
def test_run_figures(samples: list[object], expected: dict[str, float]) -> None:
    got = rf.run_figures(samples)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, nan_ok=True), key


@pytest.mark.parametrize(
    ("runs", "expected_ttft_p50"),
    [
        ([10.0, 30.0, 20.0], 20.0),  # the middle run, not the mean
        ([10.0, 40.0], 25.0),  # two runs: their mean (statistics.median)
        ([10.0, NAN, 30.0], 20.0),  # a run without figures is left out
        ([NAN, NAN], NAN),
    ],
)
def test_median_of_runs(runs: list[float], expected_ttft_p50: float) -> None:
    rows = [dict.fromkeys(rf.FIGURES, x) for x in runs]
    got = rf.median_of_runs(rows)
    assert got["ttft_p50"] == pytest.approx(expected_ttft_p50, nan_ok=True)
    assert set(got) == set(rf.FIGURES)


@pytest.mark.parametrize(
    ("real", "sim", "named", "verdict", "ratio"),
    [
        (125.0, 100.0, True, "PASS", 1.25),  # exactly 25% above: within
        (75.0, 100.0, True, "PASS", 0.75),
        (126.0, 100.0, True, "FAIL", 1.26),
        (70.0, 100.0, True, "FAIL", 0.70),
        (300.0, 100.0, False, "", 3.0),  # not named: shown, never judged
        (100.0, NAN, True, "FAIL", NAN),  # a missing sim figure fails a named cell
        (100.0, 0.0, True, "FAIL", NAN),
    ],
)
def test_table_verdicts(real: float, sim: float, named: bool, verdict: str, ratio: float) -> None:
    lines = rf.table(
        {"c": {"ttft_p50": real}}, {"c": {"ttft_p50": sim}}, {"c": ("ttft_p50",) if named else ()}
    )
    line = next(x for x in lines if x.figure == "ttft_p50")
    assert (line.verdict, line.named) == (verdict, named)
    assert line.ratio == pytest.approx(ratio, nan_ok=True)
    assert len(lines) == len(rf.FIGURES)  # every figure listed, the others NaN
    assert rf.format_lines(lines, {"c": {"real": [3.0], "sim": [4.0]}}).count("\n") == len(rf.FIGURES)


def test_cells_only_on_both_sides_are_compared() -> None:
    real = {"a": dict.fromkeys(rf.FIGURES, 1.0), "b": dict.fromkeys(rf.FIGURES, 1.0)}
    sim = {"a": dict.fromkeys(rf.FIGURES, 1.0)}
    assert {line.cell for line in rf.table(real, sim, {})} == {"a"}


def test_request_sets_are_seeded_per_cell_and_run_and_within_their_ranges() -> None:
    cell = next(c for c in rf.CELLS if c.prompts == "mixed")
    first, again, other = rf.cell_requests(cell, 0), rf.cell_requests(cell, 0), rf.cell_requests(cell, 1)
    assert first == again  # real and sim get the same prompts
    assert first != other  # every run new ones: no prefix-cache hit across runs
    assert len(first) == cell.requests
    lengths = [len(p) for p, _ in first]
    short, long = rf.PROMPT_RANGES["short"], rf.PROMPT_RANGES["long"]
    assert all(short[0] <= n <= short[1] for n in lengths[0::2])
    assert all(long[0] <= n <= long[1] for n in lengths[1::2])
    assert all(rf.VOCAB[0] <= t <= rf.VOCAB[1] for p, _ in first for t in p)
    assert {n for _, n in first} == {cell.output}


def test_evaluation_differs_from_the_calibration_grid() -> None:
    """No evaluation cell is a grid point: other batch sizes or arrivals, random lengths."""
    for cell in rf.CELLS:
        assert cell.streams in {1, 2, 4, 8}
        lengths = {len(p) for p, _ in rf.cell_requests(cell, 0)}
        assert len(lengths) > 1
    assert not {2, 4, 8} & set(rf.DECODE_BATCHES)
    # the named figures: TPOT p50 everywhere, TTFT p50 on colocated steady cells only
    for cell in rf.CELLS:
        assert "tpot_p50" in rf.NAMED[cell.name]
        assert ("ttft_p50" in rf.NAMED[cell.name]) == (cell.mode == "colocated" and cell.arrival == "steady")
        assert not {"ttft_p90", "tpot_p90"} & set(rf.NAMED[cell.name])


def test_decode_grid_order_covers_every_point_once_in_an_order_per_repeat() -> None:
    """Each repeat measures every decode point once; the repeats' orders differ (the first point after
    the prefill grid is not the same point every time) and are reproducible from the seed."""
    every = sorted((b, c) for b in rf.DECODE_BATCHES for c in rf.DECODE_CONTEXTS)
    orders = [rf.decode_grid_order(random.Random(f"calibration/{part}")) for part in range(3)]
    for order in orders:
        assert sorted(order) == every
    assert len({tuple(order) for order in orders}) == 3
    assert orders[1] == rf.decode_grid_order(random.Random("calibration/1"))


def _stream(first: float, step: float, tokens: int) -> tuple[float, ...]:
    return tuple(first + i * step for i in range(tokens))


def test_a_bursts_decode_step_leaves_out_the_steps_that_carried_prompts() -> None:
    # The first request decodes at 80 ms a step while the second's prompt is prefilled (5 steps), then
    # both decode at 2 ms a step: the window starts at the second's first token.
    early = (*_stream(0.0, 0.080, 5), *_stream(0.402, 0.002, 20))
    late = _stream(0.400, 0.002, 20)
    samples = [rf.Sample(0.0, 0.0, len(c), chunks=c) for c in (early, late)]
    step, held = rf.burst_decode_step(samples, 1000)
    assert step == pytest.approx(0.002)
    # The window is 0.400-0.438 s; at its middle, 0.419 s, the first has 5 + 9 tokens, the second 10.
    assert held == pytest.approx(2 * 1000 + 14 + 10)
    first_tpot = (early[-1] - early[0]) / (len(early) - 1)
    assert first_tpot > 5 * step  # what the first request's whole-answer TPOT charges decode


@pytest.mark.parametrize(
    "samples",
    [
        [],
        [rf.Sample(0.0, 0.0, 20, chunks=_stream(0.0, 0.002, 20)), rf.Sample(NAN, NAN, 0, "HTTP 500")],
        # fewer than MIN_DECODE_STEPS steps in which both decode
        [
            rf.Sample(0.0, 0.0, 10, chunks=_stream(0.0, 0.002, 10)),
            rf.Sample(0.0, 0.0, 10, chunks=_stream(0.006, 0.002, 10)),
        ],
    ],
)
def test_a_burst_without_a_long_enough_common_window_gives_no_step(samples: list[object]) -> None:
    step, held = rf.burst_decode_step(samples, 64)
    assert math.isnan(step)
    assert math.isnan(held)


def test_grid_medians_take_the_median_of_repeats_and_drop_failures() -> None:
    cal = {
        "prefill": [
            {"tokens": 24, "ttft_s": 0.020, "error": ""},
            {"tokens": 24, "ttft_s": 0.080, "error": ""},  # a slow repeat does not move the median far
            {"tokens": 24, "ttft_s": 0.022, "error": ""},
            {"tokens": 200, "ttft_s": NAN, "error": "HTTP 500"},
            {"tokens": 600, "ttft_s": 0.040, "error": ""},
        ],
        "decode": [
            {"batch": 1, "context": 64, "tpot_s": 0.009, "step_s": 0.004, "context_tokens": 80.0},
            {"batch": 1, "context": 64, "tpot_s": 0.009, "step_s": 0.006, "context_tokens": 90.0},
            {"batch": 3, "context": 64, "tpot_s": 0.009, "step_s": NAN, "context_tokens": NAN},
        ],
    }
    ttft, steps = rf.grid_medians(cal)
    assert ttft == {24: pytest.approx(0.022), 600: pytest.approx(0.040)}  # 200: nothing answered
    assert steps == {(1, 64): (pytest.approx(0.005), pytest.approx(85.0))}


def test_a_grid_without_step_times_is_refused_with_what_to_do() -> None:
    cal = {"prefill": [], "decode": [{"batch": 1, "context": 64, "tpot_s": 0.004}]}
    with pytest.raises(SystemExit, match="without --reuse-real"):
        rf.grid_medians(cal)


def test_markdown_has_one_row_per_cell_with_its_verdicts_and_loads() -> None:
    real = {"a": {"ttft_p50": 20.0, "ttft_p90": 150.0, "tpot_p50": 4.4, "tpot_p90": NAN}}
    sim = {"a": {"ttft_p50": 25.0, "ttft_p90": 100.0, "tpot_p50": 4.0, "tpot_p90": 5.0}}
    rows = rf.markdown_lines(
        rf.table(real, sim, {"a": ("ttft_p50", "tpot_p50")}), {"a": {"real": [3.2], "sim": [9.6]}}
    )
    assert len(rows) == 3  # header, rule, one cell
    assert rows[2] == (
        "| a | 20.0 / 25.0 (0.80) | 150 / 100 (1.50) | 4.40 / 4.00 (1.10) | - / 5.00 (-) "
        "| TTFT P50 PASS, TPOT P50 PASS | 3; 10 |"
    )


def test_range_of_runs_leaves_out_runs_without_figures() -> None:
    rows = [dict.fromkeys(rf.FIGURES, x) for x in (12.0, NAN, 9.0, 15.0)]
    assert rf.range_of_runs(rows)["tpot_p50"] == (9.0, 15.0)
    empty = rf.range_of_runs([dict.fromkeys(rf.FIGURES, NAN)])["ttft_p50"]
    assert all(math.isnan(x) for x in empty)


@pytest.mark.parametrize(
    ("real_runs", "sim", "verdict", "inside"),
    [
        ((4.0, 5.0, 6.0), 5.5, "PASS", True),
        ((2.4, 4.2, 5.9), 2.8, "FAIL", True),  # a miss the real engine's own runs straddle
        ((5.0, 5.2, 5.3), 3.0, "FAIL", False),  # a miss outside them: the profile's
        ((5.0, 5.2, 5.3), 5.4, "PASS", False),
    ],
)
def test_a_miss_is_read_against_the_real_runs_own_spread(
    real_runs: tuple[float, ...], sim: float, verdict: str, inside: bool
) -> None:
    runs = [dict.fromkeys(rf.FIGURES, x) for x in real_runs]
    real = {"a": rf.median_of_runs(runs)}
    lines = rf.table(real, {"a": dict.fromkeys(rf.FIGURES, sim)}, {"a": ("tpot_p50",)},
                     real_ranges={"a": rf.range_of_runs(runs)})  # fmt: skip
    line = next(x for x in lines if x.figure == "tpot_p50")
    assert (line.verdict, line.sim_within_real_runs) == (verdict, inside)
    assert (line.real_low_ms, line.real_high_ms) == (min(real_runs), max(real_runs))
    assert rf.misses_within_real_spread(lines) == ([line] if verdict == "FAIL" and inside else [])


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        (3, [1, 1, 1]),  # one repeat of the grid before each evaluation run
        (1, [3]),  # fewer runs than PREFILL_REPEATS: the rest before the first
        (5, [1, 1, 1, 1, 1]),
    ],
)
def test_the_grid_is_spread_over_the_evaluation_runs(runs: int, expected: list[int]) -> None:
    assert rf.PREFILL_REPEATS == 3
    assert [rf.repeats_before_run(run, runs) for run in range(runs)] == expected


@pytest.mark.parametrize(
    ("intercept_ms", "base_ms", "serving_ms", "want_intercept_ms", "want_latency_ms"),
    [
        (5.2, 1.7, 2.0, 3.2, 2.0),  # the serving process's measured time; the rest stays with the step
        (5.2, 1.7, 9.0, 1.7, 3.5),  # at most the intercept beyond a step's fixed cost
        (5.2, 1.7, -0.4, 5.2, 0.0),  # histograms' means that disagree below zero: none
        (5.2, 1.7, NAN, 1.7, 3.5),  # not measured (a calibration from before): all beyond the base
        (1.2, 1.7, 2.0, 1.2, 0.0),  # under decode's base: nothing to split off
        (1.7, 1.7, NAN, 1.7, 0.0),
    ],
)
def test_the_request_latency_is_the_serving_processs_time_within_the_intercept_beyond_decodes_base(
    intercept_ms: float, base_ms: float, serving_ms: float, want_intercept_ms: float, want_latency_ms: float
) -> None:
    from tandem.perf.fit import DecodePoint, PrefillPoint, fit_profile

    fitted = fit_profile(
        "tandem/tiny-llama",
        "CPU",
        3.27,
        [PrefillPoint(n, (intercept_ms + 0.03 * n) / 1000) for n in (24, 600, 1800)],
        [DecodePoint(b, c, (base_ms + 1e-3 * c) / 1000) for b in (1, 4) for c in (100, 2000)],
    )
    profile, latency = rf.split_request_latency(fitted, serving_ms)
    assert profile.prefill.intercept_ms == pytest.approx(want_intercept_ms, abs=1e-6)
    assert latency * 1000 == pytest.approx(want_latency_ms, abs=1e-6)
    assert profile.prefill.per_token_ms == fitted.prefill.per_token_ms
    assert profile.decode == fitted.decode


def test_the_serving_time_is_vllms_ttft_less_queue_and_prefill_and_its_median_over_repeats() -> None:
    parts = {"colocated server": 15.0, "colocated queue": 0.5, "colocated prefill": 11.5, "client": 19.0}
    assert rf.serving_ms(parts) == pytest.approx(3.0)
    assert math.isnan(rf.serving_ms({"colocated server": 15.0, "colocated queue": NAN}))
    assert rf.measured_serving_ms({"serving_ms": [3.0, NAN, 5.0, 4.0]}) == pytest.approx(4.0)
    assert math.isnan(rf.measured_serving_ms({"prefill": [], "decode": []}))  # recorded before it existed


def test_ttft_parts_are_the_histograms_means_between_two_scrapes() -> None:
    samples = [rf.Sample(0.010, 0.003, 8), rf.Sample(0.030, 0.003, 8), rf.Sample(NAN, NAN, 0, "HTTP 500")]
    before = {
        "colocated": {
            "vllm:time_to_first_token_seconds_sum": 1.0,
            "vllm:time_to_first_token_seconds_count": 10,
        }
    }
    after = {
        "colocated": {
            "vllm:time_to_first_token_seconds_sum": 1.03,
            "vllm:time_to_first_token_seconds_count": 12,
            "vllm:request_queue_time_seconds_sum": 0.004,
            "vllm:request_queue_time_seconds_count": 2,
        }
    }
    parts = rf.ttft_parts(samples, before, after)
    assert parts["client"] == pytest.approx(20.0)  # the failed request left out
    assert parts["colocated server"] == pytest.approx(15.0)
    assert parts["colocated queue"] == pytest.approx(2.0)
    assert math.isnan(parts["colocated prefill"])  # nothing observed


def test_parts_lines_give_the_median_of_runs_per_side_and_skip_cells_without_parts() -> None:
    real = {
        "a": {
            "ttft_parts": [
                {"client": 10.0, "x server": NAN},
                {"client": 30.0, "x server": 5.0},
                {"client": 20.0, "x server": 7.0},
            ]
        },
        "old": {"runs": []},
    }
    sim = {"a": {"ttft_parts": [{"client": 8.0, "x server": 4.0}]}, "old": {"runs": []}}
    lines = rf.parts_lines(real, sim)
    assert len(lines) == 3
    assert "real client 20.0, x server 6.0" in lines[1]
    assert "sim  client 8.0, x server 4.0" in lines[2]
