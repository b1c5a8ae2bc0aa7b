"""GPU types: their datasheet figures (`gpus.yaml`, each sourced), the roofline scaling that derives a
profile on one GPU from a calibrated profile on another, and which profile GPU a pool's `gpuType` (GPU
Feature Discovery's `nvidia.com/gpu.product` label) runs on.

Scaling from GPU `a` to GPU `b` (`derive_profile`), with `c = TFLOPS_a / TFLOPS_b` (dense BF16) and
`m = BW_a / BW_b` (HBM):
- compute-bound terms times `c`: prefill's per-token (linear ops over many tokens) and per-token-squared
  (attention) terms, and decode's per-sequence slope beyond the knee (linear ops over a large batch);
- memory-bound terms times `m`: prefill's floor and intercept (the weight read of a small step), decode's
  base step (the weight read at batch 1) and its per-context-token KV read;
- the decode knee (where the batch's compute overtakes the weight read) times `m / c`, rounded: the
  ratio of the two GPUs' ridge points (FLOPs per byte);
- `gpu_memory_gib` is `b`'s.
The all-reduce and the host's scheduling time inside those terms scale with them (a simplification:
NVLink differs between generations and the host does not get faster; docs/performance-model.md).

`python -m tandem.perf.regenerate` rewrites `profiles/<gpu>-*.yaml` for every derived GPU from the H100
profiles; `tests/unit/perf/test_gpus.py` checks that the files are what this module derives.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from tandem.perf.profile import Profile, available_profiles

BASE_GPU = "H100"  # the GPU of the calibrated profiles the others are derived from
# Label tokens that mark a part whose figures differ from the SXM one of the same name (PCIe and NVL
# cards, the 40 GB A100), or a slice of a GPU (MIG, time-shared): such a label maps to no profile.
_OTHER_PART_TOKENS = frozenset({"PCIE", "NVL", "40GB", "MIG", "SHARED"})


class UnknownGpuError(LookupError):
    """No datasheet figures for this GPU type."""


class GpuSpec(BaseModel):
    """One GPU type's datasheet figures."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    product: str  # the model token of its GPU Feature Discovery product label
    label: str  # that label on the SXM part (what `tandem advise` writes into a pool's gpuType)
    bf16_dense_tflops: float = Field(gt=0)
    hbm_tb_per_s: float = Field(gt=0)
    memory_gib: float = Field(gt=0)
    sources: tuple[str, ...] = Field(min_length=1)

    @property
    def ridge_flops_per_byte(self) -> float:
        return self.bf16_dense_tflops / self.hbm_tb_per_s


@functools.cache
def gpu_specs() -> dict[str, GpuSpec]:
    """Every GPU type in `gpus.yaml`, by name (H100, H200, ...)."""
    raw = yaml.safe_load(resources.files("tandem.perf").joinpath("gpus.yaml").read_text(encoding="utf-8"))
    return {name: GpuSpec.model_validate({"name": name, **fields}) for name, fields in raw["gpus"].items()}


def gpu_spec(name: str) -> GpuSpec:
    """The figures of GPU type `name` (any case), or UnknownGpuError naming the known ones."""
    for spec in gpu_specs().values():
        if spec.name.lower() == name.lower():
            return spec
    raise UnknownGpuError(f"no GPU type {name!r}; known: {', '.join(gpu_specs())}")


def profile_gpu(gpu_type: str) -> str | None:
    """The profile GPU name of a pool's `gpuType`: a GPU Feature Discovery product label such as
    NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-80GB or NVIDIA-H200 (or a profile GPU name itself). None for a
    label of no known type, or of a part whose figures differ from the known one (PCIe, NVL, A100 40GB,
    a MIG slice, a time-shared GPU)."""
    tokens = [t.upper() for t in gpu_type.split("-") if t]
    if not tokens or _OTHER_PART_TOKENS.intersection(tokens):
        return None
    for spec in gpu_specs().values():
        if spec.product.upper() in tokens:
            return spec.name
    return None


def _round(value: float) -> float:
    """Three significant figures: the precision of the H100 profiles' coefficients."""
    return float(f"{value:.3g}")


def derive_profile(base: Profile, gpu: GpuSpec) -> Profile:
    """`base` (on a GPU of `gpus.yaml`) scaled to `gpu` by the roofline rules of the module docstring."""
    source = gpu_spec(base.gpu)
    c = source.bf16_dense_tflops / gpu.bf16_dense_tflops
    m = source.hbm_tb_per_s / gpu.hbm_tb_per_s
    p, d = base.prefill, base.decode
    return base.model_copy(
        update={
            "gpu": gpu.name,
            "gpu_memory_gib": gpu.memory_gib,
            "derived_from": f"{base.model} {base.gpu} TP{base.tensor_parallel_size}, roofline-scaled",
            "prefill": p.model_copy(
                update={
                    "floor_ms": _round(p.floor_ms * m),
                    "intercept_ms": _round(p.intercept_ms * m),
                    "per_token_ms": _round(p.per_token_ms * c),
                    "per_token_sq_ms": _round(p.per_token_sq_ms * c),
                }
            ),
            "decode": d.model_copy(
                update={
                    "base_ms": _round(d.base_ms * m),
                    "knee_batch": round(d.knee_batch * m / c),
                    "per_seq_beyond_knee_ms": _round(d.per_seq_beyond_knee_ms * c),
                    "per_context_token_ms": _round(d.per_context_token_ms * m),
                }
            ),
        }
    )


def profile_file_name(profile: Profile) -> str:
    """`h100-llama-3.1-70b-tp4.yaml`: the GPU, the model's short name and the TP degree."""
    short = profile.model.rsplit("/", 1)[-1].lower().removesuffix("-instruct")
    return f"{profile.gpu.lower()}-{short}-tp{profile.tensor_parallel_size}.yaml"


def derived_profile_text(base: Profile, gpu: GpuSpec) -> str:
    """The YAML file of `derive_profile(base, gpu)`, its header saying where every figure comes from."""
    source = gpu_spec(base.gpu)
    derived = derive_profile(base, gpu)
    c = source.bf16_dense_tflops / gpu.bf16_dense_tflops
    m = source.hbm_tb_per_s / gpu.hbm_tb_per_s
    p, d, dp, dd = base.prefill, base.decode, derived.prefill, derived.decode

    def figures(spec: GpuSpec) -> str:
        return (
            f"#   {spec.name}: {spec.bf16_dense_tflops:g} TFLOPS dense BF16, "
            f"{spec.hbm_tb_per_s:g} TB/s HBM, {spec.memory_gib:g} GB"
        )

    lines = [
        f"# {base.model}, bf16, {gpu.name} at tensor parallel {base.tensor_parallel_size}. "
        f"Every figure is [derived]: {profile_file_name(base)}",
        "# scaled by the roofline rules of operator/tandem/perf/gpus.py; written by",
        "# `python -m tandem.perf.regenerate` (tests/unit/perf/test_gpus.py checks this file against it).",
        "# Datasheet figures (gpus.yaml):",
        figures(source),
        figures(gpu),
        *(f"#   source: {' '.join(s.split())}" for s in gpu.sources),
        f"# compute ratio c = {source.bf16_dense_tflops:g} / {gpu.bf16_dense_tflops:g} = {c:.4f}; "
        f"bandwidth ratio m = {source.hbm_tb_per_s:g} / {gpu.hbm_tb_per_s:g} = {m:.4f}.",
        f"# prefill floor {p.floor_ms:g} x m = {dp.floor_ms:g} ms; "
        f"intercept {p.intercept_ms:g} x m = {dp.intercept_ms:g} ms;",
        f"#   per token {p.per_token_ms:g} x c = {dp.per_token_ms:g} ms; "
        f"per token^2 {p.per_token_sq_ms:g} x c = {dp.per_token_sq_ms:g} ms.",
        f"# decode base {d.base_ms:g} x m = {dd.base_ms:g} ms; "
        f"knee {d.knee_batch} x m / c = {dd.knee_batch};",
        f"#   per sequence {d.per_seq_beyond_knee_ms:g} x c = {dd.per_seq_beyond_knee_ms:g} ms; "
        f"per context token {d.per_context_token_ms:g} x m = {dd.per_context_token_ms:g} ms.",
        "# Scaled with the terms they sit in though they do not follow HBM bandwidth: the all-reduce",
        "# (NVLink differs by generation) and the host's 0.3-1 ms of scheduling and sampling",
        "# (docs/performance-model.md, 'GPU types').",
    ]
    body = derived.model_dump(mode="json", exclude_defaults=True)
    return "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False)


def derived_gpus() -> list[GpuSpec]:
    return [spec for name, spec in gpu_specs().items() if name != BASE_GPU]


def base_profiles() -> list[Profile]:
    """The calibrated profiles every other GPU's are derived from."""
    return [p for p in available_profiles() if p.gpu == BASE_GPU and p.derived_from is None]


def write_derived_profiles(directory: Path) -> list[Path]:
    """Writes every derived profile into `directory`; returns the paths."""
    written: list[Path] = []
    for gpu in derived_gpus():
        for base in base_profiles():
            path = directory / profile_file_name(derive_profile(base, gpu))
            path.write_text(derived_profile_text(base, gpu), encoding="utf-8")
            written.append(path)
    return written
