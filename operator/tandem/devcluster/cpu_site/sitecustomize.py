"""Loaded by every Python process of a real vLLM pod on the dev cluster (its PYTHONPATH names this
directory, `realvllm.CPU_ENV`): NIXL's progress thread, which vLLM's NixlConnector starts with no
pause between its passes, sleeps `TANDEM_NIXL_PROGRESS_DELAY_US` between them instead.

NIXL's Python agent sets the agent config's `pthrDelay` (the progress thread's pause, in
microseconds) to 0, and vLLM exposes no knob for it. On a GPU node a core spinning for the NIC is
the norm; on these two shared cores each idle engine's progress thread took a whole core (measured:
1.0 core idle, 0.02 with a 1 ms pause), so three engines starved everything else, the KV transfers
they exist for included. Only the config's pause changes: transfers, backends and threads are
vLLM's and NIXL's own.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

_DELAY_US = os.environ.get("TANDEM_NIXL_PROGRESS_DELAY_US", "")


def _patch(bindings: Any, delay_us: int) -> None:
    base = bindings.nixlAgentConfig

    class PausedProgressConfig(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "pthrDelay":
                value = max(int(value), delay_us)
            super().__setattr__(name, value)

    bindings.nixlAgentConfig = PausedProgressConfig


if _DELAY_US.isdigit():
    try:
        _bindings = importlib.import_module("nixl_cu13._bindings")
    except ImportError:  # a process of the environment that has no NIXL: nothing to pause
        pass
    else:
        _patch(_bindings, int(_DELAY_US))
