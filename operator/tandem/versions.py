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
