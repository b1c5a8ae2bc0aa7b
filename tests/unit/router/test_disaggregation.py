"""The router's side of the remote-or-local choice: settings from the PDDeployment (mode in effect, a
rollout's split), the reply read back from what the client got, the text a next turn starts with."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tandem.kube.pods import pdd_info_from
from tandem.router.disaggregation import Disaggregation, reply_text, with_reply
from tandem.router.metrics import RouterMetrics
from tandem.router.state import RouterState
from tandem.routing.balancer import Balancer
from tandem.routing.disaggregation import DisaggregationKnobs
from tandem.routing.prefix import prompt_text


def pdd(spec: dict[str, Any] | None, status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "demo"}, "spec": {"router": {}}}
    if spec is not None:
        obj["spec"]["router"]["disaggregation"] = spec
    if status is not None:
        obj["status"] = {"disaggregation": status}
    return obj


def state(default: DisaggregationKnobs | None = None) -> RouterState:
    return RouterState(
        balancer=Balancer(rng=random.Random(1)),
        metrics=RouterMetrics(),
        pdd_name="demo",
        disaggregation_default=default or DisaggregationKnobs(),
    )


def test_the_mode_in_effect_and_live_knobs_come_from_the_pddeployment() -> None:
    router = state()
    router.on_pdd(pdd_info_from(pdd({"mode": "Auto", "maxLocalTokens": 64}, {"mode": "Auto"})))
    assert router.disaggregation.knobs == DisaggregationKnobs(mode="Auto", max_local_tokens=64)
    # A knob changed in the spec applies at once; the mode only as the operator says (status).
    router.on_pdd(pdd_info_from(pdd({"mode": "Threshold", "thresholdTokens": 32}, {"mode": "Auto"})))
    assert router.disaggregation.knobs.mode == "Auto"
    # No field and no record: the flags' default.
    flagged = state(DisaggregationKnobs(mode="Threshold", threshold_tokens=8))
    flagged.on_pdd(pdd_info_from(pdd(None, None)))
    assert flagged.disaggregation.knobs == DisaggregationKnobs(mode="Threshold", threshold_tokens=8)


def test_a_rollout_splits_requests_by_id() -> None:
    router = state()
    rollout = {"target": "Auto", "phase": "Shifting", "weight": 30, "startedAt": 0, "stepStartedAt": 0}
    router.on_pdd(
        pdd_info_from(pdd({"mode": "Auto"}, {"mode": "Always", "rollout": {**rollout, "phaseSince": 0}}))
    )
    disagg = router.disaggregation
    modes = [disagg.knobs_for(f"req-{i}").mode for i in range(4000)]
    assert modes.count("Auto") / len(modes) == pytest.approx(0.3, abs=0.03)
    assert all(disagg.knobs_for(f"req-{i}").mode == modes[i] for i in range(100))  # the same id, the same arm
    # Settled records split nothing.
    for phase in ("Promoted", "RolledBack"):
        record = {**rollout, "phase": phase, "phaseSince": 0}
        router.on_pdd(pdd_info_from(pdd({"mode": "Auto"}, {"mode": "Always", "rollout": record})))
        assert {disagg.knobs_for(f"req-{i}").mode for i in range(200)} == {"Always"}


def test_the_tenants_stage_sends_the_named_tenants_to_the_target_mode_first() -> None:
    """spec.rollout.tenants: decided by the target mode while it takes traffic (Shifting, Paused), at
    weight 0 too; everyone else by the weight; back to the mode in effect on a rollback."""
    router = state()
    obj = pdd({"mode": "Auto"}, None)
    obj["spec"]["rollout"] = {"tenants": ["team-a"], "steps": [{"weight": 0}, {"weight": 100}]}
    disagg = router.disaggregation
    record = {"target": "Auto", "weight": 0, "startedAt": 0, "stepStartedAt": 0, "phaseSince": 0}
    for phase, first in (("Shifting", True), ("Paused", True), ("RollingBack", False)):
        obj["status"] = {"disaggregation": {"mode": "Always", "rollout": {**record, "phase": phase}}}
        info = pdd_info_from(obj)
        assert (info.disaggregation_target, info.disaggregation_tenants_first) == ("Auto", first)
        router.on_pdd(info)
        chosen = {disagg.knobs_for(f"req-{i}", first=True).mode for i in range(200)}
        assert chosen == ({"Auto"} if first else {"Always"}), phase
        assert {disagg.knobs_for(f"req-{i}").mode for i in range(200)} == {"Always"}, "weight 0: nobody else"
    # A weighted step: the named tenants all on the target, the others split by the weight.
    obj["status"] = {
        "disaggregation": {"mode": "Always", "rollout": {**record, "phase": "Shifting", "weight": 50}}
    }
    router.on_pdd(pdd_info_from(obj))
    assert {disagg.knobs_for(f"req-{i}", first=True).mode for i in range(200)} == {"Auto"}
    assert {disagg.knobs_for(f"req-{i}").mode for i in range(200)} == {"Always", "Auto"}
    # No rollout: nothing goes first.
    obj["status"] = {"disaggregation": {"mode": "Always"}}
    router.on_pdd(pdd_info_from(obj))
    assert {disagg.knobs_for(f"req-{i}", first=True).mode for i in range(200)} == {"Always"}


def test_every_arms_series_exists_from_zero() -> None:
    metrics = RouterMetrics()
    registry = metrics.registry
    disagg = Disaggregation(metrics, DisaggregationKnobs())
    disagg.configure(DisaggregationKnobs(), 1024, DisaggregationKnobs(mode="Auto"), 50)
    for mode in ("Always", "Auto"):
        for side in ("remote", "local"):
            labels = {"mode": mode, "prefill": side}
            assert (
                registry.get_sample_value(
                    "tandem_router_disaggregation_requests_total", {**labels, "code": "5xx"}
                )
                == 0
            )
            assert registry.get_sample_value("tandem_router_disaggregation_ttft_seconds_count", labels) == 0
    assert (
        registry.get_sample_value(
            "tandem_router_disaggregation_total", {"prefill": "local", "reason": "no_prefill_ready"}
        )
        == 0
    )


def sse(*texts: str, chat: bool) -> bytes:
    events = []
    for text in texts:
        choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        events.append(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
    events.append(b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n')
    return b"".join(events) + b"data: [DONE]\n\n"


def test_the_reply_is_read_back_from_what_the_client_got() -> None:
    assert reply_text(sse(" bazou", " kilan", chat=True), stream=True) == " bazou kilan"
    assert reply_text(sse(" bazou", " kilan", chat=False), stream=True) == " bazou kilan"
    whole = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "all of it"}}]}
    assert reply_text(json.dumps(whole).encode(), stream=False) == "all of it"
    assert reply_text(b"not json", stream=False) == ""
    # A chunk that is not JSON (or a keep-alive comment) is skipped; the others still read.
    broken = sse(" bazou", chat=True).replace(b"data: [DONE]", b"data: {oops\n\n: ping\n\ndata: [DONE]")
    assert reply_text(broken, stream=True) == " bazou"
    assert reply_text(b"data: [DONE]\n\n", stream=True) == ""


def test_the_next_turn_starts_with_the_prompt_and_the_reply() -> None:
    turn = {"messages": [{"role": "user", "content": "hello"}]}
    nxt = {
        "messages": [
            *turn["messages"],
            {"role": "assistant", "content": " bazou kilan"},
            {"role": "user", "content": "more"},
        ]
    }
    held = with_reply(prompt_text(turn), " bazou kilan", "chat")
    assert prompt_text(nxt).startswith(held)
    assert with_reply("Once upon", " a time", "completions") == "Once upon a time"
