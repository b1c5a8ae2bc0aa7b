"""Sim-only settings, read from `TANDEM_SIM_*` environment variables, and the fault switches.

Everything here is pure: `SimSettings.from_env(mapping)` takes the environment as an argument.
See the package docstring (`tandem.engine`) for the meaning and defaults of each variable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_GPU = "H100"
DEFAULT_PERF_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_KV_BANDWIDTH_GBPS = 400.0
DEFAULT_KV_SCALE = 1024
DEFAULT_LEASE_SECONDS = 30.0


class SettingsError(ValueError):
    """A TANDEM_SIM_* variable that cannot be used; the message names it."""


class Faults(BaseModel):
    """Injected failures; all off by default. Set by TANDEM_SIM_FAULTS (JSON) or POST /admin/faults."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    crash: bool = False  # exit(1) at once (admin) / at start (env)
    crash_after_requests: int | None = Field(default=None, ge=1)  # exit(1) when the Nth request arrives
    hang: bool = False  # stop stepping and answering everything but /admin
    slowdown: float = Field(default=1.0, gt=0)  # multiplies every step's duration
    kv_pull_failure_rate: float = Field(default=0.0, ge=0, le=1)  # KV reads that fail (either side)
    # A slow P->D link (a silent TCP fallback): KV reads run at this fraction of the configured link.
    # Either end's factor slows a read (the slower end bounds it): a decode engine sends its factor
    # with the read, the prefill engine paces at the lower of the two.
    kv_bandwidth_factor: float = Field(default=1.0, gt=0, le=1)
    error_rate: float = Field(default=0.0, ge=0, le=1)  # completion requests answered with error_status
    error_status: int = Field(default=500, ge=400, le=599)
    # A decode engine (kv_consumer) that cannot prefill for itself: completion requests it would
    # prefill locally (no `do_remote_prefill` KV to pull: a router's local prefill) answered with
    # error_status. Requests with remote KV are served as usual.
    local_prefill_error_rate: float = Field(default=0.0, ge=0, le=1)
    stream_error_rate: float = Field(default=0.0, ge=0, le=1)  # streams that end in an error event
    stream_error_after_tokens: int = Field(default=1, ge=0)  # ... after this many tokens were sent
    # /metrics answers 500 while everything else serves: a scrape that fails (a rank's port Prometheus
    # cannot read) on an engine that is Ready and takes requests.
    metrics_error: bool = False

    def merged(self, patch: Mapping[str, Any]) -> Faults:
        return Faults.model_validate({**self.model_dump(), **patch})


class SimSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str = DEFAULT_GPU
    perf_model: str | None = None
    time_scale: float = Field(default=1.0, ge=0)
    kv_bandwidth_gbps: float = Field(default=DEFAULT_KV_BANDWIDTH_GBPS, gt=0)
    kv_scale: int = Field(default=DEFAULT_KV_SCALE, ge=1)
    random_seed: int = 0
    nixl_handshake_seconds: float = Field(default=0.0, ge=0)
    # Modelled work of the serving process on each request, outside the engine's steps, one request at
    # a time (x time_scale; engine/ingress.py).
    request_latency_seconds: float = Field(default=0.0, ge=0, le=60)
    nixl_side_channel_host: str = "localhost"
    nixl_side_channel_port: int = Field(default=5600, ge=0, le=65535)
    abort_request_timeout: float | None = Field(default=None, gt=0)
    load_seconds: float = Field(default=0.0, ge=0)  # wall-clock seconds of "loading weights" (not scaled)
    # A multi-node group's members that hear nothing from each other for this long (wall clock) break
    # the group, as a hung rank's collectives would: the sim's own deadline, not a vLLM figure.
    group_timeout_seconds: float = Field(default=30.0, gt=0)
    # The pod's serving revision (rendered by the operator); a decode engine refuses KV of another.
    serving_revision: str = ""
    faults: Faults = Field(default_factory=Faults)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SimSettings:
        names = {
            "TANDEM_SIM_GPU": "gpu",
            "TANDEM_SIM_PERF_MODEL": "perf_model",
            "TANDEM_SIM_TIME_SCALE": "time_scale",
            "TANDEM_SIM_KV_BANDWIDTH_GBPS": "kv_bandwidth_gbps",
            "TANDEM_SIM_KV_SCALE": "kv_scale",
            "TANDEM_SIM_RANDOM_SEED": "random_seed",
            "TANDEM_SIM_NIXL_HANDSHAKE_SECONDS": "nixl_handshake_seconds",
            "TANDEM_SIM_REQUEST_LATENCY_SECONDS": "request_latency_seconds",
            "TANDEM_SIM_LOAD_SECONDS": "load_seconds",
            "TANDEM_SIM_GROUP_TIMEOUT_SECONDS": "group_timeout_seconds",
            "TANDEM_SERVING_REVISION": "serving_revision",
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "nixl_side_channel_host",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": "nixl_side_channel_port",
            "VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "abort_request_timeout",
        }
        raw: dict[str, Any] = {field: env[var] for var, field in names.items() if env.get(var, "") != ""}
        if env.get("TANDEM_SIM_FAULTS", "").strip():
            try:
                raw["faults"] = json.loads(env["TANDEM_SIM_FAULTS"])
            except json.JSONDecodeError as exc:
                raise SettingsError(f"TANDEM_SIM_FAULTS is not valid JSON: {exc}") from None
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            by_field = {field: var for var, field in names.items()} | {"faults": "TANDEM_SIM_FAULTS"}
            problems = "; ".join(
                f"{by_field.get(str(e['loc'][0]), e['loc'][0])}"
                f"{'.' + '.'.join(map(str, e['loc'][1:])) if len(e['loc']) > 1 else ''}: {e['msg']}"
                for e in exc.errors()
            )
            raise SettingsError(problems) from None
