"""`tandem advise --gpus H100,H200,A100 --prices H100=2.5,...`: which GPU type for each pool, pure.

For a load, an SLO and a price list in $ per GPU-hour: every prefill type x decode type of the listed GPU
types (the same type on both included), and colocated on each type. Each candidate is the fewest
replicas meeting the SLO over the load, found by the searches plain `advise` runs
(`baselines.search_static_pd` / `search_static_colocated`, from the planner's peak size), with each pool's
replicas on that pool's GPU type's profile. Its price per hour is the sum over pools of GPUs x the type's
price; the cheapest meeting the SLO is recommended (then the fewest GPUs, then the highest attainment,
then the earlier candidate). A candidate that does not fit (the model's weights on that GPU at that TP)
or meets the SLO at no size within `--max-gpus` is listed with why.

The searches minimise GPUs per candidate, not dollars: with one GPU type per pool each pool's fewest
replicas meeting its share of the SLO is also its cheapest, so that is the candidate's price; the
search's greedy step may add a replica to the pool whose price is higher where both would do.

Data-parallel replicas (`--prefill-dp`, `--decode-dp`, `--colocated-dp`, `AdviseRequest.shapes`): a pool's
replica is a group of D ranks, each an engine on its type's per-rank profile (the simulator's groups,
`tandem.sim.group`); the searches count replicas in whole groups from the planner's peak size in engines
divided by D, and a group is priced per GPU, TP x PP x D x its type's price. `group_layout` writes a
layout with each pool's group (`2P+1D(DP4)`).

Price input (`parse_prices`): `H100=2.5,H200=3.2` inline, or the path of a YAML or JSON file mapping GPU
type to price. Errors name the flag (`--gpus`, `--prices`) and raise `AdviseError` (the CLI exits 2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tandem.api.shape import Shape
from tandem.perf import available_profiles, gpu_spec, gpu_specs
from tandem.sim.advise import (
    AdviseError,
    AdviseRequest,
    checked_shapes,
    deployment_object,
    planner_config,
    replica_spec,
    static_layout,
)
from tandem.sim.baselines import (
    SearchResult,
    StaticLayout,
    peak_size,
    search_static_colocated,
    search_static_pd,
)
from tandem.sim.cluster import simulate
from tandem.sim.layout import ReplicaSpec, SimConfig
from tandem.sim.results import Summary

COLOCATED = "colocated"


def known_gpus() -> list[str]:
    """GPU types with a profile (any model)."""
    return sorted({p.gpu for p in available_profiles()})


def parse_gpus(text: str) -> tuple[str, ...]:
    """`H100,H200,A100` as profile GPU names (any case), each known and listed once."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise AdviseError("--gpus: give GPU types, e.g. H100,H200,A100")
    known = {g.lower(): g for g in known_gpus()}
    out: list[str] = []
    for name in names:
        if name.lower() not in known:
            raise AdviseError(f"--gpus: no profile on GPU {name!r}; known: {', '.join(known.values())}")
        if known[name.lower()] in out:
            raise AdviseError(f"--gpus: {known[name.lower()]} is listed twice")
        out.append(known[name.lower()])
    return tuple(out)


def parse_prices(text: str) -> dict[str, float]:
    """`H100=2.5,H200=3.2` (no `=`: the path of a YAML/JSON mapping of GPU type to price) as $/GPU-hour
    by the name as given (matched to `--gpus` case-insensitively by `prices_for`)."""
    raw: Any
    if "=" in text:
        raw = {}
        for part in text.split(","):
            name, sep, value = part.strip().partition("=")
            if not sep or not name.strip():
                raise AdviseError(f"--prices: expected GPU=PRICE pairs like H100=2.5, got {part.strip()!r}")
            raw[name.strip()] = value.strip()
    else:
        try:
            raw = yaml.safe_load(Path(text).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise AdviseError(f"--prices: {text}: {exc}") from None
        if not isinstance(raw, dict) or not raw:
            raise AdviseError(f"--prices: {text}: expected a mapping of GPU type to $ per GPU-hour")
    prices: dict[str, float] = {}
    for name, value in raw.items():
        try:
            price = float(value)
        except (TypeError, ValueError):
            price = math.nan
        if not (math.isfinite(price) and price > 0):
            raise AdviseError(f"--prices: {name}={value} is not a positive price per GPU-hour")
        prices[str(name)] = price
    return prices


def prices_for(gpus: Sequence[str], prices: dict[str, float]) -> dict[str, float]:
    """The price of each of `gpus` (names matched case-insensitively); a missing one names the flag."""
    by_lower = {name.lower(): price for name, price in prices.items()}
    missing = [g for g in gpus if g.lower() not in by_lower]
    if missing:
        given = ", ".join(prices) or "none"
        raise AdviseError(f"--prices: no price for {', '.join(missing)} (given: {given})")
    return {g: by_lower[g.lower()] for g in gpus}


@dataclass(frozen=True, slots=True)
class TypeCandidate:
    """One way to serve the load: a P/D pair of GPU types, or colocated on one, and what it takes."""

    prefill_gpu: str | None  # None for colocated
    decode_gpu: str | None
    colocated_gpu: str | None
    layout: StaticLayout | None  # None: does not fit, or meets the SLO at no size within the budget
    gpus: int
    cost_per_hour: float
    summary: Summary | None
    note: str = ""

    @property
    def name(self) -> str:
        if self.colocated_gpu is not None:
            return f"colocated {self.colocated_gpu}"
        return f"P/D {self.prefill_gpu} + {self.decode_gpu}"

    @property
    def mixed(self) -> bool:
        """Prefill and decode on different GPU types."""
        return self.colocated_gpu is None and self.prefill_gpu != self.decode_gpu

    def gpu_hours(self, duration_seconds: float) -> float:
        return self.gpus * duration_seconds / 3600.0


@dataclass(slots=True)
class GpuTypeAdvice:
    request: AdviseRequest
    gpus: tuple[str, ...]
    prices: dict[str, float]
    candidates: list[TypeCandidate]
    duration_seconds: float
    simulations: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def recommended(self) -> TypeCandidate | None:
        """The cheapest per hour meeting the SLO, then the fewest GPUs, the highest attainment, the
        earlier one."""
        met = [
            (i, c) for i, c in enumerate(self.candidates) if c.layout is not None and c.summary is not None
        ]
        if not met:
            return None

        def key(ic: tuple[int, TypeCandidate]) -> tuple[float, int, float, int]:
            i, c = ic
            assert c.summary is not None
            return (round(c.cost_per_hour, 6), c.gpus, -c.summary.attainment, i)

        return min(met, key=key)[1]


def advise_gpu_types(
    req: AdviseRequest,
    gpus: Sequence[str],
    prices: dict[str, float],
    on_simulation: Callable[[str], None] | None = None,
) -> GpuTypeAdvice:
    """Evaluates every candidate of the module docstring over `req`'s load and SLO (`req.gpu` is unused)."""
    if not req.requests:
        raise AdviseError("the load has no requests")
    if not 0 < req.attainment_target <= 1:
        raise AdviseError("the attainment target must be within (0, 100] percent")
    shapes = checked_shapes(req)
    per_replica = {role: shape.gpus_per_instance for role, shape in shapes.items()}
    price = prices_for(gpus, prices)
    config = SimConfig(slo=req.slo, seed=req.seed)
    duration = max(r.arrival for r in req.requests) - min(r.arrival for r in req.requests)
    specs: dict[tuple[str, int], ReplicaSpec | str] = {}  # (gpu, tp) -> replica, or why it cannot be
    notes: list[str] = []
    for gpu in gpus:
        for tp in sorted({req.prefill_tp, req.decode_tp, req.colocated_tp}):
            try:
                specs[(gpu, tp)], derived = replica_spec(req.model, gpu, tp, req.bandwidth_gbps)
                notes += [n for n in derived if n not in notes]
            except AdviseError as exc:
                specs[(gpu, tp)] = str(exc)
    advice = GpuTypeAdvice(req, tuple(gpus), price, [], duration, notes=notes)

    def evaluator(label: str, prefill: ReplicaSpec, decode: ReplicaSpec) -> Callable[[StaticLayout], Summary]:
        """Simulates a layout with these replicas (a colocated one's are `prefill`'s)."""

        def evaluate(layout: StaticLayout) -> Summary:
            if on_simulation is not None:
                on_simulation(f"{label} {layout}")
            advice.simulations += 1
            pools = static_layout(layout, prefill, decode, prefill, shapes)
            return simulate(req.requests, pools, config).summary

        return evaluate

    for p_gpu in gpus:
        for d_gpu in gpus:
            prefill, decode = specs[(p_gpu, req.prefill_tp)], specs[(d_gpu, req.decode_tp)]
            pair = TypeCandidate(p_gpu, d_gpu, None, None, 0, math.inf, None)
            if isinstance(prefill, str) or isinstance(decode, str):
                why = prefill if isinstance(prefill, str) else decode
                advice.candidates.append(_unmet(pair, str(why)))
                continue
            engines = peak_size(planner_config(prefill, decode, req.slo), req.requests)
            search = search_static_pd(
                evaluator(pair.name, prefill, decode),
                req.max_gpus,
                per_replica["prefill"],
                per_replica["decode"],
                req.attainment_target,
                guess=(
                    math.ceil(engines["prefill"] / req.prefill_dp),
                    math.ceil(engines["decode"] / req.decode_dp),
                ),
            )
            advice.candidates.append(_priced(pair, search, req, price, per_replica))
    for gpu in gpus:
        colocated = specs[(gpu, req.colocated_tp)]
        alone = TypeCandidate(None, None, gpu, None, 0, math.inf, None)
        if isinstance(colocated, str):
            advice.candidates.append(_unmet(alone, colocated))
            continue
        search = search_static_colocated(
            evaluator(alone.name, colocated, colocated),
            req.max_gpus,
            per_replica["colocated"],
            req.attainment_target,
        )
        advice.candidates.append(_priced(alone, search, req, price, per_replica))
    return advice


def _unmet(candidate: TypeCandidate, why: str) -> TypeCandidate:
    return TypeCandidate(
        candidate.prefill_gpu, candidate.decode_gpu, candidate.colocated_gpu, None, 0, math.inf, None, why
    )


def _priced(
    candidate: TypeCandidate,
    search: SearchResult,
    req: AdviseRequest,
    price: dict[str, float],
    per_replica: Mapping[str, int],
) -> TypeCandidate:
    """The candidate with the search's layout, its GPUs (every rank's: `per_replica` by role) and their
    price."""
    layout = search.layout
    if layout is None:
        return _unmet(candidate, search.note or f"not within {req.max_gpus} GPUs")
    summary = search.tried[layout]
    assert isinstance(summary, Summary)
    if candidate.colocated_gpu is not None:
        gpus = layout.colocated * per_replica["colocated"]
        cost = gpus * price[candidate.colocated_gpu]
    else:
        assert candidate.prefill_gpu is not None
        assert candidate.decode_gpu is not None
        p_gpus, d_gpus = layout.prefill * per_replica["prefill"], layout.decode * per_replica["decode"]
        gpus = p_gpus + d_gpus
        cost = p_gpus * price[candidate.prefill_gpu] + d_gpus * price[candidate.decode_gpu]
    return TypeCandidate(
        candidate.prefill_gpu, candidate.decode_gpu, candidate.colocated_gpu, layout, gpus, cost, summary
    )


def group_layout(layout: StaticLayout, shapes: Mapping[str, Shape]) -> str:
    """`layout` in replicas, each pool's data-parallel group after its count when it has more than one
    rank: `2P+1D(DP4)`, `3C(DP2)`; `2P+1D` without groups."""

    def part(count: int, letter: str, role: str) -> str:
        shape = shapes.get(role)
        return f"{count}{letter}" + (f"(DP{shape.data})" if shape is not None and shape.data > 1 else "")

    if layout.colocated:
        return part(layout.colocated, "C", "colocated")
    return part(layout.prefill, "P", "prefill") + "+" + part(layout.decode, "D", "decode")


def gpu_type_deployment(advice: GpuTypeAdvice, name: str = "", namespace: str = "default") -> dict[str, Any]:
    """The recommended candidate as a PDDeployment: each pool's `gpuType` the GPU Feature Discovery
    label of its type, `autoscaling.gpu` the decode (or colocated) type."""
    chosen = advice.recommended
    if chosen is None or chosen.layout is None:
        raise AdviseError("no candidate meets the SLO, so there is no deployment to recommend")
    if chosen.colocated_gpu is not None:
        by_role = {"colocated": chosen.colocated_gpu}
    else:
        assert chosen.prefill_gpu is not None
        assert chosen.decode_gpu is not None
        by_role = {"prefill": chosen.prefill_gpu, "decode": chosen.decode_gpu}
    labels = {role: _label(gpu) for role, gpu in by_role.items()}
    default = by_role.get("decode", by_role.get("colocated", ""))
    req = replace(advice.request, gpu=default)
    return deployment_object(req, chosen.layout, None, name, namespace, gpu_types=labels)


def _label(gpu: str) -> str:
    """The gpuType written for `gpu`: its product label where gpus.yaml has it, else the name itself."""
    return gpu_spec(gpu).label if gpu in gpu_specs() else gpu
