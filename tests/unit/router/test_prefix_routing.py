"""The prefix-aware choice inside the router: settings from the spec, the flow's pick, pods leaving."""

from __future__ import annotations

import random
from typing import Any, cast

import pytest

from tandem.kube.pods import pdd_info_from
from tandem.router.failure import RetryBudget
from tandem.router.flow import ClientRequest, Flow, Timeouts
from tandem.router.metrics import RouterMetrics
from tandem.router.protocol import RequestFacts
from tandem.router.state import RouterState
from tandem.router.upstream import Upstream
from tandem.routing.balancer import Balancer
from tandem.routing.prefix import KEY_BLOCKS, MAX_BLOCKS, PrefixKnobs, PrefixSettings

P1, P2, P3 = "http://127.0.0.1:7001", "http://127.0.0.1:7002", "http://127.0.0.1:7003"
D1, D2 = "http://127.0.0.1:7101", "http://127.0.0.1:7102"
SYSTEM = "You are a careful assistant. Answer in full sentences and cite the documents you used. " * 3


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(settings: PrefixSettings | None = None) -> tuple[Flow, RouterState, FakeClock]:
    state = RouterState(
        balancer=Balancer(rng=random.Random(3)),
        metrics=RouterMetrics(),
        prefix_default=settings or PrefixSettings(),
    )
    state.set_static({"prefill": [P1, P2, P3], "decode": [D1, D2]})
    clock = FakeClock()
    flow = Flow(
        state,
        cast(Upstream, object()),  # never called: these tests only pick pods
        timeouts=Timeouts(),
        max_retries=2,
        budget=RetryBudget(ratio=0.2),
        clock=clock,
    )
    return flow, state, clock


def chat(*turns: str, system: str = SYSTEM) -> ClientRequest:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    body = {"model": "m", "messages": messages}
    facts = RequestFacts(endpoint="chat", model="m", stream=False, prompt_tokens=100, max_tokens=16)
    return ClientRequest("chat", body, b"", facts, "req", 0.0)


def pick_prefill(flow: Flow, request: ClientRequest, exclude: set[str] | None = None) -> str | None:
    return flow._pick("prefill", exclude or set(), None, flow._prefix_keys(request))


def turn(n: int) -> str:
    return f"conversation {n}: tell me about topic {n} " * 4


@pytest.mark.parametrize("system", ["", SYSTEM])
def test_a_conversation_returns_to_its_prefill_pod(system: str) -> None:
    """Each first turn is in flight (outstanding) when the next conversation starts, so the bound
    spreads them even when they share a system prompt; each follow-up goes back to its pod."""
    flow, state, _ = make()
    first: dict[int, str | None] = {}
    for n in range(30):
        first[n] = pick_prefill(flow, chat(turn(n), system=system))
        state.balancer.acquire(first[n] or "", 100)
    assert set(first.values()) == {P1, P2, P3}
    for n in range(30):
        state.balancer.release(first[n] or "", 100)
    for n in range(30):
        follow_up = chat(turn(n), "Here is what I know. " * 5, "And more, please.", system=system)
        assert pick_prefill(flow, follow_up) == first[n]


def test_idle_pool_spreads_new_prompts_and_a_shared_prefix_goes_to_its_holder() -> None:
    flow, state, _ = make()
    # Nothing outstanding, no shared prefix: new prompts spread by hash.
    alone = {pick_prefill(flow, chat(turn(n), system="")) for n in range(30)}
    assert alone == {P1, P2, P3}
    # Nothing outstanding, a system prompt one pod holds: a hit there beats an idle pod elsewhere.
    holder = pick_prefill(flow, chat("warm up", system=SYSTEM))
    assert {pick_prefill(flow, chat(turn(n), system=SYSTEM)) for n in range(30)} == {holder}
    # Once every pod holds it, the part past it decides: they spread again.
    for pod in (P1, P2, P3):
        state.prefix_index.record(pod, flow._prefix_keys(chat("warm up", system=SYSTEM)) or [])
    spread = {pick_prefill(flow, chat(turn(n), system=SYSTEM)) for n in range(100, 130)}
    assert spread == {P1, P2, P3}


def test_load_bound_moves_a_hot_prefix_off_a_busy_pod() -> None:
    flow, state, _ = make()
    request = chat("the same long question " * 10)
    holder = pick_prefill(flow, request)
    assert holder is not None
    assert pick_prefill(flow, request) == holder
    for _ in range(6):  # the holder is busy: 6 outstanding prefills, the others idle
        state.balancer.acquire(holder, 100)
    other = pick_prefill(flow, request)
    assert other not in (holder, None)
    # Both now hold the prefix (the index learnt the spill).
    keys = flow._prefix_keys(request) or []
    assert state.prefix_index.matched_keys(holder, keys) == len(keys)
    assert state.prefix_index.matched_keys(other or "", keys) == len(keys)


def test_excluded_and_quarantined_pods_are_not_chosen() -> None:
    flow, state, clock = make()
    request = chat("a question about retries " * 6)
    holder = pick_prefill(flow, request)
    assert holder is not None
    assert pick_prefill(flow, request, exclude={holder}) != holder  # a retry goes elsewhere
    state.balancer.mark_failed(holder, clock.now)
    assert pick_prefill(flow, request) != holder
    # Every pod tried: trying one again beats failing the request.
    assert pick_prefill(flow, request, exclude={P1, P2, P3}) in (P1, P2, P3)


def test_a_pod_that_leaves_is_forgotten() -> None:
    flow, state, _ = make()
    request = chat("what the pod held " * 6)
    holder = pick_prefill(flow, request)
    assert holder is not None
    keys = flow._prefix_keys(request) or []
    rest = [pod for pod in (P1, P2, P3) if pod != holder]
    state.set_static({"prefill": rest, "decode": [D1, D2]})
    assert state.prefix_index.matched_keys(holder, keys) == 0
    assert pick_prefill(flow, request) in rest


def test_disabled_or_no_full_chunk_is_load_only() -> None:
    flow, state, _ = make(PrefixSettings(enabled=False))
    assert flow._prefix_keys(chat("anything " * 20)) is None
    flow, state, _ = make(PrefixSettings(knobs=PrefixKnobs(block_chars=4096)))
    assert flow._prefix_keys(chat("short")) == []
    state.balancer.acquire(P1, 0)
    state.balancer.acquire(P2, 0)
    assert pick_prefill(flow, chat("short")) == P3  # the balancer's choice: P3 is the only idle one
    assert state.prefix_index.pods() == []


def test_decode_stays_load_balanced() -> None:
    flow, state, _ = make()
    state.balancer.acquire(D1, 1000)
    picks = {flow._pick("decode", set(), None) for _ in range(20)}
    assert picks == {D2}


def test_settings_from_the_spec() -> None:
    base = PrefixSettings(knobs=PrefixKnobs(block_chars=32), index_blocks_per_pod=100)
    assert PrefixSettings.from_spec(None, base) == base
    spec = {"enabled": False, "maxBlocks": 8, "loadBound": 2}
    got = PrefixSettings.from_spec(spec, base)
    assert got == PrefixSettings(
        enabled=False,
        knobs=PrefixKnobs(block_chars=32, max_blocks=8, load_bound=2.0),
        index_blocks_per_pod=100,
    )
    # Wrong types and out-of-range values keep the base's (the CRD refuses them anyway).
    bad = {"enabled": "yes", "blockChars": 0, "maxBlocks": 2.5, "loadBound": 0.5, "indexBlocksPerPod": True}
    assert PrefixSettings.from_spec(bad, base) == base
    too_big = {"blockChars": 8193, "maxBlocks": 4097}  # over the CRD's bounds, which the knobs share
    assert PrefixSettings.from_spec(too_big, base) == base


def test_state_follows_the_pddeployment() -> None:
    flow, state, _ = make()
    obj = {
        "metadata": {"name": "llm"},
        "spec": {
            "model": {"name": "m"},
            "router": {"prefixAware": {"blockChars": 128, "indexBlocksPerPod": 2}},
        },
    }
    info = pdd_info_from(obj)
    assert info.prefix_aware == {"blockChars": 128, "indexBlocksPerPod": 2}
    pick_prefill(flow, chat("long enough to fill some chunks " * 10))
    state.on_pdd(info)
    assert state.prefix.knobs.block_chars == 128
    assert state.prefix_index.capacity_blocks_per_pod == 2
    assert all(state.prefix_index.size(pod) <= 2 for pod in state.prefix_index.pods())
    # The spec's field removed: back to the flags' value.
    state.on_pdd(pdd_info_from({**obj, "spec": {"model": {"name": "m"}}}))
    assert state.prefix == PrefixSettings()


@pytest.mark.parametrize("chars", [1, 64])
def test_keys_count(chars: int) -> None:
    flow, _, _ = make(PrefixSettings(knobs=PrefixKnobs(block_chars=chars, max_blocks=MAX_BLOCKS)))
    request = chat("x" * 500)
    keys = flow._prefix_keys(request) or []
    from tandem.routing.prefix import prompt_text

    chunks = len(prompt_text(request.body)) // chars
    assert len(keys) == len([count for count in KEY_BLOCKS if count <= chunks])


def test_colocated_pods_are_chosen_by_prefix_too() -> None:
    state = RouterState(balancer=Balancer(rng=random.Random(5)), metrics=RouterMetrics())
    state.set_static({"colocated": [P1, P2, P3]})
    flow = Flow(
        state,
        cast(Upstream, object()),
        timeouts=Timeouts(),
        max_retries=2,
        budget=RetryBudget(ratio=0.2),
        clock=FakeClock(),
    )
    request = chat("a colocated conversation " * 6)
    keys = flow._prefix_keys(request)
    holder = flow._pick("colocated", set(), None, keys)
    assert holder is not None
    assert all(flow._pick("colocated", set(), None, keys) == holder for _ in range(10))
    assert state.prefix_index.matched_keys(holder, keys or []) == len(keys or [])


@pytest.mark.parametrize(
    ("enabled", "policy", "effective"),
    [
        (True, None, "PrefixAware"),
        (False, None, "LeastLoaded"),
        (True, "RoundRobin", "RoundRobin"),
        (False, "RoundRobin", "RoundRobin"),
        (True, "LeastLoaded", "LeastLoaded"),
        (False, "PrefixAware", "PrefixAware"),  # set, the policy wins over `enabled`
    ],
)
def test_the_policy_in_force(enabled: bool, policy: Any, effective: str) -> None:
    assert PrefixSettings(enabled=enabled, policy=policy).prefill_policy == effective
    got = PrefixSettings.from_spec({"enabled": enabled}, PrefixSettings(), policy)
    assert got.prefill_policy == effective


def test_an_unknown_policy_keeps_the_base() -> None:
    base = PrefixSettings(policy="RoundRobin")
    assert PrefixSettings.from_spec(None, base, "Random") == base
    assert PrefixSettings.from_spec(None, base, 3) == base


def test_round_robin_takes_pods_in_turn_skipping_excluded_and_quarantined() -> None:
    flow, state, clock = make(PrefixSettings(policy="RoundRobin"))
    request = chat("the same conversation every time " * 5)
    assert flow._prefix_keys(request) is None  # no keys: the prefix index is not used
    state.balancer.acquire(P1, 100_000)  # load is ignored
    assert [pick_prefill(flow, request) for _ in range(6)] == [P1, P2, P3, P1, P2, P3]
    assert pick_prefill(flow, request, {P1}) == P2
    state.balancer.mark_failed(P3, clock.now)
    assert [pick_prefill(flow, request) for _ in range(3)] == [P1, P2, P1]
    # Every pod excluded: the balancer's fallback still answers (as for the other policies).
    assert pick_prefill(flow, request, {P1, P2, P3}) in {P1, P2, P3}
    assert state.prefix_index.pods() == []


def test_round_robin_leaves_decode_load_balanced() -> None:
    flow, state, _ = make(PrefixSettings(policy="RoundRobin"))
    state.balancer.acquire(D1, 1000)
    assert {flow._pick("decode", set(), None) for _ in range(20)} == {D2}


def policy_of(state: RouterState) -> str:
    return state.prefix.prefill_policy


def test_the_policy_follows_the_pddeployment() -> None:
    flow, state, _ = make()
    obj = {
        "metadata": {"name": "llm"},
        "spec": {"model": {"name": "m"}, "router": {"prefillPolicy": "RoundRobin"}},
    }
    info = pdd_info_from(obj)
    assert info.prefill_policy == "RoundRobin"
    state.on_pdd(info)
    assert policy_of(state) == "RoundRobin"
    request = chat("same text " * 30)
    assert [pick_prefill(flow, request) for _ in range(3)] == [P1, P2, P3]
    state.on_pdd(
        pdd_info_from({**obj, "spec": {"model": {"name": "m"}, "router": {"prefillPolicy": "LeastLoaded"}}})
    )
    assert policy_of(state) == "LeastLoaded"
    state.balancer.acquire(P1, 0)
    state.balancer.acquire(P2, 0)
    assert pick_prefill(flow, request) == P3  # the least loaded
    state.on_pdd(pdd_info_from({**obj, "spec": {"model": {"name": "m"}}}))
    assert policy_of(state) == "PrefixAware"


def test_the_static_flag() -> None:
    from tandem.router.main import parse_args

    static = ["--prefill", P1, "--decode", D1]
    assert parse_args(static).prefix().prefill_policy == "PrefixAware"
    assert parse_args([*static, "--no-prefix-aware"]).prefix().prefill_policy == "LeastLoaded"
    assert parse_args([*static, "--prefill-policy", "RoundRobin"]).prefix().prefill_policy == "RoundRobin"
    with pytest.raises(SystemExit):
        parse_args([*static, "--prefill-policy", "Random"])
