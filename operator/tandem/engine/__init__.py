"""tandem's vLLM-compatible simulation engine (`tandem engine serve MODEL [vllm serve args]`).

Documented in full in the module docstrings below and in worker_image/README.md; summary here.
"""
