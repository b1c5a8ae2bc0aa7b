"""How long an engine pod may take to start and to stop: probes, preStop, grace, drain, /dev/shm.

Pure. The numbers and where they come from (shared/reference/vllm-pd.md section 4.4-4.5):

- Start-up: vLLM listens only after weights are loaded, the KV cache profiled and CUDA graphs
  captured; 70B TP8 takes ~3.5 min with a warm page cache and far more cold. The startup probe
  allows 10 min per doubling of a replica's GPUs (TP x PP x DP: 1 GPU 10 min ... 8 GPUs 40 min),
  at most 45 min (a wide-EP group of several nodes takes 7-45 min: its ranks load, compile and
  capture, then wait for each other; llm-d's wide-EP recipe allows the same 45 min), plus 20 min when
  the engine first downloads the weights from Hugging Face. A probe that gives up early restarts a
  healthy load (and a whole group with it).
- Stop: the router watches pods and stops picking a terminating one within seconds; `preStop`
  sleeps PRESTOP_SECONDS so no request arrives after SIGTERM.
  Prefill holds finished KV blocks until decode has read them; SIGTERM does not wait for those
  reads (`--shutdown-timeout` does not cover them), so prefill's preStop also waits one NIXL KV
  lease (`kv_lease_duration`, 30 s) before the engine is signalled.
  Decode and colocated stream answers; `--shutdown-timeout` lets them finish in-flight streams
  (2 min covers ~2.4k tokens at 50 ms per token) before aborting the rest.
  terminationGracePeriodSeconds = preStop + drain + EXIT_MARGIN_SECONDS for the process to exit.
"""

from __future__ import annotations

from typing import Any

from tandem.api.meta import Role

PRESTOP_SECONDS = 15  # KServe's value; the router's pod watch converges well within it
NIXL_KV_LEASE_SECONDS = 30  # vLLM kv_lease_duration default (>= v0.22)
STREAM_DRAIN_SECONDS = 120  # decode/colocated --shutdown-timeout
EXIT_MARGIN_SECONDS = 15

STARTUP_PERIOD_SECONDS = 10
STARTUP_MINUTES_PER_GPU_DOUBLING = 10
MAX_LOAD_STARTUP_MINUTES = 45
DOWNLOAD_STARTUP_MINUTES = 20

GIB = 1 << 30
SHM_MIN_GIB = 8
SHM_GIB_PER_GPU = 4  # NCCL and vLLM's multiprocess executor keep per-rank buffers in /dev/shm


def prestop_seconds(role: Role) -> int:
    if role == "prefill":
        return PRESTOP_SECONDS + NIXL_KV_LEASE_SECONDS
    return PRESTOP_SECONDS


def shutdown_timeout_seconds(role: Role) -> int | None:
    """The `--shutdown-timeout` tandem renders for `role` (None: not rendered, SIGTERM aborts)."""
    return None if role == "prefill" else STREAM_DRAIN_SECONDS


def termination_grace_seconds(role: Role, *, drain_seconds: float | None) -> int:
    """preStop + the engine's drain (`--shutdown-timeout` in effect, if any) + time to exit."""
    drain = int(-(-(drain_seconds or 0) // 1))  # ceil without floats
    return prestop_seconds(role) + drain + EXIT_MARGIN_SECONDS


def startup_budget_seconds(gpus_per_instance: int, *, downloads: bool) -> int:
    """How long a replica of `gpus_per_instance` GPUs may take to serve (the startup probe's budget)."""
    doublings = max(gpus_per_instance, 1).bit_length() - 1
    minutes = min(STARTUP_MINUTES_PER_GPU_DOUBLING * (1 + doublings), MAX_LOAD_STARTUP_MINUTES)
    if downloads:
        minutes += DOWNLOAD_STARTUP_MINUTES
    return minutes * 60


def _http_get(path: str, port: str) -> dict[str, Any]:
    return {"path": path, "port": port}


def readiness_probe(port: str = "http") -> dict[str, Any]:
    return {
        "httpGet": _http_get("/health", port),
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 3,
    }


def engine_probes(
    gpus_per_instance: int, *, downloads: bool, port: str = "http"
) -> dict[str, dict[str, Any]]:
    """startupProbe, readinessProbe and livenessProbe of an engine container, all on `/health`."""
    budget = startup_budget_seconds(gpus_per_instance, downloads=downloads)
    return {
        "startupProbe": {
            "httpGet": _http_get("/health", port),
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": budget // STARTUP_PERIOD_SECONDS,
        },
        "readinessProbe": readiness_probe(port),
        "livenessProbe": {
            "httpGet": _http_get("/health", port),
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
    }


def shm_size(gpus_per_pod: int) -> str:
    """sizeLimit of the memory-backed /dev/shm (counts against the pod's memory)."""
    return f"{max(SHM_MIN_GIB, SHM_GIB_PER_GPU * gpus_per_pod)}Gi"
