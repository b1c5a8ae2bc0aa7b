"""The per-request choice between remote prefill and prefill on the decode pod, with a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tandem.api.models import DisaggregationSpec
from tandem.routing.disaggregation import (
    DEFAULT_MAX_LOCAL_PREFILLS,
    DEFAULT_MAX_LOCAL_TOKENS,
    JUDGED_LOCAL_BUDGET,
    REASONS,
    Choice,
    CostModel,
    DecodeIndex,
    DecodePodStats,
    DecodeView,
    DisaggregationKnobs,
    LinearFit,
    PrefillView,
    Request,
    can_judge_tpot,
    decide,
    held_chunks,
    key_at,
    uncached_tokens,
)
from tandem.routing.prefix import KEY_BLOCKS, PrefixKnobs, text_keys

AUTO = DisaggregationKnobs(mode="Auto", max_local_tokens=1000, max_local_prefills=2)
READY = PrefillView(ready=True)
IDLE = DecodeView()


def measured(
    prefill: tuple[float, float] = (0.010, 0.0002),
    pull: tuple[float, float] = (0.005, 0.00005),
    local: tuple[float, float] | None = None,
    now: float = 0.0,
) -> CostModel:
    """A cost model fed exact points of the given (intercept, slope) lines at `now`."""
    costs = CostModel()
    lines = [(costs.prefill, prefill), (costs.pull, pull)]
    if local is not None:
        lines.append((costs.local, local))
    for fit, (a, b) in lines:
        for x in (100, 400, 1600, 3200):
            fit.observe(x, a + b * x, now)
    return costs


# --- the table ------------------------------------------------------------------------------------

CASES: list[
    tuple[str, DisaggregationKnobs, Request, PrefillView, DecodeView, CostModel, float | None, Choice]
] = [
    (
        "Always: remote, whatever the prompt",
        DisaggregationKnobs(),
        Request(10, 10),
        READY,
        IDLE,
        measured(),
        None,
        Choice("remote", "always"),
    ),
    (
        "Always with no prefill pod: still remote (today's behaviour: the path's fallback decides)",
        DisaggregationKnobs(),
        Request(10, 10),
        PrefillView(ready=False),
        IDLE,
        measured(),
        None,
        Choice("remote", "always"),
    ),
    (
        "Threshold: at the threshold, local",
        DisaggregationKnobs(mode="Threshold", threshold_tokens=256),
        Request(4000, 256),
        READY,
        IDLE,
        CostModel(),
        None,
        Choice("local", "below_threshold"),
    ),
    (
        "Threshold: one past it, remote",
        DisaggregationKnobs(mode="Threshold", threshold_tokens=256),
        Request(257, 257),
        READY,
        IDLE,
        CostModel(),
        None,
        Choice("remote", "above_threshold"),
    ),
    (
        "Threshold, no prefill pod ready: local instead of failing",
        DisaggregationKnobs(mode="Threshold", threshold_tokens=256),
        Request(5000, 5000),
        PrefillView(ready=False),
        IDLE,
        CostModel(),
        None,
        Choice("local", "no_prefill_ready"),
    ),
    (
        "Auto, no prefill pod ready: local even past every bound",
        AUTO,
        Request(5000, 5000),
        PrefillView(ready=False),
        DecodeView(local_prefills=9),
        CostModel(),
        None,
        Choice("local", "no_prefill_ready"),
    ),
    (
        "Auto: longer than maxLocalTokens on the decode side, remote",
        AUTO,
        Request(1001, 1001),
        READY,
        IDLE,
        measured(),
        None,
        Choice("remote", "too_long"),
    ),
    (
        "Auto: the decode pod runs its cap of local prefills, remote",
        AUTO,
        Request(10, 10),
        READY,
        DecodeView(local_prefills=2, local_tokens=20),
        measured(),
        None,
        Choice("remote", "local_cap"),
    ),
    (
        "Auto: the local prefills in flight and this one lack more than maxLocalTokens together, remote",
        AUTO,
        Request(101, 101),
        READY,
        DecodeView(local_prefills=1, local_tokens=900),
        measured(),
        None,
        Choice("remote", "local_cap"),
    ),
    (
        "Auto: nothing measured yet, remote",
        AUTO,
        Request(10, 10),
        READY,
        IDLE,
        CostModel(),
        None,
        Choice("remote", "unmeasured"),
    ),
]


@pytest.mark.parametrize(
    ("knobs", "request_", "prefill", "decode", "costs", "slo", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_table(
    knobs: DisaggregationKnobs,
    request_: Request,
    prefill: PrefillView,
    decode: DecodeView,
    costs: CostModel,
    slo: float | None,
    expected: Choice,
) -> None:
    assert decide(knobs, request_, prefill, decode, costs, 1.0, slo) == expected


def test_auto_short_uncached_prompt_is_local_with_the_prior_and_its_estimates() -> None:
    # No local leg measured: local = the pull's intercept + the prefill pod's per-token cost.
    choice = decide(AUTO, Request(200, 200), READY, IDLE, measured(), 1.0)
    assert choice.side == "local"
    assert choice.reason == "local_faster"
    assert choice.local_s == pytest.approx(0.005 + 0.0002 * 200)
    assert choice.remote_s == pytest.approx(0.010 + 0.0002 * 200 + 0.005 + 0.00005 * 200)


def test_auto_prefill_pod_holding_the_prompt_beats_a_cold_decode_pod() -> None:
    # The prefill pod holds all but 50 tokens; the decode pod holds nothing of 900.
    choice = decide(AUTO, Request(50, 900), READY, IDLE, measured(), 1.0)
    assert choice == Choice("remote", "remote_faster", choice.local_s, choice.remote_s)
    assert choice.local_s is not None
    assert choice.remote_s is not None
    assert choice.local_s > choice.remote_s


def test_auto_multi_turn_append_prefill_goes_local() -> None:
    # Turn 2: the decode pod holds turn 1's prompt and reply; 40 new tokens. The prefill pod holds
    # turn 1's prompt only, so it would compute the reply too (300) and the decode pod would pull 40.
    choice = decide(AUTO, Request(340, 40), READY, IDLE, measured(), 1.0)
    assert choice.side == "local"
    assert choice.reason == "local_faster"


def test_auto_busy_prefill_queue_sends_local_and_busy_local_queue_sends_remote() -> None:
    costs = measured(local=(0.005, 0.0004))  # decode pods prefill at half the prefill pods' speed
    request = Request(800, 800)
    assert decide(AUTO, request, READY, IDLE, costs, 1.0).reason == "remote_faster"
    queued = PrefillView(ready=True, queued_tokens=20_000)
    assert decide(AUTO, request, queued, IDLE, costs, 1.0).reason == "local_faster"
    busy_local = DecodeView(local_prefills=1, local_tokens=900)
    assert decide(AUTO, Request(100, 100), READY, busy_local, costs, 1.0).reason == "remote_faster"


def test_auto_caps_local_prefills_in_flight_by_their_tokens_then_by_their_count() -> None:
    costs = measured(local=(0.001, 0.00001))  # local prefills cheap: local whenever allowed
    one_in_flight = DecodeView(local_prefills=1, local_tokens=900)
    assert decide(AUTO, Request(100, 100), READY, one_in_flight, costs, 1.0).reason == "local_faster"
    assert decide(AUTO, Request(101, 101), READY, one_in_flight, costs, 1.0).reason == "local_cap"
    short_ones = DecodeView(local_prefills=AUTO.max_local_prefills, local_tokens=20)
    assert decide(AUTO, Request(10, 10), READY, short_ones, costs, 1.0).reason == "local_cap"


def test_where_tpot_can_be_judged_the_budget_doubles_and_the_headroom_counts_every_local_prefill() -> None:
    """With a TPOT target and the pod's TPOT measured, the local prefills in flight may lack up to
    JUDGED_LOCAL_BUDGET x maxLocalTokens together, as long as the stall of all of them (with this one)
    keeps the streams' TPOT within the target."""
    costs = measured(local=(0.001, 0.00001))  # 0.01 ms a local token
    busy = DecodeView(streams=4, local_prefills=1, local_tokens=1500, tpot_s=0.020, output_tokens=101.0)
    assert AUTO.max_local_tokens * JUDGED_LOCAL_BUDGET == 2000
    # 1500 + 500 within 2 x 1000: local; without a target to judge by, 1 x 1000 holds.
    assert decide(AUTO, Request(500, 500), READY, busy, costs, 1.0, 0.030).reason == "local_faster"
    assert decide(AUTO, Request(500, 500), READY, busy, costs, 1.0, None).reason == "local_cap"
    assert decide(AUTO, Request(501, 501), READY, busy, costs, 1.0, 0.030).reason == "local_cap"
    # The headroom counts the 1,500 tokens in flight too: (1500 + 100) x 0.01 ms = 16 ms over 100
    # output tokens, +0.16 ms. A target of 20.15 ms refuses it; this request's 100 alone would not.
    small = Request(100, 100)
    assert decide(AUTO, small, READY, busy, costs, 1.0, 0.02017).reason == "local_faster"
    assert decide(AUTO, small, READY, busy, costs, 1.0, 0.02015).reason == "tpot_headroom"


def test_auto_tpot_headroom() -> None:
    costs = measured()  # local per-token cost (the prior): 0.2 ms
    request = Request(1000, 1000)  # a 0.2 s stall
    # 4 streams at 40 ms TPOT of ~101 tokens: +2 ms each -> 42 ms.
    decode = DecodeView(streams=4, tpot_s=0.040, output_tokens=101.0)
    assert decide(AUTO, request, READY, decode, costs, 1.0, slo_tpot_s=0.042).side == "local"
    refused = decide(AUTO, request, READY, decode, costs, 1.0, slo_tpot_s=0.0419)
    assert (refused.side, refused.reason) == ("remote", "tpot_headroom")
    # No stream to stall, or no SLO to keep: no headroom check.
    assert decide(
        AUTO, request, READY, DecodeView(tpot_s=0.2, output_tokens=10.0), costs, 1.0, 0.04
    ).side == ("local")
    assert decide(AUTO, request, READY, decode, costs, 1.0, None).side == "local"


def test_measurements_fade_back_to_unmeasured() -> None:
    costs = measured(now=0.0)
    assert decide(AUTO, Request(10, 10), READY, IDLE, costs, 1.0).reason == "local_faster"
    # Four points at t=0 weigh 4; below MIN_WEIGHT (3) once half-lives pass (4 x 0.5^0.5 = 2.8).
    later = costs.prefill.half_life_s * 0.5 + 1.0
    assert decide(AUTO, Request(10, 10), READY, IDLE, costs, later).reason == "unmeasured"


def test_knobs_from_spec_match_the_api_defaults() -> None:
    assert DisaggregationKnobs.from_spec(None) == DisaggregationKnobs()
    spec = DisaggregationSpec(mode="Auto")
    knobs = DisaggregationKnobs.from_spec(spec.model_dump(by_alias=True, exclude_none=True))
    assert knobs == DisaggregationKnobs(mode="Auto")
    assert DisaggregationKnobs.from_spec({"mode": "Threshold", "thresholdTokens": 64}) == DisaggregationKnobs(
        mode="Threshold", threshold_tokens=64
    )
    # The CRD's descriptions state the router's defaults.
    fields = DisaggregationSpec.model_fields
    assert f"Unset: {DEFAULT_MAX_LOCAL_TOKENS}." in str(fields["max_local_tokens"].description)
    assert f"Unset: {DEFAULT_MAX_LOCAL_PREFILLS}." in str(fields["max_local_prefills"].description)
    # Out of range or of the wrong type: the default (the CRD refuses these).
    bad = {"mode": "Sometimes", "maxLocalTokens": 0, "maxLocalPrefills": True}
    assert DisaggregationKnobs.from_spec(bad) == DisaggregationKnobs()


def test_every_reason_is_a_label_pair() -> None:
    sides = {reason: side for side, reason in REASONS}
    assert len(sides) == len(REASONS)  # each reason chooses one side
    assert set(sides.values()) == {"remote", "local"}


# --- the fit ----------------------------------------------------------------------------------------


def test_linear_fit_edge_cases() -> None:
    fit = LinearFit()
    assert fit.line() is None
    fit.observe(100, 0.5, 0.0)
    fit.observe(100, 0.7, 0.0)
    assert fit.line() == pytest.approx((0.0, 0.006))  # one x: through the origin
    flat = LinearFit()
    for x, y in ((0, 0.1), (0, 0.3)):
        flat.observe(x, y, 0.0)
    assert flat.line() == pytest.approx((0.2, 0.0))
    falling = LinearFit()
    for x, y in ((100, 0.3), (200, 0.1)):
        falling.observe(x, y, 0.0)
    assert falling.line() == pytest.approx((0.2, 0.0))  # no size effect: the mean
    ignored = LinearFit()
    ignored.observe(-1, 0.1, 0.0)
    ignored.observe(1, float("nan"), 0.0)
    assert ignored.line() is None


@settings(max_examples=200, deadline=None)
@given(
    intercept=st.floats(0.0, 1.0),
    slope=st.floats(1e-6, 1e-2),
    xs=st.lists(st.integers(0, 50_000), min_size=2, max_size=30, unique=True),
    times=st.lists(st.floats(0.0, 600.0), min_size=30, max_size=30),
)
def test_linear_fit_recovers_an_exact_line_whatever_the_times(
    intercept: float, slope: float, xs: list[int], times: list[float]
) -> None:
    fit = LinearFit()
    for x, now in zip(xs, sorted(times), strict=False):
        fit.observe(x, intercept + slope * x, now)
    line = fit.line()
    assert line is not None
    assert line[0] == pytest.approx(intercept, abs=1e-6)
    assert line[1] == pytest.approx(slope, rel=1e-4)


# --- properties of the choice ---------------------------------------------------------------------

knobs_st = st.builds(
    DisaggregationKnobs,
    mode=st.sampled_from(["Auto", "Threshold"]),
    threshold_tokens=st.integers(1, 8192),
    max_local_tokens=st.integers(1, 8192),
    max_local_prefills=st.integers(1, 8),
)
decode_st = st.builds(
    DecodeView,
    streams=st.integers(0, 64),
    local_prefills=st.integers(0, 10),
    local_tokens=st.integers(0, 20_000),
    tpot_s=st.none() | st.floats(0.001, 0.2),
    output_tokens=st.none() | st.floats(1.0, 2000.0),
)
request_st = st.builds(Request, st.integers(0, 16_384), st.integers(0, 16_384))
line_st = st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 0.01))


@settings(max_examples=300, deadline=None)
@given(knobs=knobs_st, request_=request_st, decode=decode_st, queued=st.integers(0, 100_000))
def test_no_prefill_pod_ready_is_always_served_locally(
    knobs: DisaggregationKnobs, request_: Request, decode: DecodeView, queued: int
) -> None:
    choice = decide(knobs, request_, PrefillView(False, queued), decode, measured(), 1.0, 0.05)
    assert choice == Choice("local", "no_prefill_ready")


@settings(max_examples=300, deadline=None)
@given(
    request_=request_st,
    decode=decode_st,
    queued=st.integers(0, 100_000),
    more=st.integers(0, 100_000),
    prefill=line_st,
    pull=line_st,
    local=st.none() | line_st,
    slo=st.none() | st.floats(0.005, 0.2),
)
@example(  # within the judged budget (2 x maxLocalTokens), over the unjudged one: local is allowed
    request_=Request(0, 0),
    decode=DecodeView(streams=1, local_prefills=0, local_tokens=1001, tpot_s=0.125, output_tokens=1.0),
    queued=0,
    more=0,
    prefill=(0.0, 0.0),
    pull=(0.0, 0.0),
    local=None,
    slo=0.125,
)
def test_auto_keeps_its_bounds_and_a_longer_prefill_queue_never_turns_local_into_remote(
    request_: Request,
    decode: DecodeView,
    queued: int,
    more: int,
    prefill: tuple[float, float],
    pull: tuple[float, float],
    local: tuple[float, float] | None,
    slo: float | None,
) -> None:
    costs = measured(prefill, pull, local)
    choice = decide(AUTO, request_, PrefillView(True, queued), decode, costs, 1.0, slo)
    if choice.side == "local":
        # The in-flight budget is JUDGED_LOCAL_BUDGET x maxLocalTokens where the TPOT check can judge.
        judged = can_judge_tpot(decode, slo)
        budget = AUTO.max_local_tokens * (JUDGED_LOCAL_BUDGET if judged else 1)
        assert request_.uncached_local <= AUTO.max_local_tokens
        assert decode.local_tokens + request_.uncached_local <= budget
        assert decode.local_prefills < AUTO.max_local_prefills
        longer = decide(AUTO, request_, PrefillView(True, queued + more), decode, costs, 1.0, slo)
        assert longer.side == "local"
    reasons = dict((reason, side) for side, reason in REASONS)
    assert reasons[choice.reason] == choice.side


# --- helpers ----------------------------------------------------------------------------------------


def test_uncached_tokens_from_held_chunks() -> None:
    # Nothing held: every token.
    assert uncached_tokens(300, 0, 6400, 64) == 300
    # 3 keys matched = KEY_BLOCKS[2] = 3 chunks of 64 bytes of a 640-byte text: 30% held.
    assert held_chunks(3) == KEY_BLOCKS[2] == 3
    assert held_chunks(0) == 0
    assert uncached_tokens(100, 3, 640, 64) == 70
    # All of it (and more, from rounding) held: none.
    assert uncached_tokens(100, 4, 256, 64) == 0


KNOBS = PrefixKnobs(block_chars=8, max_blocks=512)


def test_key_at_is_text_keys_at_every_sampled_count() -> None:
    data = ("the quick brown fox jumps over the lazy dog " * 40).encode()
    keys = text_keys(data.decode(), KNOBS)
    assert keys == [key_at(data, count, 8) for count in KEY_BLOCKS[: len(keys)]]


def test_decode_index_knows_a_recorded_text_to_the_chunk() -> None:
    index = DecodeIndex(100_000)
    turn = ("user: " + "history words " * 100).encode()  # 1406 bytes: 175 chunks of 8, last key at 128
    index.record("d0", turn, text_keys(turn.decode(), KNOBS), KNOBS)
    nxt = turn + b" reply and more words that follow"
    keys = text_keys(nxt.decode(), KNOBS)
    # The sampled keys alone: 128 chunks; the recorded end: all 175.
    assert held_chunks(index.index.matched_keys("d0", keys)) == 128
    assert index.held_chunks("d0", nxt, keys, KNOBS) == 175
    # A text that parts from it after chunk 150 holds only the sampled part.
    other = turn[:1200] + b"X" * 300
    assert index.held_chunks("d0", other, text_keys(other.decode(), KNOBS), KNOBS) == 128
    # Another pod holds nothing; a forgotten pod neither.
    assert index.held_chunks("d1", nxt, keys, KNOBS) == 0
    index.forget_pod("d0")
    assert index.held_chunks("d0", nxt, keys, KNOBS) == 0


def test_decode_index_keeps_a_few_ends_per_anchor() -> None:
    index = DecodeIndex(100_000)
    base = "x" * (8 * 130)
    texts = [(base + "y" * (8 * n)).encode() for n in (1, 2, 3, 4, 5, 6)]
    for data in texts:
        index.record("d0", data, text_keys(data.decode(), KNOBS), KNOBS)
    longest = texts[-1]
    keys = text_keys(longest.decode(), KNOBS)
    assert index.held_chunks("d0", longest, keys, KNOBS) == 136
    # The shortest ends were dropped (4 a anchor): a text ending at 131 chunks finds only 128.
    assert index.held_chunks("d0", texts[0], text_keys(texts[0].decode(), KNOBS), KNOBS) == 128


def test_decode_pod_stats_moving_averages() -> None:
    stats = DecodePodStats()
    stats.observe(None, 1)
    assert stats.tpot_s is None
    assert stats.output_tokens == 1.0
    stats.observe(0.05, 101, smoothing=0.5)
    assert stats.tpot_s == 0.05
    assert stats.output_tokens == pytest.approx(51.0)
    stats.observe(0.03, 1, smoothing=0.5)
    assert stats.tpot_s == pytest.approx(0.04)
