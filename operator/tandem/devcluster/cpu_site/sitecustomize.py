"""Loaded by every Python process of a real vLLM pod on the dev cluster (its PYTHONPATH names this
directory, `realvllm.CPU_ENV`): pauses for engines that share two cores, each set by a variable.

- `TANDEM_NIXL_PROGRESS_DELAY_US`: NIXL's progress thread sleeps this long between its passes. NIXL's
  Python agent sets the agent config's `pthrDelay` (the progress thread's pause, in microseconds) to
  0, and vLLM exposes no knob for it. On a GPU node a core spinning for the NIC is the norm; on these
  two shared cores each idle engine's progress thread took a whole core (measured: 1.0 core idle,
  0.02 with a 1 ms pause), so three engines starved everything else, the KV transfers included.
- `TANDEM_VLLM_SHM_BUSY_LOOP_S`: how long a reader of vLLM's shared-memory message queue (the worker
  waiting for the engine core's next step, the engine core waiting for the worker's answer) keeps
  spinning on `sched_yield` after its last read before it sleeps on the queue's notification socket
  (`SpinCondition`'s `busy_loop_s`, 1 s in vLLM, no knob). Spinning, an engine that had just served a
  request took a core for a second more: a decode engine's 24-token answer right after its prefill
  peer's step took 0.6 s instead of 0.2 s (docs/real-vllm.md).
- `TANDEM_VLLM_SHM_RECHECK_MS`: how often such a reader, asleep, looks at the queue again in case it
  missed the notification (`SHM_READER_RECHECK_INTERVAL_MS`, 5,000 in vLLM). With a short spin the
  reader sleeps between most steps, and a missed notification held a step for 5 s.

Only these values change: transfers, backends, queues and threads are vLLM's and NIXL's own.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_DELAY_US = os.environ.get("TANDEM_NIXL_PROGRESS_DELAY_US", "")
_BUSY_LOOP_S = os.environ.get("TANDEM_VLLM_SHM_BUSY_LOOP_S", "")
_RECHECK_MS = os.environ.get("TANDEM_VLLM_SHM_RECHECK_MS", "")
SHM_BROADCAST = "vllm.distributed.device_communicators.shm_broadcast"


def _patch_nixl(bindings: Any, delay_us: int) -> None:
    base = bindings.nixlAgentConfig

    class PausedProgressConfig(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "pthrDelay":
                value = max(int(value), delay_us)
            super().__setattr__(name, value)

    bindings.nixlAgentConfig = PausedProgressConfig


def _patch_spin(module: ModuleType, busy_loop_s: float | None, recheck_ms: int | None) -> None:
    if recheck_ms is not None:
        if "SHM_READER_RECHECK_INTERVAL_MS" not in module.__dict__:
            print(f"sitecustomize: {SHM_BROADCAST} has no SHM_READER_RECHECK_INTERVAL_MS", file=sys.stderr)
        module.__dict__["SHM_READER_RECHECK_INTERVAL_MS"] = recheck_ms
    if busy_loop_s is None:
        return
    init = module.SpinCondition.__init__
    code, defaults = init.__code__, list(init.__defaults__ or ())
    if not defaults or code.co_varnames[code.co_argcount - 1] != "busy_loop_s":
        print(f"sitecustomize: {SHM_BROADCAST}.SpinCondition has no trailing busy_loop_s", file=sys.stderr)
        return
    defaults[-1] = busy_loop_s
    init.__defaults__ = tuple(defaults)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs `patch` on module `name` right after it is first imported (vLLM's processes import it
    long after start-up; importing it here would load vLLM into every process)."""

    def __init__(self, name: str, patch: Any) -> None:
        self.name, self.patch = name, patch

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, self.patch

        class PatchingLoader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                patch(module)

        spec.loader = PatchingLoader()
        return spec


if _DELAY_US.isdigit():
    try:
        _bindings = importlib.import_module("nixl_cu13._bindings")
    except ImportError:  # a process of the environment that has no NIXL: nothing to pause
        pass
    else:
        _patch_nixl(_bindings, int(_DELAY_US))

if _BUSY_LOOP_S or _RECHECK_MS:
    _seconds = float(_BUSY_LOOP_S) if _BUSY_LOOP_S else None
    _ms = int(_RECHECK_MS) if _RECHECK_MS else None
    sys.meta_path.insert(0, _PatchOnImport(SHM_BROADCAST, lambda module: _patch_spin(module, _seconds, _ms)))
