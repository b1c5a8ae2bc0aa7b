"""Pools on different GPU types in the simulator: prefill and decode replicas with their own profiles
(a PDDeployment's `gpuType` per pool), and `tandem advise --gpus ... --prices ...` (`tandem.sim.gpu_types`)
recommending the GPU type per pool: where mixed types win, where they do not, with data-parallel groups, and
its input errors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeployment, PDDeploymentSpec
from tandem.api.shape import Shape
from tandem.cli import main
from tandem.sim.advise import AdviseError, AdviseRequest, layout_of_spec, resolve_model, synthetic_requests
from tandem.sim.baselines import StaticLayout
from tandem.sim.cluster import simulate
from tandem.sim.gpu_types import (
    GpuTypeAdvice,
    TypeCandidate,
    advise_gpu_types,
    gpu_type_deployment,
    group_layout,
    parse_gpus,
    parse_prices,
    prices_for,
)
from tandem.sim.layout import SLO, SimConfig

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
PRICES = {"H100": 2.5, "H200": 3.2, "A100": 1.6}  # $ per GPU-hour: the example price list
GPUS = ("H100", "H200", "A100")

# --- the simulator: each pool on its own GPU type's profile ---------------------------------------------


def _spec(prefill_gpu: str | None, decode_gpu: str | None) -> PDDeploymentSpec:
    spec: dict[str, Any] = {
        "model": {"name": "llama", "uri": f"hf://{LLAMA_8B}"},
        "engine": {"image": "vllm/vllm-openai:v0.33.0"},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
        "slo": {"ttftMs": 1000, "tpotMs": 50},
    }
    for role, gpu in (("prefill", prefill_gpu), ("decode", decode_gpu)):
        if gpu is not None:
            spec[role]["gpuType"] = gpu
    return PDDeploymentSpec.model_validate(spec)


# id, prefill gpuType, decode gpuType, TTFT p50 vs all-H100 (-1 lower, 0 within 3%, 1 higher), TPOT p50's.
# A TTFT holds the decode pool's first step too (and the wait for its running step), so a decode GPU moves
# it by some milliseconds of ~60.
SIM_CASES = [
    ("prefill-on-b200", "NVIDIA-B200", None, -1, 0),
    ("prefill-on-a100", "NVIDIA-A100-SXM4-80GB", None, 1, 0),
    ("decode-on-h200", None, "NVIDIA-H200", -1, -1),
    ("decode-on-a100", None, "NVIDIA-A100-SXM4-80GB", 1, 1),
]


@pytest.mark.parametrize(
    ("prefill_gpu", "decode_gpu", "ttft", "tpot"), [c[1:] for c in SIM_CASES], ids=[c[0] for c in SIM_CASES]
)
def test_prefill_and_decode_replicas_run_their_own_gpus_profile(
    prefill_gpu: str | None, decode_gpu: str | None, ttft: int, tpot: int
) -> None:
    # an idle-ish load (1 req/s) so that the latencies are the replicas' own step times
    requests = synthetic_requests(2000, 100, 1, 60, cv=0.0, seed=3)
    config = SimConfig(slo=SLO(ttft_ms=1000, tpot_ms=50))
    base = simulate(requests, layout_of_spec(_spec(None, None)).layout, config).summary
    sim = layout_of_spec(_spec(prefill_gpu, decode_gpu))
    pools = sim.layout.pools
    assert pools["prefill"].replica.profile.gpu == (
        "H100" if prefill_gpu is None else prefill_gpu.split("-")[1]
    )
    assert pools["decode"].replica.profile.gpu == ("H100" if decode_gpu is None else decode_gpu.split("-")[1])
    summary = simulate(requests, sim.layout, config).summary

    def change(now: float, before: float) -> int:
        return 0 if abs(now / before - 1) < 0.03 else (1 if now > before else -1)

    assert change(summary.ttft_p50, base.ttft_p50) == ttft
    assert change(summary.tpot_p50, base.tpot_p50) == tpot


def test_a_gpu_type_of_no_profile_is_simulated_on_the_default_with_a_note() -> None:
    sim = layout_of_spec(_spec("NVIDIA-L4", "NVIDIA-H200"))
    assert sim.layout.pools["prefill"].replica.profile.gpu == "H100"
    assert "prefill: gpuType NVIDIA-L4 is no GPU with a profile; simulated on H100" in sim.notes
    assert "decode: on H200 (gpuType NVIDIA-H200)" in sim.notes


# --- advise: the GPU type per pool ----------------------------------------------------------------------


def _advise(rate: float, tpot_ms: float, decode_dp: int = 1) -> GpuTypeAdvice:
    requests = synthetic_requests(4000, 150, rate, 60, cv=0.5, seed=7)
    req = AdviseRequest(
        model=resolve_model(LLAMA_8B, None),
        gpu="H100",
        bandwidth_gbps=400.0,
        slo=SLO(ttft_ms=1500, tpot_ms=tpot_ms),
        requests=requests,
        max_gpus=16,
        decode_dp=decode_dp,
    )
    return advise_gpu_types(req, GPUS, PRICES)


def test_mixed_types_win_when_prefill_wants_compute_and_decode_bandwidth() -> None:
    # long prompts at 12 req/s, TPOT 12 ms: H100 prefill is the cheapest compute, the H200's bandwidth
    # lets one decode replica hold what takes two H100s, and the A100 cannot decode within 12 ms at all
    advice = _advise(12, 12)
    assert len(advice.candidates) == 3 * 3 + 3
    chosen = advice.recommended
    assert chosen is not None
    assert chosen.layout is not None
    assert chosen.summary is not None
    assert (chosen.name, str(chosen.layout), chosen.gpus) == ("P/D H100 + H200", "2P+1D", 3)
    assert chosen.mixed
    assert chosen.cost_per_hour == pytest.approx(2 * 2.5 + 1 * 3.2)
    assert chosen.summary.attainment >= 0.95
    assert chosen.gpu_hours(advice.duration_seconds) == pytest.approx(3 * advice.duration_seconds / 3600)
    single = [c for c in advice.candidates if c.layout is not None and not c.mixed]
    assert single
    assert min(c.cost_per_hour for c in single) > chosen.cost_per_hour
    a100_decode = [c for c in advice.candidates if c.decode_gpu == "A100"]
    assert all(c.layout is None and "decode alone cannot" in c.note for c in a100_decode)
    # the deployment puts each pool on its GPU type, and replays to the candidate's figures
    obj = gpu_type_deployment(advice, name="mixed")
    spec = obj["spec"]
    assert spec["prefill"] == {"replicas": 2, "tensorParallelSize": 1, "gpuType": "NVIDIA-H100-80GB-HBM3"}
    assert spec["decode"] == {"replicas": 1, "tensorParallelSize": 1, "gpuType": "NVIDIA-H200"}
    sim = layout_of_spec(PDDeployment.from_object(obj).spec)
    assert [sim.layout.pools[r].replica.profile.gpu for r in ("prefill", "decode")] == ["H100", "H200"]
    replayed = simulate(advice.request.requests, sim.layout, SimConfig(slo=advice.request.slo)).summary
    assert replayed.attainment == pytest.approx(chosen.summary.attainment)


def test_one_type_wins_when_a_pair_of_h100_replicas_is_enough() -> None:
    # half the load and a 10 ms TPOT: one H100 replica per pool does it, and any other pair costs more
    advice = _advise(6, 10)
    chosen = advice.recommended
    assert chosen is not None
    assert (chosen.name, str(chosen.layout)) == ("P/D H100 + H100", "1P+1D")
    assert not chosen.mixed
    assert chosen.cost_per_hour == pytest.approx(5.0)
    met = [c for c in advice.candidates if c.layout is not None and c is not chosen]
    assert all(c.cost_per_hour > chosen.cost_per_hour for c in met)
    assert gpu_type_deployment(advice)["spec"]["decode"]["gpuType"] == "NVIDIA-H100-80GB-HBM3"


# --- data-parallel groups: a replica of D ranks on its type's per-rank profile, priced per GPU ------------


@pytest.fixture(scope="module")
def per_rank() -> GpuTypeAdvice:
    """The mixed-types case above with one engine a replica: the per-rank results."""
    return _advise(12, 12)


def _pd(advice: GpuTypeAdvice) -> dict[str, TypeCandidate]:
    return {c.name: c for c in advice.candidates if c.colocated_gpu is None and c.layout is not None}


def test_decode_groups_of_2_ranks_turn_the_winner_to_one_type(per_rank: GpuTypeAdvice) -> None:
    """Decode in groups of 2 ranks: a pool needing d engines takes ceil(d / 2) groups of 2 GPUs. The
    per-rank winner (H100 prefill, one H200 decode engine, $8.20/h) must now hold a whole group, 2 H200s,
    where H100 decode needed 2 engines anyway: H100 + H100 in one group is cheaper. Expected figures are
    worked out here from the per-rank layouts and the price list, not by the code under test."""
    grouped = _advise(12, 12, decode_dp=2)
    expected: dict[str, tuple[int, int, float]] = {}  # name -> prefill replicas, decode groups, $/h
    for name, c in _pd(per_rank).items():
        assert c.layout is not None
        assert c.prefill_gpu is not None
        assert c.decode_gpu is not None
        groups = math.ceil(c.layout.decode / 2)
        cost = c.layout.prefill * PRICES[c.prefill_gpu] + groups * 2 * PRICES[c.decode_gpu]
        expected[name] = (c.layout.prefill, groups, cost)
    assert expected["P/D H100 + H100"] == (2, 1, 10.0)
    assert expected["P/D H100 + H200"] == (2, 1, 11.4)
    found = _pd(grouped)
    assert found.keys() == expected.keys()  # the same pairs meet the SLO (A100 decode: none)
    for name, (prefill, groups, cost) in expected.items():
        c = found[name]
        assert c.layout is not None
        assert (c.layout.prefill, c.layout.decode) == (prefill, groups), name
        assert c.gpus == prefill + 2 * groups
        assert c.cost_per_hour == pytest.approx(cost), name
    chosen = grouped.recommended
    assert chosen is not None
    assert chosen.summary is not None
    cheapest = min(expected, key=lambda n: expected[n][2])
    assert (chosen.name, chosen.cost_per_hour) == (cheapest, pytest.approx(expected[cheapest][2]))
    assert chosen.name == "P/D H100 + H100"
    assert per_rank.recommended is not None
    assert per_rank.recommended.name == "P/D H100 + H200"
    assert chosen.summary.attainment >= 0.95
    assert chosen.gpu_hours(grouped.duration_seconds) == pytest.approx(4 * grouped.duration_seconds / 3600)
    # the deployment's decode pool is a group of 2 ranks on its type, and replays to the candidate
    obj = gpu_type_deployment(grouped, name="grouped")
    decode = obj["spec"]["decode"]
    assert decode["parallelism"] == {"data": 2}
    assert (decode["replicas"], decode["gpuType"]) == (1, "NVIDIA-H100-80GB-HBM3")
    sim = layout_of_spec(PDDeployment.from_object(obj).spec)
    assert sim.layout.pools["decode"].gpus_per_replica == 2
    replayed = simulate(grouped.request.requests, sim.layout, SimConfig(slo=grouped.request.slo)).summary
    assert replayed.attainment == pytest.approx(chosen.summary.attainment)
    assert replayed.peak_gpus == 4


# id, layout, each pool's group, what the table writes
GROUP_LAYOUTS = [
    ("one-engine", StaticLayout(2, 1), {}, "2P+1D"),
    ("dp-1-shapes", StaticLayout(2, 1), {"prefill": Shape(), "decode": Shape(tensor=2)}, "2P+1D"),
    ("decode-dp4", StaticLayout(2, 1), {"decode": Shape(data=4)}, "2P+1D(DP4)"),
    (
        "both",
        StaticLayout(3, 2),
        {"prefill": Shape(data=2), "decode": Shape(tensor=2, data=4)},
        "3P(DP2)+2D(DP4)",
    ),
    (
        "colocated",
        StaticLayout(colocated=3),
        {"colocated": Shape(data=2), "decode": Shape(data=4)},
        "3C(DP2)",
    ),
]


@pytest.mark.parametrize(
    ("layout", "shapes", "text"), [c[1:] for c in GROUP_LAYOUTS], ids=[c[0] for c in GROUP_LAYOUTS]
)
def test_the_table_writes_each_pools_group(layout: StaticLayout, shapes: dict[str, Shape], text: str) -> None:
    assert group_layout(layout, shapes) == text


PRICE_CASES = [
    ("H100=2.5, h200=3.2", {"H100": 2.5, "h200": 3.2}),
    ("A100=1.6", {"A100": 1.6}),
]


@pytest.mark.parametrize(("text", "expected"), PRICE_CASES)
def test_prices_inline(text: str, expected: dict[str, float]) -> None:
    assert parse_prices(text) == expected


def test_prices_from_a_file_and_matched_to_the_gpus(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("H100: 2.5\nh200: 3.2\nA100: 1.6\nB200: 6\n")
    assert prices_for(("H100", "H200", "A100"), parse_prices(str(path))) == PRICES


ERROR_CASES = [
    (lambda: parse_gpus("H100,TPU"), "--gpus: no profile on GPU 'TPU'; known: A100, B200"),
    (lambda: parse_gpus("H100,h100"), "--gpus: H100 is listed twice"),
    (lambda: parse_gpus(" , "), "--gpus: give GPU types"),
    (lambda: prices_for(("H100", "A100"), {"H100": 2.5}), "--prices: no price for A100 (given: H100)"),
    (lambda: parse_prices("H100=2.5,H200"), "--prices: expected GPU=PRICE pairs like H100=2.5, got 'H200'"),
    (lambda: parse_prices("H100=free"), "--prices: H100=free is not a positive price per GPU-hour"),
    (lambda: parse_prices("H100=-1"), "--prices: H100=-1 is not a positive price"),
    (lambda: parse_prices("/nonexistent/prices.yaml"), "--prices: /nonexistent/prices.yaml:"),
]


@pytest.mark.parametrize(("call", "message"), ERROR_CASES, ids=[c[1][:40] for c in ERROR_CASES])
def test_input_errors_name_the_flag(call: Any, message: str) -> None:
    with pytest.raises(AdviseError) as info:
        call()
    assert message in str(info.value)


# --- from the command line, on a small trace ------------------------------------------------------------


def _trace(tmp_path: Path) -> Path:
    """60 s of 4,000-token prompts at 12 req/s (the mixed-types case above), in the plain CSV format."""
    path = tmp_path / "long-prompts.csv"
    rows = ["timestamp,input_tokens,output_tokens"]
    rows += [
        f"{r.arrival:.3f},{r.prompt_tokens},{r.output_tokens}"
        for r in synthetic_requests(4000, 150, 12, 60, cv=0.5, seed=7)
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_cli_prints_the_candidates_and_writes_the_mixed_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "advised.yaml"
    argv = ["advise", "--model", LLAMA_8B, "--trace", str(_trace(tmp_path)), "--ttft-ms", "1500"]
    argv += ["--tpot-ms", "12", "--max-gpus", "16", "--gpus", "H100,H200,A100"]
    code = main([*argv, "--prices", "H100=2.5,H200=3.2,A100=1.6", "-o", str(out_file)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "prices per GPU-hour: H100 $2.50, H200 $3.20, A100 $1.60" in out
    header = next(line for line in out.splitlines() if "cost/h" in line)
    assert header.split() == ["candidate", "layout", "GPUs", "cost/h", "GPU-hours", "attainment"]
    chosen = [line for line in out.splitlines() if line.startswith("* ")]
    assert len(chosen) == 1
    assert chosen[0].split()[1:5] == ["P/D", "H100", "+", "H200"]
    assert "recommendation: P/D H100 + H200 2P+1D (3 GPUs, $8.20/h; the cheapest on one GPU type:" in out
    obj = yaml.safe_load(out_file.read_text())
    assert obj["spec"]["decode"]["gpuType"] == "NVIDIA-H200"


def test_cli_with_decode_groups_shows_them_and_writes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "advised.yaml"
    argv = ["advise", "--model", LLAMA_8B, "--trace", str(_trace(tmp_path)), "--ttft-ms", "1500"]
    argv += ["--tpot-ms", "12", "--max-gpus", "16", "--gpus", "H100,H200,A100", "--decode-dp", "2"]
    code = main([*argv, "--colocated-dp", "1", "--prices", "H100=2.5,H200=3.2,A100=1.6", "-o", str(out_file)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert (
        "a replica: prefill 1x1 TP1 (1 GPU), decode 1x2 TP1 DP2 Internal (2 GPUs), colocated 1x1 TP1 (1 GPU)"
        in out
    )
    chosen = [line for line in out.splitlines() if line.startswith("* ")]
    assert len(chosen) == 1
    assert chosen[0].split()[1:7] == ["P/D", "H100", "+", "H100", "2P+1D(DP2)", "4"]
    assert "recommendation: P/D H100 + H100 2P+1D(DP2) (4 GPUs, $10.00/h)" in out
    assert yaml.safe_load(out_file.read_text())["spec"]["decode"]["parallelism"] == {"data": 2}


CLI_ERRORS = [
    (["--gpus", "H100,H200"], "--gpus needs --prices"),
    (["--prices", "H100=2.5"], "--prices prices the GPU types of --gpus: give --gpus too"),
    (["--gpus", "H100", "--gpu", "H200", "--prices", "H100=2"], "give --gpu (one GPU type) or --gpus"),
    (["--gpus", "H100,X9", "--prices", "H100=2"], "--gpus: no profile on GPU 'X9'"),
    (["--gpus", "H100,H200", "--prices", "H100=2"], "--prices: no price for H200 (given: H100)"),
    (
        ["--gpus", "H100", "--prices", "H100=2", "--decode-dp", "0"],
        "a decode replica needs at least one data-parallel rank (--decode-dp)",
    ),
    (
        ["--gpus", "H100", "--prices", "H100=2", "--colocated-dp", "0"],
        "a colocated replica needs at least one data-parallel rank (--colocated-dp)",
    ),
    (
        ["--gpus", "H100", "--prices", "H100=2", "--decode-tp", "4", "--decode-dp", "4"],
        "a decode replica of TP4 x DP4 must fit one pod of 8 GPUs (--decode-tp x --decode-dp)",
    ),
]


@pytest.mark.parametrize(("extra", "message"), CLI_ERRORS, ids=[c[1][:30] for c in CLI_ERRORS])
def test_cli_errors_are_one_line_naming_the_flag(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    load = ["--input-tokens", "800", "--output-tokens", "100", "--rate", "4", "--seconds", "30"]
    code = main(["advise", "--model", LLAMA_8B, *load, "--ttft-ms", "1000", "--tpot-ms", "50", *extra])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("error: ")
    assert message in err
    assert "Traceback" not in err
