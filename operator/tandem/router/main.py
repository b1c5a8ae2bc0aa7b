"""`tandem router`: flags, wiring, and the serve loop.

Two ways to find engines: `--pddeployment NAME` (watch that PDDeployment's pods in `--namespace`,
in-cluster config in a pod, `KUBECONFIG` outside), or static `--prefill/--decode/--colocated URL`
lists (tests, benchmarks, running beside engines by hand).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import random
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.api.meta import ENGINE_PORT, ROUTER_PORT
from tandem.api.models import DEFAULT_BODY_BYTES, MAX_BODY_BYTES, MIN_BODY_BYTES
from tandem.kube.pods import PddInfo, PddWatcher, PodEventKind, PodInfo
from tandem.kube.secrets import SecretPoller
from tandem.render.lifecycle import STREAM_DRAIN_SECONDS
from tandem.router.failure import RetryBudget
from tandem.router.flow import Flow, Timeouts
from tandem.router.front import READ_TIMEOUT_S, Front
from tandem.router.kvwatch import watch_kv_usage
from tandem.router.metrics import RouterMetrics, check_length_bounds
from tandem.router.server import RouterApp, refresh_models
from tandem.router.slo import SloTargets
from tandem.router.state import RouterState
from tandem.router.upstream import LeanUpstream
from tandem.routing.balancer import Balancer
from tandem.routing.buckets import (
    DEFAULT_CONCURRENCY_BOUNDS,
    DEFAULT_INPUT_LENGTH_BOUNDS,
    DEFAULT_OUTPUT_LENGTH_BOUNDS,
)
from tandem.routing.disaggregation import (
    DEFAULT_MAX_LOCAL_PREFILLS,
    DEFAULT_MAX_LOCAL_TOKENS,
    DEFAULT_THRESHOLD_TOKENS,
    MAX_LOCAL_PREFILLS,
    MAX_THRESHOLD_TOKENS,
    MODES,
    DisaggregationKnobs,
    Mode,
)
from tandem.routing.prefix import (
    DEFAULT_INDEX_BLOCKS_PER_POD,
    MAX_BLOCK_CHARS,
    MAX_BLOCKS,
    PREFILL_POLICIES,
    PrefillPolicy,
    PrefixKnobs,
    PrefixSettings,
)

log = logging.getLogger("tandem.router")


class RouterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str | None = None
    pddeployment: str | None = None
    host: str = "127.0.0.1"
    port: int = ROUTER_PORT
    engine_port: int = ENGINE_PORT
    prefill: list[str] = Field(default_factory=list)
    decode: list[str] = Field(default_factory=list)
    colocated: list[str] = Field(default_factory=list)
    model: str | None = None
    max_model_len: int | None = Field(default=None, ge=1)
    serving_mode: Literal["Disaggregated", "Colocated"] | None = None
    colocated_fallback: bool = True
    slo_ttft_ms: float | None = Field(default=None, gt=0)
    slo_tpot_ms: float | None = Field(default=None, gt=0)
    prefill_timeout_s: float = Field(default=60.0, gt=0)
    decode_idle_timeout_s: float = Field(default=60.0, gt=0)
    decode_timeout_s: float = Field(default=1800.0, gt=0)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    retry_budget_ratio: float = Field(default=0.2, ge=0)
    quarantine_s: float = Field(default=5.0, ge=0)
    max_body_bytes: int = Field(default=DEFAULT_BODY_BYTES, ge=MIN_BODY_BYTES, le=MAX_BODY_BYTES)
    read_timeout_s: float = Field(default=READ_TIMEOUT_S, gt=0)
    drain_timeout_s: float = Field(default=float(STREAM_DRAIN_SECONDS), ge=0)
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    input_length_buckets: tuple[int, ...] = DEFAULT_INPUT_LENGTH_BOUNDS
    output_length_buckets: tuple[int, ...] = DEFAULT_OUTPUT_LENGTH_BOUNDS
    concurrency_buckets: tuple[int, ...] = DEFAULT_CONCURRENCY_BOUNDS
    # Static mode's gateway: spec.router's auth/tenants/admission, and the API keys (tenant -> keys,
    # one a line, as in the keys Secret; given: keys are required). A PDDeployment sets its own.
    gateway: dict[str, Any] | None = None
    api_keys: dict[str, str] | None = None
    # The prefix-aware prefill choice (spec.router.prefixAware wins field by field).
    prefix_aware: bool = True
    prefill_policy: PrefillPolicy | None = None  # spec.router.prefillPolicy wins
    prefix_block_chars: int = Field(default=PrefixKnobs.block_chars, ge=1, le=MAX_BLOCK_CHARS)
    prefix_max_blocks: int = Field(default=PrefixKnobs.max_blocks, ge=1, le=MAX_BLOCKS)
    prefix_load_bound: float = Field(default=PrefixKnobs.load_bound, ge=1.0)
    prefix_index_blocks: int = Field(default=DEFAULT_INDEX_BLOCKS_PER_POD, ge=1)
    # Remote or local prefill per request (spec.router.disaggregation wins as a whole).
    disaggregation: Mode = "Always"
    threshold_tokens: int = Field(default=DEFAULT_THRESHOLD_TOKENS, ge=1, le=MAX_THRESHOLD_TOKENS)
    max_local_tokens: int = Field(default=DEFAULT_MAX_LOCAL_TOKENS, ge=1, le=MAX_THRESHOLD_TOKENS)
    max_local_prefills: int = Field(default=DEFAULT_MAX_LOCAL_PREFILLS, ge=1, le=MAX_LOCAL_PREFILLS)

    @model_validator(mode="after")
    def _one_discovery(self) -> RouterConfig:
        static = self.prefill or self.decode or self.colocated
        if self.pddeployment and static:
            raise ValueError("give either --pddeployment or static --prefill/--decode/--colocated URLs")
        if not self.pddeployment and not static:
            raise ValueError("give --pddeployment NAME or at least one --prefill/--decode/--colocated URL")
        if (self.slo_ttft_ms is None) != (self.slo_tpot_ms is None):
            raise ValueError("give both --slo-ttft-ms and --slo-tpot-ms, or neither")
        check_length_bounds(self.input_length_buckets)
        check_length_bounds(self.output_length_buckets)
        check_length_bounds(self.concurrency_buckets)
        if self.pddeployment and (self.gateway is not None or self.api_keys is not None):
            raise ValueError("--gateway and --api-keys-file are static mode's; use spec.router")
        return self

    def buckets(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """The histogram bucket bounds: input length, output length, concurrency."""
        return self.input_length_buckets, self.output_length_buckets, self.concurrency_buckets

    def prefix(self) -> PrefixSettings:
        return PrefixSettings(
            enabled=self.prefix_aware,
            knobs=PrefixKnobs(
                block_chars=self.prefix_block_chars,
                max_blocks=self.prefix_max_blocks,
                load_bound=self.prefix_load_bound,
            ),
            index_blocks_per_pod=self.prefix_index_blocks,
            policy=self.prefill_policy,
        )

    def disaggregation_knobs(self) -> DisaggregationKnobs:
        return DisaggregationKnobs(
            self.disaggregation, self.threshold_tokens, self.max_local_tokens, self.max_local_prefills
        )

    def slo(self) -> SloTargets | None:
        if self.slo_ttft_ms is None or self.slo_tpot_ms is None:
            return None
        return SloTargets.from_ms(self.slo_ttft_ms, self.slo_tpot_ms)


def _bounds(text: str) -> tuple[int, ...]:
    try:
        return check_length_bounds([int(part) for part in text.split(",") if part.strip()])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def parse_args(argv: Sequence[str]) -> RouterConfig:
    parser = argparse.ArgumentParser(prog="tandem router", description="P/D router for one PDDeployment")
    add = parser.add_argument
    add("--namespace", default=os.environ.get("POD_NAMESPACE"), help="namespace of the PDDeployment")
    add("--pddeployment", help="name of the PDDeployment whose pods to route to")
    add("--host", default="127.0.0.1", help="address to listen on")
    add("--port", type=int, default=ROUTER_PORT)
    add("--engine-port", type=int, default=ENGINE_PORT, help="engine HTTP port inside pods")
    add("--prefill", action="append", default=[], metavar="URL", help="static prefill engine (repeatable)")
    add("--decode", action="append", default=[], metavar="URL", help="static decode engine (repeatable)")
    add(
        "--colocated", action="append", default=[], metavar="URL", help="static colocated engine (repeatable)"
    )
    add("--model", help="served model name (else learned from the PDDeployment and the engines)")
    add("--max-model-len", type=int, help="context limit (else from the PDDeployment or engines' /v1/models)")
    add("--serving-mode", choices=["Disaggregated", "Colocated"], help="static mode's serving mode")
    add("--no-colocated-fallback", dest="colocated_fallback", action="store_false",
        help="answer 503 instead of serving colocated when no prefill/decode pod is ready")  # fmt: skip
    add("--slo-ttft-ms", dest="slo_ttft_ms", type=float,
        help="TTFT target of tandem_router_requests_within_slo_total (spec.slo wins)")  # fmt: skip
    add("--slo-tpot-ms", dest="slo_tpot_ms", type=float, help="TPOT target, with --slo-ttft-ms")
    add(
        "--prefill-timeout",
        dest="prefill_timeout_s",
        type=float,
        default=60.0,
        help="seconds, whole prefill leg",
    )
    add("--decode-idle-timeout", dest="decode_idle_timeout_s", type=float, default=60.0,
        help="seconds without bytes on a decode/colocated leg, the first token included")  # fmt: skip
    add(
        "--decode-timeout",
        dest="decode_timeout_s",
        type=float,
        default=1800.0,
        help="seconds, whole decode leg",
    )
    add("--connect-timeout", dest="connect_timeout_s", type=float, default=3.0)
    add(
        "--max-retries", type=int, default=2, help="extra attempts per request (prefill retries, re-prefills)"
    )
    add("--retry-budget-ratio", type=float, default=0.2, help="router-wide retries per request")
    add("--quarantine", dest="quarantine_s", type=float, default=5.0, help="seconds a failed pod sits out")
    add("--max-body-bytes", type=int, default=DEFAULT_BODY_BYTES,
        help="larger bodies are answered 413; spec.router.admission.maxBodyBytes wins when set")  # fmt: skip
    add("--read-timeout", dest="read_timeout_s", type=float, default=READ_TIMEOUT_S,
        help="seconds a request's head and body may take to arrive; then 408 and close")  # fmt: skip
    add(
        "--event-loop",
        choices=["auto", "asyncio", "uvloop"],
        default="auto",
        help="auto: uvloop when installed",
    )
    add("--drain-timeout", dest="drain_timeout_s", type=float, default=float(STREAM_DRAIN_SECONDS),
        help="seconds answers in progress may take to finish after SIGTERM")  # fmt: skip
    add("--input-length-buckets", dest="input_length_buckets", type=_bounds,
        default=DEFAULT_INPUT_LENGTH_BOUNDS, metavar="N,N,...",
        help="prompt-token bounds of the TTFT length buckets (spec.router.metrics wins)")  # fmt: skip
    add("--output-length-buckets", dest="output_length_buckets", type=_bounds,
        default=DEFAULT_OUTPUT_LENGTH_BOUNDS, metavar="N,N,...",
        help="output-token bounds of the TPOT length buckets (spec.router.metrics wins)")  # fmt: skip
    add("--concurrency-buckets", dest="concurrency_buckets", type=_bounds,
        default=DEFAULT_CONCURRENCY_BOUNDS, metavar="N,N,...",
        help="in-flight bounds of the TPOT/ITL concurrency buckets (spec.router.metrics wins)")  # fmt: skip
    add("--gateway", type=_yaml_file, metavar="FILE",
        help="static mode: YAML of spec.router's auth, tenants and admission (docs/router.md)")  # fmt: skip
    add("--api-keys-file", dest="api_keys", type=_yaml_file, metavar="FILE",
        help="static mode: YAML map tenant -> API keys (one a line); requests then need a key")  # fmt: skip
    add("--no-prefix-aware", dest="prefix_aware", action="store_false",
        help="choose prefill/colocated pods by load only (spec.router.prefixAware.enabled wins)")  # fmt: skip
    add("--prefill-policy", dest="prefill_policy", choices=PREFILL_POLICIES,
        help="PrefixAware, LeastLoaded or RoundRobin (default: PrefixAware, or LeastLoaded with "
        "--no-prefix-aware; spec.router.prefillPolicy wins)")  # fmt: skip
    add("--prefix-block-chars", dest="prefix_block_chars", type=int, default=PrefixKnobs.block_chars,
        help="characters of prompt text per chunk of the prefix-aware choice")  # fmt: skip
    add("--prefix-max-blocks", dest="prefix_max_blocks", type=int, default=PrefixKnobs.max_blocks,
        help="leading chunks of a prompt the prefix-aware choice considers")  # fmt: skip
    add("--prefix-load-bound", dest="prefix_load_bound", type=float, default=PrefixKnobs.load_bound,
        help="a pod takes its cached prefixes while its load <= this x the mean + 1")  # fmt: skip
    add("--prefix-index-blocks", dest="prefix_index_blocks", type=int, default=DEFAULT_INDEX_BLOCKS_PER_POD,
        help="chunks remembered per pod (least recently used forgotten first)")  # fmt: skip
    add("--disaggregation", choices=MODES, default="Always",
        help="where P/D requests are prefilled: Always on a prefill pod, Threshold or Auto per request "
        "(docs/router.md; spec.router.disaggregation wins)")  # fmt: skip
    add("--threshold-tokens", dest="threshold_tokens", type=int, default=DEFAULT_THRESHOLD_TOKENS,
        help="Threshold: most uncached prompt tokens a decode pod prefills itself")  # fmt: skip
    add("--max-local-tokens", dest="max_local_tokens", type=int, default=DEFAULT_MAX_LOCAL_TOKENS,
        help="Auto: most uncached prompt tokens a decode pod prefills itself at once")  # fmt: skip
    add("--max-local-prefills", dest="max_local_prefills", type=int, default=DEFAULT_MAX_LOCAL_PREFILLS,
        help="Auto: local prefills at once per decode pod")  # fmt: skip
    add("--log-level", default="INFO")
    args = vars(parser.parse_args(list(argv)))
    logging.basicConfig(
        level=args.pop("log_level").upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        return RouterConfig(**args)
    except ValueError as error:
        parser.error(str(error))
        raise  # unreachable: parser.error exits


def _yaml_file(path: str) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise argparse.ArgumentTypeError(f"{path}: {error}") from error
    if not isinstance(loaded, dict):
        raise argparse.ArgumentTypeError(f"{path}: not a YAML map")
    return {
        str(key): value if isinstance(value, dict | list) else str(value) for key, value in loaded.items()
    }


def build(config: RouterConfig) -> tuple[RouterApp, RouterState, Flow]:
    metrics = RouterMetrics()
    balancer = Balancer(rng=random.Random(), quarantine_s=config.quarantine_s)
    state = RouterState(
        balancer=balancer,
        metrics=metrics,
        pdd_name=config.pddeployment,
        engine_port=config.engine_port,
        serving_mode=config.serving_mode,
        colocated_fallback=config.colocated_fallback,
        slo_default=config.slo(),
        buckets_default=config.buckets(),
        prefix_default=config.prefix(),
        disaggregation_default=config.disaggregation_knobs(),
    )
    metrics.set_buckets(*config.buckets())
    state.set_slo(config.slo())
    if config.model:
        state.catalog.configured[config.model] = config.max_model_len
    if not config.pddeployment:
        state.set_static({"prefill": config.prefill, "decode": config.decode, "colocated": config.colocated})
        if config.gateway is not None or config.api_keys is not None:
            state.gateway.configure(config.gateway, keys_required=config.api_keys is not None)
            if config.api_keys is not None:
                state.gateway.on_keys(config.api_keys)
    flow = Flow(
        state,
        LeanUpstream(connect_timeout_s=config.connect_timeout_s),
        timeouts=Timeouts(config.prefill_timeout_s, config.decode_idle_timeout_s, config.decode_timeout_s),
        max_retries=config.max_retries,
        budget=RetryBudget(ratio=config.retry_budget_ratio),
    )
    app = RouterApp(state, flow, max_body_bytes=config.max_body_bytes, max_model_len=config.max_model_len)
    return app, state, flow


async def serve(config: RouterConfig) -> None:
    app, state, flow = build(config)
    loop = asyncio.get_running_loop()
    watcher: PddWatcher | None = None
    if config.pddeployment:

        def on_pods(kind: PodEventKind, infos: list[PodInfo]) -> None:
            loop.call_soon_threadsafe(state.on_pods, kind, infos)

        def on_pdd(info: PddInfo | None) -> None:
            loop.call_soon_threadsafe(state.on_pdd, info)

        watcher = PddWatcher(config.namespace or "default", config.pddeployment, on_pods, on_pdd)
        watcher.start()

        def on_keys(name: str, data: dict[str, str] | None, gone: bool, error: str | None) -> None:
            def apply() -> None:
                if name == state.gateway.keys_secret:  # not a read of a Secret the spec has left
                    state.gateway.on_keys(data, gone=gone, error=error)

            loop.call_soon_threadsafe(apply)

        secrets = SecretPoller(config.namespace or "default", lambda: state.gateway.keys_secret, on_keys)
        secrets.start()
    front = Front(
        app.handle,
        max_body_bytes=app.body_limit,
        on_refused=app.count_refusal,
        read_timeout_s=config.read_timeout_s,
    )
    await front.start(config.host, config.port)
    refresher = asyncio.create_task(refresh_models(state, flow))
    kv_watch = asyncio.create_task(
        watch_kv_usage(state.gateway, flow.upstream, lambda: state.endpoints["decode"])
    )
    # What start-up allocated (the Kubernetes client, pydantic models) lives for good: freeze it so
    # later full collections do not walk it again (one full pass over it took ~19 ms here, a pause
    # every in-flight stream would feel).
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    print(f"tandem router listening on http://{config.host}:{config.port}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        refresher.cancel()
        kv_watch.cancel()
        if watcher is not None:
            watcher.stop()
            secrets.stop()
        await front.stop(config.drain_timeout_s)
        await flow.upstream.close()


def main(argv: Sequence[str]) -> int:
    config = parse_args(argv)
    if config.event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if config.event_loop == "uvloop":
                raise
        else:
            # uvloop: ~20-40% more requests per CPU-second here (bench/router_overhead.py).
            uvloop.install()
    asyncio.run(serve(config))
    return 0
