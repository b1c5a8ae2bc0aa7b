"""The PromQL builders and the parsing of recorded Prometheus answers into a Snapshot (no sockets)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tandem.metrics.queries import (
    BUCKET_LATENCIES,
    ENGINE_QUERIES,
    POD_QUERIES,
    QUERIES,
    ROUTER_QUERIES,
    build_pod_loads,
    build_snapshot,
    engine_selector,
    failed_queries,
    pod_load_queries,
    quantile_of,
    router_selector,
    selector,
    snapshot_queries,
)
from tandem.signals import PoolSize

NOW = 1_800_000_000.0
DATA = Path(__file__).parent / "data"


def sample(value: float | str, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [NOW, str(value)]}


def fresh_answers(**over: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Answers of a P/D deployment with one prefill, one decode and one router pod, all fresh."""
    role = "tandem_dev_role"
    answers: dict[str, list[dict[str, Any]]] = {name: [] for name in QUERIES}
    answers |= {
        "engine_age": [
            sample(1.2, pod="llm-prefill-0", **{role: "prefill"}),
            sample(0.4, pod="llm-decode-0", **{role: "decode"}),
        ],
        "engine_samples": [
            sample(60, pod="llm-prefill-0", **{role: "prefill"}),
            sample(61, pod="llm-decode-0", **{role: "decode"}),
        ],
        "waiting": [sample(3, **{role: "prefill"}), sample(0, **{role: "decode"})],
        "waiting_before": [sample(1, **{role: "prefill"})],
        "running": [sample(1, **{role: "prefill"}), sample(12, **{role: "decode"})],
        "kv_usage_mean": [sample(0.1, **{role: "prefill"}), sample(0.4, **{role: "decode"})],
        "kv_usage_max": [sample(0.1, **{role: "prefill"}), sample(0.4, **{role: "decode"})],
        "prompt_tokens_rate": [sample(5000, **{role: "prefill"}), sample(5000, **{role: "decode"})],
        "generation_tokens_rate": [sample(10, **{role: "prefill"}), sample(900, **{role: "decode"})],
        "request_rate": [sample(10, **{role: "prefill"}), sample(9.5, **{role: "decode"})],
        "mean_prompt_tokens": [sample(500, **{role: "prefill"}), sample(500, **{role: "decode"})],
        "mean_output_tokens": [sample(1, **{role: "prefill"}), sample(95, **{role: "decode"})],
        "mean_prompt_tokens_lifetime": [sample(450, **{role: "prefill"}), sample(450, **{role: "decode"})],
        "router_age": [sample(0.8, pod="llm-router-abc")],
        "router_samples": [sample(60, pod="llm-router-abc")],
        "path_request_rate": [sample(10, path="disaggregated")],
        "path_within_slo_rate": [sample(9.6, path="disaggregated")],
        "path_ttft": [sample(0.35, path="disaggregated"), sample("NaN", path="colocated")],
        "path_tpot": [sample(0.042, path="disaggregated")],
    }
    answers |= over
    return answers


def snapshot(answers: dict[str, Any], errors: dict[str, str] | None = None, **kw: Any) -> Any:
    kw.setdefault("slo_set", True)
    return build_snapshot(answers, errors or {}, now=NOW, window_seconds=120, **kw)


# --- building ---------------------------------------------------------------------------------------


def test_selectors_quote_values_and_match_roles() -> None:
    assert engine_selector("team-a", "llm") == (
        '{namespace="team-a",tandem_dev_pddeployment="llm",tandem_dev_role=~"prefill|decode|colocated"}'
    )
    assert router_selector("team-a", "llm") == (
        '{namespace="team-a",tandem_dev_pddeployment="llm",tandem_dev_role="router"}'
    )
    assert selector(a='say "hi"\\') == '{a="say \\"hi\\"\\\\"}'


def test_snapshot_queries_render_every_table_entry() -> None:
    queries = snapshot_queries("ns", "llm", 120, 0.95)
    assert set(queries) == {q.name for q in (*ENGINE_QUERIES, *ROUTER_QUERIES)}
    for promql in queries.values():
        assert "SEL" not in promql
        assert "WINDOW" not in promql
        assert "QUANTILE" not in promql
    assert queries["waiting"] == (
        "sum by (tandem_dev_role) (vllm:num_requests_waiting"
        ' {namespace="ns",tandem_dev_pddeployment="llm",tandem_dev_role=~"prefill|decode|colocated"})'
    )
    assert queries["path_ttft"].startswith("histogram_quantile(0.95, sum by (path, le) (rate(")
    assert queries["path_ttft"].endswith('tandem_dev_role="router"} [120s])))')
    assert "[120s]" in queries["prompt_tokens_rate"]
    assert queries["waiting_before"].endswith("} offset 120s)")
    assert snapshot_queries("ns", "llm", 30.4, 0.99)["path_tpot"].startswith("histogram_quantile(0.99,")


def test_quantile_follows_the_attainment_target() -> None:
    assert quantile_of(95) == 0.95
    assert quantile_of(99.9) == pytest.approx(0.999)
    assert quantile_of(None) == 0.95


def test_pod_load_queries_match_exactly_the_named_pods() -> None:
    queries = pod_load_queries("ns", ["llm-prefill-1", "llm.decode-2"])
    assert set(queries) == {q.name for q in POD_QUERIES}
    assert '{namespace="ns",pod=~"llm\\\\-prefill\\\\-1|llm\\\\.decode\\\\-2"}' in queries["pod_running"]


# --- parsing ----------------------------------------------------------------------------------------


def test_fresh_answers_make_a_complete_snapshot() -> None:
    snap = snapshot(fresh_answers(), sizes={"prefill": PoolSize(1, 1), "decode": PoolSize(2, 1)})
    assert snap.missing == ()
    assert snap.observed_at == NOW
    assert snap.sizes["decode"] == PoolSize(2, 1)
    prefill, decode = snap.pools["prefill"], snap.pools["decode"]
    assert prefill.scraped_targets == decode.scraped_targets == 1
    assert prefill.waiting_requests == 3
    assert prefill.queued_prompt_tokens == 1750  # (3 waiting + half of 1 prefilling) x 500 tokens
    assert prefill.queued_prompt_tokens_before == 500  # 1 waiting a window earlier (none running then)
    assert decode.queued_prompt_tokens_before is None  # no series then: not read
    assert prefill.prompt_tokens_rate == 5000
    assert decode.running_requests == 12
    assert decode.kv_usage_max == 0.4
    assert decode.mean_output_tokens == 95
    assert snap.pools["colocated"].scraped_targets == 0
    pd = snap.paths["disaggregated"]
    assert (pd.request_rate, pd.within_slo_rate, pd.ttft_seconds, pd.tpot_seconds) == (10, 9.6, 0.35, 0.042)
    assert pd.attainment == pytest.approx(0.96)
    assert snap.paths["colocated"].ttft_seconds is None  # NaN: no requests
    assert snap.paths["colocated"].attainment is None
    assert pd.local_prefill_share is None  # no tandem_router_disaggregation_requests_total series


def test_the_share_prefilled_on_decode_pods() -> None:
    sides = [sample(1.5, prefill="local"), sample(4.5, prefill="remote")]
    pd = snapshot(fresh_answers(prefill_side_rate=sides)).paths["disaggregated"]
    assert (pd.local_prefill_rate, pd.remote_prefill_rate) == (1.5, 4.5)
    assert pd.local_prefill_share == 0.25


def test_a_prefill_pools_running_prompts_count_as_half_queued() -> None:
    """Prefill pods admit up to --max-num-seqs prompts and share each step among them: 32 running and
    none waiting is a backlog (make demo's surge), which the waiting queue alone would not show."""
    role = "tandem_dev_role"
    answers = fresh_answers(
        waiting=[sample(0, **{role: "prefill"}), sample(2, **{role: "decode"})],
        running=[sample(32, **{role: "prefill"}), sample(12, **{role: "decode"})],
        waiting_before=[sample(0, **{role: "prefill"})],
        running_before=[sample(8, **{role: "prefill"}), sample(12, **{role: "decode"})],
    )
    pools = snapshot(answers).pools
    assert pools["prefill"].queued_prompt_tokens == 16 * 500
    assert pools["prefill"].queued_prompt_tokens_before == 4 * 500
    assert pools["decode"].queued_prompt_tokens == 2 * 500  # decode's running requests are decoding


def test_the_ttft_breakdown_comes_from_the_legs_and_the_engines() -> None:
    role = "tandem_dev_role"
    legs = {
        "path_ttft_mean": [sample(0.9, path="disaggregated"), sample(0.3, path="colocated")],
        "prefill_leg_mean": [sample(0.7, outcome="ok"), sample(5.0, outcome="timeout")],
        "decode_first_token_mean": [sample(0.15, path="disaggregated"), sample(0.3, path="colocated")],
    }
    snap = snapshot(
        fresh_answers(
            **legs,
            queue_seconds_mean=[sample(0.4, **{role: "prefill"}), sample(0.01, **{role: "decode"})],
            kv_read_seconds_mean=[sample(0.02, **{role: "decode"})],
            engine_ttft_seconds_mean=[sample(0.7, **{role: "prefill"}), sample(0.14, **{role: "decode"})],
        )
    )
    parts = snap.paths["disaggregated"].ttft_breakdown
    assert parts is not None
    assert (parts.ttft, parts.prefill_leg, parts.decode_first_token) == (0.9, 0.7, 0.15)
    assert (parts.prefill_queue, parts.kv_transfer, parts.decode_engine_first_token) == (0.4, 0.02, 0.14)
    assert parts.router_queue == pytest.approx(0.05)
    assert snap.paths["colocated"].ttft_breakdown is None  # the colocated path has no legs to split
    # Engines without the queue or NIXL histograms: those parts are unknown, the legs still split.
    bare = snapshot(fresh_answers(**legs, queue_seconds_mean=[sample("NaN", **{role: "prefill"})]))
    parts = bare.paths["disaggregated"].ttft_breakdown
    assert parts is not None
    assert (parts.prefill_queue, parts.kv_transfer, parts.decode_engine_first_token) == (None, None, None)
    # No timed prefill leg in the window (or routers that do not time it): no breakdown at all.
    no_legs = snapshot(fresh_answers(**{**legs, "prefill_leg_mean": [sample(5.0, outcome="timeout")]}))
    assert no_legs.paths["disaggregated"].ttft_breakdown is None
    assert no_legs.missing == ()  # optional parts never hold a decision


@pytest.mark.parametrize(
    ("sides", "leg", "share", "router_queue"),
    [
        ([], 0.7, 0.0, 0.05),  # no count by side (Always before the counter): every request remote
        ([sample(0.0, prefill="local"), sample(4.0, prefill="remote")], 0.7, 0.0, 0.05),
        # 3 in 4 prefilled on decode: the 0.7 s leg weighs 0.175 s of the 0.9 s mean TTFT
        ([sample(3.0, prefill="local"), sample(1.0, prefill="remote")], 0.7, 0.75, 0.575),
        # Only local prefills: no prefill leg in the window, taken as 0 (it weighs nothing)
        ([sample(4.0, prefill="local"), sample(0.0, prefill="remote")], None, 1.0, 0.75),
    ],
    ids=["no-sides", "all-remote", "mostly-local", "all-local"],
)
def test_the_ttft_breakdown_weighs_the_prefill_leg_by_the_remote_share(
    sides: list[dict[str, Any]], leg: float | None, share: float, router_queue: float
) -> None:
    legs = {
        "path_ttft_mean": [sample(0.9, path="disaggregated")],
        "prefill_leg_mean": [sample(leg if leg is not None else "NaN", outcome="ok")],
        "decode_first_token_mean": [sample(0.15, path="disaggregated")],
    }
    parts = snapshot(fresh_answers(**legs, prefill_side_rate=sides)).paths["disaggregated"].ttft_breakdown
    assert parts is not None
    assert parts.prefill_leg == (leg if leg is not None else 0.0)
    assert parts.local_share == share
    assert parts.router_queue == pytest.approx(router_queue)
    # Some remote requests but no timed prefill leg: no breakdown, as before.
    if 0 < share < 1:
        no_leg = {**legs, "prefill_leg_mean": [sample("NaN", outcome="ok")]}
        assert (
            snapshot(fresh_answers(**no_leg, prefill_side_rate=sides)).paths["disaggregated"].ttft_breakdown
            is None
        )


def test_latency_by_bucket_for_status_never_holds_a_decision() -> None:
    queries = snapshot_queries("ns", "llm", 120, 0.9)
    assert queries["tpot_by_concurrency"] == (
        "histogram_quantile(0.9, sum by (concurrency, le) (rate("
        "tandem_router_tpot_by_concurrency_seconds_bucket"
        ' {namespace="ns",tandem_dev_pddeployment="llm",tandem_dev_role="router"} [120s])))'
    )
    assert queries["ttft_by_prefill"] == (
        "histogram_quantile(0.9, sum by (prefill, le) (rate("
        "tandem_router_disaggregation_ttft_seconds_bucket"
        ' {namespace="ns",tandem_dev_pddeployment="llm",tandem_dev_role="router"} [120s])))'
    )
    answers = fresh_answers(
        tpot_by_concurrency=[sample(0.02, concurrency="0-4"), sample("NaN", concurrency="4-16")],
        itl_by_output_length=[sample(0.01, output_length="0-128")],
        ttft_by_prefill=[sample(0.2, prefill="remote"), sample(0.01, prefill="local")],
    )
    snap = snapshot(answers)
    assert snap.latency_by_bucket == {
        "tpot_by_concurrency": {"0-4": 0.02},  # NaN: no request in that bucket in the window
        "itl_by_output_length": {"0-128": 0.01},
        "ttft_by_prefill": {"remote": 0.2, "local": 0.01},
    }
    failed = snapshot(answers, errors={"itl_by_concurrency": "HTTP 500"})
    assert failed.missing == ()  # shown in status only: its failure is not "metrics missing"
    assert "itl_by_concurrency" not in failed.latency_by_bucket


def test_zero_traffic_with_fresh_series_is_data() -> None:
    answers = fresh_answers(
        path_request_rate=[],  # no requests_total series yet: no request ever
        path_within_slo_rate=[],
        path_ttft=[sample("NaN", path="disaggregated")],
        path_tpot=[],
        request_rate=[sample(0, tandem_dev_role="decode")],
        mean_prompt_tokens=[sample("NaN", tandem_dev_role="prefill")],
        waiting=[sample(0, tandem_dev_role="prefill")],
    )
    snap = snapshot(answers, sizes={"prefill": PoolSize(1, 1), "decode": PoolSize(1, 1)})
    assert snap.missing == ()
    assert snap.has_data
    assert snap.paths["disaggregated"].request_rate == 0
    assert snap.paths["disaggregated"].ttft_seconds is None
    assert snap.pools["prefill"].mean_prompt_tokens == 0
    assert snap.pools["decode"].request_rate == 0


def test_within_slo_never_exceeds_the_request_rate() -> None:
    answers = fresh_answers(path_within_slo_rate=[sample(0.157, path="disaggregated")])
    answers["path_request_rate"] = [sample(0.155, path="disaggregated")]
    pd = snapshot(answers).paths["disaggregated"]
    assert pd.within_slo_rate == pd.request_rate == 0.155


def test_queued_tokens_fall_back_to_the_lifetime_mean() -> None:
    answers = fresh_answers(mean_prompt_tokens=[sample("NaN", tandem_dev_role="prefill")])
    assert snapshot(answers).pools["prefill"].queued_prompt_tokens == 3.5 * 450


def test_a_stale_series_is_missing() -> None:
    answers = fresh_answers(engine_age=[sample(40, pod="llm-decode-0", tandem_dev_role="decode")])
    snap = snapshot(answers)
    assert len(snap.missing) == 1
    assert "engine_age: pod llm-decode-0 last scraped 40s ago" in snap.missing[0]
    assert snap.pools["decode"].scraped_targets == 0
    # 120 s / 61 samples ~ 2 s interval: 5 s old is fresh, 7 s is not.
    ok = fresh_answers(engine_age=[sample(5, pod="llm-decode-0", tandem_dev_role="decode")])
    assert snapshot(ok).missing == ()
    late = fresh_answers(engine_age=[sample(7, pod="llm-decode-0", tandem_dev_role="decode")])
    assert snapshot(late).missing
    assert snapshot(late, scrape_interval=15.0).missing == ()  # a given interval wins


def test_ready_pods_without_engine_series_are_missing() -> None:
    answers = fresh_answers(engine_age=[sample(1, pod="llm-prefill-0", tandem_dev_role="prefill")])
    snap = snapshot(answers, sizes={"prefill": PoolSize(1, 1), "decode": PoolSize(1, 1)})
    assert snap.missing == ("engine_age: decode has 1 ready pods but no fresh engine metrics",)
    starting = snapshot(answers, sizes={"prefill": PoolSize(1, 1), "decode": PoolSize(1, 0)})
    assert starting.missing == ()  # a pod loading its model has no metrics yet: not a gap


def test_no_router_series_is_missing() -> None:
    snap = snapshot(fresh_answers(router_age=[], router_samples=[]))
    assert snap.missing == ("router_age: no fresh router metrics (tandem_router_*) for this PDDeployment",)


# A MultiPortExternal prefill pod pair (2 pods x 2 rank ports, each port a scrape target with its own
# engine's series) and one decode pod: (pod, instance, age in seconds) of each target's newest sample.
RANK_TARGETS = [
    ("llm-prefill-0", "127.0.1.1:8000", 1.0),
    ("llm-prefill-0", "127.0.1.1:8001", 1.0),
    ("llm-prefill-0-1", "127.0.1.2:8000", 1.0),
    ("llm-prefill-0-1", "127.0.1.2:8001", 1.0),
]
SILENT_RANK_CASES = [
    # id, targets answered (age), prefill targets counted, the stale line expected ("" none)
    ("every-rank-port", RANK_TARGETS, 4, ""),
    # A port that fails to scrape has no series at the next instant query (Prometheus marks its
    # series stale at the failed scrape), while its pod's other port answers: one target fewer.
    ("a-rank-port-silent", RANK_TARGETS[:3], 3, ""),
    (
        "a-rank-port-stale",
        [*RANK_TARGETS[:3], ("llm-prefill-0-1", "127.0.1.2:8001", 40.0)],
        3,
        "engine_age: pod llm-prefill-0-1 (127.0.1.2:8001) last scraped 40s ago",
    ),
    ("a-pod-silent", RANK_TARGETS[:2], 2, ""),
]


@pytest.mark.parametrize(
    ("targets", "counted", "stale"), [c[1:] for c in SILENT_RANK_CASES], ids=[c[0] for c in SILENT_RANK_CASES]
)
def test_engines_report_per_scrape_target(
    targets: list[tuple[str, str, float]], counted: int, stale: str
) -> None:
    """Reporting is counted per scrape target (pod and port), so a rank whose port Prometheus cannot
    scrape leaves the pool with fewer reporting targets than its ready replicas have (partial), not its
    pod counted whole while that rank's load goes unseen."""
    role = "tandem_dev_role"
    decode = {"pod": "llm-decode-0", "instance": "127.0.2.1:8000", role: "decode"}
    answers = fresh_answers(
        engine_age=[
            *(sample(age, pod=pod, instance=instance, **{role: "prefill"}) for pod, instance, age in targets),
            sample(0.4, **decode),
        ],
        engine_samples=[
            *(sample(60, pod=pod, instance=instance, **{role: "prefill"}) for pod, instance, _ in targets),
            sample(60, **decode),
        ],
    )
    snap = snapshot(answers, sizes={"prefill": PoolSize(1, 1), "decode": PoolSize(1, 1)})
    assert snap.pools["prefill"].scraped_targets == counted
    assert snap.pools["decode"].scraped_targets == 1
    assert len(snap.missing) == (1 if stale else 0), snap.missing
    if stale:
        assert snap.missing[0].startswith(stale)  # ... more than 3 scrape intervals (~2.0s)


def test_the_freshness_queries_keep_each_scrape_target() -> None:
    queries = snapshot_queries("ns", "llm", 120, 0.95)
    assert queries["engine_age"].startswith("max by (pod, instance, tandem_dev_role) (")
    assert queries["engine_samples"].startswith("min by (pod, instance, tandem_dev_role) (")


def test_an_slo_the_routers_do_not_count_is_missing() -> None:
    snap = snapshot(fresh_answers(path_within_slo_rate=[]))
    assert len(snap.missing) == 1
    assert snap.missing[0].startswith("path_within_slo_rate:")
    # Without an SLO nothing is counted and nothing is expected.
    no_slo = snapshot(fresh_answers(path_within_slo_rate=[]), slo_set=False)
    assert no_slo.missing == ()
    assert no_slo.paths["disaggregated"].within_slo_rate == 0


def test_failed_queries_are_named() -> None:
    errors = {"path_ttft": "ConnectionError: refused", "waiting": "no answer within 5s"}
    answers = fresh_answers()
    del answers["path_ttft"], answers["waiting"]
    snap = snapshot(answers, errors)
    assert snap.missing == ("path_ttft: ConnectionError: refused", "waiting: no answer within 5s")
    assert not snap.has_data


def test_every_query_failing_gives_only_their_errors() -> None:
    errors = {name: "ConnectionError: refused" for name in snapshot_queries("ns", "llm", 60, 0.95)}
    snap = snapshot({}, errors, sizes={"decode": PoolSize(1, 1)})
    # One line for the one error, naming how many queries it hit (status-only ones not counted).
    held = sorted(name for name in errors if name not in BUCKET_LATENCIES)
    assert len(held) == len(errors) - len(BUCKET_LATENCIES)
    assert snap.missing == (f"ConnectionError: refused ({len(held)} queries: {', '.join(held[:3])}, ...)",)


def test_distinct_errors_each_get_a_line_naming_their_query() -> None:
    errors = {"engine_age": "timeout", "waiting": "HTTP 500", "running": "HTTP 500"}
    assert failed_queries(errors) == ["HTTP 500 (2 queries: running, waiting)", "engine_age: timeout"]


def test_recorded_answers_from_the_dev_cluster() -> None:
    """Answers recorded from the dev cluster's Prometheus (tests/integration/metrics) parse as there."""
    recorded = json.loads((DATA / "snapshot_answers.json").read_text())
    snap = build_snapshot(
        recorded["results"],
        {},
        now=recorded["now"],
        window_seconds=recorded["window_seconds"],
        slo_set=True,
        sizes={role: PoolSize(1, 1) for role in ("prefill", "decode")},
    )
    assert snap.missing == ()
    assert snap.paths["disaggregated"].request_rate > 0
    assert snap.paths["disaggregated"].within_slo_rate > 0
    assert snap.pools["prefill"].scraped_targets == snap.pools["decode"].scraped_targets == 1
    assert snap.pools["decode"].generation_tokens_rate > 0
    # 8-token outputs, all in vLLM's bucket (5, 10]; no preemption (a series that reads 0)
    decode = snap.pools["decode"]
    assert 64 < decode.output_tokens_second_moment <= 1.07 * decode.mean_output_tokens**2
    assert decode.mean_output_tokens == pytest.approx(8)
    assert decode.preemptions_rate == 0
    assert {"preemptions_rate", "output_tokens_buckets"} <= set(recorded["results"])
    parts = snap.paths["disaggregated"].ttft_breakdown
    assert parts is not None
    assert parts.prefill_queue is not None
    assert parts.kv_transfer is not None
    assert 0 < parts.prefill_leg + parts.decode_first_token <= parts.ttft * 1.05


# --- pod loads --------------------------------------------------------------------------------------


def pod_answers(**over: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    answers = {
        "pod_age": [sample(1, pod="p-0"), sample(1, pod="p-1"), sample(1, pod="d-0")],
        "pod_targets": [sample(1, pod="p-0"), sample(1, pod="p-1"), sample(2, pod="d-0")],
        "pod_samples": [sample(30, pod="p-0"), sample(30, pod="p-1"), sample(30, pod="d-0")],
        "pod_running": [sample(0, pod="p-0"), sample(0, pod="p-1"), sample(2, pod="d-0")],
        "pod_waiting": [sample(0, pod="p-0"), sample(0, pod="p-1"), sample(1, pod="d-0")],
        "pod_kv_held_blocks": [sample(7, pod="p-0")],
        "pod_kv_usage": [sample(0.5, pod="p-0"), sample(0.25, pod="p-1"), sample(0.3, pod="d-0")],
        "pod_cache_config": [
            {"metric": {"pod": "p-1", "num_gpu_blocks": "1000", "block_size": "16"}, "value": [NOW, "1"]}
        ],
    }
    answers |= over
    return answers


def test_pod_loads() -> None:
    loads = build_pod_loads(pod_answers(), ["p-0", "p-1", "d-0", "gone-0"])
    assert set(loads) == {"p-0", "p-1", "d-0"}  # no series: no known load
    assert loads["p-0"].kv_blocks_held == 7  # the sim's exact figure
    assert loads["p-1"].kv_blocks_held == 250  # vLLM: usage x num_gpu_blocks
    assert (loads["d-0"].running, loads["d-0"].waiting) == (2, 1)
    assert math.isnan(loads["d-0"].kv_blocks_held)  # unknown (irrelevant for decode)


def test_a_stale_pod_has_no_known_load() -> None:
    loads = build_pod_loads(pod_answers(pod_age=[sample(30, pod="p-0")]), ["p-0"])
    assert loads == {}


@pytest.mark.parametrize(
    ("targets", "known"),
    [
        (None, {"p-0", "p-1", "d-0"}),  # one target each expected
        ({"d-0": 2}, {"p-0", "p-1", "d-0"}),  # both of d-0's rank ports report
        ({"d-0": 3}, {"p-0", "p-1"}),  # a rank port of d-0 silent: its sums miss that rank's requests
        ({"p-0": 2, "p-1": 1}, {"p-1", "d-0"}),
    ],
)
def test_a_pod_with_a_silent_scrape_target_has_no_known_load(
    targets: dict[str, int] | None, known: set[str]
) -> None:
    """A MultiPortExternal pod reports from a target per rank port: with fewer targets fresh than it
    has, its running and waiting sums cover only the ranks that report, so its load is unknown."""
    loads = build_pod_loads(pod_answers(), ["p-0", "p-1", "d-0"], targets=targets)
    assert set(loads) == known


def test_the_pod_targets_query_counts_distinct_instances() -> None:
    promql = pod_load_queries("ns", ["d-0"])["pod_targets"]
    assert promql.startswith("count by (pod) (count by (pod, instance) (vllm:num_requests_running {")


def test_the_prompt_buckets_give_the_second_moment() -> None:
    """vLLM's cumulative `le` buckets by role: prefill's 4 prompts, 2 in (0, 10] and 2 in (10, 20], mean
    12 (from _sum/_count): bucketed E[n] 10, E[n^2] 133.3, ratio 4/3, so E[n^2] = 4/3 x 144 = 192."""
    role = "tandem_dev_role"
    buckets = [
        sample(2, le="10.0", **{role: "prefill"}),
        sample(4, le="20.0", **{role: "prefill"}),
        sample(4, le="+Inf", **{role: "prefill"}),
        sample(0, le="10.0", **{role: "decode"}),
    ]
    answers = fresh_answers(
        prompt_tokens_buckets=buckets,
        mean_prompt_tokens=[sample(12, **{role: "prefill"}), sample("NaN", **{role: "decode"})],
    )
    pools = snapshot(answers).pools
    assert pools["prefill"].prompt_tokens_second_moment == pytest.approx(192.0)
    assert pools["decode"].prompt_tokens_second_moment == 0.0  # no prompts in the window
    assert pools["colocated"].prompt_tokens_second_moment == 0.0  # no series


def test_the_output_buckets_and_preemptions() -> None:
    """vllm:request_generation_tokens' buckets give decode's outputs' second moment as the prompts'
    (2 in (0, 10], 2 in (10, 20], mean 12: 192), and vllm:num_preemptions_total's rate is the pool's
    preemptions per second; a pool without either series reads 0 (none, or not exported)."""
    role = "tandem_dev_role"
    buckets = [
        sample(2, le="10.0", **{role: "decode"}),
        sample(4, le="20.0", **{role: "decode"}),
        sample(4, le="+Inf", **{role: "decode"}),
    ]
    answers = fresh_answers(
        output_tokens_buckets=buckets,
        mean_output_tokens=[sample(1, **{role: "prefill"}), sample(12, **{role: "decode"})],
        preemptions_rate=[sample(0.25, **{role: "decode"}), sample(0, **{role: "prefill"})],
    )
    pools = snapshot(answers).pools
    assert pools["decode"].output_tokens_second_moment == pytest.approx(192.0)
    assert pools["decode"].preemptions_rate == 0.25
    assert pools["prefill"].preemptions_rate == 0.0
    assert pools["prefill"].output_tokens_second_moment == 0.0  # no buckets for it
    queries = snapshot_queries("ns", "llm", 120, 0.95)
    assert queries["preemptions_rate"] == (
        'sum by (tandem_dev_role) (rate(vllm:num_preemptions_total {namespace="ns",'
        'tandem_dev_pddeployment="llm",tandem_dev_role=~"prefill|decode|colocated"} [120s]))'
    )
    assert "vllm:request_generation_tokens_bucket" in queries["output_tokens_buckets"]
