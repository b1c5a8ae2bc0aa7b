"""The demo's pure parts: the trace window, latency statistics, router metrics parsing, the panel."""

from __future__ import annotations

import math

import pytest

from tandem.demo import trace, view
from tandem.demo.cluster import parse_router_metrics
from tandem.demo.stats import Sample, Tally, percentile

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
    tally.add(Sample(ok=True, ttft_s=0.6, tpot_s=0.01, output_tokens=10, input_tokens=100))
    snap = view.Snapshot(
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
