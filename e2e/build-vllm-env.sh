#!/usr/bin/env bash
# Installs the vLLM release tandem pins (operator/tandem/versions.py) into a virtualenv in the cache
# outside the repository, for the test that runs every rendered command line through vLLM's own
# argument parser (tests/unit/render/test_vllm_parser.py). Several GB from PyPI the first time
# (about 5 minutes here); nothing on a warm run: a stamp names the version installed.
#
# Prints the environment's python on its last line of stdout.
# Env: TANDEM_CACHE (default ~/.cache/tandem), PY (the interpreter to build the venv with).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
py=${PY:-python3}
version=$(sed -n 's/^VLLM_VERSION = "\(.*\)"$/\1/p' "$here/../operator/tandem/versions.py")
[[ -n "$version" ]] || { echo "[build-vllm-env] no VLLM_VERSION in operator/tandem/versions.py" >&2; exit 1; }
env="$cache/vllm-$version"
stamp="$env/.tandem-stamp"

if [[ ! -f "$stamp" || "$(cat "$stamp")" != "vllm==$version" ]]; then
  echo "[build-vllm-env] installing vllm==$version into $env (several GB, once)" >&2
  rm -rf "$env"
  "$py" -m venv "$env"
  "$env/bin/pip" install -q --upgrade pip
  "$env/bin/pip" install -q "vllm==$version"
  echo "vllm==$version" > "$stamp"
fi
echo "$env/bin/python"
