"""The dev cluster's pauses for engines on shared cores (operator/tandem/devcluster/cpu_site) reach the
pinned CPU build's own modules: NIXL's agent config and vLLM's shared-memory queue, as the engine's
processes import them with the environment the pod runner gives a vLLM pod; and with that environment
the pinned build runs a one-rank engine's worker in the engine-core process (`uni`), not in a third."""

from __future__ import annotations

import os
import subprocess

from tandem.devcluster import realvllm

PROBE = """
import inspect
import nixl_cu13._bindings as bindings
import vllm.distributed.device_communicators.shm_broadcast as shm
config = bindings.nixlAgentConfig()
config.pthrDelay = 0
busy = inspect.signature(shm.SpinCondition.__init__).parameters["busy_loop_s"].default
print(config.pthrDelay, busy, shm.SHM_READER_RECHECK_INTERVAL_MS)
"""


def test_the_pauses_reach_nixl_and_vllms_modules(engine_setup: realvllm.EngineSetup) -> None:
    env = realvllm.environment({"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}, engine_setup)
    done = subprocess.run(
        [engine_setup.python, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sitecustomize" not in done.stderr, done.stderr[-3000:]
    want = [str(realvllm.NIXL_PROGRESS_DELAY_US), str(realvllm.SHM_BUSY_LOOP_S), str(realvllm.SHM_RECHECK_MS)]
    assert done.stdout.split()[-3:] == want


def test_without_the_variables_the_modules_keep_their_own_values(engine_setup: realvllm.EngineSetup) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "PYTHONPATH": str(realvllm.CPU_SITE)}
    done = subprocess.run(
        [engine_setup.python, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["0", "1", "5000"]


EXECUTOR = """
import sys
from vllm.engine.arg_utils import EngineArgs
config = EngineArgs(model=sys.argv[1], max_model_len=2048, enforce_eager=True).create_engine_config()
print(config.parallel_config.distributed_executor_backend)
"""


def _executor(engine_setup: realvllm.EngineSetup, env: dict[str, str]) -> str:
    done = subprocess.run(
        [engine_setup.python, "-c", EXECUTOR, str(realvllm.tiny_model_dir())],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()[-1]


def test_a_one_rank_engine_runs_its_worker_in_the_engine_core(engine_setup: realvllm.EngineSetup) -> None:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
    assert _executor(engine_setup, realvllm.environment(dict(base), engine_setup)) == "uni"
    # The CPU platform's own choice, which the dev cluster's environment overrides.
    assert _executor(engine_setup, {**base, "VLLM_CPU_KVCACHE_SPACE": "1"}) == "mp"
