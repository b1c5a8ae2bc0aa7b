"""Tenants and keys (parse, identify, bounded labels), the gateway's configuration from spec.router,
the rollout-by-tenant draw, the KV usage read from an engine's /metrics, and the operator's check of
the keys Secret."""

from __future__ import annotations

import base64
import random
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tandem.controller.api_keys import keys_problem
from tandem.kube.pods import pdd_info_from
from tandem.router.gateway import Gateway, rate_limited_body, unauthorized_body
from tandem.router.kvwatch import kv_usage_of
from tandem.router.main import build, parse_args
from tandem.router.metrics import RouterMetrics
from tandem.router.state import RouterState
from tandem.routing.admission import Refusal, Ticket
from tandem.routing.balancer import Balancer
from tandem.routing.paths import choose_path
from tandem.routing.tenants import KeysError, Tenancy, Unauthorized, parse_keys

KEYS = {"team-a": "sk-team-a-0001\n  sk-team-a-0002  \n\n", "team-b": "sk-team-b-0001"}


def test_parse_keys_maps_every_key_to_its_tenant() -> None:
    digests = parse_keys(KEYS)
    assert sorted(digests.values()) == ["team-a", "team-a", "team-b"]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({}, "has no entries"),
        ({"team-a": "  \n "}, "entry 'team-a' holds no key"),
        ({"team-a": "short"}, "entry 'team-a': a key is at least 8 characters"),
        ({"team-a": "sk-aaaaaaaa", "team-b": "sk-aaaaaaaa"}, "also a key of 'team-a'"),
        ({"-bad": "sk-aaaaaaaa"}, "entry '-bad': a tenant name"),
    ],
)
def test_parse_keys_refuses_naming_the_entry(data: dict[str, str], fragment: str) -> None:
    with pytest.raises(KeysError) as info:
        parse_keys(data)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"authorization": "Bearer sk-team-a-0002"}, "team-a"),
        ({"authorization": "bearer   sk-team-b-0001 "}, "team-b"),
        ({}, Unauthorized("You didn't provide an API key.")),
        ({"authorization": "Bearer sk-wrong-0000"}, Unauthorized("Incorrect API key provided.")),
        ({"authorization": "Basic dXNlcjpwYXNz"}, Unauthorized("The Authorization header must be")),
        ({"authorization": "Bearer "}, Unauthorized("The Authorization header must be")),
        ({"x-tenant": "team-a"}, Unauthorized("You didn't provide an API key.")),  # header ignored
    ],
)
def test_identify_with_keys(headers: dict[str, str], expected: object) -> None:
    tenancy = Tenancy()
    tenancy.configure(keys_required=True, header="X-Tenant", tenants=["team-a"])
    tenancy.keys = parse_keys(KEYS)
    got = tenancy.identify(headers)
    if isinstance(expected, Unauthorized):
        assert isinstance(got, Unauthorized)
        assert got.message.startswith(expected.message)
    else:
        assert got == expected


def test_identify_by_header_and_bounded_labels() -> None:
    tenancy = Tenancy()
    tenancy.configure(keys_required=False, header="X-Team", tenants=["team-a", "default"])
    assert tenancy.identify({"x-team": "team-a"}) == "team-a"
    assert tenancy.identify({"x-tenant": "team-a"}) == "default"  # another header is not the tenant
    assert tenancy.identify({}) == "default"
    assert tenancy.label("team-a") == "team-a"
    assert tenancy.label("default") == "default"
    assert {tenancy.label(f"sprayed-{i}") for i in range(10_000)} == {"other"}
    assert tenancy.ready


def test_keys_required_but_not_loaded_is_not_ready() -> None:
    tenancy = Tenancy()
    tenancy.configure(keys_required=True, header="X-Tenant", tenants=[])
    assert not tenancy.ready
    tenancy.keys = parse_keys(KEYS)
    assert tenancy.ready


ROUTER_SPEC: dict[str, Any] = {
    "auth": {"apiKeysSecret": "llm-keys"},
    "tenants": [
        {"name": "team-a", "limits": {"requestsPerSecond": 1, "requestBurst": 1}},
        {"name": "team-b"},
    ],
    "admission": {
        "defaultLimits": {"promptTokensPerSecond": 100},
        "longPrompts": {"minTokens": 1000, "maxConcurrent": 1},
        "decodeBackpressure": {"kvUsagePercent": 80, "scrapeIntervalSeconds": 1, "queueSeconds": 0.5},
    },
}


def gateway() -> Gateway:
    return Gateway(CollectorRegistry())


def test_configure_from_spec_router() -> None:
    gw = gateway()
    gw.configure(ROUTER_SPEC, ["team-b"], rollout_target="Disaggregated")
    assert gw.keys_secret == "llm-keys"
    assert gw.tenancy.keys_required
    assert not gw.ready
    gw.on_keys(KEYS)
    assert gw.ready
    assert gw.identify({"authorization": "Bearer sk-team-a-0001"}) == "team-a"
    assert gw.kv_full_at == pytest.approx(0.8)
    assert gw.kv_queue_s == 0.5
    assert gw.kv_scrape_interval_s == 1
    # team-a: its own request bucket of 1; team-b: listed without limits, so the default's tokens.
    assert isinstance(gw.admit("team-a", 10, 0.0), Ticket)
    refused = gw.admit("team-a", 10, 0.0)
    assert isinstance(refused, Refusal)
    assert refused.reason == "tenant_requests"
    assert isinstance(gw.admit("team-b", 100, 0.0), Ticket)
    refused = gw.admit("team-b", 50, 0.0)
    assert isinstance(refused, Refusal)
    assert refused.reason == "tenant_prompt_tokens"
    assert gw.refusals.labels("tenant_requests", "team-a")._value.get() == 1
    assert gw.refusals.labels("tenant_prompt_tokens", "team-b")._value.get() == 1


def test_keys_fail_closed() -> None:
    gw = gateway()
    gw.configure(ROUTER_SPEC)
    gw.on_keys({"team-a": "bad"})  # malformed before any good read: still no keys
    assert not gw.ready
    assert "entry 'team-a'" in (gw.tenancy.keys_error or "")
    gw.on_keys(KEYS)
    gw.on_keys({"team-a": "bad"})  # malformed after a good read: the good keys stay
    assert gw.ready
    gw.on_keys(None, error="Secret 'llm-keys' unreadable (HTTP 500)")  # apiserver trouble: keep them
    assert gw.ready
    gw.on_keys(None, gone=True, error="Secret 'llm-keys' not found")  # deleted: refuse everyone
    assert not gw.ready


def test_keys_off_when_the_spec_drops_them() -> None:
    gw = gateway()
    gw.configure(ROUTER_SPEC)
    gw.configure({"auth": {"tenantHeader": "X-Team"}, "tenants": [{"name": "team-a"}]})
    assert gw.ready
    assert gw.keys_secret is None
    assert gw.kv_full_at is None
    assert gw.identify({"x-team": "team-a"}) == "team-a"
    assert gw.identify({"x-team": "team-z"}) == "other"


def test_a_spec_that_does_not_parse_keeps_the_settings_in_use() -> None:
    gw = gateway()
    gw.configure(ROUTER_SPEC)
    gw.configure({"tenants": [{"name": "x", "limits": {"requestsPerSecond": -1}}]})
    assert gw.keys_secret == "llm-keys"


def test_the_body_limit_follows_the_spec_and_falls_back_to_the_flag() -> None:
    app, state, _ = build(parse_args(["--colocated", "http://127.0.0.1:9", "--max-body-bytes", "65536"]))
    assert app.body_limit() == 65536  # no spec: the flag's
    state.gateway.configure({"admission": {"maxBodyBytes": 8 * 1024 * 1024}})
    assert state.gateway.max_body_bytes == 8 * 1024 * 1024
    assert app.body_limit() == 8 * 1024 * 1024
    state.gateway.configure({"admission": {"maxBodyBytes": 512}})  # under 1 KiB: does not parse
    assert app.body_limit() == 8 * 1024 * 1024  # the setting in use stays
    state.gateway.configure({"admission": {}})
    assert app.body_limit() == 65536


@pytest.mark.parametrize(
    ("target", "tenant", "weight", "path"),
    [
        ("Disaggregated", "team-b", 1, "disaggregated"),  # first at any weight above 0
        ("Disaggregated", "team-b", 0, "disaggregated"),  # and at 0: the tenants stage
        ("Disaggregated", "team-a", 1, None),  # everyone else by the request id
        ("Colocated", "team-b", 1, "colocated"),  # target colocated: P/D share 99
        ("Colocated", "team-b", 0, "colocated"),  # the tenants stage toward colocated: P/D share 100
        (None, "team-b", 1, None),  # no target taking traffic: before the first step, rolled back
        (None, "team-b", 0, None),
    ],
)
def test_rollout_tenants_go_to_the_target_first(
    target: str | None, tenant: str, weight: int, path: str | None
) -> None:
    gw = gateway()
    gw.configure(ROUTER_SPEC, ["team-b"], rollout_target=target)
    share = gw.first_share(tenant)
    if path is None:
        assert share is None
        return
    assert share is not None
    for draw in (0.0, 0.5, 1.0 - 2**-53):  # whatever the request id
        got = choose_path(
            share, draw, has_prefill=True, has_decode=True, has_colocated=True, colocated_fallback=True
        )
        assert got == path


def test_decode_room_and_full_gauge() -> None:
    gw = gateway()
    assert gw.decode_with_room(["d1"]) is None  # off
    gw.configure(ROUTER_SPEC)
    gw.set_kv_usage({"d1": 0.85, "d2": 0.2})
    assert gw.decode_with_room(["d1", "d2", "d3"]) == ["d2", "d3"]
    assert gw.kv_full._value.get() == 1


def test_bodies_are_openai_style() -> None:
    assert b'"type": "invalid_request_error"' in unauthorized_body("x")
    assert b'"code": "invalid_api_key"' in unauthorized_body("x")
    body = rate_limited_body(Refusal("long_prompts", 1, "too many"))
    assert b'"type": "rate_limit_exceeded"' in body
    assert b'"code": "long_prompts"' in body


METRICS = b"""# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4
vllm:kv_cache_usage_perc{engine="1",model_name="a b}"} 0.93
vllm:kv_cache_usage_perc_other 0.99
vllm:num_requests_running{engine="0"} 3.0
"""


def test_kv_usage_of_engine_metrics() -> None:
    assert kv_usage_of(METRICS) == pytest.approx(0.93)
    assert kv_usage_of(b"vllm:gpu_cache_usage_perc 0.5\n") == pytest.approx(0.5)
    assert kv_usage_of(b"vllm:num_requests_running 1\n") is None
    assert kv_usage_of(b'vllm:kv_cache_usage_perc{a="b"} nonsense\n') is None


def secret(data: dict[str, str]) -> dict[str, Any]:
    return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (None, "Secret 'keys' (spec.router.auth.apiKeysSecret) not found"),
        (secret({}), "Secret 'keys' (spec.router.auth.apiKeysSecret): has no entries"),
        (secret({"team-a": "x"}), "entry 'team-a': a key is at least 8 characters"),
        ({"data": {"team-a": "!!notbase64"}}, "entry 'team-a' is not UTF-8 text"),
        (secret(KEYS), None),
    ],
)
def test_operator_checks_the_keys_secret(obj: dict[str, Any] | None, fragment: str | None) -> None:
    problem = keys_problem(obj, "keys")
    if fragment is None:
        assert problem is None
    else:
        assert problem is not None
        assert fragment in problem


def test_the_router_reads_its_gateway_settings_from_the_pddeployment() -> None:
    obj = {
        "metadata": {"name": "llm"},
        "spec": {
            "router": {"replicas": 2, "image": "x", **ROUTER_SPEC},
            "rollout": {"steps": [{"weight": 50}], "tenants": ["team-b"]},
        },
        "status": {"rollout": {"phase": "Shifting", "weight": 10, "target": "Disaggregated"}},
    }
    info = pdd_info_from(obj)
    assert info.router_gateway == ROUTER_SPEC  # auth, tenants, admission; not the router's pod settings
    assert info.rollout_tenants == ("team-b",)
    assert info.rollout_target == "Disaggregated"
    no_rollout = pdd_info_from(
        {"metadata": {"name": "llm"}, "spec": {}, "status": {"rollout": {"target": "Colocated"}}}
    )
    assert no_rollout.rollout_target is None  # a target without a phase: no rollout running
    assert no_rollout.router_gateway is None
    assert no_rollout.rollout_tenants == ()


@pytest.mark.parametrize(
    ("phase", "weight", "serving"),
    [
        ("Preparing", 0, False),  # not before its first step
        ("Shifting", 0, True),  # the tenants stage: weight 0, the chosen tenants on the target
        ("Paused", 0, True),
        ("Shifting", 50, True),
        ("Promoted", 100, True),
        ("RollingBack", 0, False),  # back on the source like everyone, at once
        ("RolledBack", 0, False),
        ("Nonsense", 50, False),
    ],
)
def test_the_chosen_tenants_follow_the_rollout_phase(phase: str, weight: int, serving: bool) -> None:
    record = {"phase": phase, "weight": weight, "target": "Colocated"}
    obj = {
        "metadata": {"name": "llm"},
        "spec": {"rollout": {"steps": [{"weight": 0}, {"weight": 100}], "tenants": ["team-b"]}},
        "status": {
            "rollout": record,
            "revisions": {
                "current": {"id": "new", "prefix": "llm-new"},
                "previous": {"id": "old", "prefix": "llm"},
                "weight": weight,
                "rollout": {**record, "target": "new"},
            },
        },
    }
    info = pdd_info_from(obj)
    assert info.rollout_target == ("Colocated" if serving else None)
    assert info.revision_rollout_serving is serving


def test_static_mode_flags(tmp_path: Path) -> None:
    (tmp_path / "gw.yaml").write_text("tenants:\n- {name: a, limits: {requestsPerSecond: 2}}\n")
    (tmp_path / "keys.yaml").write_text("a: |\n  sk-aaaaaaaa1\n  sk-aaaaaaaa2\nb: sk-bbbbbbbb\n")
    flags = ["--gateway", str(tmp_path / "gw.yaml"), "--api-keys-file", str(tmp_path / "keys.yaml")]
    _, state, _ = build(parse_args(["--colocated", "http://127.0.0.1:9", *flags]))
    gw = state.gateway
    assert gw.ready
    assert gw.identify({"authorization": "Bearer sk-aaaaaaaa2"}) == "a"
    assert gw.identify({"authorization": "Bearer sk-bbbbbbbb"}) == "other"
    assert isinstance(gw.identify({}), Unauthorized)
    with pytest.raises(SystemExit):
        parse_args(["--pddeployment", "llm", *flags])  # a PDDeployment's router takes spec.router


@pytest.mark.parametrize(
    ("new_weight", "serving", "expected"),
    [
        (1, True, {"new"}),
        (1, False, {"new"}),  # a cut-over (no rollout record) at a weight above 0
        (0, True, {"new"}),  # the tenants stage
        (0, False, {"old"}),  # before the first step, or rolled back
    ],
)
def test_rollout_tenants_take_the_new_revision_first(
    new_weight: int, serving: bool, expected: set[str]
) -> None:
    state = RouterState(balancer=Balancer(rng=random.Random(0)), metrics=RouterMetrics(), pdd_name="llm")
    state.revision_endpoints = {
        rev: {"prefill": [f"p-{rev}"], "decode": [f"d-{rev}"]} for rev in ("new", "old")
    }
    state.revision_shares = (("new", new_weight), ("old", 100 - new_weight))
    state.revision_rollout_serving = serving
    first = {state.revision_for(f"req-{i}", first=True) for i in range(200)}
    assert first == expected  # every request of a chosen tenant
    everyone = [state.revision_for(f"req-{i}") for i in range(200)]
    assert everyone.count("new") <= 10  # everyone else by the weight (1 % or 0)
