"""The rollout scenario's pure parts (`tandem.demo.gray`): its manifest, the path a request took,
the router's per-path counters, the panel and the report; and the scenario switch of `main`."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeployment
from tandem.demo import gray, main
from tandem.demo.stats import Sample, Tally
from tandem.demo.view import Snapshot
from tandem.routing.paths import draw_for

EXAMPLE = Path(__file__).parents[3] / "examples" / "sim-gray-rollout.yaml"


def test_the_manifest_is_the_example_with_the_demo_settings_in_either_mode() -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    colocated = gray.rollout_manifest(example, "Colocated")
    switched = gray.rollout_manifest(example, "Disaggregated")
    for doc, mode in ((colocated, "Colocated"), (switched, "Disaggregated")):
        pdd = PDDeployment.model_validate(doc)
        assert pdd.spec.serving.mode == mode
        assert pdd.spec.rollout is not None
        assert [s.weight for s in pdd.spec.rollout.steps] == [s["weight"] for s in gray.STEPS]
        assert pdd.spec.rollout.auto_rollback
        assert pdd.spec.rollout.analysis.window_seconds == gray.ANALYSIS["windowSeconds"]
        assert pdd.spec.rollout.analysis.attainment_floor == gray.ANALYSIS["attainmentFloor"]
        assert pdd.spec.slo is not None
        assert pdd.spec.slo.tpot_ms == gray.SLO["tpotMs"]
        env = {e.name: e.value for e in pdd.spec.engine.env}
        assert env["TANDEM_SIM_LOAD_SECONDS"] == str(gray.LOAD_SECONDS)
    # a user's change: only serving.mode differs between the two applies
    colocated["spec"]["serving"]["mode"] = "Disaggregated"
    assert colocated == switched
    assert example["spec"]["serving"]["mode"] == "Colocated", "the example is not changed in place"
    assert "steps 20% (10s) -> 50% (10s) -> 100%" in gray.describe()
    assert "at least 80% within the SLO and at most 25% below colocated" in gray.describe()


def _pdd(
    rollout: dict[str, Any] | None, mode: str = "Colocated", ready: dict[str, int] | None = None
) -> dict[str, Any]:
    ready = {"colocated": 1, "prefill": 1, "decode": 1} if ready is None else ready
    status: dict[str, Any] = {
        "mode": mode,
        "pools": {role: {"readyReplicas": n, "replicas": n} for role, n in ready.items()},
    }
    if rollout is not None:
        status["rollout"] = rollout
    return {"status": status}


@pytest.mark.parametrize(
    ("pdd", "share"),
    [
        ({}, None),
        (_pdd(None, "Colocated"), 0),
        (_pdd(None, "Disaggregated"), 100),
        (_pdd({"target": "Disaggregated", "phase": "Shifting", "weight": 50}), 50),
        (_pdd({"target": "Colocated", "phase": "Shifting", "weight": 20}, "Disaggregated"), 80),
        # P/D not ready yet (decode loading): the router keeps every request on colocated
        (_pdd({"target": "Disaggregated", "weight": 20}, ready={"colocated": 1, "prefill": 1}), 0),
        # a fall-back: weight 0, but colocated is still loading: P/D keeps serving
        (_pdd({"target": "Disaggregated", "weight": 0}, "Disaggregated", {"prefill": 1, "decode": 1}), 100),
        (_pdd({"target": "Disaggregated", "phase": "Promoted", "weight": 100}, "Disaggregated"), 100),
    ],
)
def test_routed_pd_share_follows_status_and_readiness(pdd: dict[str, Any], share: int | None) -> None:
    assert gray.routed_pd_share(pdd) == share


def _id_with_draw(low: float, high: float) -> str:
    return next(f"r{i}" for i in itertools.count() if low <= draw_for(f"r{i}") < high)


def test_path_of_uses_the_routers_draw_and_leaves_changes_unattributed() -> None:
    timeline = gray.ShareTimeline()
    for at, share in ((100.0, 0), (101.0, 0), (200.0, 20), (230.0, 50), (260.0, 100)):
        timeline.see(at, share)
    assert timeline.points == [(100.0, 0), (200.0, 20), (230.0, 50), (260.0, 100)]
    low, mid, high = _id_with_draw(0.0, 0.2), _id_with_draw(0.2, 0.5), _id_with_draw(0.5, 1.0)

    def path(rid: str, sent: float) -> str:
        return gray.path_of(Sample(ok=True, sent_at=sent, request_id=rid), timeline, slack=3.0)

    assert path(low, 150.0) == "colocated"  # share 0
    assert path(low, 215.0) == "disaggregated"  # share 20, draw below it
    assert path(mid, 215.0) == "colocated"
    assert path(mid, 245.0) == "disaggregated"
    assert path(high, 245.0) == "colocated"
    assert path(high, 300.0) == "disaggregated"
    assert path(low, 201.0) == "unattributed"  # 0 or 20: the router may not have seen the change yet
    assert path(low, 231.0) == "disaggregated"  # 20 or 50: the draw is below both
    assert path(mid, 231.0) == "unattributed"
    assert path(low, 50.0) == "unattributed"  # before anything was seen
    assert gray.path_of(Sample(ok=True, sent_at=215.0), timeline) == "unattributed"  # no request id
    assert gray.path_of(Sample(ok=True, request_id=low), timeline) == "unattributed"  # never sent
    paths = gray.by_path([Sample(ok=True, sent_at=215.0, request_id=low)], timeline)
    assert list(paths) == list(gray.PATHS)
    assert len(paths["disaggregated"].samples) == 1


def test_router_requests_by_path_sums_codes_in_any_label_order() -> None:
    text = (
        "# HELP tandem_router_requests_total Client requests.\n"
        'tandem_router_requests_total{code="2xx",path="disaggregated"} 40.0\n'
        'tandem_router_requests_total{path="disaggregated",code="5xx"} 2.0\n'
        'tandem_router_requests_total{code="2xx",path="colocated"} 7.0\n'
        'tandem_router_requests_created{code="2xx",path="colocated"} 1.7e9\n'
    )
    assert gray.router_requests_by_path(text) == {"disaggregated": 42.0, "colocated": 7.0}


VERDICT = {
    "step": 1,
    "result": "Fail",
    "reason": "9 requests on the target arm: SLO attainment 0.0% below the floor 90.0%",
    "windowStart": 1040.0,
    "windowEnd": 1050.0,
    "figures": {
        "targetRequests": 9.0,
        "targetAttainment": 0.0,
        "targetTtftSeconds": 0.25,
        "targetTpotSeconds": 0.121,
        "baselineRequests": 0.0,
    },
}


def test_rollout_lines_show_phase_step_weight_reason_and_verdict_figures() -> None:
    pdd = {
        "spec": {"serving": {"mode": "Disaggregated"}, "rollout": {"steps": gray.STEPS}},
        "status": {
            "mode": "Colocated",
            "rollout": {
                "target": "Disaggregated",
                "phase": "Shifting",
                "step": 1,
                "weight": 50,
                "attempt": 1,
                "phaseSince": 1030.0,
                "reason": "step 1: 50% to the target arm",
                "verdicts": [VERDICT],
            },
        },
    }
    text = "\n".join(gray.rollout_lines(pdd, now=1052.0, started=1000.0))
    assert "spec.serving.mode Disaggregated, mode in effect (status.mode) Colocated" in text
    assert "rollout to Disaggregated: Shifting, step 2/3, weight 50%, attempt 1, 22s in the phase" in text
    assert "P/D share [##########..........] 50%   colocated 50%" in text
    assert "reason: step 1: 50% to the target arm" in text
    assert "+50s step 1 Fail: 9 requests on the target arm" in text
    assert "          target   9 req, TTFT 250 ms, TPOT 121 ms, within SLO 0.0%\n" in text
    assert "          baseline 0 req, TTFT - ms" in text
    none = gray.rollout_lines({"status": {"mode": "Colocated"}}, now=0.0, started=0.0)
    assert none[1].startswith("rollout: none")


def test_panel_shows_the_fault_and_client_latency_per_path_against_the_slo() -> None:
    timeline = gray.ShareTimeline([(900.0, 0), (1000.0, 100)])
    low = _id_with_draw(0.0, 1.0)
    tally = Tally(sent=3)
    tally.add(Sample(ok=True, ttft_s=0.2, tpot_s=0.01, output_tokens=9, sent_at=990.0, request_id=low))
    tally.add(Sample(ok=True, ttft_s=0.3, tpot_s=0.2, output_tokens=9, sent_at=1040.0, request_id=low))
    tally.add(Sample(ok=False, error="HTTP 503", sent_at=1041.0, request_id=low))
    pdd = _pdd({"target": "Disaggregated", "phase": "Promoted", "weight": 100}, "Disaggregated")
    pdd["metadata"] = {"namespace": "default", "name": "sim-gray"}
    snap = Snapshot(elapsed_s=80, stage="the fault", pdd=pdd, now=1050.0, ttft_slo_ms=1000, tpot_slo_ms=50)
    snap.recent_seconds = 60.0
    gv = gray.GrayView(
        switched_at=1000.0,
        fault="every decode engine slowed x10",
        fault_at=1030.0,
        timeline=timeline,
        router_paths={"disaggregated": 2.0, "colocated": 1.0},
    )
    text = gray.panel(snap, tally, gv)
    assert "FAULT at +30s: every decode engine slowed x10" in text
    assert "(router counted colocated 1, disaggregated 2)" in text
    assert "colocated             1      0    200 ms     10 ms     100.0%  TTFT ok, TPOT ok" in text
    assert "disaggregated         2      1    300 ms    200 ms       0.0%  TTFT ok, TPOT MISS" in text
    assert "unattributed" not in text  # no such request


def test_phase_history_and_the_report_give_times_cause_and_figures() -> None:
    r = {"target": "Disaggregated", "step": 0, "weight": 0, "reason": "x"}
    readings = [
        (999.0, {}),
        (1001.0, {**r, "phase": "Preparing"}),
        (1002.0, {**r, "phase": "Preparing"}),
        (1010.0, {**r, "phase": "Shifting", "weight": 20}),
        (1040.0, {**r, "phase": "Promoted", "step": 2, "weight": 100}),
        (1075.0, {**r, "phase": "RollingBack", "weight": 0, "reason": "steady P/D breach: TPOT"}),
        (1090.0, {**r, "phase": "RolledBack", "weight": 0}),
    ]
    history = gray.phase_history(readings)
    assert [(h["phase"], h["weight"]) for h in history] == [
        ("Preparing", 0),
        ("Shifting", 20),
        ("Promoted", 100),
        ("RollingBack", 0),
        ("RolledBack", 0),
    ]
    assert gray.first_at(history, 1000.0, phase="Promoted") == 1040.0
    assert gray.first_at(history, 1050.0, phase="Promoted") is None
    for h in history:
        h["rel"] = h["at"] - 1000.0
    fig = gray.path_figures(Tally(samples=[Sample(ok=True, ttft_s=0.1, tpot_s=0.2)]), 1000, 50)
    assert fig == {"requests": 1, "failed": 0, "ttft_ms_p90": 100.0, "tpot_ms_p90": 200.0, "within_slo": 0.0}
    summary = {
        "settings": "steps ...",
        "requests": 10,
        "ok": 10,
        "failed": 0,
        "router_paths": {"colocated": 6.0, "disaggregated": 4.0},
        "slo_ms": {"ttft": 1000.0, "tpot": 50.0},
        "history": history,
        "promote_s": 40.0,
        "colocated_zero_s": 47.5,
        "fault": {
            "what": "decode slowed x10",
            "rel": 60.0,
            "cause": "steady P/D breach: TPOT",
            "to_weight_0_s": 14.2,
            "to_colocated_ready_s": 20.0,
            "to_pd_zero_s": None,
            "to_rolled_back_s": 30.0,
            "to_last_pd_request_s": 19.5,
            "verdict": VERDICT,
            "pd_client": {"requests": 23, "ttft_ms_p90": 293.6, "tpot_ms_p90": 83.3, "within_slo": 0.0},
        },
        "stages": [{"label": "P/D steady", "paths": {"disaggregated": fig, "colocated": {"requests": 0}}}],
        "stage_seconds": {"rollout": 40.0},
    }
    text = gray.report(summary)
    assert "+75.0s  RollingBack step 0 weight   0% -> Disaggregated: steady P/D breach: TPOT" in text
    assert "100% P/D 40.0s after the mode change, colocated scaled to 0 at +47.5s" in text
    assert "fault         decode slowed x10 at +60.0s" in text
    assert "cause         steady P/D breach: TPOT" in text
    assert "                target   9 req, TTFT 250 ms, TPOT 121 ms, within SLO 0.0%" in text
    assert (
        "P/D at the client from the fault to weight 0: 23 requests, TTFT p90 293.6 ms (SLO 1000),"
        " TPOT p90 83.3 ms (SLO 50), within SLO 0.0%" in text
    )
    assert "weight 0 (status.rollout, the operator's time): 14.2s" in text
    assert "the last request sent that P/D served: 19.5s" in text
    assert "P/D scaled to 0: not seen" in text
    assert "P/D steady             disaggregated     1 req, 0 failed, TTFT p90 100.0 ms" in text
    assert "10 sent, 10 ok, 0 failed" in text
    assert math.isnan(Tally().ttft(90))


def test_the_scenario_comes_from_the_flag_or_make_s_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCENARIO", raising=False)
    assert main.parse_args([]).scenario == "autoscale"
    assert main.parse_args(["--scenario", "rollout"]).scenario == "rollout"
    monkeypatch.setenv("SCENARIO", "rollout")  # `make demo SCENARIO=rollout` puts it in the environment
    assert main.parse_args([]).scenario == "rollout"
    assert main.parse_args(["--scenario", "autoscale"]).scenario == "autoscale"
    monkeypatch.setenv("SCENARIO", "bogus")
    with pytest.raises(SystemExit):
        main.parse_args([])


def test_the_rollout_scenario_summary_times_the_fault_from_the_operators_phase_change(
    tmp_path: Path,
) -> None:
    from tandem.demo.rollout import RolloutDemo

    demo = RolloutDemo(main.parse_args(["--scenario", "rollout", "--dir", str(tmp_path)]))
    demo.slo()
    assert (demo.snap.ttft_slo_ms, demo.snap.tpot_slo_ms) == (1000.0, 50.0)
    gv = demo.gv
    gv.switched_at, gv.fault_at = 1000.0, 1060.0
    for at, share in ((990.0, 0), (1007.0, 20), (1030.0, 100), (1075.4, 0)):  # 0 once colocated is ready
        gv.timeline.see(at, share)
    r = {"target": "Disaggregated", "step": 2, "weight": 100, "reason": "ok"}
    back = {
        **r,
        "phase": "RollingBack",
        "weight": 0,
        "phaseSince": 1068.4,  # the operator's time; the demo's poll saw it at 1069
        "reason": "steady P/D breach: 5 requests on the target arm: SLO attainment 50.0% below the floor",
    }
    demo.readings = [
        (995.0, {}),
        (1001.0, {**r, "phase": "Preparing", "step": 0, "weight": 0}),
        (1030.0, {**r, "phase": "Shifting"}),
        (1044.0, {**r, "phase": "Promoted"}),
        (1069.0, back),
        (1121.0, {**back, "phase": "RolledBack"}),
    ]
    both = {"readyReplicas": 1, "replicas": 1}
    none = {"readyReplicas": 0, "replicas": 0}
    demo.pool_readings = [
        (1044.0, {"colocated": both, "prefill": both, "decode": both}),
        (1049.0, {"colocated": none, "prefill": both, "decode": both}),
        (1075.4, {"colocated": both, "prefill": both, "decode": both}),
        (1121.0, {"colocated": both, "prefill": none, "decode": none}),
    ]
    low = _id_with_draw(0.0, 0.2)
    demo.tally = Tally(
        sent=4,
        samples=[
            Sample(ok=True, ttft_s=0.04, tpot_s=0.008, sent_at=995.0, request_id=low),  # colocated only
            Sample(ok=True, ttft_s=0.3, tpot_s=0.085, sent_at=1062.0, request_id=low),  # on slowed P/D
            Sample(
                ok=True, ttft_s=0.3, tpot_s=0.09, sent_at=1070.0, request_id=low
            ),  # weight 0, colocated loading
            Sample(ok=True, ttft_s=0.05, tpot_s=0.008, sent_at=1090.0, request_id=low),  # back on colocated
        ],
    )
    s = demo.summary()
    assert [h["phase"] for h in s["history"]] == [
        "Preparing",
        "Shifting",
        "Promoted",
        "RollingBack",
        "RolledBack",
    ]
    assert s["history"][0]["rel"] == 1.0
    assert s["promote_s"] == 44.0
    assert s["colocated_zero_s"] == 49.0
    fault = s["fault"]
    assert fault["to_weight_0_s"] == 8.4
    assert fault["to_colocated_ready_s"] == 15.4
    assert fault["to_pd_zero_s"] == 61.0
    assert fault["to_rolled_back_s"] == 61.0
    assert fault["cause"].startswith("steady P/D breach: 5 requests")
    assert fault["pd_client"]["requests"] == 1
    assert fault["pd_client"]["tpot_ms_p90"] == 85.0
    assert fault["to_last_pd_request_s"] == 10.0
    stages = {st["label"]: st["paths"] for st in s["stages"]}
    assert stages["colocated only"]["colocated"]["requests"] == 1
    assert stages["after weight 0"]["colocated"]["requests"] == 1
    assert stages["after weight 0"]["disaggregated"]["requests"] == 1
    assert s["requests"] == 4
    assert s["failed"] == 0
    text = gray.report(s)
    assert "weight 0 (status.rollout, the operator's time): 8.4s" in text
