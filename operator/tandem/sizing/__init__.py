"""Each pool's replica count in a pass: the sizing chain, in one place (pure: no I/O, time an argument).

A pool's StatefulSet replicas go through these stages, in this order; each sees the count the one
before it left, and `PoolSizing.limited_by` names the last stage that changed it:

1. **decided** (`decided_sizes`): the pool's source (`status.pools.<role>.source`) gives its size:
   `spec.<pool>.replicas` (no autoscaling bounds, autoscaling disabled, or Advisory mode), the
   autoscaler's `status.autoscaling.pools.<role>.desiredReplicas` (its decision: within the pool's
   bounds narrowed by the rollout arms, `rollout.arms.bounded_spec`, and within maxGPUs by the
   autoscaler's own rule, `autoscale.budget.arbitrate`), or none for an external pool (HPA, KEDA);
2. **rollout arms** (`rollout.arms.Bound`, from the rollout step): each arm sized for its share of
   the traffic, the arm not in effect held at zero, a cut-over's old arm kept whole. The count here
   is `status.pools.<role>.desiredReplicas` unless a later stage other than the drain changes it;
3. **drain** (`sizing.drain.plan`, pools the autoscaler sizes): a shrinking StatefulSet keeps the
   pods being drained until they are idle or the drain timeout passed (a LeaderWorkerSet its groups:
   every pod of each group leaving is marked, and the group goes once it is idle); a pool it no longer sizes
   has the marks of a drain it left lifted; a new external pool starts at the spec's size;
4. **revision shares** (`pair_sizes`): during a revision rollout under `spec.rollout`, the new P/D
   pair at its share of the P/D requests and the kept previous pair at the rest;
5. **maxGPUs trade** (`autoscale.budget.fit_budget`): while a change holds both sides (a mode
   rollout's two arms, a revision rollout's two pairs: `budget_order`), the side that gives way
   shrinks first until `spec.maxGPUs` fits. This is the only place the replicas that run are fitted
   to maxGPUs; without a change the autoscaler's decision is already within it;
6. the router Deployment: `spec.router.replicas`.

The revision step (controller/revisions.py) needs the sizes of stage 3 (whether the new pair is
ready) and its status is stage 4's input: `size_pools()`, the one call a pass makes, runs stages 1-3
(`serving()`), then the step it is given (`between`, the revision step: it is not pure, it reads
Prometheus when a verdict or the old pair's idleness is due, so it is passed in, not run here), then
stages 4-6 (`finish()`) with the change that step returned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, TypeVar

from tandem.api import meta
from tandem.api.models import AutoscalingMode, PDDeploymentSpec
from tandem.api.status import (
    AutoscalingPoolsStatus,
    AutoscalingStatus,
    DrainStatus,
    PoolAutoscalingStatus,
    ReplicaSource,
    RevisionsStatus,
    RolloutStatus,
    SizingStage,
)
from tandem.autoscale.bounds import autoscaled_roles
from tandem.autoscale.budget import fit_budget
from tandem.rollout.arms import ARMS, DISAGGREGATED, Bound, other, share_of, yield_order
from tandem.sizing import drain

Stage = SizingStage  # status.pools.<role>.limitedBy
PREVIOUS: Final = "previous/"  # budget keys of the previous revision's pair: previous/prefill, ...
_Step = TypeVar("_Step")  # what the step between stages 3 and 4 hands back besides the change


def is_external(spec: PDDeploymentSpec, role: str) -> bool:
    block = spec.pool(role).autoscaling
    return block is not None and block.external


def source(spec: PDDeploymentSpec, role: str) -> ReplicaSource:
    """Who sizes the pool: another controller, the autoscaler (not in Advisory mode), or the spec."""
    if is_external(spec, role):
        return ReplicaSource.external
    if role in autoscaled_roles(spec) and spec.autoscaling.mode is not AutoscalingMode.Advisory:
        return ReplicaSource.autoscaler
    return ReplicaSource.spec


def decided_sizes(spec: PDDeploymentSpec, state: AutoscalingStatus | None) -> dict[str, int | None]:
    """Stage 1: the size each pool should have by its source (before the arms and any drain).

    `None` for external pools: their StatefulSets are rendered without `spec.replicas`.
    """
    sizes: dict[str, int | None] = {}
    for role in meta.POOL_ROLES:
        held = getattr(state.pools, role).desired_replicas if state is not None else None
        if is_external(spec, role):
            sizes[role] = None
        elif role in autoscaled_roles(spec) and held is not None:  # in Advisory, the spec's size clamped
            sizes[role] = held
        else:
            sizes[role] = spec.pool(role).replicas
    return sizes


@dataclass(frozen=True, slots=True)
class PoolDrain:
    """What the drain stage decided for a pool; the controller carries out the marks."""

    plan: drain.DrainPlan | None = None  # pools the autoscaler sizes
    before: DrainStatus | None = None  # the drain recorded before this pass (for its Events)
    lift: tuple[str, ...] = ()  # other pools: marks of a drain they left, removed


@dataclass(frozen=True, slots=True)
class PoolSizing:
    """One pool's size this pass, and why."""

    role: str
    replicas: int | None  # the StatefulSet's spec.replicas (None: another controller's)
    desired: int | None  # status.pools.<role>.desiredReplicas (None: the count its controller set)
    source: ReplicaSource
    limited_by: Stage  # the last stage that changed the count (the source's when none did)
    drain: PoolDrain = PoolDrain()


@dataclass(frozen=True, slots=True)
class ServingInput:
    """Stages 1-3: the serving pair's pools (`<name>-<role>` to the drain)."""

    spec: PDDeploymentSpec
    name: str
    state: AutoscalingStatus | None  # status.autoscaling after this pass's decision
    bounds: Mapping[str, Bound]  # the rollout arms' (none: no bound)
    live: Mapping[str, int | None]  # the StatefulSets' spec.replicas (None: not created yet)
    now: float
    drain_timeout: float
    pods: Mapping[str, Sequence[drain.PodView]] = field(default_factory=dict)  # by role
    loads: Mapping[str, Mapping[str, drain.Load] | None] = field(default_factory=dict)  # by role
    recorded: Mapping[str, frozenset[str]] = field(default_factory=dict)  # last status's drained pods
    # each pool's workload (a StatefulSet, or a multi-node pool's LeaderWorkerSet); `<name>-<role>` if absent
    workloads: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Serving:
    """After stage 3: each pool's size and the autoscaling state with this pass's drain records."""

    pools: Mapping[str, PoolSizing]
    state: AutoscalingStatus | None

    @property
    def replicas(self) -> dict[str, int | None]:
        return {role: pool.replicas for role, pool in self.pools.items()}


@dataclass(frozen=True, slots=True)
class Change:
    """Stages 4-5: the change in progress, if any (status after this pass's rollout and revision steps)."""

    revisions: RevisionsStatus | None = None
    mode_rollout: RolloutStatus | None = None
    step_weights: Sequence[int] = ()  # spec.rollout's steps
    previous_live: Mapping[str, int | None] = field(default_factory=dict)  # the kept pair's replicas


@dataclass(frozen=True, slots=True)
class Sizes:
    """Every size of the pass: the pools, the kept previous pair, the router."""

    pools: Mapping[str, PoolSizing]
    previous: Mapping[str, int]  # replicas to set on the kept previous pair's StatefulSets, by role
    router: int
    state: AutoscalingStatus | None
    serving: Serving  # after stage 3: the drain's marks and the autoscaler's report read it

    @property
    def replicas(self) -> dict[str, int | None]:
        """What `render` gives each child workload."""
        return {**{role: pool.replicas for role, pool in self.pools.items()}, "router": self.router}


def serving(inp: ServingInput) -> Serving:
    """Stages 1-3 (module docstring)."""
    decided = decided_sizes(inp.spec, inp.state)
    pools: dict[str, PoolSizing] = {}
    state = inp.state
    for role in meta.POOL_ROLES:
        src = source(inp.spec, role)
        size, stage = decided[role], _source_stage(src)
        bound = inp.bounds.get(role)
        if bound is not None and size is not None and bound.apply(size) != size:
            size, stage = bound.apply(size), Stage.rollout_arm
        pool = PoolSizing(role, size, size, src, stage)
        if src is ReplicaSource.autoscaler and size is not None and state is not None:
            before = getattr(state.pools, role).draining
            plan = drain.plan(
                role=role,
                statefulset=inp.workloads.get(role, f"{inp.name}-{role}"),
                desired=size,
                applied=inp.live.get(role),
                drain=before,
                pods=inp.pods.get(role, ()),
                loads=inp.loads.get(role),
                now=inp.now,
                timeout=inp.drain_timeout,
                nodes=inp.spec.pool(role).nodes_per_instance,
            )
            state = with_drain(state, role, plan.drain)
            held = Stage.drain if plan.replicas != size else stage
            pool = replace(pool, replicas=plan.replicas, limited_by=held, drain=PoolDrain(plan, before))
        elif size is None and inp.live.get(role) is None:  # a new external pool starts at the spec's
            pool = replace(pool, replicas=inp.spec.pool(role).replicas)  # size (handed over next pass)
        else:  # no drain for pools the autoscaler does not size: lift the marks of one it left
            recorded = inp.recorded.get(role, frozenset())
            lift = tuple(
                v.name
                for v in inp.pods.get(role, ())
                if v.draining and v.name in recorded and (size is None or v.ordinal < size)
            )
            pool = replace(pool, drain=PoolDrain(lift=lift))
            if state is not None and getattr(state.pools, role).draining is not None:
                state = with_drain(state, role, None)
        pools[role] = pool
    return Serving(pools, state)


def finish(spec: PDDeploymentSpec, served: Serving, change: Change) -> Sizes:
    """Stages 4-6 (module docstring)."""
    pools = dict(served.pools)
    previous: dict[str, int] = {}
    if change.revisions is not None:
        shares = pair_sizes(change.revisions, served.replicas, change.step_weights)
        for role, n in shares.current.items():
            pool = pools[role]
            stage = Stage.revision_share if n != pool.replicas else pool.limited_by
            desired = n if n is not None else pool.desired
            pools[role] = replace(pool, replicas=n, desired=desired, limited_by=stage)
        previous = dict(shares.previous)
    order = budget_order(change.mode_rollout, change.revisions) if spec.max_gpus is not None else None
    if order is not None and spec.max_gpus is not None:
        sizes: dict[str, int] = {r: p.replicas for r, p in pools.items() if p.replicas is not None}
        gpus = {r: spec.pool(r).gpus_per_instance for r in sizes}
        kept = change.revisions.previous if change.revisions is not None else None
        if kept is not None:
            for role in meta.REVISIONED_ROLES:
                size = previous.get(role, change.previous_live.get(role))
                if size is not None:
                    sizes[PREVIOUS + role] = size
                    gpus[PREVIOUS + role] = spec.pool(role).gpus_per_instance
        for key, n in fit_budget(sizes, gpus, order, spec.max_gpus).items():
            if n == sizes[key]:
                continue
            if key.startswith(PREVIOUS):
                previous[key.removeprefix(PREVIOUS)] = n
            else:
                pools[key] = replace(pools[key], replicas=n, desired=n, limited_by=Stage.max_gpus)
    return Sizes(pools, previous, spec.router.replicas, served.state, served)


def size_pools(inp: ServingInput, between: Callable[[Serving], tuple[Change, _Step]]) -> tuple[Sizes, _Step]:
    """The whole chain (module docstring): stages 1-3, `between` given their result (it returns the
    change in progress for stages 4-5, and its own outcome, handed back with the sizes), stages 4-6."""
    served = serving(inp)
    change, outcome = between(served)
    return finish(inp.spec, served, change), outcome


def given(change: Change) -> Callable[[Serving], tuple[Change, None]]:
    """A `between` for a caller that knows the change's status up front (tests, tools)."""
    return lambda _served: (change, None)


def with_drain(state: AutoscalingStatus, role: str, record: DrainStatus | None) -> AutoscalingStatus:
    """`state` with `role`'s drain record replaced."""
    pools: dict[str, PoolAutoscalingStatus] = {r: getattr(state.pools, r) for r in meta.POOL_ROLES}
    pools[role] = pools[role].model_copy(update={"draining": record})
    return state.model_copy(update={"pools": AutoscalingPoolsStatus(**pools)})


def _source_stage(src: ReplicaSource) -> Stage:
    return Stage(src.value)  # the source's stage has the source's name


@dataclass(frozen=True)
class PairSizes:
    """Replicas of the two pairs during a revision change under spec.rollout (empty: as decided)."""

    current: dict[str, int | None] = field(default_factory=dict)  # rendered with the current pair
    previous: dict[str, int] = field(default_factory=dict)  # set on the kept previous pair


def pair_sizes(
    status: RevisionsStatus, decided: Mapping[str, int | None], step_weights: Sequence[int]
) -> PairSizes:
    """Stage 4: each pair sized for the share of P/D requests it gets (capacity traded, not doubled),
    as the arms of a mode rollout are (`rollout.arms.share_of`): the size decided for the pool (the
    spec's, or the autoscaler's for the whole P/D load) times the pair's share, rounded up, and at
    least one replica per pool while the pair carries (or is about to carry, or still drains) weight.
    Only under spec.rollout (a cut-over moves every request at once, so the new pair starts at its
    full size):
    - Preparing: the new pair at the first step's share, the old one at its full size;
    - Shifting, Paused: the new pair at the weight's share, the old one at the rest;
    - RollingBack: the new pair at the step it left, the old one back to its full size;
    - Promoted: the new pair at its full size; the old one is left as it is until it goes (idle).
    A pool decided externally (None) is left to its controller."""
    record = status.rollout
    if status.previous is None or record is None or record.target != status.current.id:
        return PairSizes()
    step = step_weights[min(record.step, len(step_weights) - 1)] if step_weights else 100
    phase = record.phase
    if phase in ("Shifting", "Paused"):
        new_pct, old_pct = status.weight, 100 - status.weight
    elif phase == "Preparing":
        new_pct, old_pct = step_weights[0] if step_weights else 100, 100
    elif phase == "RollingBack":
        new_pct, old_pct = step, 100
    else:  # Promoted
        new_pct, old_pct = 100, -1

    def size(role: str, pct: int) -> int | None:
        base = decided.get(role)
        if base is None:
            return None
        return max(share_of(base, pct), 1) if base > 0 else 0

    current: dict[str, int | None] = {str(role): size(role, new_pct) for role in meta.REVISIONED_ROLES}
    previous: dict[str, int] = {}
    if old_pct >= 0:
        for role in meta.REVISIONED_ROLES:
            n = size(role, old_pct)
            if n is not None:
                previous[str(role)] = n
    return PairSizes(current=current, previous=previous)


def budget_order(
    mode_rollout: RolloutStatus | None, revisions: RevisionsStatus | None
) -> list[list[str]] | None:
    """Who gives way first when a change holds more than `spec.maxGPUs` (stage 5); None when no change
    trades capacity (nothing to fit: the autoscaler keeps the budget, and a cut-over keeps the old side
    whole until the new one is ready). Pool keys are the roles, and `previous/<role>` for the previous
    revision's pair."""
    if revisions is not None and revisions.previous is not None:
        record = revisions.rollout
        if record is None or record.target != revisions.current.id:
            return None
        old = [PREVIOUS + role for role in ARMS[DISAGGREGATED]]
        order = yield_order(record.phase, revisions.weight, ARMS[DISAGGREGATED], old)
        return [*order, list(ARMS[other(DISAGGREGATED)])]
    if mode_rollout is None or mode_rollout.target not in ARMS:
        return None
    target = mode_rollout.target
    return yield_order(mode_rollout.phase, mode_rollout.weight, ARMS[target], ARMS[other(target)])
