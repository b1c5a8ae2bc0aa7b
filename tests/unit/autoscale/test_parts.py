"""The parts of the policy on their own: capacity per replica, windows and steps, the GPU budget."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tandem.api.status import Recommendation
from tandem.autoscale import stabilize
from tandem.autoscale.budget import Claim, arbitrate
from tandem.autoscale.capacity import (
    busy_prefill_tokens_per_second,
    decode_capacity,
    engine_limits,
    pool_model,
    prefill_capacity,
)
from tandem.autoscale.knobs import KNOBS, Knobs
from tandem.perf import load_profile, prefill_tokens_per_second
from tandem.signals import second_moment

if TYPE_CHECKING:
    from conftest import Kit

# --- capacity -----------------------------------------------------------------------------------------

LIMIT_CASES: list[tuple[str, str, dict[str, Any], tuple[int, int, str, float]]] = [
    ("prefill-defaults", "prefill", {}, (8192, 1024, "auto", 0.9)),
    ("colocated-token-budget", "colocated", {}, (2048, 1024, "auto", 0.9)),
    (
        "pool-args-win",
        "decode",
        {
            "engine": {"extraArgs": ["--max-num-seqs", "512", "--kv-cache-dtype=fp8"]},
            "decode": {"engineArgs": ["--max-num-seqs=128", "--gpu-memory-utilization", "0.8"]},
        },
        (8192, 128, "fp8", 0.8),
    ),
    (
        "nonsense-ignored",
        "prefill",
        {"prefill": {"engineArgs": ["--max-num-batched-tokens", "lots"]}},
        (8192, 1024, "auto", 0.9),
    ),
]


@pytest.mark.parametrize(
    ("role", "patch", "expected"), [c[1:] for c in LIMIT_CASES], ids=[c[0] for c in LIMIT_CASES]
)
def test_engine_limits_come_from_the_pools_arguments(
    kit: Kit, role: str, patch: dict[str, Any], expected: tuple[int, int, str, float]
) -> None:
    limits = engine_limits(kit.with_spec(**patch).spec, role)
    assert (
        limits.max_num_batched_tokens,
        limits.max_num_seqs,
        limits.kv_cache_dtype,
        limits.gpu_memory_utilization,
    ) == expected


def test_profile_choice_and_fallback(kit: Kit) -> None:
    assert not pool_model(kit.spec, "prefill").fallback
    unknown = kit.with_spec(model={"uri": "hf://someone/private-model", "name": "private"}).spec
    assert pool_model(unknown, "prefill").fallback
    sim = kit.with_spec(
        engine={
            "type": "sim",
            "env": [{"name": "TANDEM_SIM_PERF_MODEL", "value": "meta-llama/Llama-3.1-70B-Instruct"}],
        },
        prefill={"tensorParallelSize": 4},
        decode={"tensorParallelSize": 4},
    ).spec
    model = pool_model(sim, "prefill")
    assert "70B" in model.profile.model
    assert model.profile.tensor_parallel_size == 4
    other_gpu = kit.with_spec(autoscaling={"gpu": "TPU-v9"}).spec
    assert pool_model(other_gpu, "prefill").fallback


def test_prefill_capacity_leaves_room_for_queueing_within_the_ttft(kit: Kit) -> None:
    model = pool_model(kit.spec, "prefill")
    slo = kit.spec.slo
    assert slo is not None
    loose = prefill_capacity(model, slo.model_copy(update={"ttft_ms": 5000}), 1000, KNOBS, transfer_gbps=400)
    tight = prefill_capacity(model, slo.model_copy(update={"ttft_ms": 150}), 1000, KNOBS, transfer_gbps=400)
    impossible = prefill_capacity(
        model, slo.model_copy(update={"ttft_ms": 5}), 1000, KNOBS, transfer_gbps=400
    )
    assert loose.utilisation == KNOBS.prefill_utilisation_cap
    assert KNOBS.prefill_utilisation_floor < tight.utilisation < loose.utilisation
    assert impossible.utilisation == KNOBS.prefill_utilisation_floor
    assert loose.at_target == pytest.approx(loose.raw_tokens_per_second * loose.utilisation)
    long_prompts = prefill_capacity(model, slo, 16000, KNOBS, transfer_gbps=400)
    assert long_prompts.raw_tokens_per_second < loose.raw_tokens_per_second  # attention grows with length


def test_decode_capacity_is_bounded_by_tpot_and_kv(kit: Kit) -> None:
    model = pool_model(kit.spec, "decode")
    slo = kit.spec.slo
    assert slo is not None
    base = decode_capacity(model, slo, 1100, KNOBS)
    tighter = decode_capacity(model, slo.model_copy(update={"tpot_ms": 15}), 1100, KNOBS)
    longer = decode_capacity(model, slo, 8000, KNOBS)
    assert tighter.sequences < base.sequences
    assert longer.sequences < base.sequences
    assert base.sequences == pytest.approx(
        min(base.batch_at_tpot, base.kv_tokens * 0.85 / base.context_tokens)
    )
    fewer_seqs = decode_capacity(
        pool_model(kit.with_spec(decode={"engineArgs": ["--max-num-seqs", "32"]}).spec, "decode"),
        slo,
        1100,
        KNOBS,
    )
    assert fewer_seqs.batch_at_tpot == 32
    fp8 = decode_capacity(
        pool_model(kit.with_spec(decode={"engineArgs": ["--kv-cache-dtype", "fp8"]}).spec, "decode"),
        slo,
        1100,
        KNOBS,
    )
    assert fp8.kv_tokens > 1.9 * base.kv_tokens


# --- stabilize -------------------------------------------------------------------------------------------

NOW = 10_000.0

WINDOW_CASES = [
    # id, history [(age s, replicas)] incl. this pass (age 0), current, up window, down window, expected
    ("up-immediate", [(0, 7)], 4, 0, 300, 7),
    ("up-lowest-in-window", [(50, 5), (20, 9), (0, 8)], 4, 60, 300, 5),
    ("up-not-if-any-recent-below-current", [(50, 3), (0, 8)], 4, 60, 300, 4),
    ("down-highest-in-window", [(400, 9), (250, 6), (100, 5), (0, 2)], 8, 0, 300, 6),
    ("down-after-window", [(301, 9), (0, 2)], 8, 0, 300, 2),
    ("down-window-edge-inclusive", [(300, 9), (0, 2)], 8, 0, 300, 8),
    ("no-down-before-history-covers-window", [(200, 2), (0, 2)], 8, 0, 300, 8),
    ("no-down-on-first-pass", [(0, 2)], 8, 0, 300, 8),
    ("down-at-once-without-window", [(0, 2)], 8, 0, 0, 2),
    ("up-on-first-pass", [(0, 9)], 8, 0, 300, 9),
    ("steady", [(100, 4), (0, 4)], 4, 0, 300, 4),
]


@pytest.mark.parametrize(
    ("history", "current", "up", "down", "expected"),
    [c[1:] for c in WINDOW_CASES],
    ids=[c[0] for c in WINDOW_CASES],
)
def test_stabilization_windows(
    history: list[tuple[float, int]], current: int, up: float, down: float, expected: int
) -> None:
    recs = [Recommendation(time=NOW - age, replicas=n) for age, n in history]
    assert stabilize.stabilized(recs, NOW, current, up, down) == expected


FELL_FOR_GOOD_CASES = [
    # id, history [(age s, replicas)] incl. this pass (age 0), window, level, expected
    ("steady-above", [(400, 4), (200, 4), (0, 4)], 300, 3, True),
    ("falling", [(400, 9), (250, 6), (100, 5), (0, 2)], 300, 5, True),
    ("noise-below-the-level", [(400, 9), (250, 4), (100, 5), (50, 3), (0, 4)], 300, 5, True),
    ("a-burst-back-above", [(400, 4), (250, 2), (100, 7), (0, 2)], 300, 2, False),
    ("a-burst-up-to-the-level", [(400, 4), (250, 2), (100, 3), (0, 2)], 300, 3, True),
    ("flapping-across", [(400, 3), (200, 2), (100, 3), (0, 2)], 300, 2, False),
    ("back-above-just-now", [(400, 2), (100, 2), (0, 3)], 300, 2, False),
    ("rose-before-the-window", [(400, 2), (350, 6), (200, 5), (0, 2)], 300, 2, True),
    ("rose-into-the-window", [(350, 2), (250, 6), (0, 2)], 300, 2, False),
    ("rose-at-the-window-start", [(330, 2), (300, 6), (0, 2)], 300, 2, False),
    ("history-short-of-the-window", [(200, 4), (0, 2)], 300, 2, False),
    ("empty", [], 300, 2, False),
]


@pytest.mark.parametrize(
    ("history", "window", "level", "expected"),
    [c[1:] for c in FELL_FOR_GOOD_CASES],
    ids=[c[0] for c in FELL_FOR_GOOD_CASES],
)
def test_fell_for_good(history: list[tuple[float, int]], window: float, level: int, expected: bool) -> None:
    recs = [Recommendation(time=NOW - age, replicas=n) for age, n in history]
    assert stabilize.fell_for_good(recs, NOW, window, level) is expected


def test_record_prunes_and_caps() -> None:
    old = [Recommendation(time=NOW - age, replicas=1) for age in (1000, 301, 300, 10)]
    old.append(Recommendation(time=NOW + 5, replicas=1))  # from the future (clock stepped back): dropped
    kept = stabilize.record(old, NOW, 3, 300)
    assert [NOW - r.time for r in kept] == [301, 300, 10, 0]  # 301: the newest older than the window
    many = [Recommendation(time=NOW - i * 0.01, replicas=1) for i in range(2000, 0, -1)]
    assert len(stabilize.record(many, NOW, 2, 300)) == stabilize.MAX_HISTORY


@pytest.mark.parametrize(
    ("exact", "current", "tolerance", "hold"),
    [
        (4.3, 4, 0.1, True),
        (4.5, 4, 0.1, False),
        (3.6, 4, 0.1, True),
        (3.5, 4, 0.1, False),
        (0.05, 0, 0.1, False),
    ],
)
def test_dead_band(exact: float, current: int, tolerance: float, hold: bool) -> None:
    assert stabilize.within_dead_band(exact, current, tolerance) is hold


@pytest.mark.parametrize(("target", "current", "expected"), [(12, 4, 8), (1, 8, 6), (5, 4, 5), (4, 4, 4)])
def test_limit_step(target: int, current: int, expected: int) -> None:
    assert stabilize.limit_step(target, current, up_step=4, down_step=2) == expected


def test_knobs_override() -> None:
    assert Knobs(dead_band=0.2).dead_band == 0.2
    assert KNOBS.dead_band == 0.1


# --- budget ----------------------------------------------------------------------------------------------


def claim(role: str, wanted: int, current: int, minimum: int = 1, tp: int = 1, deficit: float = 0.0) -> Claim:
    return Claim(
        role=role, wanted=wanted, current=current, min_replicas=minimum, gpus_per_replica=tp, deficit=deficit
    )


BUDGET_CASES = [
    # id, claims, available GPUs, expected
    ("fits", [claim("prefill", 4, 2), claim("decode", 3, 3)], 10, {"prefill": 4, "decode": 3}),
    (
        "deficit-first",
        [claim("prefill", 6, 2, deficit=0.1), claim("decode", 6, 2, deficit=0.9)],
        8,
        {"prefill": 2, "decode": 6},
    ),
    (
        "keep-before-adding",  # decode's deficit is larger, but prefill keeps the 3 it runs
        [claim("prefill", 3, 3, deficit=0.0), claim("decode", 8, 2, deficit=2.0)],
        8,
        {"prefill": 3, "decode": 5},
    ),
    (
        "shortfall-breaks-ties",
        [claim("prefill", 4, 1), claim("decode", 8, 1)],
        6,
        {"prefill": 2, "decode": 4},
    ),
    (
        "tp-that-does-not-fit-leaves-room-for-others",
        [claim("prefill", 4, 1, deficit=1.0, tp=4), claim("decode", 4, 1, tp=1)],
        7,
        {"prefill": 1, "decode": 3},
    ),
    (
        "minimums-over-budget",
        [claim("prefill", 4, 3, minimum=3), claim("decode", 4, 3, minimum=2)],
        3,
        {"prefill": 3, "decode": 2},
    ),
    (
        "budget-cut-below-current",
        [claim("prefill", 6, 6), claim("decode", 6, 6)],
        6,
        {"prefill": 3, "decode": 3},
    ),
]


@pytest.mark.parametrize(
    ("claims", "available", "expected"), [c[1:] for c in BUDGET_CASES], ids=[c[0] for c in BUDGET_CASES]
)
def test_budget_arbitration(claims: list[Claim], available: int, expected: dict[str, int]) -> None:
    assert arbitrate(claims, available) == expected


SIM_ENGINE = {"image": "tandem:dev", "type": "sim"}


@pytest.mark.parametrize(
    ("env", "slower"),
    [
        ([], 1.0),
        ([{"name": "TANDEM_SIM_TIME_SCALE", "value": "3"}], 3.0),
        ([{"name": "TANDEM_SIM_TIME_SCALE", "value": "0.5"}], 0.5),
        ([{"name": "TANDEM_SIM_TIME_SCALE", "value": "not-a-number"}], 1.0),
        ([{"name": "TANDEM_SIM_GPU", "value": "H100"}], 1.0),
    ],
)
def test_a_sim_engine_is_sized_by_the_profile_it_runs(
    kit: Kit, env: list[dict[str, str]], slower: float
) -> None:
    plain = pool_model(kit.with_spec(engine=SIM_ENGINE).spec, "decode").profile
    scaled = pool_model(kit.with_spec(engine={**SIM_ENGINE, "env": env}).spec, "decode").profile
    assert scaled.gpu == "H100"
    assert scaled.decode_step_seconds(8, 8000) == pytest.approx(plain.decode_step_seconds(8, 8000) * slower)
    assert scaled.prefill_seconds(2000) == pytest.approx(plain.prefill_seconds(2000) * slower)


def test_a_vllm_engine_ignores_the_sim_settings(kit: Kit) -> None:
    env = [{"name": "TANDEM_SIM_TIME_SCALE", "value": "3"}]
    scaled = pool_model(kit.with_spec(engine={"env": env}).spec, "prefill").profile
    assert scaled == pool_model(kit.spec, "prefill").profile


# --- prefill over the prompt-length distribution ----------------------------------------------------

SECOND_MOMENT_CASES = [
    # id, bounds, counts (last: +Inf), exact mean, expected E[n^2]
    # all in (5, 10]: bucketed E[n] 7.5, E[n^2] (25 + 50 + 100) / 3 = 58.33; ratio 1.037 x 7.5^2
    ("one-bucket", (1.0, 2.0, 5.0, 10.0), [0, 0, 0, 5, 0], 7.5, 175 / 3),
    # half in (0, 10], half in (10, 20]: E[n] (5 + 15) / 2 = 10, E[n^2] (100/3 + 700/3) / 2 = 133.3;
    # ratio 1.333, times the exact mean 12 squared: 192
    ("two-buckets", (10.0, 20.0), [1, 1, 0], 12.0, 192.0),
    ("inf-at-last-bound", (10.0,), [0, 2], 50.0, 2500.0),  # a point at 10: ratio 1, so mean^2
    ("no-observations", (10.0,), [0, 0], 0.0, 0.0),
    ("no-mean", (10.0,), [3, 0], 0.0, 0.0),
]


@pytest.mark.parametrize(
    ("bounds", "counts", "mean", "expected"),
    [c[1:] for c in SECOND_MOMENT_CASES],
    ids=[c[0] for c in SECOND_MOMENT_CASES],
)
def test_second_moment_from_a_histogram(
    bounds: tuple[float, ...], counts: list[float], mean: float, expected: float
) -> None:
    assert second_moment(bounds, counts, mean) == pytest.approx(expected)


def _simple_profile() -> Any:
    """Linear 0.1 ms per token (no floor or intercept), attention 1e-5 ms per token^2."""
    base = load_profile("meta-llama/Llama-3.1-8B-Instruct", "H100", 1)
    prefill = base.prefill.model_copy(
        update={"floor_ms": 0.0, "intercept_ms": 0.0, "per_token_ms": 0.1, "per_token_sq_ms": 1e-5}
    )
    return base.model_copy(update={"prefill": prefill})


BUSY_CASES = [
    # id, E[n], E[n^2], tokens/s = E[n] / (E[n] x 1e-4 s + 1e-8 s x E[n^2])
    ("all-alike", 1000.0, 1e6, 1000 / 0.11),  # 0.1 + 0.01 s per prompt: 9,091
    ("mooncake-spread", 1000.0, 2.72e6, 1000 / 0.1272),  # 0.1 + 0.0272 s: 7,862
    ("spread-4", 1000.0, 4e6, 1000 / 0.14),  # 7,143
    ("unknown-is-mean-squared", 1000.0, 0.0, 1000 / 0.11),
]


@pytest.mark.parametrize(
    ("mean", "moment", "expected"), [c[1:] for c in BUSY_CASES], ids=[c[0] for c in BUSY_CASES]
)
def test_busy_prefill_tokens_per_second_over_the_distribution(
    mean: float, moment: float, expected: float
) -> None:
    profile = _simple_profile()
    assert busy_prefill_tokens_per_second(profile, mean, moment, 8192) == pytest.approx(expected)


def test_busy_prefill_at_the_mean_is_perfs_figure() -> None:
    profile = load_profile("meta-llama/Llama-3.1-8B-Instruct", "H100", 1)
    for n in (128, 2048, 12035):
        assert busy_prefill_tokens_per_second(profile, n, float(n * n), 8192) == pytest.approx(
            prefill_tokens_per_second(profile, n, 8192)
        )


def test_prefill_capacity_uses_the_second_moment(kit: Kit) -> None:
    model = pool_model(kit.spec, "prefill")
    slo = kit.spec.slo
    assert slo is not None
    slo = slo.model_copy(update={"ttft_ms": 5000})
    at_mean = prefill_capacity(model, slo, 12000, KNOBS, transfer_gbps=400)
    spread = prefill_capacity(
        model, slo, 12000, KNOBS, transfer_gbps=400, prompt_second_moment=2.72 * 12000**2
    )
    assert spread.raw_tokens_per_second == pytest.approx(
        busy_prefill_tokens_per_second(
            model.profile, 12000, 2.72 * 12000**2, model.limits.max_num_batched_tokens
        )
    )
    assert spread.raw_tokens_per_second < 0.85 * at_mean.raw_tokens_per_second
    assert spread.service_seconds == pytest.approx(12000 / spread.raw_tokens_per_second)
