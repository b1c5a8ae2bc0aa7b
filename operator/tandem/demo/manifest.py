"""The PDDeployment the demo applies: examples/sim-pd-autoscaling.yaml with compressed settings (pure).

A real deployment decides every 15-30 s, waits minutes before a scale-down and loads a model for
minutes; a demo has five. The changes, all stated in the panel and docs/demo.md:
- decisions every 5 s, scale-up at once by up to 4, scale-down after a 30 s window by up to 2 (7 pods
  back to 1 within the minute of quiet), drains of at most 30 s;
- the sim engine loads its "model" for `LOAD_SECONDS` (503 and not Ready until then, so the
  autoscaler counts starting pods) and runs `TIME_SCALE` times slower than the H100 profile;
- prefill computes with `--max-num-batched-tokens 32` (and `--max-num-seqs 32`, which vLLM wants no
  larger): with the time scale, one prefill pod computes ~1.6k prompt tokens/s instead of an H100's
  ~44k, so the trace's surge saturates it at ~1.2 requests/s, a rate two shared cores can drive,
  while decode stays fast enough to stream the trace's recorded output lengths;
- the SLO is scaled to that pace (TTFT 4 s, TPOT 100 ms at p90), prefill may grow to 7 pods (all
  of `maxGPUs` 8 but decode's one) and decode starts at 1.
"""

from __future__ import annotations

import copy
from typing import Any

TIME_SCALE = 3
LOAD_SECONDS = 10
PREFILL_ARGS = ("--max-num-batched-tokens", "32", "--max-num-seqs", "32")
SLO: dict[str, int] = {"ttftMs": 4000, "tpotMs": 100, "attainmentPercent": 90}
AUTOSCALING: dict[str, Any] = {
    "intervalSeconds": 5,
    # up to 4 per decision (the API's default): the 4.4x surge needs 1 -> 5+ pods within two decisions
    "scaleUp": {"stabilizationSeconds": 0, "maxStep": 4},
    # 2 down per decision: prefill comes back from 7 pods to 1 within the demo's minute of quiet
    "scaleDown": {"stabilizationSeconds": 30, "maxStep": 2},
    "drainTimeoutSeconds": 30,
}
# Prefill may take every GPU of maxGPUs 8 that decode's minimum leaves: at the slowed prefill the surge
# needs 6-8 pods (it wanted 7 and 8 in measured runs), and capped at 4 it ended with TTFT p90 8.4 s of
# 4 s. Decode keeps 1-3: its TPOT stays far within target, and a TTFT miss is no longer charged to it.
PREFILL_BOUNDS = {"minReplicas": 1, "maxReplicas": 7}
DECODE_BOUNDS = {"minReplicas": 1, "maxReplicas": 3}


def set_sim_pacing(spec: dict[str, Any], time_scale: float, load_seconds: float) -> None:
    """Replaces the TANDEM_SIM_* variables of `spec.engine.env` with the demo's: the sim engine runs
    `time_scale` times slower than its profile and loads its model for `load_seconds`."""
    env = [e for e in spec["engine"].get("env") or [] if not e["name"].startswith("TANDEM_SIM_")]
    spec["engine"]["env"] = [
        *env,
        {"name": "TANDEM_SIM_TIME_SCALE", "value": str(time_scale)},
        {"name": "TANDEM_SIM_LOAD_SECONDS", "value": str(load_seconds)},
    ]


def demo_manifest(example: dict[str, Any]) -> dict[str, Any]:
    """`example` (examples/sim-pd-autoscaling.yaml, parsed) with the demo's settings."""
    doc = copy.deepcopy(example)
    spec = doc["spec"]
    set_sim_pacing(spec, TIME_SCALE, LOAD_SECONDS)
    spec["prefill"]["replicas"] = 1
    spec["prefill"]["engineArgs"] = [*spec["prefill"].get("engineArgs", []), *PREFILL_ARGS]
    spec["prefill"]["autoscaling"] = dict(PREFILL_BOUNDS)
    spec["decode"]["replicas"] = 1
    spec["decode"]["autoscaling"] = dict(DECODE_BOUNDS)
    spec["slo"] = dict(SLO)
    spec["autoscaling"] = {**spec.get("autoscaling", {}), **copy.deepcopy(AUTOSCALING)}
    spec["autoscaling"]["enabled"] = True
    spec["autoscaling"]["mode"] = "Active"
    return doc


def describe() -> str:
    """One line for the panel and the log: what the demo changed in the example."""
    a = AUTOSCALING
    window = a["scaleDown"]["stabilizationSeconds"]
    return (
        f"decisions every {a['intervalSeconds']}s, scale-down window {window}s"
        f" (maxStep up {a['scaleUp']['maxStep']}, down {a['scaleDown']['maxStep']}); sim x{TIME_SCALE} slower"
        f" with a {LOAD_SECONDS}s model load; prefill {' '.join(PREFILL_ARGS)}; SLO TTFT {SLO['ttftMs']} ms,"
        f" TPOT {SLO['tpotMs']} ms, {SLO['attainmentPercent']}% within both; prefill"
        f" {PREFILL_BOUNDS['minReplicas']}-{PREFILL_BOUNDS['maxReplicas']}, decode"
        f" {DECODE_BOUNDS['minReplicas']}-{DECODE_BOUNDS['maxReplicas']} replicas"
    )
