"""`tandem advise` logic (`tandem.sim.advise`): the KV arithmetic against the seed formulas, the model and
load inputs, the advice on small loads, and its recommendation replayed through the simulator."""

from __future__ import annotations

import math

import pytest

from tandem.api.models import PDDeployment
from tandem.perf import load_profile
from tandem.routing.disaggregation import DisaggregationKnobs
from tandem.sim.advise import (
    COLOCATED,
    Advice,
    AdviseError,
    AdviseRequest,
    ModeRow,
    advise,
    best_mode,
    default_load_seconds,
    deployment,
    layout_of_spec,
    replica_spec,
    resolve_model,
    synthetic_requests,
    transfer_point,
)
from tandem.sim.cluster import simulate
from tandem.sim.layout import SLO, SimConfig
from tandem.sim.results import Summary

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
GIB = 1 << 30


def test_8k_tokens_of_llama_8b_are_one_gib_and_21_ms_at_400_gbps() -> None:
    info = resolve_model(LLAMA_8B, None)
    assert info.kv_bytes_per_token == 128 * 1024
    assert 8192 * info.kv_bytes_per_token == GIB
    spec, notes = replica_spec(info, "H100", 1, 400.0)
    assert notes == ()
    point = transfer_point("p90", 8192, spec, spec)
    assert point.transfer_ms == pytest.approx(GIB * 8 / 400e9 * 1e3)  # 21.47 ms
    assert point.transfer_ms == pytest.approx(21.5, abs=0.05)
    # at 25 Gb/s TCP the same KV takes ~344 ms (reference section 6)
    slow, _ = replica_spec(info, "H100", 1, 25.0)
    assert transfer_point("p90", 8192, slow, slow).transfer_ms == pytest.approx(343.6, abs=0.1)


def test_transfer_share_of_an_idle_ttft() -> None:
    info = resolve_model(LLAMA_8B, None)
    spec, _ = replica_spec(info, "H100", 1, 400.0)
    profile = load_profile(LLAMA_8B, "H100", 1)
    point = transfer_point("p50", 8192, spec, spec)
    # prefill ~225 ms (reference section 7.4), transfer 21.5 ms, first decode step ~7 ms
    assert point.prefill_ms == pytest.approx(profile.prefill_seconds(8192) * 1e3)
    assert 220 < point.prefill_ms < 235
    assert point.first_decode_ms == pytest.approx(profile.decode_step_seconds(1, 8192) * 1e3)
    assert point.ttft_ms == pytest.approx(point.prefill_ms + point.transfer_ms + point.first_decode_ms)
    assert point.share == pytest.approx(point.transfer_ms / point.ttft_ms)
    assert 0.08 < point.share < 0.09


def test_tp_splits_gqa_kv_over_each_ranks_nic() -> None:
    info = resolve_model(LLAMA_8B, None)
    tp2, _ = replica_spec(info, "H100", 2, 400.0)
    assert tp2.kv_bytes_per_token_per_gpu == 64 * 1024  # 4 of the 8 KV heads per rank
    assert transfer_point("x", 8192, tp2, tp2).transfer_ms == pytest.approx(21.47 / 2, abs=0.01)


def test_unknown_model_needs_kv_bytes() -> None:
    with pytest.raises(AdviseError, match="unknown model 'acme/secret-13b': give --kv-bytes-per-token"):
        resolve_model("acme/secret-13b", None)
    with pytest.raises(AdviseError, match="no model given"):
        resolve_model(None, None)
    with pytest.raises(AdviseError, match=">= 1"):
        resolve_model("acme/secret-13b", 0)
    info = resolve_model("hf://acme/secret-13b@main", 200_000)
    assert info.model == "acme/secret-13b"
    assert not info.known
    spec, notes = replica_spec(info, "H100", 1, 400.0)
    assert spec.kv_bytes_per_token_per_gpu == 200_000
    assert any("decode KV read scaled" in n for n in notes)
    with pytest.raises(AdviseError, match="no profile on GPU 'TPU'"):
        replica_spec(info, "TPU", 1, 400.0)
    with pytest.raises(AdviseError, match="1, 2, 4 or 8"):
        replica_spec(info, "H100", 3, 400.0)


def test_known_model_resolves_aliases_and_load_times() -> None:
    assert resolve_model("hf://meta-llama/Llama-3.1-8B", None).model == LLAMA_8B
    assert default_load_seconds(LLAMA_8B) == 120.0
    assert default_load_seconds("meta-llama/Llama-3.1-70B-Instruct") == 300.0


def test_synthetic_requests_have_the_asked_means() -> None:
    requests = synthetic_requests(1000, 200, 50, 200, cv=1.0, seed=3)
    assert 9000 < len(requests) < 11000  # 50/s for 200 s
    assert sum(r.prompt_tokens for r in requests) / len(requests) == pytest.approx(1000, rel=0.05)
    assert sum(r.output_tokens for r in requests) / len(requests) == pytest.approx(200, rel=0.05)
    fixed = synthetic_requests(1000, 200, 5, 10, cv=0.0, seed=3)
    assert {(r.prompt_tokens, r.output_tokens) for r in fixed} == {(1000, 200)}
    assert synthetic_requests(1000, 200, 5, 10, seed=3) == synthetic_requests(1000, 200, 5, 10, seed=3)
    for bad in ((0, 200, 5, 10), (1000, 200, 0, 10), (1000, 200, 5, -1)):
        with pytest.raises(AdviseError):
            synthetic_requests(*bad)


def _advise(input_tokens: float, output_tokens: float, rate: float, ttft_ms: float, tpot_ms: float) -> Advice:
    requests = synthetic_requests(input_tokens, output_tokens, rate, 120, cv=0.5, seed=7)
    req = AdviseRequest(
        model=resolve_model(LLAMA_8B, None),
        gpu="H100",
        bandwidth_gbps=400.0,
        slo=SLO(ttft_ms=ttft_ms, tpot_ms=tpot_ms),
        requests=requests,
        max_gpus=16,
        ratios=((1, 1), (1, 2), (2, 1)),
    )
    return advise(req)


def test_advice_is_replayed_through_the_simulator() -> None:
    # long prompts, tight TPOT: prefill chunks stall colocated decodes, so P/D should pay
    advice = _advise(4000, 150, 12, ttft_ms=1500, tpot_ms=12)
    chosen = advice.recommended
    assert chosen is not None
    assert chosen is advice.pd
    assert advice.colocated is None or advice.colocated.gpus > chosen.gpus
    assert chosen.summary.attainment >= 0.95
    obj = deployment(advice, name="long-prompts")
    assert obj["spec"]["serving"] == {"mode": "Disaggregated"}
    spec = PDDeployment.from_object(obj).spec
    sim = layout_of_spec(spec)
    assert sim.slo == SLO(ttft_ms=1500, tpot_ms=12)
    # the deployment carries the disaggregation mode advise chose (none: Always), and replays to its figures
    mode = advice.mode
    assert mode is not None
    carried = mode.knobs if mode.knobs is not None else DisaggregationKnobs()
    assert sim.disaggregation == carried
    expected = mode.summary if mode.knobs is not None else chosen.summary
    config = SimConfig(slo=sim.slo, disaggregation=sim.disaggregation)
    replayed = simulate(advice.request.requests, sim.layout, config).summary
    assert replayed.attainment >= 0.95
    assert replayed.attainment == pytest.approx(expected.attainment)
    assert replayed.ttft_p90 == pytest.approx(expected.ttft_p90)
    assert replayed.peak_gpus == chosen.gpus
    # every ratio row that found a layout meets the target at that ratio
    for row in advice.ratios:
        if row.found is not None:
            layout = row.found.layout
            assert layout.prefill * row.decode == layout.decode * row.prefill
            assert row.found.summary.attainment >= 0.95
    # and the recommended P/D layout is no bigger than any ratio's
    if advice.pd is not None:
        assert all(advice.pd.gpus <= row.found.gpus for row in advice.ratios if row.found is not None)


def test_short_requests_are_advised_colocated_when_pd_does_not_pay() -> None:
    advice = _advise(200, 100, 20, ttft_ms=1000, tpot_ms=50)
    assert advice.colocated is not None
    assert advice.colocated.gpus == 1  # one replica serves 20 short req/s
    assert advice.recommended is advice.colocated  # P/D needs at least 2 GPUs
    obj = deployment(advice)
    assert obj["spec"]["serving"] == {"mode": "Colocated"}
    assert obj["spec"]["colocated"] == {"replicas": 1, "tensorParallelSize": 1}
    spec = PDDeployment.from_object(obj).spec
    replayed = simulate(
        advice.request.requests, layout_of_spec(spec).layout, SimConfig(slo=SLO(ttft_ms=1000, tpot_ms=50))
    )
    assert replayed.summary.attainment >= 0.95


def test_an_slo_no_layout_meets_is_not_achievable_with_the_reason() -> None:
    # 8k-token prompts take ~225 ms to prefill alone: a 50 ms TTFT cannot be met at any size
    advice = _advise(8000, 50, 2, ttft_ms=50, tpot_ms=50)
    assert not advice.achievable
    assert advice.recommended is None
    reason = advice.notes[-1]
    assert reason.startswith("not achievable:")
    assert "miss the 50 ms TTFT even on an idle replica" in reason
    with pytest.raises(AdviseError, match="no layout meets the SLO"):
        deployment(advice)


def test_unknown_model_deployment_carries_its_kv_bytes() -> None:
    requests = synthetic_requests(500, 100, 5, 60, seed=1)
    req = AdviseRequest(
        model=resolve_model("acme/secret-8b", 131072),
        gpu="H100",
        bandwidth_gbps=400.0,
        slo=SLO(ttft_ms=1000, tpot_ms=50),
        requests=requests,
        max_gpus=8,
        ratios=((1, 1),),
    )
    advice = advise(req)
    obj = deployment(advice)
    assert obj["spec"]["model"]["kvBytesPerToken"] == 131072
    assert obj["spec"]["model"]["uri"] == "hf://acme/secret-8b"
    sim = layout_of_spec(PDDeployment.from_object(obj).spec)
    assert math.isclose(sim.layout.model_load_seconds, 120.0)


def _row(name: str, attainment: float, ttft_p90: float) -> ModeRow:
    knobs = None if name == COLOCATED else DisaggregationKnobs()
    return ModeRow(name, knobs, Summary.model_construct(attainment=attainment, ttft_p90=ttft_p90))


@pytest.mark.parametrize(
    ("rows", "best"),
    [
        ([("Always", 0.95, 0.4), ("Auto", 0.97, 0.5), ("Threshold 512", 0.96, 0.2)], "Auto"),
        ([("Always", 0.97, 0.4), ("Auto", 0.97, 0.3), ("Threshold 512", 0.97, 0.35)], "Auto"),
        ([("Always", 0.97, 0.3), ("Auto", 0.97, 0.3), ("Threshold 512", 0.97, 0.3)], "Always"),  # tie
        ([("Always", 0.9, 0.3), ("Auto", 0.9, 0.3), (COLOCATED, 0.99, 0.9)], COLOCATED),
        ([("Always", 1.0, 0.3), ("Threshold 256", 1.0, 0.29), (COLOCATED, 1.0, 0.29)], "Threshold 256"),
    ],
)
def test_best_mode_is_the_highest_attainment_then_ttft_p90_then_the_simpler(
    rows: list[tuple[str, float, float]], best: str
) -> None:
    assert best_mode([_row(*r) for r in rows]).name == best


def test_modes_compared_on_the_pd_layout_and_colocated_on_as_many_gpus() -> None:
    advice = _advise(4000, 150, 12, ttft_ms=1500, tpot_ms=12)
    pd = advice.pd
    assert pd is not None
    assert advice.recommended is pd
    names = [row.name for row in advice.modes]
    assert names == [
        "Always",
        "Auto",
        "Threshold 256",
        "Threshold 512",
        "Threshold 1024",
        "Threshold 2048",
        COLOCATED,
    ]
    assert advice.modes[0].summary is pd.summary  # the search's own run of the layout
    # each mode replays to its row on the P/D layout
    layout = layout_of_spec(PDDeployment.from_object(deployment(advice)).spec).layout
    for row in advice.modes[1:-1]:
        assert row.knobs is not None
        config = SimConfig(slo=SLO(ttft_ms=1500, tpot_ms=12), disaggregation=row.knobs)
        again = simulate(advice.request.requests, layout, config).summary
        assert again.attainment == pytest.approx(row.summary.attainment)
    # the Threshold rows differ: a higher threshold prefills at least as many prompts on decode
    local = [
        sum(v for k, v in row.summary.prefill_choices.items() if k == "below_threshold")
        for row in advice.modes[2:-1]
    ]
    assert local == sorted(local)
    assert local[-1] > 0
    assert advice.mode is best_mode(advice.modes)
