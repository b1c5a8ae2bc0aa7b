"""GPU types (`tandem.perf.gpus`): the derived profiles on disk are what the roofline rules give, the rules
themselves, how they compare with Vidur's measured A100/H100 linear-op ratios, and which profile GPU a
GPU Feature Discovery product label maps to."""

from __future__ import annotations

from importlib import resources

import pytest

from tandem.perf import estimate_profile, load_profile
from tandem.perf.gpus import (
    BASE_GPU,
    UnknownGpuError,
    base_profiles,
    derive_profile,
    derived_gpus,
    derived_profile_text,
    gpu_spec,
    gpu_specs,
    profile_file_name,
    profile_gpu,
)

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def test_every_derived_profile_file_is_what_the_rules_give() -> None:
    directory = resources.files("tandem.perf").joinpath("profiles")
    expected = {}
    for gpu in derived_gpus():
        for base in base_profiles():
            expected[profile_file_name(derive_profile(base, gpu))] = derived_profile_text(base, gpu)
    assert len(expected) == len(derived_gpus()) * len(base_profiles()) >= 9  # H200, A100, B200 x 3 models
    for name, text in expected.items():
        assert directory.joinpath(name).read_text(encoding="utf-8") == text, (
            f"{name} is stale: run python -m tandem.perf.regenerate"
        )
    derived_names = {g.name for g in derived_gpus()}
    derived_on_disk = {
        entry.name
        for entry in directory.iterdir()
        if entry.name.endswith(".yaml") and entry.name.split("-", 1)[0].upper() in derived_names
    }
    assert derived_on_disk == set(expected)


def test_every_gpu_has_sources_and_the_pd_pairs_are_there() -> None:
    assert {"H100", "H200", "A100", "B200"} <= set(gpu_specs())
    for spec in gpu_specs().values():
        assert spec.sources
    with pytest.raises(UnknownGpuError, match="no GPU type 'TPU'; known: H100"):
        gpu_spec("TPU")
    assert gpu_spec("h200").name == "H200"
    for spec in gpu_specs().values():  # the label advise writes maps back to the GPU
        assert profile_gpu(spec.label) == spec.name


# (gpu, compute ratio c = TFLOPS_H100 / TFLOPS_gpu, bandwidth ratio m = BW_H100 / BW_gpu)
RATIO_CASES = [
    ("H200", 1.0, 3.35 / 4.8),
    ("A100", 989 / 312, 3.35 / 2.039),
    ("B200", 989 / 2250, 3.35 / 8.0),
]


@pytest.mark.parametrize(("gpu", "c", "m"), RATIO_CASES, ids=[c[0] for c in RATIO_CASES])
@pytest.mark.parametrize(("model", "tp"), [(LLAMA_8B, 1), (LLAMA_70B, 4), (LLAMA_70B, 8)])
def test_compute_terms_follow_tflops_and_memory_terms_follow_bandwidth(
    gpu: str, c: float, m: float, model: str, tp: int
) -> None:
    base, derived = load_profile(model, BASE_GPU, tp), load_profile(model, gpu, tp)
    rel = 0.006  # three significant figures
    p, d, dp, dd = base.prefill, base.decode, derived.prefill, derived.decode
    assert dp.per_token_ms == pytest.approx(p.per_token_ms * c, rel=rel)
    assert dp.per_token_sq_ms == pytest.approx(p.per_token_sq_ms * c, rel=rel)
    assert dd.per_seq_beyond_knee_ms == pytest.approx(d.per_seq_beyond_knee_ms * c, rel=rel)
    assert dp.floor_ms == pytest.approx(p.floor_ms * m, rel=rel)
    assert dp.intercept_ms == pytest.approx(p.intercept_ms * m, rel=rel)
    assert dd.base_ms == pytest.approx(d.base_ms * m, rel=rel)
    assert dd.per_context_token_ms == pytest.approx(d.per_context_token_ms * m, rel=rel)
    assert dd.knee_batch == round(d.knee_batch * m / c)
    assert derived.gpu_memory_gib == gpu_spec(gpu).memory_gib
    assert derived.derived_from == f"{model} H100 TP{tp}, roofline-scaled"


# Vidur's measured linear-op times, A100 over H100 (shared/reference/vllm-pd.md section 7.2): at one token
# the step is a weight read, at 1k+ tokens it is compute, so the ratios should be the HBM ratio (1.64) and
# the TFLOPS ratio (3.17). (label, A100 ms, H100 ms, which ratio the rules use)
VIDUR_CASES = [
    ("70B TP4 n=1", 24.9, 14.3, "m"),
    ("70B TP8 n=1", 14.3, 8.36, "m"),
    ("8B TP1 n=1", 9.70, 5.60 * 1.08, "m"),
    ("70B TP4 n=1024", 187.0, 62.1, "c"),
    ("70B TP1 n=1024", 708.0, 235.0, "c"),
    ("8B TP1 n=4096", 274.0, 83.5 * 1.08, "c"),
]


@pytest.mark.parametrize(
    ("a100_ms", "h100_ms", "term"), [c[1:] for c in VIDUR_CASES], ids=[c[0] for c in VIDUR_CASES]
)
def test_the_a100_rules_are_within_ten_percent_of_vidurs_measured_ratios(
    a100_ms: float, h100_ms: float, term: str
) -> None:
    h100, a100 = gpu_spec("H100"), gpu_spec("A100")
    bandwidth = h100.hbm_tb_per_s / a100.hbm_tb_per_s
    rule = bandwidth if term == "m" else h100.bf16_dense_tflops / a100.bf16_dense_tflops
    assert a100_ms / h100_ms == pytest.approx(rule, rel=0.10)


def test_each_gpu_is_faster_where_its_datasheet_is() -> None:
    prompt, batch, context = 4096, 64, 64 * 2000
    h100, h200, b200, a100 = (load_profile(LLAMA_8B, g, 1) for g in ("H100", "H200", "B200", "A100"))
    # the H200 has the H100's compute: a long prefill is no faster, a decode step is
    assert h200.prefill_seconds(prompt) == pytest.approx(h100.prefill_seconds(prompt), rel=0.01)
    assert h200.decode_step_seconds(batch, context) < 0.75 * h100.decode_step_seconds(batch, context)
    assert b200.prefill_seconds(prompt) < 0.5 * h100.prefill_seconds(prompt)
    assert a100.prefill_seconds(prompt) > 3 * h100.prefill_seconds(prompt)


def test_estimates_on_a_derived_gpu_say_both_steps() -> None:
    tp2 = estimate_profile(LLAMA_8B, "A100", 2)
    assert tp2.gpu == "A100"
    assert tp2.derived_from == f"{LLAMA_8B} A100 TP1 ({LLAMA_8B} H100 TP1, roofline-scaled)"


LABEL_CASES = [
    ("NVIDIA-H100-80GB-HBM3", "H100"),
    ("NVIDIA-H100-SXM5-80GB", "H100"),
    ("NVIDIA-H200", "H200"),
    ("NVIDIA-H200-141GB-HBM3e", "H200"),
    ("NVIDIA-A100-SXM4-80GB", "A100"),
    ("NVIDIA-B200", "B200"),
    ("H200", "H200"),  # a profile GPU name itself
    ("b200", "B200"),
    ("NVIDIA-A100-SXM4-40GB", None),  # 1.555 TB/s, 40 GB: not the A100 80GB's figures
    ("NVIDIA-A100-80GB-PCIe", None),  # 1.935 TB/s
    ("NVIDIA-H100-PCIe", None),  # 2.0 TB/s, 756 TFLOPS
    ("NVIDIA-H100-NVL", None),
    ("NVIDIA-H200-NVL", None),
    ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", None),  # a slice of a GPU
    ("NVIDIA-H100-80GB-HBM3-SHARED", None),  # time-shared
    ("NVIDIA-GH200-480GB", None),  # not the H200
    ("NVIDIA-L4", None),
    ("Tesla-T4", None),
]


@pytest.mark.parametrize(("label", "expected"), LABEL_CASES, ids=[c[0] for c in LABEL_CASES])
def test_gpu_feature_discovery_labels_map_to_profile_gpus(label: str, expected: str | None) -> None:
    assert profile_gpu(label) == expected
