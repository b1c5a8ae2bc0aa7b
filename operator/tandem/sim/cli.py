"""`tandem sim` and `tandem advise`: the simulator from the command line.

    tandem sim -f DEPLOYMENT.yaml --trace FILE [--format F] [--rate-scale X] [--start S] [--seconds N]
        [--policy auto|tandem|static|hpa|dynamo-180s|dynamo-60s|...] [--out DIR]
    tandem advise (--model ID | --kv-bytes-per-token N) [--gpu H100] [--bandwidth-gbps 400]
        (--trace FILE ... | --input-tokens N --output-tokens N --rate R [--seconds N])
        --ttft-ms T --tpot-ms T [--ratios 1:1,1:2,...] [-o DEPLOYMENT.yaml]
    tandem advise ... --gpus H100,H200,A100 --prices H100=2.5,H200=3.2,A100=1.6 (or --prices FILE)
        [--prefill-dp N --decode-dp N --colocated-dp N]
        which GPU type per pool: the cheapest per hour meeting the SLO (`tandem.sim.gpu_types`), each
        replica a group of that many data-parallel ranks

The only module of `tandem.sim` that does I/O (reads files, prints, writes the plots). Bad input
(a file that is not there or not a PDDeployment, a malformed or empty trace, an unknown model without
`--kv-bytes-per-token`) prints one `error:` line and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tandem.api.models import PDDeployment, PDDeploymentSpec
from tandem.signals import Snapshot
from tandem.sim import advise as adv
from tandem.sim import gpu_types
from tandem.sim.baselines import HPAPolicy, PlannerConfig, PlannerPolicy
from tandem.sim.cluster import simulate
from tandem.sim.layout import SLO, PoolSpec, SimConfig
from tandem.sim.policy import Policy, StaticPolicy
from tandem.sim.report import Row, plot_trace, table
from tandem.sim.requests import Request
from tandem.sim.tandem_policy import TandemPolicy
from tandem.sim.traces import TraceError
from tandem.sim.traces.reasoning import reasoning_mix

EXIT_BAD_INPUT = 2
POLICIES = (
    "auto",
    "tandem",
    "static",
    "hpa",
    "dynamo-180s",
    "dynamo-60s",
    "dynamo-180s-trend",
    "dynamo-60s-trend",
)


class CliError(Exception):
    """Bad input: printed as one line, exit code 2."""


# --- shared helpers ---------------------------------------------------------------------------------------


def _add_trace_args(parser: argparse.ArgumentParser, required: bool) -> None:
    group = parser.add_argument_group("trace")
    group.add_argument(
        "--trace", required=required, help="trace file (Azure 2023 CSV, Mooncake JSONL, CSV/JSONL)"
    )
    group.add_argument(
        "--format", default=None, help="azure, mooncake or plain (default: from the file's first line)"
    )
    group.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        help="multiply the arrival rate, keeping the duration (copies of the trace superposed; default 1)",
    )
    group.add_argument("--start", type=float, default=0.0, help="first second of the trace to replay")
    group.add_argument(
        "--seconds", type=float, default=None, help="how many seconds to replay (default: all)"
    )


def load_requests(args: argparse.Namespace) -> list[Request]:
    if args.rate_scale <= 0:
        raise CliError(f"--rate-scale must be positive, got {args.rate_scale}")
    if args.seconds is not None and args.seconds <= 0:
        raise CliError(f"--seconds must be positive, got {args.seconds}")
    if args.format is not None and args.format not in adv.TRACE_FORMATS:
        raise CliError(f"--format must be one of {', '.join(adv.TRACE_FORMATS)}, got {args.format!r}")
    try:
        requests = adv.load_trace(
            args.trace,
            fmt=args.format,
            rate_scale=args.rate_scale,
            start=args.start,
            seconds=args.seconds,
            seed=args.seed,
        )
    except (TraceError, OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    return requests


class Progress:
    """A tqdm bar over virtual seconds, advanced at each policy tick (the wrapped policy's interval)."""

    def __init__(self, policy: Policy | None, total_seconds: float, enabled: bool, label: str) -> None:
        self.inner = policy or StaticPolicy()
        self.interval_seconds = self.inner.interval_seconds
        self.bar: Any = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=round(total_seconds), unit="s", desc=label, leave=False, file=sys.stderr)
        self.seen = 0.0

    def decide(self, snapshot: Snapshot, now: float) -> dict[str, int]:
        if self.bar is not None:
            step = min(now, float(self.bar.total)) - self.seen
            if step > 0:
                self.bar.update(round(step))
                self.seen += round(step)
        return self.inner.decide(snapshot, now)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --- tandem sim -------------------------------------------------------------------------------------------


def _read_deployment(path: str) -> PDDeploymentSpec:
    try:
        with open(path, encoding="utf-8") as handle:
            documents = list(yaml.safe_load_all(handle))
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"{path}: {exc}") from None
    found = [d for d in documents if isinstance(d, dict) and d.get("kind") == "PDDeployment"]
    if not found:
        raise CliError(f"{path}: no PDDeployment in the file")
    try:
        return PDDeployment.from_object(found[0]).spec
    except ValidationError as exc:
        from tandem.render.cli import validation_messages

        raise CliError(f"{path}: " + "; ".join(validation_messages(exc))) from None


def make_policy(
    name: str, spec: PDDeploymentSpec, sim: adv.SpecLayout, window_seconds: float
) -> Policy | None:
    """The policy `name` for this deployment; None for a static run."""
    if name == "auto":
        name = "tandem" if spec.autoscaling.enabled else "static"
    if name == "static":
        return None
    if name == "tandem":
        if not spec.autoscaling.enabled or spec.slo is None:
            raise CliError("--policy tandem needs spec.autoscaling.enabled and spec.slo in the deployment")
        return TandemPolicy(spec)
    gpus: dict[str, int] = {role: pool.gpus_per_replica for role, pool in sim.layout.pools.items()}
    if name == "hpa":
        return HPAPolicy(gpus_per_replica=gpus, max_gpus=sim.max_gpus)
    if name.startswith("dynamo-"):
        if "prefill" not in sim.layout.pools:
            raise CliError(
                "the Dynamo-style planner sizes prefill and decode pools: use a Disaggregated deployment"
            )
        if any(pool.instance.data > 1 for pool in sim.layout.pools.values()):
            raise CliError("the Dynamo-style planner sizes one engine per replica: no parallelism.data > 1")
        assert sim.slo is not None
        interval = float(name.split("-")[1].rstrip("s"))
        prefill, decode = sim.layout.pools["prefill"].replica, sim.layout.pools["decode"].replica
        config = PlannerConfig(
            prefill_profile=prefill.profile,
            decode_profile=decode.profile,
            ttft_seconds=sim.slo.ttft_ms / 1e3,
            itl_seconds=sim.slo.tpot_ms / 1e3,
            decode_kv_capacity_tokens=decode.kv_capacity_tokens,
            adjustment_interval_seconds=interval,
            predictor="trend" if name.endswith("-trend") else "constant",
            max_num_batched_tokens=prefill.max_num_batched_tokens,
            max_num_seqs=decode.max_num_seqs,
            max_gpu_budget=sim.max_gpus,
        )
        return PlannerPolicy(config, window_seconds=window_seconds)
    raise CliError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")


def sim_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tandem sim", description="Replay a trace through a PDDeployment in the cluster simulator."
    )
    parser.add_argument("-f", "--filename", required=True, help="PDDeployment YAML file")
    _add_trace_args(parser, required=True)
    parser.add_argument(
        "--policy",
        default="auto",
        help=f"one of {', '.join(POLICIES)} (auto: tandem when spec.autoscaling.enabled, else static)",
    )
    parser.add_argument("--ttft-ms", type=float, default=None, help="TTFT target (default: spec.slo.ttftMs)")
    parser.add_argument("--tpot-ms", type=float, default=None, help="TPOT target (default: spec.slo.tpotMs)")
    parser.add_argument(
        "--model-load-seconds",
        type=float,
        default=None,
        help="pod requested -> ready (default 120 s, 300 s for models of 30B and more)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the router's random choices (default 0)")
    parser.add_argument("--out", default=".tandem/sim", help="where the plot goes (default .tandem/sim)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(list(argv))
    try:
        spec = _read_deployment(args.filename)
        requests = load_requests(args)
        load = args.model_load_seconds
        if load is not None and load < 0:
            raise CliError("--model-load-seconds must be >= 0")
        try:
            sim = adv.layout_of_spec(spec, model_load_seconds=load if load is not None else 120.0)
            if load is None:
                sim = adv.layout_of_spec(spec, model_load_seconds=adv.default_load_seconds(sim.model.model))
        except adv.AdviseError as exc:
            raise CliError(str(exc)) from None
        slo = _slo(sim.slo, args.ttft_ms, args.tpot_ms)
        sim = adv.SpecLayout(
            sim.layout,
            slo,
            sim.attainment_target,
            sim.gpu,
            sim.model,
            sim.max_gpus,
            sim.notes,
            sim.disaggregation,
        )
        config = SimConfig(slo=slo, seed=args.seed, disaggregation=sim.disaggregation)
        policy = make_policy(args.policy, spec, sim, config.window_seconds)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    label = args.policy if args.policy != "auto" else ("tandem" if policy is not None else "static")
    progress = Progress(policy, requests[-1].arrival, not args.no_progress and sys.stderr.isatty(), label)
    started = time.perf_counter()
    try:
        result = simulate(requests, sim.layout, config, progress)
    finally:
        progress.close()
    wall = time.perf_counter() - started
    trace = Path(args.trace).name
    sizes = ", ".join(f"{role} {pool.replicas}" for role, pool in sim.layout.pools.items())
    for note in sim.notes:
        print(f"note: {note}")
    for role, pool in sim.layout.pools.items():
        print(pool_line(role, pool, spec.pool(role).gpu_type))
    print(
        f"{len(requests):,} requests over {requests[-1].arrival / 3600:.2f} h of {trace}; "
        f"start {sizes}; SLO TTFT {slo.ttft_ms:g} ms, TPOT {slo.tpot_ms:g} ms; seed {args.seed}; "
        f"simulated in {wall:.1f} s"
    )
    print(table([Row(trace, label, result.summary, note=f"target {sim.attainment_target:.0%}")]))
    s = result.summary
    print(
        f"TTFT p50/p90/p99 {s.ttft_p50 * 1e3:.0f}/{s.ttft_p90 * 1e3:.0f}/{s.ttft_p99 * 1e3:.0f} ms; "
        f"TPOT p50/p90/p99 {s.tpot_p50 * 1e3:.1f}/{s.tpot_p90 * 1e3:.1f}/{s.tpot_p99 * 1e3:.1f} ms"
    )
    print(f"GPU-hours {s.gpu_hours:.3f} (mean {s.mean_gpus:.2f} GPUs, peak {s.peak_gpus})")
    path = plot_trace(
        Path(args.out) / f"{Path(args.filename).stem}-{Path(args.trace).stem}-{label}.png",
        f"{trace}: {label}",
        {label: result.series},
        slo.ttft_ms / 1e3,
        slo.tpot_ms / 1e3,
    )
    print(f"plot: {path}")
    return 0


def pool_line(role: str, pool: PoolSpec, gpu_type: str | None = None) -> str:
    """A pool as simulated, e.g. `decode: 2 replicas of 1x4 TP1 DP4 Internal (4 engines at TP1, 4 GPUs
    each)`: the replica's shape as `tandem render` prints it, what the simulator runs and counts."""
    shape = pool.instance
    engines = f"{shape.data} engines" if shape.data > 1 else "1 engine"
    count = f"{pool.replicas} replica" + ("" if pool.replicas == 1 else "s")
    each = _gpus(pool.gpus_per_replica)
    return f"{role}: {count} of {shape.summary(gpu_type)} ({engines} at TP{shape.tensor}, {each} each)"


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def _slo(spec_slo: SLO | None, ttft_ms: float | None, tpot_ms: float | None) -> SLO:
    ttft = ttft_ms if ttft_ms is not None else (spec_slo.ttft_ms if spec_slo else None)
    tpot = tpot_ms if tpot_ms is not None else (spec_slo.tpot_ms if spec_slo else None)
    if ttft is None or tpot is None:
        raise CliError("no SLO: set spec.slo in the deployment or give --ttft-ms and --tpot-ms")
    if ttft <= 0 or tpot <= 0:
        raise CliError("the TTFT and TPOT targets must be positive")
    return SLO(ttft_ms=ttft, tpot_ms=tpot)


# --- tandem advise ----------------------------------------------------------------------------------------


def _ratios(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in text.split(","):
        a, sep, b = part.strip().partition(":")
        if not sep or not a.isdigit() or not b.isdigit() or int(a) < 1 or int(b) < 1:
            raise argparse.ArgumentTypeError(f"expected ratios like 1:1,1:2,2:1, got {part!r}")
        out.append((int(a), int(b)))
    return tuple(out)


def advise_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tandem advise",
        description="Should this model be served P/D, at what P:D ratio, on how many GPUs? (simulated)",
    )
    parser.add_argument("--model", default=None, help="Hugging Face model id (or hf://id)")
    parser.add_argument(
        "--kv-bytes-per-token",
        type=int,
        default=None,
        help="KV bytes per token (required for a model perf does not know)",
    )
    parser.add_argument("--gpu", default=None, help="GPU type of the performance profile (default H100)")
    parser.add_argument(
        "--gpus",
        default=None,
        help="compare GPU types per pool, e.g. H100,H200,A100: every prefill x decode type and colocated "
        "on each, the cheapest per hour meeting the SLO (needs --prices)",
    )
    parser.add_argument(
        "--prices",
        default=None,
        help="$ per GPU-hour of each --gpus type: H100=2.5,H200=3.2,A100=1.6, or a YAML/JSON file "
        "mapping type to price",
    )
    parser.add_argument(
        "--bandwidth-gbps", type=float, default=400.0, help="KV link bandwidth per GPU, Gb/s (default 400)"
    )
    parser.add_argument("--prefill-tp", type=int, default=1)
    parser.add_argument("--decode-tp", type=int, default=1)
    parser.add_argument("--colocated-tp", type=int, default=None, help="default: --decode-tp")
    for role in ("prefill", "decode"):
        parser.add_argument(
            f"--{role}-dp",
            type=int,
            default=1,
            help=f"data-parallel ranks per {role} replica (parallelism.data, one pod; default 1)",
        )
    parser.add_argument("--colocated-dp", type=int, default=None, help="default: --decode-dp")
    _add_trace_args(parser, required=False)
    parser.add_argument(
        "--reasoning-outputs",
        default=None,
        metavar="LOW:HIGH",
        help="with --trace: its outputs replaced by lengths drawn log-uniform in [LOW, HIGH] tokens "
        "(decode-heavy traffic on the trace's arrivals; e.g. 1024:8192)",
    )
    lengths = parser.add_argument_group("or a length distribution (lognormal, Poisson arrivals)")
    lengths.add_argument("--input-tokens", type=float, default=None, help="mean input length")
    lengths.add_argument("--output-tokens", type=float, default=None, help="mean output length")
    lengths.add_argument("--rate", type=float, default=None, help="requests per second")
    lengths.add_argument("--length-cv", type=float, default=1.0, help="lengths' coefficient of variation")
    parser.add_argument("--ttft-ms", type=float, required=True)
    parser.add_argument("--tpot-ms", type=float, required=True)
    parser.add_argument("--attainment", type=float, default=95.0, help="percent within SLO (default 95)")
    parser.add_argument("--max-gpus", type=int, default=64, help="largest layout considered (default 64)")
    parser.add_argument("--ratios", type=_ratios, default=adv.DEFAULT_RATIOS, help="P:D ratios to sweep")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="", help="metadata.name of the PDDeployment")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("-o", "--output", default=None, help="write the PDDeployment here (default: print)")
    args = parser.parse_args(list(argv))
    try:
        req = _advise_request(args)
        types = _gpu_types(args)
    except (CliError, adv.AdviseError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    started = time.perf_counter()
    show = sys.stderr.isatty()
    if types is not None:
        return _advise_gpu_types(req, *types, args, started, show)
    try:
        advice = adv.advise(
            req, on_simulation=(lambda s: print(f"  simulating {s}", file=sys.stderr)) if show else None
        )
    except adv.AdviseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(render_advice(advice, time.perf_counter() - started))
    if advice.achievable:
        text = yaml.safe_dump(adv.deployment(advice, args.name, args.namespace), sort_keys=False)
        return _emit(text, args.output)
    return 0


def _gpu_types(args: argparse.Namespace) -> tuple[tuple[str, ...], dict[str, float]] | None:
    """`--gpus` and `--prices` checked (None: neither given, plain advise on `--gpu`)."""
    if args.gpus is None:
        if args.prices is not None:
            raise CliError("--prices prices the GPU types of --gpus: give --gpus too")
        return None
    if args.gpu is not None:
        raise CliError("give --gpu (one GPU type) or --gpus (compare types per pool), not both")
    if args.prices is None:
        raise CliError("--gpus needs --prices (e.g. --prices H100=2.5,H200=3.2)")
    gpus = gpu_types.parse_gpus(args.gpus)
    return gpus, gpu_types.prices_for(gpus, gpu_types.parse_prices(args.prices))


def _advise_gpu_types(
    req: adv.AdviseRequest,
    gpus: tuple[str, ...],
    prices: dict[str, float],
    args: argparse.Namespace,
    started: float,
    show: bool,
) -> int:
    try:
        progress = (lambda s: print(f"  simulating {s}", file=sys.stderr)) if show else None
        advice = gpu_types.advise_gpu_types(req, gpus, prices, on_simulation=progress)
    except adv.AdviseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(render_gpu_types(advice, time.perf_counter() - started))
    if advice.recommended is not None:
        obj = gpu_types.gpu_type_deployment(advice, args.name, args.namespace)
        return _emit(yaml.safe_dump(obj, sort_keys=False), args.output)
    return 0


def _emit(text: str, output: str | None) -> int:
    """Writes the PDDeployment to `output`, or prints it after a document separator."""
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"error: {output}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"\nPDDeployment written to {output}")
    else:
        print("\n---\n" + text, end="")
    return 0


def render_gpu_types(advice: gpu_types.GpuTypeAdvice, wall_seconds: float) -> str:
    """The candidates' table (the recommended one marked *) and the recommendation."""
    req = advice.request
    price_list = ", ".join(f"{g} ${p:.2f}" for g, p in advice.prices.items())
    lines = [
        f"model {req.model.model} ({req.model.kv_bytes_per_token:,} KV bytes/token), KV link "
        f"{req.bandwidth_gbps:g} Gb/s; SLO TTFT {req.slo.ttft_ms:g} ms, TPOT {req.slo.tpot_ms:g} ms, "
        f"{req.attainment_target:.0%} of requests",
        f"load: {req.load_description}",
        f"prices per GPU-hour: {price_list}",
        *_shapes_line(req),
        "",
        "GPU types per pool: the fewest replicas meeting the SLO over the load (simulated), priced:",
    ]
    shapes = req.shapes()
    cells = {id(c): gpu_types.group_layout(c.layout, shapes) for c in advice.candidates if c.layout}
    width = max([8, *map(len, cells.values())])
    header = f"{'GPUs':>4} {'cost/h':>9} {'GPU-hours':>9}  attainment"
    lines.append(f"  {'candidate':<22} {'layout':<{width}} {header}")
    chosen = advice.recommended
    for c in advice.candidates:
        mark = "*" if c is chosen else " "
        if c.layout is None or c.summary is None:
            lines.append(f"{mark} {c.name:<22} {'-':<{width}} {'-':>4} {'-':>9} {'-':>9}  {c.note}")
            continue
        lines.append(
            f"{mark} {c.name:<22} {cells[id(c)]:<{width}} {c.gpus:>4} {f'${c.cost_per_hour:,.2f}':>9} "
            f"{c.gpu_hours(advice.duration_seconds):>9.2f}  {c.summary.attainment:.1%}"
        )
    lines.append("")
    if chosen is None:
        lines.append("recommendation: no candidate meets the SLO within --max-gpus")
    else:
        same = [c for c in advice.candidates if c.layout is not None and not c.mixed and c is not chosen]
        versus = ""
        if chosen.mixed and same:
            best = min(same, key=lambda c: c.cost_per_hour)
            versus = f"; the cheapest on one GPU type: {best.name} at ${best.cost_per_hour:,.2f}/h"
        assert chosen.layout is not None
        lines.append(
            f"recommendation: {chosen.name} {gpu_types.group_layout(chosen.layout, shapes)} "
            f"({chosen.gpus} GPUs, ${chosen.cost_per_hour:,.2f}/h{versus})"
        )
    lines += [f"note: {n}" for n in advice.notes]
    lines.append(f"({advice.simulations} simulations, {wall_seconds:.1f} s)")
    return "\n".join(lines)


def _token_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        values = (int(low), int(high))
    except ValueError:
        values = (0, 0)
    if not sep or not 1 <= values[0] <= values[1]:
        raise CliError(f"--reasoning-outputs must be LOW:HIGH tokens with 1 <= LOW <= HIGH, got {text!r}")
    return values


def _advise_request(args: argparse.Namespace) -> adv.AdviseRequest:
    info = adv.resolve_model(args.model, args.kv_bytes_per_token)
    if args.ttft_ms <= 0 or args.tpot_ms <= 0:
        raise CliError("--ttft-ms and --tpot-ms must be positive")
    if not 0 < args.attainment <= 100:
        raise CliError("--attainment is a percentage within (0, 100]")
    if args.max_gpus < 2:
        raise CliError("--max-gpus must be at least 2 (one prefill and one decode GPU)")
    if args.trace:
        if args.input_tokens is not None or args.output_tokens is not None or args.rate is not None:
            raise CliError("give either --trace or --input-tokens/--output-tokens/--rate, not both")
        requests = load_requests(args)
        described = f"{Path(args.trace).name} x{args.rate_scale:g}, {len(requests):,} requests"
        if args.reasoning_outputs is not None:
            low, high = _token_range(args.reasoning_outputs)
            requests = reasoning_mix(requests, low, high, args.seed)
            described += f", outputs log-uniform in {low}-{high} tokens (seed {args.seed})"
    elif args.reasoning_outputs is not None:
        raise CliError("--reasoning-outputs replaces a trace's outputs: give --trace")
    else:
        missing = [f for f in ("input_tokens", "output_tokens", "rate") if getattr(args, f) is None]
        if missing:
            flags = ", ".join("--" + f.replace("_", "-") for f in missing)
            raise CliError(f"no load: give --trace, or {flags}")
        seconds = args.seconds if args.seconds is not None else 600.0
        requests = adv.synthetic_requests(
            args.input_tokens, args.output_tokens, args.rate, seconds, args.length_cv, args.seed
        )
        described = (
            f"Poisson {args.rate:g} req/s for {seconds:g} s, lognormal lengths (CV {args.length_cv:g}) "
            f"mean in {args.input_tokens:g} / out {args.output_tokens:g}"
        )
    return adv.AdviseRequest(
        model=info,
        gpu=args.gpu or "H100",
        bandwidth_gbps=args.bandwidth_gbps,
        slo=SLO(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms),
        requests=requests,
        attainment_target=args.attainment / 100,
        prefill_tp=args.prefill_tp,
        decode_tp=args.decode_tp,
        colocated_tp=args.decode_tp if args.colocated_tp is None else args.colocated_tp,
        prefill_dp=args.prefill_dp,
        decode_dp=args.decode_dp,
        colocated_dp=args.decode_dp if args.colocated_dp is None else args.colocated_dp,
        max_gpus=args.max_gpus,
        ratios=args.ratios,
        seed=args.seed,
        load_description=described,
    )


def _shapes_line(req: adv.AdviseRequest) -> list[str]:
    """With data-parallel replicas, what one replica of each pool is (none otherwise)."""
    shapes = req.shapes()
    if all(shape.data == 1 for shape in shapes.values()):
        return []
    parts = [f"{role} {shape.summary()} ({_gpus(shape.gpus_per_instance)})" for role, shape in shapes.items()]
    return ["a replica: " + ", ".join(parts) + "; layouts count replicas, GPUs count every rank's"]


def render_advice(advice: adv.Advice, wall_seconds: float) -> str:
    req = advice.request
    lines = [
        f"model {req.model.model} ({req.model.kv_bytes_per_token:,} KV bytes/token) on {req.gpu}, "
        f"KV link {req.bandwidth_gbps:g} Gb/s; SLO TTFT {req.slo.ttft_ms:g} ms, TPOT {req.slo.tpot_ms:g} ms, "
        f"{req.attainment_target:.0%} of requests",
        f"load: {req.load_description}",
        *_shapes_line(req),
        "",
        "KV transfer share of an idle P/D request's TTFT (prefill + transfer + first decode step):",
    ]
    for p in advice.transfer:
        lines.append(
            f"  {p.label} input {p.input_tokens:,} tokens: prefill {p.prefill_ms:.1f} ms, transfer "
            f"{p.transfer_ms:.1f} ms, first decode {p.first_decode_ms:.1f} ms -> TTFT {p.ttft_ms:.1f} ms, "
            f"transfer {p.share:.1%}"
        )
    lines += ["", "Fewest GPUs meeting the SLO over the load (simulated):"]
    for label, cand in (("P/D", advice.pd), ("colocated", advice.colocated)):
        if cand is None:
            lines.append(f"  {label:<10} not within {req.max_gpus} GPUs")
        else:
            s = cand.summary
            lines.append(
                f"  {label:<10} {cand.layout!s:<8} {cand.gpus:>3} GPUs  attainment {s.attainment:.1%}  "
                f"goodput {cand.goodput_per_gpu:.2f} req/s per GPU  (TTFT p90 {s.ttft_p90 * 1e3:.0f} ms, "
                f"TPOT p90 {s.tpot_p90 * 1e3:.1f} ms)"
            )
    lines += ["", "P:D ratio sweep (the smallest multiple meeting the SLO):"]
    for row in advice.ratios:
        if row.found is None:
            lines.append(f"  {row.prefill}:{row.decode}  {row.note}")
        else:
            f = row.found
            lines.append(
                f"  {row.prefill}:{row.decode}  {f.layout!s:<8} {f.gpus:>3} GPUs  attainment "
                f"{f.summary.attainment:.1%}  goodput {f.goodput_per_gpu:.2f} req/s per GPU"
            )
    if advice.modes and advice.pd is not None:
        lines += [
            "",
            f"Remote or local prefill on P/D {advice.pd.layout} (colocated: as many GPUs), same requests:",
        ]
        for mode_row in advice.modes:
            s = mode_row.summary
            lines.append(
                f"  {mode_row.name:<15} attainment {s.attainment:.2%}  TTFT p50 {s.ttft_p50 * 1e3:.0f} ms  "
                f"p90 {s.ttft_p90 * 1e3:.0f} ms  TPOT p90 {s.tpot_p90 * 1e3:.1f} ms"
            )
        mode = advice.mode
        assert mode is not None
        lines.append(
            f"  best on these {advice.pd.gpus} GPUs: {mode.name} (highest attainment, then lowest TTFT p90)"
        )
    lines.append("")
    chosen = advice.recommended
    if chosen is None:
        lines.append("recommendation: " + (advice.notes[-1] if advice.notes else "not achievable"))
    elif chosen is advice.colocated:
        if advice.pd is None:
            why = "no P/D layout meets the SLO"
        elif advice.pd.gpus == chosen.gpus:
            why = f"P/D needs as many GPUs, {advice.pd.gpus}, and an RDMA fabric"
        else:
            why = f"P/D needs {advice.pd.gpus} GPUs"
        lines.append(
            f"recommendation: colocated {chosen.layout} ({chosen.gpus} GPUs); P/D does not pay here ({why})"
        )
    else:
        co = advice.colocated
        versus = f"colocated needs {co.gpus}" if co is not None else "no colocated layout meets the SLO"
        lines.append(f"recommendation: P/D {chosen.layout} ({chosen.gpus} GPUs; {versus})")
    for note in advice.notes:
        if chosen is not None or note != advice.notes[-1]:
            lines.append(f"note: {note}")
    lines.append(f"({advice.simulations} simulations, {wall_seconds:.1f} s)")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    """Entry for `python -m tandem.sim.cli sim|advise ...` (the `tandem` command calls the two directly)."""
    args = list(argv)
    if args and args[0] == "advise":
        return advise_main(args[1:])
    if args and args[0] == "sim":
        return sim_main(args[1:])
    print("usage: tandem sim ... | tandem advise ...", file=sys.stderr)
    return EXIT_BAD_INPUT
