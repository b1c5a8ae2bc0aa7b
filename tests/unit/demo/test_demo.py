"""The demo's pure parts: the trace window, latency statistics, router metrics parsing, the panel."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tandem.demo import trace, view
from tandem.demo.cluster import parse_router_metrics
from tandem.demo.stats import Sample, Tally
from tandem.perf.stats import percentile

CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:47.1805900,100,10
2023-11-16 18:15:48.6805900,16000,1000
2023-11-16 18:15:50.6805900,50,5
"""


def test_window_retimes_stretches_and_drops_what_does_not_fit() -> None:
    rows = trace.parse_azure_csv(CSV)
    assert [r[0] for r in rows] == pytest.approx([0.0, 0.5, 2.0, 4.0])
    got = trace.window(rows, start_s=0.5, length_s=3.0, rate_scale=0.5, max_model_len=16384)
    # the 16000+1000 request does not fit 16384 and is dropped, not truncated
    assert got == [trace.TraceRequest(0.0, 100, 10)]
    got = trace.window(rows, start_s=0.0, length_s=10.0, rate_scale=2.0, max_model_len=20000)
    assert [r.at for r in got] == pytest.approx([0.0, 0.25, 1.0, 2.0])
    with pytest.raises(ValueError, match="rate_scale"):
        trace.window(rows, start_s=0, length_s=1, rate_scale=0, max_model_len=1)


def test_prompt_ids_have_the_length_asked_and_differ_per_request() -> None:
    assert len(trace.prompt_ids(3, 1000)) == 1000
    assert trace.prompt_ids(1, 50) != trace.prompt_ids(2, 50)
    assert all(1 <= t <= 32000 for t in trace.prompt_ids(7, 500))


def test_percentiles_and_attainment() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 90) == 4.0
    assert math.isnan(percentile([], 50))
    tally = Tally()
    tally.add(Sample(ok=True, ttft_s=0.1, tpot_s=0.01, output_tokens=10, input_tokens=100))
    tally.add(Sample(ok=True, ttft_s=0.9, tpot_s=0.01, output_tokens=10, input_tokens=100))
    tally.add(Sample(ok=True, ttft_s=0.1, tpot_s=math.nan, output_tokens=1, input_tokens=100))
    tally.add(Sample(ok=False, error="HTTP 503"))
    assert tally.attainment(0.5, 0.05) == 0.5  # two of four: one too slow, one failed
    assert tally.tokens() == (300, 21)
    assert tally.ttft(50) == 0.1


def test_router_metrics() -> None:
    text = (
        'tandem_router_ready_endpoints{role="prefill"} 1.0\n'
        'tandem_router_ready_endpoints{role="decode"} 3.0\n'
        'tandem_router_requests_total{code="2xx",path="disaggregated"} 40.0\n'
        'tandem_router_requests_total{code="5xx",path="disaggregated"} 2.0\n'
    )
    assert parse_router_metrics(text) == ({"prefill": 1, "decode": 3}, 42.0)


def test_panel_shows_pools_latency_against_slo_and_events() -> None:
    pdd = {
        "metadata": {"namespace": "default", "name": "sim-pd", "generation": 2},
        "spec": {"prefill": {"replicas": 1}, "decode": {"replicas": 3}},
        "status": {
            "observedGeneration": 2,
            "phase": "Progressing",
            "conditions": [{"type": "Ready", "status": "False", "reason": "WaitingForReplicas"}],
            "pools": {
                "prefill": {"readyReplicas": 1, "desiredReplicas": 1, "gpus": 1},
                "decode": {"readyReplicas": 2, "desiredReplicas": 3, "gpus": 3},
                "router": {"readyReplicas": 1, "desiredReplicas": 1},
            },
        },
    }
    tally = Tally(sent=2)
    tally.add(Sample(ok=True, ttft_s=0.6, tpot_s=0.01, output_tokens=10, input_tokens=100, sent_at=995.0))
    snap = view.Snapshot(
        now=1000.0,
        elapsed_s=12,
        stage="replaying",
        pdd=pdd,
        events=["3s ago  Normal  Applied: applied StatefulSet/sim-pd-decode"],
        router_endpoints={"decode": 2},
        replay_total=5,
        replay_elapsed_s=4,
    )
    text = view.panel(snap, tally)
    assert "decode    2/3 ready  [##.     ]  3 GPU   router sees 2" in text
    assert "phase Progressing, Ready=False (WaitingForReplicas)" in text
    assert "500 at p90: MISS" in text  # TTFT 600 ms against 500
    assert "50 at p90: ok" in text
    assert "Applied: applied StatefulSet/sim-pd-decode" in text
    assert "sent 2/5  served 1  failed 0" in text
    assert "TPOT ms       p50 10" in view.report(snap, tally, {"replay": 4.0})


def test_surge_replays_consecutive_trace_windows_at_their_own_rates() -> None:
    rows = [(float(t), 100 + t, 10) for t in range(20)]  # one request a second
    segments = [
        trace.Segment("quiet", wall_seconds=20, rate_scale=0.25),  # trace 0-5 s over 20 s
        trace.Segment("surge", wall_seconds=10, rate_scale=1.0),  # trace 5-15 s over 10 s
    ]
    got = trace.surge(rows, start_s=0.0, segments=segments, max_model_len=4096)
    quiet = [r for r in got if r.phase == "quiet"]
    surge = [r for r in got if r.phase == "surge"]
    assert [r.at for r in quiet] == pytest.approx([0, 4, 8, 12, 16])
    assert [r.at for r in surge] == pytest.approx([20 + i for i in range(10)])
    assert surge[0].input_tokens == 105  # the trace goes on where the quiet part stopped


def test_demo_manifest_is_a_valid_autoscaled_pddeployment() -> None:
    from pathlib import Path

    import yaml

    from tandem.api.models import PDDeployment
    from tandem.demo import manifest

    example = Path(__file__).parents[3] / "examples" / "sim-pd-autoscaling.yaml"
    doc = manifest.demo_manifest(yaml.safe_load(example.read_text()))
    pdd = PDDeployment.model_validate(doc)
    assert pdd.spec.autoscaling.enabled
    assert pdd.spec.autoscaling.interval_seconds == 5
    assert pdd.spec.slo is not None
    assert pdd.spec.slo.ttft_ms == manifest.SLO["ttftMs"]
    env = {e.name: e.value for e in pdd.spec.engine.env}
    assert env["TANDEM_SIM_TIME_SCALE"] == str(manifest.TIME_SCALE)
    assert env["TANDEM_SIM_LOAD_SECONDS"] == str(manifest.LOAD_SECONDS)
    assert pdd.spec.prefill.autoscaling is not None
    # Prefill may grow into every GPU decode's minimum leaves (the surge needs 6-8 pods).
    assert pdd.spec.decode.autoscaling is not None
    assert pdd.spec.max_gpus is not None
    assert pdd.spec.prefill.autoscaling.max_replicas == 7
    assert (
        pdd.spec.prefill.autoscaling.max_replicas + pdd.spec.decode.autoscaling.min_replicas
        == pdd.spec.max_gpus
    )
    assert "--max-num-batched-tokens" in pdd.spec.prefill.engine_args
    assert "intervalSeconds 5" not in manifest.describe()  # prose, not field names
    assert "decisions every 5s" in manifest.describe()


def test_panel_shows_the_autoscaler_decisions_and_status_slo() -> None:
    pdd = {
        "metadata": {"namespace": "default", "name": "sim-pd-autoscaling", "generation": 1},
        "spec": {
            "prefill": {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
            "decode": {"replicas": 1},
            "slo": {"ttftMs": 4000, "tpotMs": 100, "attainmentPercent": 90},
            "autoscaling": {"enabled": True, "intervalSeconds": 5},
        },
        "status": {
            "conditions": [
                {
                    "type": "AutoscalingActive",
                    "status": "True",
                    "reason": "Active",
                    "message": "prefill 1 -> 3",
                }
            ],
            "pools": {"prefill": {"readyReplicas": 1, "desiredReplicas": 3, "gpus": 3}},
            "autoscaling": {
                "mode": "Active",
                "pools": {
                    "prefill": {
                        "desiredReplicas": 3,
                        "lastDecision": {
                            "time": "2026-11-30T10:00:00Z",
                            "from": 1,
                            "to": 3,
                            "reason": "prompt tokens 2.4k/s + queue 9k over 5 s need 4 replicas",
                        },
                    }
                },
            },
            "slo": {"ttftMs": 5200.0, "tpotMs": 30.0, "attainmentPercent": 71.5, "windowSeconds": 60},
        },
    }
    now = view.rfc3339_seconds("2026-11-30T10:00:12Z")
    tally = Tally(sent=3)
    tally.add(Sample(ok=True, ttft_s=6.0, tpot_s=0.02, output_tokens=10, sent_at=now - 100))  # old
    tally.add(Sample(ok=True, ttft_s=1.0, tpot_s=0.02, output_tokens=10, sent_at=now - 10))
    snap = view.Snapshot(elapsed_s=99, stage="replaying", pdd=pdd, now=now, ttft_slo_ms=4000, tpot_slo_ms=100)
    snap.attainment_target = 90.0
    text = view.panel(snap, tally)
    assert "prefill   1/3 ready  [#..     ]  3 GPU" in text
    assert "autoscaler: Active, a decision every 5s; AutoscalingActive=True (Active): prefill 1 -> 3" in text
    assert "prefill  12s ago: 1 -> 3: prompt tokens 2.4k/s" in text
    # the recent column only has the 1 s request: the mark is on it, not on the whole run
    assert "4000 at p90: ok" in text
    assert "at the client: 50.0% of all, last 30s 100.0%" in text
    assert "routers (status.slo, 60s window): TTFT p90 5200 ms, TPOT p90 30 ms, within both 71.5%" in text
    assert "(target 90%)" in text
    decisions = [{"pool": "prefill", "at": 41.0, "from": 1, "to": 3, "reason": "queue"}]
    report = view.report(snap, tally, {"replay": 160.0}, decisions)
    assert "+41s prefill 1 -> 3: queue" in report
    assert "1 size changes" in report


def test_panel_says_no_change_yet_for_a_first_pass_record_and_report_has_segments() -> None:
    decision = {"time": "2026-11-30T10:00:00Z", "from": 1, "to": 1, "reason": "no data: ..."}
    pdd = {
        "spec": {"autoscaling": {"enabled": True}},
        "status": {
            "autoscaling": {
                "mode": "Active",
                "pools": {"decode": {"desiredReplicas": 1, "lastDecision": decision}},
            }
        },
    }
    lines = view.autoscaler_lines(pdd, now=0.0)
    assert "  decode   no size change yet: holding 1" in lines
    snap = view.Snapshot(elapsed_s=1, stage="done", pdd=pdd)
    segments = [
        {"label": "surge", "requests": 10, "rate_scale": 0.35, "failed": 0, "ttft_ms_p90": 9000.4,
         "tpot_ms_p90": 22.0, "within_slo": 0.6},
    ]  # fmt: skip
    text = view.report(snap, Tally(), {}, (), segments)
    assert (
        "surge         10 requests at x0.35, 0 failed, TTFT p90 9000 ms, TPOT p90 22 ms, 60.0% within both"
        in text
    )


@pytest.mark.parametrize(
    ("last", "settled", "expected"),
    [
        (
            {"label": "surge, last 30 s", "requests": 40, "within_slo": 0.95},
            True,
            "SLO held: surge, last 30 s: 95.0% of 40 requests within both targets (target 90%);"
            " pools back at their minimum",
        ),
        (
            {"label": "surge, last 30 s", "requests": 40, "within_slo": 0.69},
            True,
            "SLO MISS: surge, last 30 s: 69.0% of 40 requests within both targets (target 90%);"
            " pools back at their minimum",
        ),
        (
            {"label": "surge, last 30 s", "requests": 40, "within_slo": 0.9},
            False,
            "SLO held: surge, last 30 s: 90.0% of 40 requests within both targets (target 90%);"
            " pools NOT back at their minimum",
        ),
        (
            {"label": "surge, last 30 s", "requests": 0, "within_slo": None},
            True,
            "no verdict: no request in the surge's last seconds; pools back at their minimum",
        ),
        (None, True, "no verdict: no request in the surge's last seconds; pools back at their minimum"),
    ],
    ids=["held", "miss", "held-not-settled", "no-requests", "no-surge"],
)
def test_the_verdict_judges_the_surges_end_against_the_attainment_target(
    last: dict[str, Any] | None, settled: bool, expected: str
) -> None:
    assert view.verdict(last, 90.0, settled) == expected


def test_each_decision_shows_its_attributed_cause() -> None:
    d = {"at": 47.2, "pool": "prefill", "from": 1, "to": 2, "reason": "queue", "cause": "prefillQueue"}
    assert view.decision_line(d) == "  +47s prefill  1 -> 2 [prefillQueue]: queue"
    assert view.decision_line({**d, "cause": None}) == "  +47s prefill  1 -> 2: queue"
    snap = view.Snapshot(elapsed_s=0.0, stage="done")
    text = view.report(snap, Tally(), {}, [d], (), "SLO held: surge, last 30 s: ...")
    assert "verdict       SLO held: surge, last 30 s" in text
