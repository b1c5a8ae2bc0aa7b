"""One simulated vLLM V1 engine: continuous batching with chunked prefill, KV capacity and preemption.

The same engine serves every role, as vLLM does: a prefill replica runs prompts whose leg ends at the first
token (`max_tokens: 1`) and holds their KV until the decode replica has pulled it; a decode replica pulls
KV (blocks for the prompt first, in arrival order, as `WAITING_FOR_REMOTE_KVS`), then queues behind the
sequences already waiting, recomputes the last prompt token and samples from there; a colocated replica
does both.

A step is scheduled as `tandem.engine.scheduler` does it: running sequences first (a decode is one token,
an unfinished prompt its next chunk), then waiting ones while the token budget, `max_num_seqs` and KV last;
when the decodes' KV growth does not fit, the newest running sequence is preempted (its KV dropped and
recomputed later, vLLM V1's only mode). KV is counted in tokens, not 16-token blocks. Two departures from
vLLM keep a nearly full cache from livelocking (a prompt admitted chunk by chunk, preempted, readmitted,
forever): a waiting prompt is admitted only when the free KV holds all of its remaining tokens, and when
the head of the queue does not fit, queued sequences whose KV is already here (pulled) go first.

Closed form: a step with no prefill chunk is a pure decode step, `base + slope * context`, and the context
grows by B tokens a step. Such steps are not simulated one by one: a *run* of k steps takes
`k*a + s*(k*C0 + B*k*(k-1)/2)` seconds, and its length is solved for the next composition change (the
first sequence to finish, or KV exhausted). Something arriving mid-run cuts it at the end of the step in
flight, where the next schedule can admit it. Sequences do not store their progress: the replica has a
step counter `S`, and a decoding sequence knows at which `S` it finishes (`fin`), so its output so far is
`leg_out - (fin - S)` and the context of all decodes is `dec_base + dec_n * S`.

Prefix caching (`ReplicaSpec.enable_prefix_caching`, on by default as in vLLM V1), for requests that carry
`Request.prefix` (runs of 16-token blocks named by chained keys, `tandem.sim.traces.prefix`): the cache
holds, per run key, how many of the run's leading blocks it has and how many sequences reference them.
A prompt admitted for compute (its `computed` is 0) first looks up its leading runs: the cached blocks
(at most all but its last token, as vLLM recomputes at least one) count as computed, skip the prefill
compute and the token budget, and are referenced; the prompt's full blocks join the cache when its
prefill completes, referenced until the sequence leaves the replica (pulled, finished, or preempted).
Blocks no sequence references stay cached and count as free KV (`vllm:kv_cache_usage_perc` leaves them
out, as vLLM's free-block queue holds them) until the KV they sit in is needed: the least recently
released run goes first, its tail blocks first (a sequence's runs are released tail first, as vLLM frees
a request's blocks in reverse order). A decode replica looks its own cache up when it reserves KV for a
pull and pulls only the rest (`Seq.pull` tokens), as vLLM's NIXL connector reads only the blocks the
decode side does not hold; pulled prompts join its cache. The counters are vLLM's
`vllm:prefix_cache_queries` and `_hits` (tokens looked up and found, per lookup). Departures: a block
referenced by several running sequences is counted in the KV of each (vLLM stores it once), output
tokens are not cached, and a prompt's blocks join the cache when it completes, not block by block.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from heapq import heappop, heappush
from typing import Final, Protocol

from tandem.sim.layout import ReplicaSpec, Role
from tandem.sim.windows import ROLE_INDEX, Windows

STARTING: Final = 0
READY: Final = 1
DRAINING: Final = 2
GONE: Final = 3
STATE_NAMES: Final = ("starting", "ready", "draining", "gone")

_MS = 1e-3
BLOCK: Final = 16  # tokens per KV block (vLLM's --block-size); the prefix cache's unit


class Host(Protocol):
    """What a replica calls back on the simulation that runs it (`cluster.Cluster`). A protocol, so
    that this module does not import the cluster, which imports it."""

    windows: Windows

    def push_step(self, time: float, replica: Replica) -> None: ...
    def start_pull(self, seq: Seq, decode: Replica, now: float) -> None: ...
    def first_token(self, seq: Seq, replica: Replica) -> None: ...
    def prefill_done(self, seq: Seq, prefill: Replica, now: float) -> None: ...
    def leg_done(self, seq: Seq, replica: Replica, now: float) -> None: ...
    def replica_gone(self, replica: Replica, now: float) -> None: ...


class Seq:
    """One request inside the simulator, across its legs (prefill replica, then decode replica)."""

    __slots__ = (
        "admitted",
        "arrival",
        "base",
        "choice_x",
        "computed",
        "decode",
        "decode_load",
        "fin",
        "finished",
        "first",
        "heap_key",
        "index",
        "leg_out",
        "local",
        "num_output",
        "out",
        "path",
        "preemptions",
        "prefill",
        "prefill_load",
        "prefilled",
        "preloaded",
        "prompt",
        "pull",
        "pull_start",
        "pull_x",
        "pulled",
        "runs",
    )

    def __init__(
        self,
        index: int,
        arrival: float,
        prompt: int,
        out: int,
        path: int,
        runs: tuple[tuple[int, int], ...] | None = None,
    ) -> None:
        self.index = index
        self.arrival = arrival
        self.prompt = prompt
        self.out = out
        self.path = path  # 0 disaggregated, 1 colocated
        self.leg_out = out  # output tokens of the current leg (1 on a prefill replica)
        self.num_output = 0  # tokens sampled on the current leg, while not decoding
        self.computed = 0  # KV tokens computed on the current replica, while not decoding
        self.fin = -1  # step counter at which the decoding sequence samples its last token; -1: not decoding
        self.base = 0  # prompt + leg_out - fin: its context at step counter S is base + S
        self.heap_key = -1  # which finish-heap entry is current (stale ones are skipped)
        self.first = -1.0  # first token time (the decode or colocated leg's)
        self.finished = -1.0
        self.preemptions = 0
        self.prefill: Replica | None = None
        self.decode: Replica | None = None
        self.prefill_load = 0  # tokens the router's balancer counted for each leg
        self.decode_load = 0
        self.runs = runs  # the prompt's cacheable blocks (`Request.prefix`)
        self.pull = prompt  # KV tokens the decode leg pulls (less what the decode replica has cached)
        # P/D timings for the TTFT breakdown (`autoscale.attribution`): first admitted for compute (the
        # prefill queue ends), prefill finished, KV read started and ended; -1: not yet
        self.admitted = -1.0
        self.prefilled = -1.0
        self.pull_start = -1.0
        self.pulled = -1.0
        # spec.router.disaggregation (`Cluster._choose_side`): prefilled on its decode replica, and what
        # the router's cost lines are fed with (the prefill or local leg's tokens, the tokens pulled)
        self.local = False
        self.choice_x = -1  # -1: Always (nothing to measure)
        self.pull_x = 0
        # bidirectional mode: leading prompt tokens the prefill replica pulled back from the decode
        # replica before its prefill (they count as computed when admitted, not as cache hits)
        self.preloaded = 0


class Replica:
    """One engine replica; the cluster calls `submit`, `submit_remote`, `pull_done`, `release_held`,
    `step_end` (its own scheduled event) and `drain`; the replica calls the cluster back."""

    __slots__ = (
        "_ctx",
        "_d_base",
        "_floor",
        "_int",
        "_knee",
        "_knee_slope",
        "_p_sq",
        "_p_tok",
        "_pc_index",
        "admit_blocked",
        "busy",
        "busy_seconds",
        "cache",
        "cap",
        "closed_form",
        "cluster",
        "dec_base",
        "dec_n",
        "evictable",
        "fin_heap",
        "gone_at",
        "heap_counter",
        "held",
        "hold_on_finish",
        "load_requests",
        "load_tokens",
        "lru",
        "max_batched",
        "max_seqs",
        "name",
        "other",
        "pc",
        "pc_hits",
        "pc_queries",
        "pending_pulls",
        "plan",
        "preempted_counts",
        "preemptions",
        "prefilling",
        "pull_blocked",
        "ready_at",
        "requested_at",
        "role",
        "run_a",
        "run_b",
        "run_c0",
        "run_k",
        "run_s",
        "run_t0",
        "running",
        "spec",
        "state",
        "step",
        "tp",
        "version",
        "waiting",
        "waiting_resident",
        "waiting_tokens",
    )

    def __init__(
        self,
        cluster: Host,
        name: str,
        role: Role,
        spec: ReplicaSpec,
        requested_at: float,
        ready_at: float,
        closed_form: bool = True,
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.role = role
        self.spec = spec
        self.tp = spec.tp
        self.cap = spec.kv_capacity_tokens
        self.max_seqs = spec.max_num_seqs
        self.max_batched = spec.max_num_batched_tokens
        self.closed_form = closed_form
        self.hold_on_finish = role == "prefill"
        p, d = spec.profile.prefill, spec.profile.decode
        self._floor = p.floor_ms * _MS
        self._int = p.intercept_ms * _MS
        self._p_tok = p.per_token_ms * _MS
        self._p_sq = p.per_token_sq_ms * _MS
        self._d_base = d.base_ms * _MS
        self._knee = d.knee_batch
        self._knee_slope = d.per_seq_beyond_knee_ms * _MS
        self._ctx = d.per_context_token_ms * _MS
        self.state = STARTING if ready_at > requested_at else READY
        self.requested_at = requested_at
        self.ready_at = ready_at
        self.gone_at = math.inf
        self.step = 0  # the step counter S
        self.running: dict[Seq, None] = {}  # admission order: the newest is preempted first
        self.dec_n = 0
        self.dec_base = 0
        self.fin_heap: list[tuple[int, int, Seq]] = []
        self.heap_counter = 0
        self.prefilling: list[Seq] = []  # running sequences still computing their prompt
        self.waiting: deque[Seq] = deque()
        # Kept as `waiting` changes (a waiting sequence's counts do not move), so neither the scrape's
        # gauge nor a blocked head rescans a long queue: tokens still to compute of the waiting
        # sequences, and how many of them hold pulled KV (`computed` > 0: only those can jump the head).
        self.waiting_tokens = 0
        self.waiting_resident = 0
        self.pending_pulls: deque[Seq] = deque()  # decode role: KV to pull once blocks are free
        self.other = 0  # KV tokens not held by decodes: prefills, pulls, prefills held for their pull
        self.busy = False
        self.version = 0
        self.plan: list[tuple[Seq, int]] = []  # the chunks of a mixed step in flight
        self.run_t0 = self.run_a = self.run_s = 0.0
        self.run_k = self.run_b = self.run_c0 = 0
        self.admit_blocked = False
        self.pull_blocked = False
        self.load_requests = 0  # the router's view: outstanding legs and their tokens
        self.load_tokens = 0
        self.preemptions = 0
        self.busy_seconds = 0.0  # time spent in steps (the GPU time the replica computed)
        # prefix caching: run key -> [leading blocks cached, sequences referencing them]
        self.pc = spec.enable_prefix_caching
        self.cache: dict[int, list[int]] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # unreferenced runs, least recently released first
        self.evictable = 0  # tokens of unreferenced cached blocks (free KV that still holds a prefix)
        self.held: dict[Seq, int] = {}  # leading runs of the sequence it references
        totals = cluster.windows.totals
        index = ROLE_INDEX[role]
        self.pc_queries = totals.pool_prefix_queries  # the pool's counters, indexed by role
        self.pc_hits = totals.pool_prefix_hits
        self.preempted_counts = totals.pool_preemptions
        self._pc_index = index

    # --- the router's and the cluster's view --------------------------------------------------------
    def cost(self) -> float:
        return self.load_requests + self.load_tokens / 512.0

    def choose(self) -> Replica:
        """The rank a request sent to this endpoint runs on: this one (a rank with an endpoint of its
        own; `tandem.sim.group.Endpoint` balances over several)."""
        return self

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.pending_pulls or self.other or self.busy)

    def steps_done(self, now: float) -> int:
        """Steps of the run in flight already complete at `now` (0 when idle or in a mixed step)."""
        if not self.busy or self.plan:
            return 0
        return _steps_within(now - self.run_t0, self.run_a, self.run_s, self.run_c0, self.run_b, self.run_k)

    def kv_used(self, now: float) -> int:
        s = self.step + self.steps_done(now)
        return self.dec_base + self.dec_n * s + self.other

    def queued_prompt_tokens(self) -> int:
        return self.waiting_tokens + sum(q.prompt + q.num_output - q.computed for q in self.prefilling)

    def _queue(self, seq: Seq, first: bool = False) -> None:
        if first:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)
        self.waiting_tokens += seq.prompt + seq.num_output - seq.computed
        if seq.computed:
            self.waiting_resident += 1

    def _unqueued(self, seq: Seq) -> None:
        """`seq` has just left `waiting` (before its counts change)."""
        self.waiting_tokens -= seq.prompt + seq.num_output - seq.computed
        if seq.computed:
            self.waiting_resident -= 1

    # --- intake ---------------------------------------------------------------------------------------
    def submit(self, seq: Seq, now: float) -> None:
        """A prompt to compute here (prefill or colocated leg)."""
        seq.computed = 0
        seq.num_output = 0
        seq.fin = -1
        self._queue(seq)
        self._poke(now)

    def submit_remote(self, seq: Seq, now: float) -> None:
        """A decode leg whose KV sits on its prefill replica: blocks first, then the pull."""
        self.pending_pulls.append(seq)
        self._poke(now)

    def pull_done(self, seq: Seq, now: float) -> None:
        """The KV arrived: all but the last prompt token are computed (vLLM's decode recomputes that one)."""
        seq.computed = seq.prompt - 1
        seq.num_output = 0
        seq.leg_out = seq.out
        self.other -= 1  # the pull reserved the whole prompt; the sequence stores `computed` tokens
        if seq.runs and self.pc:
            self._cache_insert(seq)
        self._queue(seq)
        self._poke(now, resident=True)

    def release_held(self, seq: Seq, now: float) -> None:
        """Prefill role: the decode replica has the KV of `seq`; its tokens are free again."""
        self.other -= seq.prompt
        if self.held:
            self._cache_release(seq)
        self._freed(now)

    def drain(self, now: float) -> None:
        if self.state == STARTING:
            self._gone(now)
            return
        self.state = DRAINING
        if not self.has_work:
            self._gone(now)

    def make_ready(self, now: float) -> None:
        if self.state == STARTING:
            self.state = READY

    # --- scheduling -----------------------------------------------------------------------------------
    def _freed(self, now: float) -> None:
        self.admit_blocked = self.pull_blocked = False
        self._poke(now)

    def _poke(self, now: float, resident: bool = False) -> None:
        """Something new to schedule: now if idle, else at the end of the step in flight."""
        if not self.busy:
            self._schedule(now)
            return
        if self.plan or self.run_k <= 1:
            return  # a single step in flight: the next schedule comes at its end anyway
        if (self.waiting and (resident or not self.admit_blocked)) or (
            self.pending_pulls and not self.pull_blocked
        ):
            done = _steps_within(
                now - self.run_t0, self.run_a, self.run_s, self.run_c0, self.run_b, self.run_k
            )
            if done + 1 < self.run_k:
                self.run_k = done + 1
                self.version += 1
                end = self.run_t0 + _run_seconds(done + 1, self.run_a, self.run_s, self.run_c0, self.run_b)
                self.cluster.push_step(end, self)

    def _schedule(self, now: float) -> None:
        s = self.step
        cap = self.cap
        b = self.dec_n
        free = cap - (self.dec_base + b * s - b) - self.other  # tokens free before this step's growth
        preempted = False
        running = self.running
        while free < b and running:  # every decode grows by one token
            free += self._preempt(next(reversed(running)), reserved=False)
            preempted = True
            b = self.dec_n
        free -= b
        budget = self.max_batched - b
        plan: list[tuple[Seq, int]] = []
        if self.prefilling:
            for seq in list(self.prefilling):
                if budget <= 0:
                    break
                if seq not in running:
                    continue  # preempted while an older sequence made room
                rem = seq.prompt + seq.num_output - seq.computed
                n = rem if rem < budget else budget
                stop = False
                while free < n:
                    victim = next(reversed(running))
                    free += self._preempt(victim, reserved=True)
                    preempted = True
                    if victim is seq:
                        stop = True
                        break
                if stop:
                    break
                plan.append((seq, n))
                budget -= n
                free -= n
                self.other += n
            b = self.dec_n
        if not preempted:
            pulls = self.pending_pulls
            self.pull_blocked = False
            while pulls:
                seq = pulls[0]
                if free < seq.prompt:
                    self.pull_blocked = True
                    break
                pulls.popleft()
                free -= seq.prompt
                self.other += seq.prompt
                if self.pc:
                    self.pc_queries[self._pc_index] += seq.prompt
                    if seq.runs:
                        seq.pull = seq.prompt - self._lookup(seq)
                self.cluster.start_pull(seq, self, now)
            waiting = self.waiting
            self.admit_blocked = False
            n_running = len(running)
            while waiting:
                if budget <= 0 or n_running >= self.max_seqs:
                    self.admit_blocked = True
                    break
                seq = waiting[0]
                rem = seq.prompt + seq.num_output - seq.computed
                n = rem if rem < budget else budget
                if free < rem:  # room for the whole prompt, not just this chunk (see the docstring)
                    self.admit_blocked = True
                    if self.waiting_resident:
                        budget, free, n_running = self._admit_resident(plan, budget, free, n_running)
                    break
                waiting.popleft()
                self._unqueued(seq)
                if seq.admitted < 0:
                    seq.admitted = now
                if self.pc and not seq.computed:
                    self.pc_queries[self._pc_index] += rem
                    if seq.runs:
                        hit = self._lookup(seq)
                        if seq.preloaded > hit:
                            hit = min(seq.preloaded, (seq.prompt - 1) // BLOCK * BLOCK)
                        if hit:
                            seq.computed = hit
                            self.other += hit
                            free -= hit
                            rem -= hit
                            n = rem if rem < budget else budget
                running[seq] = None
                self.prefilling.append(seq)
                plan.append((seq, n))
                budget -= n
                free -= n
                self.other += n
                n_running += 1
        if self.evictable > free:
            self._evict(free if free > 0 else 0)
        if plan:
            self._start_mixed(now, plan, b)
        elif b:
            # After a preemption nothing was admitted: the next step's schedule must try, so one step.
            self._start_run(now, b, single=preempted and bool(self.waiting or self.pending_pulls))
        elif preempted:
            self._schedule(now)  # everything was preempted: vLLM's loop schedules again at once
        else:
            self.busy = False
            if self.state == DRAINING and not self.has_work:
                self._gone(now)

    def _admit_resident(
        self, plan: list[tuple[Seq, int]], budget: int, free: int, n_running: int
    ) -> tuple[int, int, int]:
        """The head of the queue does not fit: admit queued sequences whose KV is already here (pulled).

        Strict FCFS would deadlock when the pulled KV of queued sequences is what the head waits for.
        """
        for seq in list(self.waiting):
            if budget <= 0 or n_running >= self.max_seqs or not self.waiting_resident:
                break
            if not seq.computed:
                continue
            rem = seq.prompt + seq.num_output - seq.computed
            n = rem if rem < budget else budget
            if free < rem:
                continue
            self.waiting.remove(seq)
            self._unqueued(seq)
            self.running[seq] = None
            self.prefilling.append(seq)
            plan.append((seq, n))
            budget -= n
            free -= n
            self.other += n
            n_running += 1
        return budget, free, n_running

    def _start_mixed(self, now: float, plan: list[tuple[Seq, int]], b: int) -> None:
        tokens = b
        attention = 0
        for seq, n in plan:
            tokens += n
            o = seq.computed
            attention += (o + n) * (o + n) - o * o
        seconds = self.mixed_step_seconds(tokens, attention, b, self.dec_base + b * self.step)
        self.plan = plan
        self.run_t0 = now
        self.run_k = 1
        self.busy = True
        self.version += 1
        self.cluster.push_step(now + seconds, self)

    def mixed_step_seconds(self, tokens: int, attention: int, b: int, context: int) -> float:
        """`Profile.step_seconds` for a step of `tokens` tokens (chunks + `b` decodes over `context`
        tokens), its chunks' attention term being `attention` = sum((offset + n)^2 - offset^2)."""
        linear = self._int + self._p_tok * tokens
        if linear < self._floor:
            linear = self._floor
        seconds = linear + self._p_sq * attention
        if b:
            growth = self._ctx * context
            if b > self._knee:
                growth += (b - self._knee) * self._knee_slope
            seconds += growth
            decode_only = self._d_base + growth
            if decode_only > seconds:
                seconds = decode_only
        return seconds

    def _start_run(self, now: float, b: int, single: bool) -> None:
        heap = self.fin_heap
        while heap[0][2].heap_key != heap[0][1]:
            heappop(heap)
        k = heap[0][0] - self.step
        c0 = self.dec_base + b * self.step
        k_kv = (self.cap - self.other - c0) // b + 1
        if k_kv < k:
            k = k_kv
        if single or not self.closed_form:
            k = 1
        a = self._d_base
        if b > self._knee:
            a += (b - self._knee) * self._knee_slope
        self.run_t0, self.run_a, self.run_s, self.run_c0, self.run_b, self.run_k = now, a, self._ctx, c0, b, k
        if self.evictable:
            room = self.cap - self.other - c0 - b * (k - 1)
            if self.evictable > room:
                self._evict(room if room > 0 else 0)
        self.plan = []
        self.busy = True
        self.version += 1
        self.cluster.push_step(now + _run_seconds(k, a, self._ctx, c0, b), self)

    def step_end(self, now: float) -> None:
        """The step (or run of decode steps) in flight ended at `now`."""
        s = self.step = self.step + self.run_k
        self.busy_seconds += now - self.run_t0
        cluster = self.cluster
        if self.plan:
            plan, self.plan = self.plan, []
            for seq, n in plan:
                seq.computed += n
                if seq.computed < seq.prompt + seq.num_output:
                    continue
                seq.num_output += 1  # the prompt (or its recompute) is done: one token sampled
                self.prefilling.remove(seq)
                if seq.runs and self.pc and self.held.get(seq, 0) < len(seq.runs):
                    self._cache_insert(seq)
                if seq.first < 0 and not self.hold_on_finish:
                    seq.first = now
                    cluster.first_token(seq, self)
                if seq.num_output >= seq.leg_out:
                    del self.running[seq]
                    if self.hold_on_finish:
                        cluster.prefill_done(seq, self, now)  # its KV stays in `other` until pulled
                    else:
                        self.other -= seq.computed
                        if self.held:
                            self._cache_release(seq)
                        cluster.leg_done(seq, self, now)
                    continue
                self.other -= seq.computed
                fin = s + seq.leg_out - seq.num_output
                seq.fin = fin
                seq.base = seq.prompt + seq.leg_out - fin
                self.dec_n += 1
                self.dec_base += seq.base
                self.heap_counter += 1
                seq.heap_key = self.heap_counter
                heappush(self.fin_heap, (fin, self.heap_counter, seq))
        heap = self.fin_heap
        while heap and heap[0][0] <= s:
            fin, key, seq = heappop(heap)
            if seq.heap_key != key:
                continue
            seq.heap_key = -1
            seq.fin = -1
            del self.running[seq]
            self.dec_n -= 1
            self.dec_base -= seq.base
            seq.num_output = seq.leg_out
            if self.held:
                self._cache_release(seq)
            cluster.leg_done(seq, self, now)
        self.busy = False
        self._schedule(now)

    def _preempt(self, seq: Seq, reserved: bool) -> int:
        """Drops the KV of running `seq` and queues it first for recompute; returns the tokens freed
        (with its growth for this step when that was already reserved)."""
        del self.running[seq]
        if seq.fin >= 0:
            seq.num_output = seq.leg_out - (seq.fin - self.step)
            stored = seq.prompt + seq.num_output - 1
            self.dec_n -= 1
            self.dec_base -= seq.base
            seq.fin = -1
            seq.heap_key = -1
            freed = stored + 1 if reserved else stored
        else:
            freed = seq.computed
            self.other -= seq.computed
            self.prefilling.remove(seq)
        seq.computed = 0
        seq.preemptions += 1
        self.preemptions += 1
        self.preempted_counts[self._pc_index] += 1
        if self.held:
            self._cache_release(seq)
        self._queue(seq, first=True)
        return freed

    # --- prefix caching -------------------------------------------------------------------------------
    def cached_blocks(self, runs: tuple[tuple[int, int], ...] | None) -> int:
        """Leading blocks of `runs` this replica has cached (the affinity oracle's view; no side effect)."""
        if not runs or not self.pc:
            return 0
        cache = self.cache
        total = 0
        for key, n in runs:
            entry = cache.get(key)
            if entry is None:
                break
            c = entry[0]
            if c < n:
                return total + c
            total += n
        return total

    def _lookup(self, seq: Seq) -> int:
        """Tokens of `seq`'s prompt found cached (all but its last token at most), referenced by it."""
        runs = seq.runs
        assert runs is not None
        limit = (seq.prompt - 1) // BLOCK
        cache = self.cache
        lru = self.lru
        hit = refs = 0
        for key, n in runs:
            if hit >= limit:
                break
            entry = cache.get(key)
            if entry is None:
                break
            if not entry[1]:
                del lru[key]
                self.evictable -= entry[0] * BLOCK
            entry[1] += 1
            refs += 1
            c = entry[0]
            m = c if c < n else n
            hit += m if m < limit - hit else limit - hit
            if c < n:
                break
        if refs:
            self.held[seq] = refs
        tokens = hit * BLOCK
        self.pc_hits[self._pc_index] += tokens
        return tokens

    def _cache_insert(self, seq: Seq) -> None:
        """`seq`'s prompt blocks are computed here: cached (or extended), all referenced by it."""
        runs = seq.runs
        assert runs is not None
        cache = self.cache
        lru = self.lru
        done = self.held.get(seq, 0)
        for i, (key, n) in enumerate(runs):
            entry = cache.get(key)
            if entry is None:
                cache[key] = [n, 1]
                continue
            if i >= done:
                if not entry[1]:
                    del lru[key]
                    self.evictable -= entry[0] * BLOCK
                entry[1] += 1
            if entry[0] < n:
                entry[0] = n
        self.held[seq] = len(runs)

    def _cache_release(self, seq: Seq) -> None:
        """`seq` no longer uses its blocks here: those nobody else references become evictable, its tail
        first (so they are evicted before its head)."""
        refs = self.held.pop(seq, 0)
        if not refs:
            return
        runs = seq.runs
        assert runs is not None
        cache = self.cache
        lru = self.lru
        for i in range(refs - 1, -1, -1):
            key = runs[i][0]
            entry = cache[key]
            entry[1] -= 1
            if not entry[1]:
                lru[key] = None
                self.evictable += entry[0] * BLOCK

    def _evict(self, room: int) -> None:
        """Evicts unreferenced blocks, least recently released first, until they fit in `room` tokens."""
        cache = self.cache
        lru = self.lru
        need = -(-(self.evictable - room) // BLOCK)  # blocks
        evicted = 0
        while need > 0:
            key, _ = lru.popitem(last=False)
            entry = cache[key]
            c = entry[0]
            if c <= need:
                del cache[key]
                need -= c
                evicted += c
            else:
                entry[0] = c - need  # its tail blocks go; the rest stays first in line
                lru[key] = None
                lru.move_to_end(key, last=False)
                evicted += need
                need = 0
        self.evictable -= evicted * BLOCK

    def _gone(self, now: float) -> None:
        self.state = GONE
        self.gone_at = now
        self.version += 1
        self.cluster.replica_gone(self, now)


def _run_seconds(k: int, a: float, s: float, c0: int, b: int) -> float:
    """Time of k decode steps of b sequences starting at context c0: sum_{i<k} (a + s*(c0 + i*b))."""
    return k * a + s * (k * c0 + b * k * (k - 1) / 2)


def _steps_within(elapsed: float, a: float, s: float, c0: int, b: int, limit: int) -> int:
    """The most steps (at most `limit`) of a run that fit in `elapsed` seconds."""
    if elapsed <= 0:
        return 0
    qa = s * b / 2
    qb = a + s * c0 - qa
    if qa > 0:
        k = int(2 * elapsed / (qb + math.sqrt(qb * qb + 4 * qa * elapsed)))
    elif qb > 0:
        k = int(elapsed / qb)
    else:
        return limit
    k = min(k, limit)
    while k < limit and _run_seconds(k + 1, a, s, c0, b) <= elapsed:
        k += 1
    while k > 0 and _run_seconds(k, a, s, c0, b) > elapsed:
        k -= 1
    return k
