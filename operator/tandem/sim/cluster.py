"""The discrete-event loop: arrivals, the router's choices, KV transfers, scaling, scrapes and results.

`simulate(requests, layout, config, policy)` replays requests (sorted by arrival) in virtual time. Events
are a heap of `(time, order, kind, object, version)`; arrivals are read from the request list in step
with it. Only composition changes are events (an arrival, a step or decode run ending, a KV pull ending,
a replica becoming ready, a scrape, a policy tick); replicas compute runs of decode steps in closed form
(`tandem.sim.replica`).

The router is modelled as `tandem.router` decides: the path by `choose_path` on a uniform draw against
the layout's P/D share, and a pod by power-of-two choices on outstanding requests + tokens/512 among
ready pods (the decode pod is picked when the prefill leg answers). `SimConfig.routing` picks the pod
that computes a prompt (prefill or colocated) otherwise: least loaded, round-robin, prefix-aware
(`routing.prefix.choose_prefill` over `traces.prefix.route_keys` sampled as the router samples them,
its index learnt from its own choices with the pod's KV cache as capacity) or the affinity oracle (the
longest prefix in the simulated caches).
Scaling follows a StatefulSet (a LeaderWorkerSet for groups): new replicas are requested now and ready
after the model load time; a removal takes the newest replica, at once if it is still starting, otherwise
it drains (no new legs, gone when its work is done). A replica counts its GPUs from request until gone.
A replica is a group of `parallelism.data` ranks (`tandem.sim.group`): one engine each, started, drained
and counted as a unit; the router chooses among the groups' endpoints, an endpoint over several ranks
sending each request on to one of them.
"""

from __future__ import annotations

import copy
import math
import random
from array import array
from collections.abc import Mapping, Sequence
from heapq import heappop, heappush

from tandem.perf.stats import nearest_rank
from tandem.routing.disaggregation import (
    CostModel,
    DecodePodStats,
    DecodeView,
    PrefillView,
    decide,
)
from tandem.routing.disaggregation import Request as Uncached
from tandem.routing.paths import choose_path
from tandem.routing.prefix import PodLoad, PrefixIndex, choose_prefill, sparse_keys
from tandem.sim.group import Group, Routable, rank_names
from tandem.sim.layout import ROLES, Layout, Role, SimConfig
from tandem.sim.observe import snapshot_of
from tandem.sim.policy import Policy
from tandem.sim.replica import BLOCK, DRAINING, GONE, READY, STARTING, Replica, Seq
from tandem.sim.requests import Request
from tandem.sim.results import (
    REFUSED,
    RequestRecords,
    SimResult,
    Summary,
    TickSample,
)
from tandem.sim.traces.prefix import route_keys
from tandem.sim.windows import ROLE_INDEX, PoolGauges, Windows

_STEP, _PULL, _BACK, _READY, _SCRAPE, _POLICY = range(6)
_EXPECTED_OUTPUT_CAP = 4096  # the router weighs a leg by prompt + min(max_tokens, 4096) tokens


class Cluster:
    """The state of one simulation; replicas call back `push_step`, `start_pull`, `first_token`,
    `prefill_done`, `leg_done` and `replica_gone`."""

    def __init__(
        self, requests: Sequence[Request], layout: Layout, config: SimConfig, policy: Policy | None
    ) -> None:
        if not requests:
            raise ValueError("no requests to simulate")
        self.requests = requests
        self.layout = layout
        self.config = config
        self.policy = policy
        self.rng = random.Random(config.seed)
        self.heap: list[tuple[float, int, int, object, int]] = []
        self.order = 0
        self.now = 0.0
        self.groups: dict[Role, list[Group]] = {role: [] for role in ROLES}  # not gone, oldest first
        self.ready: dict[Role, list[Routable]] = {role: [] for role in ROLES}  # ready groups' endpoints
        self.all_replicas: list[Replica] = []  # every rank ever started
        self.all_groups: list[Group] = []
        self.group_of: dict[Replica, Group] = {}
        self.endpoint_order: dict[str, int] = {}  # by name: the order endpoints were created in
        self.ordinals: dict[Role, int] = dict.fromkeys(ROLES, 0)
        self.gpus = 0
        self.peak_gpus = 0
        self.scale_actions = 0
        self.windows = Windows(config.window_seconds)
        self.series: list[TickSample] = []
        self.ttft_slo = config.slo.ttft_ms / 1000
        self.tpot_slo = config.slo.tpot_ms / 1000
        n = len(requests)
        self.first = array("d", [math.nan]) * n
        self.finished = array("d", [math.nan]) * n
        self.path = array("b", [REFUSED]) * n
        self.preempts = array("I", [0]) * n
        self.outstanding = 0
        self.next_arrival = 0  # index of the next request to arrive
        self.last_event = 0.0
        self.started = False  # `begin` has run
        caps = {role: pool.replica.kv_capacity_tokens for role, pool in layout.pools.items()}
        self.longest_pd = min(caps.get("prefill", 0) + 1, caps.get("decode", 0))
        self.longest_colocated = caps.get("colocated", 0)
        for role, pool in layout.pools.items():
            limit = pool.replica.max_model_len
            if limit is None:
                continue
            if role == "colocated":
                self.longest_colocated = min(self.longest_colocated, limit)
            else:
                self.longest_pd = min(self.longest_pd, limit)
        self.routing = config.routing
        self.p2c = config.routing == "power-of-two"
        self.turn = 0  # round-robin's position
        self.prefix_index: dict[Role, PrefixIndex] = {}
        for role in ("prefill", "colocated"):
            if config.routing == "prefix" and role in layout.pools:
                blocks = caps[role] // config.route_block_tokens
                self.prefix_index[role] = PrefixIndex(max(1, blocks))
        self.choosing = config.disaggregation.mode != "Always"
        self.costs = CostModel()  # the router's lines, fed by the simulated legs
        self.decode_stats: dict[str, DecodePodStats] = {}
        self.choices: dict[str, int] = {}  # by reason
        self.pulled_back = 0  # prompt tokens prefill replicas read from decode replicas (bidirectional)
        for role, pool in layout.pools.items():
            for _ in range(pool.replicas):
                self._add_group(role, 0.0, ready=True)

    # --- callbacks from replicas ----------------------------------------------------------------------
    def push_step(self, time: float, replica: Replica) -> None:
        self.order += 1
        heappush(self.heap, (time, self.order, _STEP, replica, replica.version))

    def start_pull(self, seq: Seq, decode: Replica, now: float) -> None:
        prefill = seq.prefill
        assert prefill is not None
        spec = prefill.spec
        bandwidth = min(spec.kv_bandwidth_gbps, decode.spec.kv_bandwidth_gbps)
        seconds = seq.pull * spec.kv_bytes_per_token_per_gpu * 8 / (bandwidth * 1e9)
        seq.pull_start = now
        self.order += 1
        heappush(self.heap, (now + seconds, self.order, _PULL, seq, 0))

    def first_token(self, seq: Seq, replica: Replica) -> None:
        totals = self.windows.totals
        totals.pool_prompt[ROLE_INDEX[replica.role]] += seq.prompt
        if replica.role == "decode":  # vLLM's local_compute: a local prefill's tokens, or the one
            totals.pool_local_prompt[ROLE_INDEX["decode"]] += seq.pull_x if seq.local else 1  # recomputed
        if seq.choice_x < 0 or replica.role != "decode":
            return
        if seq.local:  # the local prefill is done: the replica's slot is free again
            stats = self.decode_stats[replica.name]
            stats.local_prefills -= 1
            stats.local_tokens -= seq.pull_x
            self.costs.local.observe(seq.choice_x, seq.first - seq.arrival, seq.first)
        elif seq.prefilled >= 0:
            self.costs.pull.observe(seq.pull_x, seq.first - seq.prefilled, seq.first)

    def prefill_done(self, seq: Seq, prefill: Replica, now: float) -> None:
        seq.prefilled = now
        if seq.choice_x >= 0:
            self.costs.prefill.observe(seq.choice_x, now - seq.arrival, now)
        prefill.load_requests -= 1
        prefill.load_tokens -= seq.prefill_load
        totals = self.windows.totals
        r = ROLE_INDEX["prefill"]
        totals.pool_prompt[r] += seq.prompt
        totals.pool_generation[r] += 1
        totals.pool_finished[r] += 1
        totals.pool_finished_prompt[r] += seq.prompt
        totals.pool_finished_output[r] += 1
        totals.observe_prompt(r, seq.prompt)
        totals.observe_output(r, 1)
        decode = seq.decode if seq.decode is not None else self._pick(self.ready["decode"])
        if decode is not None and decode.state != READY:  # chosen at arrival, gone since
            decode = self._pick(self.ready["decode"])
        if decode is None:  # the router answers 503; the prefill pod's KV lease lapses
            prefill.release_held(seq, now)
            self.outstanding -= 1
            self._refuse(seq.index, 0)
            return
        seq.decode = decode
        seq.decode_load = seq.prompt + min(seq.out, _EXPECTED_OUTPUT_CAP)
        decode.load_requests += 1
        decode.load_tokens += seq.decode_load
        totals.pool_routed[ROLE_INDEX["decode"]] += 1
        decode.submit_remote(seq, now)

    def leg_done(self, seq: Seq, replica: Replica, now: float) -> None:
        replica.load_requests -= 1
        replica.load_tokens -= seq.decode_load
        i = seq.index
        p = seq.path
        out = seq.out
        self.first[i] = seq.first
        self.finished[i] = now
        self.path[i] = p
        self.preempts[i] = seq.preemptions
        self.outstanding -= 1
        totals = self.windows.totals
        r = ROLE_INDEX[replica.role]
        totals.pool_generation[r] += out
        totals.pool_finished[r] += 1
        totals.pool_finished_prompt[r] += seq.prompt
        totals.pool_finished_output[r] += out
        totals.observe_prompt(r, seq.prompt)
        totals.observe_output(r, out)
        totals.path_finished[p] += 1
        totals.path_local += seq.local
        totals.path_prompt[p] += seq.prompt
        totals.path_generation[p] += out
        ttft = seq.first - seq.arrival
        tpot = (now - seq.first) / (out - 1) if out > 1 else None
        totals.observe_latency(p, ttft, tpot)
        if p == 0 and seq.local:  # prefilled on its decode replica: the decode leg is all of it
            totals.observe_pd_parts(
                ttft, prefill_leg=0.0, prefill_queue=0.0, kv_read=0.0, decode_first=ttft, local=True
            )
        elif p == 0 and seq.pulled >= 0:
            totals.observe_pd_parts(
                ttft,
                prefill_leg=seq.prefilled - seq.arrival,
                prefill_queue=max(0.0, seq.admitted - seq.arrival),
                kv_read=seq.pulled - seq.pull_start,
                decode_first=seq.first - seq.prefilled,
            )
        if ttft <= self.ttft_slo and (tpot is None or tpot <= self.tpot_slo):
            totals.path_within[p] += 1
        if seq.choice_x >= 0 and replica.role == "decode":
            self.decode_stats.setdefault(replica.name, DecodePodStats()).observe(tpot, out)

    def replica_gone(self, replica: Replica, now: float) -> None:
        """A rank is gone; its group goes with its last rank."""
        group = self.group_of[replica]
        group.live -= 1
        if group.live:
            return
        group.state = GONE
        group.gone_at = now
        role = group.role
        index = self.prefix_index.get(role)
        ready = self.ready[role]
        for endpoint in group.endpoints:
            if index is not None:
                index.forget_pod(endpoint.name)
        self.groups[role].remove(group)
        for endpoint in group.endpoints:
            if endpoint in ready:
                ready.remove(endpoint)
        self.gpus -= group.gpus

    # --- the router -----------------------------------------------------------------------------------
    def _pick(self, pods: list[Routable]) -> Replica | None:
        """Power of two choices among endpoints; the rank the chosen one sends the request to."""
        n = len(pods)
        if n <= 1:
            return pods[0].choose() if n else None
        rand = self.rng.random
        i = int(rand() * n)
        j = int(rand() * (n - 1))
        if j >= i:
            j += 1
        first, second = pods[i], pods[j]
        first_cost = first.load_requests + first.load_tokens / 512.0
        second_cost = second.load_requests + second.load_tokens / 512.0
        return (second if second_cost < first_cost else first).choose()

    def _pick_compute(self, role: Role, request: Request) -> Replica | None:
        """The pod that computes a prompt, by `SimConfig.routing`."""
        pods = self.ready[role]
        routing = self.routing
        if routing == "power-of-two" or len(pods) <= 1:
            return self._pick(pods)
        if routing == "least-loaded":
            return min(pods, key=_cost).choose()
        if routing == "round-robin":
            self.turn += 1
            return pods[self.turn % len(pods)].choose()
        if routing == "oracle":
            runs = request.prefix
            return min(pods, key=lambda r: (-r.cached_blocks(runs), r.cost())).choose()
        knobs = self.config.prefix_knobs
        loads = [PodLoad(r.name, r.load_requests, r.load_tokens) for r in pods]
        if routing == "oracle-bounded":
            view = _CacheView({r.name: r for r in pods}, request.prefix)
            first = route_keys(request.prefix, self.config.route_block_tokens, 1)  # for its tie-breaks
            name = choose_prefill(loads, first, view, knobs)
            return next(r for r in pods if r.name == name).choose()
        keys = sparse_keys(route_keys(request.prefix, self.config.route_block_tokens, knobs.max_blocks))
        index = self.prefix_index[role]
        name = choose_prefill(loads, keys, index, knobs)
        chosen = next(r for r in pods if r.name == name)
        index.record(chosen.name, keys)
        return chosen.choose()

    def _arrive(self, index: int, request: Request, now: float) -> None:
        totals = self.windows.totals
        totals.arrivals += 1
        totals.arrival_prompt += request.prompt_tokens
        ready = self.ready
        layout = self.layout
        draw = self.rng.random()
        path = choose_path(
            layout.disaggregated_percent,
            draw,
            # Threshold and Auto: a decode replica may prefill, so P/D needs decode replicas only
            has_prefill=bool(ready["prefill"]) or (self.choosing and bool(ready["decode"])),
            has_decode=bool(ready["decode"]),
            has_colocated=bool(ready["colocated"]),
            colocated_fallback=layout.colocated_fallback,
        )
        if path == "disaggregated":
            if request.prompt_tokens + request.output_tokens > self.longest_pd:
                self._refuse(index, 0)  # vLLM answers 400: longer than the model length it can hold
                return
            seq = Seq(index, request.arrival, request.prompt_tokens, request.output_tokens, 0, request.prefix)
            if self.choosing and self._choose_side(seq, request, now):
                return
            prefill = self._pick(ready["prefill"]) if self.p2c else self._pick_compute("prefill", request)
            assert prefill is not None
            seq.prefill = prefill
            seq.leg_out = 1
            seq.prefill_load = seq.prompt
            prefill.load_requests += 1
            prefill.load_tokens += seq.prompt
            self.windows.totals.pool_routed[0] += 1
            self.outstanding += 1
            if self.config.bidirectional_kv and self._pull_back(seq, request, prefill, now):
                return
            prefill.submit(seq, now)
        elif path == "colocated":
            if request.prompt_tokens + request.output_tokens > self.longest_colocated:
                self._refuse(index, 1)
                return
            seq = Seq(index, request.arrival, request.prompt_tokens, request.output_tokens, 1, request.prefix)
            colocated = (
                self._pick(ready["colocated"]) if self.p2c else self._pick_compute("colocated", request)
            )
            assert colocated is not None
            seq.decode_load = seq.prompt + min(seq.out, _EXPECTED_OUTPUT_CAP)
            colocated.load_requests += 1
            colocated.load_tokens += seq.decode_load
            self.windows.totals.pool_routed[2] += 1
            self.outstanding += 1
            colocated.submit(seq, now)
        else:
            self._refuse(index, 0 if draw * 100 < layout.disaggregated_percent else 1)

    def _choose_side(self, seq: Seq, request: Request, now: float) -> bool:
        """spec.router.disaggregation for one P/D request (`routing.disaggregation.decide`): its decode
        replica (most of the prompt cached, within the load bound), then remote or local. Local: the
        decode replica computes the prompt and decodes it (True, submitted); remote: the caller runs the
        prefill leg and the pull goes to that replica. Uncached tokens come from the replicas' caches
        (the router estimates them from its indexes); the prefill side's is the most any prefill
        replica holds and its queue the lightest one's."""
        decodes, prefills = self.ready["decode"], self.ready["prefill"]
        if not decodes:
            return False
        decode = self._decode_by_cache(request)
        prompt = seq.prompt

        def uncached(replica: Routable) -> int:
            return prompt - min(replica.cached_blocks(request.prefix) * BLOCK, prompt - 1)

        local_tokens = uncached(decode)
        remote_tokens = min((uncached(r) for r in prefills), default=prompt)
        queued = min((r.load_tokens for r in prefills), default=0)
        stats = self.decode_stats.setdefault(decode.name, DecodePodStats())
        choice = decide(
            self.config.disaggregation,
            Uncached(remote_tokens, local_tokens),
            PrefillView(bool(prefills), queued),
            DecodeView(
                decode.load_requests,
                stats.local_prefills,
                stats.local_tokens,
                stats.tpot_s,
                stats.output_tokens,
            ),
            self.costs,
            now,
            self.tpot_slo,
        )
        self.choices[choice.reason] = self.choices.get(choice.reason, 0) + 1
        seq.decode = decode
        seq.pull_x = local_tokens
        if choice.side == "remote":
            seq.choice_x = queued + remote_tokens
            return False
        seq.local = True
        seq.choice_x = stats.local_tokens + local_tokens
        stats.local_prefills += 1
        stats.local_tokens += local_tokens
        seq.decode_load = prompt + min(seq.out, _EXPECTED_OUTPUT_CAP)
        decode.load_requests += 1
        decode.load_tokens += seq.decode_load
        self.windows.totals.pool_routed[ROLE_INDEX["decode"]] += 1
        self.outstanding += 1
        decode.submit(seq, now)
        return True

    def _decode_by_cache(self, request: Request) -> Replica:
        """The ready decode replica holding most of the prompt, within the load bound (the router's
        `choose_prefill` over the decode endpoints' caches), and the rank that endpoint sends it to."""
        decodes = self.ready["decode"]
        loads = [PodLoad(r.name, r.load_requests, r.load_tokens) for r in decodes]
        first = route_keys(request.prefix, self.config.route_block_tokens, 1)  # for its tie-breaks
        view = _CacheView({r.name: r for r in decodes}, request.prefix)
        name = choose_prefill(loads, first, view, self.config.prefix_knobs)
        return next(r for r in decodes if r.name == name).choose()

    def _pull_back(self, seq: Seq, request: Request, prefill: Replica, now: float) -> bool:
        """Bidirectional mode, a remote prefill: when the decode replica the request goes to (chosen now,
        by its cache) holds at least `kv_recompute_threshold` prompt tokens beyond what `prefill` has
        cached, the prefill replica first reads them over the KV link (at the slower side's bandwidth,
        as a decode pull), then prefills the rest (`_pulled_back`). True: the read is under way."""
        if not request.prefix or not self.ready["decode"]:
            return False
        if seq.decode is None:
            seq.decode = self._decode_by_cache(request)
        held = min(seq.decode.cached_blocks(request.prefix) * BLOCK, (seq.prompt - 1) // BLOCK * BLOCK)
        extra = held - prefill.cached_blocks(request.prefix) * BLOCK
        if extra <= 0 or extra < self.config.kv_recompute_threshold:
            return False
        spec = prefill.spec
        bandwidth = min(spec.kv_bandwidth_gbps, seq.decode.spec.kv_bandwidth_gbps)
        seconds = extra * spec.kv_bytes_per_token_per_gpu * 8 / (bandwidth * 1e9)
        seq.preloaded = held
        self.pulled_back += extra
        self.order += 1
        heappush(self.heap, (now + seconds, self.order, _BACK, seq, 0))
        return True

    def _pulled_back(self, seq: Seq, now: float) -> None:
        """The prefill replica has read the decode side's blocks: it prefills the rest. Gone meanwhile
        (scaled down): another ready prefill replica computes the whole prompt, or the router refuses."""
        prefill = seq.prefill
        assert prefill is not None
        if prefill.state != READY:
            prefill.load_requests -= 1
            prefill.load_tokens -= seq.prefill_load
            prefill = self._pick(self.ready["prefill"])
            if prefill is None:
                self.outstanding -= 1
                self._refuse(seq.index, 0)
                return
            seq.prefill = prefill
            seq.preloaded = 0
            prefill.load_requests += 1
            prefill.load_tokens += seq.prefill_load
        prefill.submit(seq, now)

    def _refuse(self, index: int, path: int) -> None:
        self.path[index] = REFUSED
        self.windows.totals.path_refused[path] += 1

    # --- scaling --------------------------------------------------------------------------------------
    def _add_group(self, role: Role, now: float, ready: bool) -> Group:
        """A new replica of `role`: its ranks, all ready at `now` or all after one model load."""
        pool = self.layout.pools[role]
        shape = pool.instance
        ordinal = self.ordinals[role]
        self.ordinals[role] = ordinal + 1
        name = f"{role}-{ordinal}"
        ready_at = now if ready else now + self.layout.model_load_seconds
        ranks = [
            Replica(self, rank, role, pool.replica, now, ready_at, self.config.closed_form)
            for rank in rank_names(name, shape)
        ]
        group = Group(name, role, ranks, shape, now)
        for rank in ranks:
            self.group_of[rank] = group
        for endpoint in group.endpoints:
            self.endpoint_order[endpoint.name] = len(self.endpoint_order)
        self.groups[role].append(group)
        self.all_replicas.extend(ranks)
        self.all_groups.append(group)
        self.gpus += group.gpus
        self.peak_gpus = max(self.peak_gpus, self.gpus)
        if group.state == READY:
            self.ready[role].extend(group.endpoints)
        else:
            self.order += 1
            heappush(self.heap, (ready_at, self.order, _READY, group, 0))
        return group

    def apply(self, desired: Mapping[str, int], now: float) -> None:
        """Resizes pools to `desired` replicas (starting + ready; draining ones no longer count)."""
        for role_name, want in desired.items():
            if role_name not in self.layout.pools:
                raise ValueError(f"the policy sized pool {role_name!r}, which the layout does not have")
            if want < 0:
                raise ValueError(f"the policy asked for {want} {role_name} replicas")
            self._resize(ROLES[ROLES.index(role_name)], want, now, ready=False)

    def resize_now(self, desired: Mapping[Role, int], now: float) -> None:
        """Resizes pools to `desired` with added replicas ready at `now` (their load done before it, as
        the hindsight oracle orders them one load time ahead); removed ones drain as in `apply`."""
        for role, want in desired.items():
            self._resize(role, want, now, ready=True)

    def _resize(self, role: Role, want: int, now: float, *, ready: bool) -> None:
        """`want` active (starting + ready) replicas (groups) of `role`: new ones added (`ready` at once,
        or loading), the newest drained first, every rank of it, as a StatefulSet's or a
        LeaderWorkerSet's."""
        active = [g for g in self.groups[role] if g.state in (STARTING, READY)]
        if want == len(active):
            return
        self.scale_actions += 1
        for _ in range(want - len(active)):
            self._add_group(role, now, ready=ready)
        for group in reversed(active[want:]):
            if group.state == READY:
                for endpoint in group.endpoints:
                    self.ready[role].remove(endpoint)
            group.state = DRAINING
            for rank in group.ranks:
                rank.drain(now)

    def fork(self) -> Cluster:
        """An independent copy of this simulation's state (replicas, queues, heap, windows, records),
        sharing only what never changes: the requests, the layout and config, the replicas' specs."""
        memo: dict[int, object] = {id(self.requests): self.requests, id(self.layout): self.layout}
        memo[id(self.config)] = self.config
        memo[id(self.policy)] = self.policy
        for pool in self.layout.pools.values():
            memo[id(pool.replica)] = pool.replica
        return copy.deepcopy(self, memo)

    def release(self) -> None:
        """Frees the per-request records now, for a fork that is done with (the oracle's searches). A
        simulation's objects refer to each other in cycles, so the fork itself goes only when Python's
        cycle collector next runs, and that runs by counts of small objects, not bytes: a day-long
        trace's records (21 bytes a request, about 100 MB at 4.6M requests) piled up over a few dozen
        forks to 7 GB before this."""
        self.first = array("d")
        self.finished = array("d")
        self.path = array("b")
        self.preempts = array("I")

    # --- scrapes and policy ticks ---------------------------------------------------------------------
    def _gauges(self, now: float) -> dict[Role, PoolGauges]:
        gauges: dict[Role, PoolGauges] = {}
        for role, pool in self.layout.pools.items():
            states = [0, 0, 0, 0]
            running = waiting = queued = gpus = 0
            usage: list[float] = []
            for group in self.groups[role]:
                states[group.state] += 1
                gpus += group.gpus
                for replica in group.ranks:
                    if replica.state in (READY, DRAINING):
                        running += len(replica.running)
                        waiting += len(replica.waiting) + len(replica.pending_pulls)
                        queued += replica.queued_prompt_tokens()
                        usage.append(min(1.0, replica.kv_used(now) / replica.cap))
            gauges[role] = PoolGauges(
                ready=states[READY],
                starting=states[STARTING],
                draining=states[DRAINING],
                running=running,
                waiting=waiting,
                queued_prompt_tokens=queued,
                kv_usage_mean=sum(usage) / len(usage) if usage else 0.0,
                kv_usage_max=max(usage, default=0.0),
                gpus=gpus,
                # Prometheus scrapes the pods of each serving group that report engine metrics (a
                # group's leader, or each serving pod), each pod every engine it runs or balances over
                scraped_targets=(states[READY] + states[DRAINING]) * pool.instance.metrics_targets,
            )
        return gauges

    def scrape(self, now: float) -> None:
        gauges = self._gauges(now)
        windows = self.windows
        windows.scrape(now, gauges)
        view = windows.view(now)
        inc = view.increase
        self.series.append(
            TickSample(
                time=now,
                arrival_rate=view.rate(inc.arrivals),
                finished_rate=view.rate(sum(inc.path_finished)),
                replicas={role: g.ready + g.starting + g.draining for role, g in gauges.items()},
                ready={role: g.ready for role, g in gauges.items()},
                gpus=self.gpus,
                ttft_p90=view.ttft_quantile(0.9),
                tpot_p90=view.tpot_quantile(0.9),
            )
        )

    def _policy_tick(self, now: float) -> None:
        assert self.policy is not None
        if self.windows.last_scrape < now:
            self.scrape(now)
        snapshot = snapshot_of(self.windows.view(now), self.config.slo.quantile)
        self.apply(self.policy.decide(snapshot, now), now)

    def _more_to_come(self) -> bool:
        return self.outstanding > 0 or self.next_arrival < len(self.requests)

    # --- the loop -------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        self.begin()
        self.advance(math.inf, len(self.requests))
        return self._result()

    def begin(self) -> None:
        """The first scrape and the scrape and policy ticks' first events (once, before `advance`)."""
        if self.started:
            return
        self.started = True
        self.scrape(0.0)
        self.order += 1
        heappush(self.heap, (self.config.scrape_interval_seconds, self.order, _SCRAPE, None, 0))
        if self.policy is not None:
            self.order += 1
            heappush(self.heap, (self.policy.interval_seconds, self.order, _POLICY, None, 0))

    def advance(self, until: float, stop: int, *, until_idle: bool = False) -> None:
        """Runs events and arrivals up to virtual time `until` (events at `until` included), admitting
        only requests whose index is below `stop`; with `until_idle`, stops as soon as every request
        admitted so far is done and none is left below `stop` (the hindsight oracle's look at one
        interval). `run` is `begin` then `advance(inf, len(requests))`."""
        heap = self.heap
        requests = self.requests
        stop = min(stop, len(requests))
        scrape_every = self.config.scrape_interval_seconds
        i = self.next_arrival
        inf = math.inf
        next_time = requests[i].arrival if i < stop else inf
        previous = requests[i - 1].arrival if i else -inf
        while True:
            if until_idle and i >= stop and not self.outstanding:
                break
            if heap and heap[0][0] <= next_time:
                if heap[0][0] > until:
                    break
                time, _, kind, obj, version = heappop(heap)
                if kind == _STEP:
                    if obj.version == version:  # type: ignore[attr-defined]
                        obj.step_end(time)  # type: ignore[attr-defined]
                elif kind == _PULL:
                    seq: Seq = obj  # type: ignore[assignment]
                    assert seq.prefill is not None
                    assert seq.decode is not None
                    seq.pulled = time
                    seq.prefill.release_held(seq, time)
                    seq.decode.pull_done(seq, time)
                elif kind == _BACK:
                    self._pulled_back(obj, time)  # type: ignore[arg-type]
                elif kind == _READY:
                    group: Group = obj  # type: ignore[assignment]
                    if group.state == STARTING:  # every rank is ready: the group is
                        for rank in group.ranks:
                            rank.make_ready(time)
                        group.state = READY
                        ready = self.ready[group.role]
                        ready.extend(group.endpoints)
                        ready.sort(key=lambda e: self.endpoint_order[e.name])
                elif kind == _SCRAPE:
                    self.scrape(time)
                    if i >= stop and self.outstanding and all(e[2] >= _SCRAPE for e in heap):
                        raise RuntimeError(
                            f"simulation stuck at {time:.3f}s with {self.outstanding} requests"
                        )
                    if self._more_to_come():
                        self.order += 1
                        heappush(heap, (time + scrape_every, self.order, _SCRAPE, None, 0))
                elif kind == _POLICY:
                    assert self.policy is not None
                    self._policy_tick(time)
                    if self._more_to_come():
                        self.order += 1
                        heappush(heap, (time + self.policy.interval_seconds, self.order, _POLICY, None, 0))
                if kind <= _BACK:
                    self.last_event = time
            elif i < stop:
                if next_time > until:
                    break
                request = requests[i]
                if request.arrival < previous:
                    raise ValueError(f"requests are not sorted by arrival (request {i})")
                previous = request.arrival
                i += 1
                self.next_arrival = i
                self._arrive(i - 1, request, request.arrival)
                self.last_event = request.arrival
                next_time = requests[i].arrival if i < stop else inf
            else:
                break

    def _result(self) -> SimResult:
        end = self.last_event
        records = RequestRecords(
            arrival=array("d", (r.arrival for r in self.requests)),
            output_tokens=array("I", (r.output_tokens for r in self.requests)),
            path=self.path,
            first=self.first,
            finished=self.finished,
            preemptions=self.preempts,
            ttft_slo=self.ttft_slo,
            tpot_slo=self.tpot_slo,
        )
        gpu_seconds = sum(max(0.0, min(g.gone_at, end) - g.requested_at) * g.gpus for g in self.all_groups)
        n = len(records)
        ttfts: list[float] = []
        tpots: list[float] = []
        ttft_ok = tpot_ok = within = finished = 0
        for i in range(n):
            if self.path[i] == REFUSED:
                continue
            finished += 1
            ttft = self.first[i] - records.arrival[i]
            ttfts.append(ttft)
            t_ok = ttft <= self.ttft_slo
            out = records.output_tokens[i]
            p_ok = True
            if out > 1:
                tpot = (self.finished[i] - self.first[i]) / (out - 1)
                tpots.append(tpot)
                p_ok = tpot <= self.tpot_slo
            ttft_ok += t_ok
            tpot_ok += p_ok
            within += t_ok and p_ok
        ttfts.sort()
        tpots.sort()
        gpu_hours = gpu_seconds / 3600
        totals = self.windows.totals
        busy: dict[str, float] = {}
        for replica in self.all_replicas:
            per_rank = self.layout.pools[replica.role].instance.gpus_per_rank
            busy[replica.role] = busy.get(replica.role, 0.0) + replica.busy_seconds * per_rank / 3600
        summary = Summary(
            requests=n,
            finished=finished,
            refused=n - finished,
            within_slo=within,
            attainment=within / n,
            ttft_attainment=ttft_ok / n,
            tpot_attainment=tpot_ok / n,
            duration_seconds=end,
            gpu_hours=gpu_hours,
            goodput_per_gpu_hour=within / gpu_hours if gpu_hours > 0 else 0.0,
            scale_actions=self.scale_actions,
            peak_gpus=self.peak_gpus,
            mean_gpus=gpu_seconds / end if end > 0 else float(self.gpus),
            preemptions=sum(self.preempts),
            ttft_p50=nearest_rank(ttfts, 0.5),
            ttft_p90=nearest_rank(ttfts, 0.9),
            ttft_p99=nearest_rank(ttfts, 0.99),
            tpot_p50=nearest_rank(tpots, 0.5),
            tpot_p90=nearest_rank(tpots, 0.9),
            tpot_p99=nearest_rank(tpots, 0.99),
            prefix_queries={role: totals.pool_prefix_queries[ROLE_INDEX[role]] for role in self.layout.pools},
            prefix_hits={role: totals.pool_prefix_hits[ROLE_INDEX[role]] for role in self.layout.pools},
            busy_gpu_hours={role: busy.get(role, 0.0) for role in self.layout.pools},
            prefill_choices=dict(self.choices),
            pulled_back_tokens=self.pulled_back,
        )
        return SimResult(records=records, series=self.series, summary=summary)


def _cost(endpoint: Routable) -> float:
    return endpoint.cost()


class _CacheView(PrefixIndex):
    """The replicas' simulated caches in the place of the balancer's index (the bounded oracle): a pod
    "matches" the blocks of the request's prompt it really holds (in blocks, not keys: the choice
    only compares the counts); the keys passed are not used."""

    def __init__(self, replicas: Mapping[str, Routable], runs: tuple[tuple[int, int], ...] | None) -> None:
        super().__init__(1)
        self.replicas = replicas
        self.runs = runs

    def matched_keys(self, pod: str, keys: Sequence[int]) -> int:
        replica = self.replicas.get(pod)
        return replica.cached_blocks(self.runs) if replica is not None else 0


def simulate(
    requests: Sequence[Request], layout: Layout, config: SimConfig, policy: Policy | None = None
) -> SimResult:
    """Replays `requests` (sorted by arrival) against `layout`; `policy` resizes pools every interval."""
    return Cluster(requests, layout, config, policy).run()
