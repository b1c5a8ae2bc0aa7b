"""The gray rollout end to end, on the local control plane with its real Prometheus.

The operator (a local `tandem operator` process with `--prometheus-url` = the dev cluster's
Prometheus, which scrapes the sim engines and the router every 2 s) moves one sim PDDeployment
between colocated and P/D while a streamed load goes through the operator's router at its pod IP
(127.0.0.0/8), each request measured at the client (`tandem.demo.load.BackgroundLoad`). The router
splits by `status.rollout` and labels every request with its path, which is what the analysis reads.

Compressed settings (one deployment, `gray`, for the whole module; bring-up is the expensive part):
- sim engines at `TANDEM_SIM_TIME_SCALE=1`, `TANDEM_SIM_LOAD_SECONDS=3` (a new pod is not Ready for
  3 s); pools colocated 1, prefill 1, decode 1 (fixed sizes: each arm gets its share, rounded up);
- SLO TTFT 2000 ms, TPOT 100 ms, attainment 90 %;
- rollout steps 50 % then 100 %, no pause beyond the analysis window (`pauseSeconds: 0`),
  `windowSeconds: 10`, `minSamples: 10`, `maxAttainmentDrop: 0.2`, `scaleDownDelaySeconds: 5`;
- load: 4 requests/s of 200-token prompts and 16 output tokens (about 20 requests per arm per window
  at 50 %).

The story, in order: colocated -> P/D completes step by step (kstatus and `kubectl wait` follow each
phase); P/D -> colocated (the same machine, arms swapped) with the operator killed -9 mid-rollout and
resumed from status; colocated -> P/D again with decode slowed 20x during the first step: automatic
rollback, weight first, with the time from the injection to weight 0 printed and bounded; then
`retry` and `promote` through the annotation, KV pulls failing at 10 % on decode at 100 %: automatic
rollback on the KV-transfer failure rate (in the step, or, when the step passed before the failures
showed in a judged window, right after promotion: the steady-state fall-back of a P/D deployment;
both are rollbacks, weight first); `retry` and `abort`, and an
unknown command; `retry` again and a slow P->D link during the 50 % step: automatic rollback on the
KV bandwidth ratio (the link is 1 Gb/s, pulls of 8 MiB and more judged); `retry` again and a decode
engine that hangs during the 50 % step (unready: the colocated arm stands in for the P/D share, and
those requests count as the P/D arm's failures): rollback; last, `spec.rollout` and the colocated
pool removed in one commit: the mode switches to P/D only once its pods are ready, colocated serving
until then. No client request may fail, except where all three attempts of a request hit a failing
KV pull (the router's failure rules; at most 2 allowed, about 1 in 1,000 P/D requests expected) and
the requests caught on the hung decode engine.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api import meta
from tandem.demo import e2e as harness
from tandem.demo.load import BackgroundLoad, Phase
from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import RestartableOperator, load_file

kstatus: Any = load_file("rollout_e2e_kstatus", Path(__file__).parent.parent / "gitops" / "kstatus.py")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

NAME = "gray"
TIME_SCALE = 1
LOAD_SECONDS = 3
WINDOW = 10
DELAY = 5
LOAD = Phase(4.0, 200, 16, "steady")
SLOWDOWN = 20.0
KV_FAILURE_RATE = 0.1
# The P->D link: 1 Gb/s in the spec and in the sims (rendered from it), and KV bandwidth judged over
# pulls of 8 MiB and more: a 200-token prompt moves 25 MiB of Llama-3.1-8B KV, 210 ms on this link.
# A pull's measured time also holds what the two engines' event loops add (connect, post, wake-ups).
# On a 10 Gb/s link (21 ms pulls) a CI run with every core busy judged the healthy link at 35 % of its
# pace, so about 40 ms added to each pull; against 210 ms that would read 84 %. Slow link: the sim's
# kv_bandwidth_factor fault at 0.2 (1.05 s a pull, 20 % of the link's pace; the window that fails the
# step still reads under half while fewer than three in four of its pulls came before the fault: the test
# injects it just after the step starts). TTFT stays within its 2 s SLO, so only the KV-transport
# figure can fail the step.
LINK_GBPS = 1
MIN_JUDGED_BYTES = 8 * 1024 * 1024
SLOW_LINK_FACTOR = 0.2
# A step lasts at least its window (10 s) plus the analysis period (5 s) and a scrape or two; on a
# 2-core machine shared with other sessions we allow 45 s per step and 60 s for a new arm's pods.
STEP_TIMEOUT = 45
ARM_TIMEOUT = 60
# Breach -> weight 0: the slowed requests must fill the window's attainment (a window is 10 s, the
# analysis reads every 5 s, Prometheus scrapes every 2 s); stated bound with slack for the machine.
ROLLBACK_BOUND = 2 * WINDOW + 5 + 15


def manifest(mode: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": {
            "type": "sim",
            "image": harness.IMAGE,
            "env": harness.engine_env(TIME_SCALE, LOAD_SECONDS),
        },
        "kvTransfer": {
            "connector": "NixlConnector",
            "bandwidthGbps": LINK_GBPS,
            "minJudgedTransferBytes": MIN_JUDGED_BYTES,
        },
        "prefill": harness.pool(1),
        "decode": harness.pool(1),
        "colocated": harness.pool(1),
        "serving": {"mode": mode},
        "slo": {"ttftMs": 2000, "tpotMs": 100, "attainmentPercent": 90},
        "rollout": {
            "steps": [{"weight": 50, "pauseSeconds": 0}, {"weight": 100, "pauseSeconds": 0}],
            "analysis": {
                "windowSeconds": WINDOW,
                "minSamples": 10,
                "maxAttainmentDrop": 0.2,
                "inconclusivePauseSeconds": 120,
            },
            "scaleDownDelaySeconds": DELAY,
        },
    }
    doc: dict[str, Any] = harness.pddeployment(NAME, spec)
    return doc


def rollout(seen: Any) -> dict[str, Any]:
    return dict(seen.status.get("rollout") or {})


def phase_of(seen: Any) -> tuple[str, int] | None:
    r = rollout(seen)
    return (str(r["phase"]), int(r["weight"])) if r else None


@dataclass
class Gray:
    cluster: ClusterHandle
    operator: RestartableOperator
    namespace: str
    watch: Any
    load: BackgroundLoad
    figures: dict[str, Any] = field(default_factory=dict)

    def kubectl(self, *args: str, check: bool = True) -> Any:
        return self.cluster.kubectl(*args, "-n", self.namespace, check=check)

    def set_mode(self, mode: str) -> float:
        patch = json.dumps({"spec": {"serving": {"mode": mode}}})
        self.kubectl("patch", "pdd", NAME, "--type", "merge", "-p", patch)
        return time.time()

    def command(self, value: str) -> None:
        self.kubectl("annotate", "pdd", NAME, f"{meta.ANNOTATION_ROLLOUT_COMMAND}={value}", "--overwrite")

    def wait(self, what: str, check: Callable[[Any], Any], timeout: float) -> Any:
        return self.watch.wait(what, check, timeout)

    def wait_phase(self, phase: str, weight: int | None = None, timeout: float = STEP_TIMEOUT) -> Any:
        def check(seen: Any) -> Any:
            got = phase_of(seen)
            ok = got is not None and got[0] == phase and (weight is None or got[1] == weight)
            return seen if ok else None

        return self.wait(f"rollout {phase} {weight}", check, timeout)

    def phases_since(self, moment: float) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for seen in self.watch.since(moment):
            got = phase_of(seen)
            if got is not None and (not out or out[-1] != got):
                out.append(got)
        return out

    def kstatus(self) -> tuple[str, str]:
        """kstatus of the object read now, and what it was computed from (for a failed check)."""
        obj = json.loads(self.kubectl("get", "pdd", NAME, "-o", "json").stdout)
        result = kstatus.compute(obj)
        status = obj.get("status") or {}
        conditions = [
            f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
            for c in status.get("conditions") or []
        ]
        why = (
            f"{result.reason}: {result.message}; generation {obj['metadata'].get('generation')}, "
            f"observed {status.get('observedGeneration')}; phase {status.get('phase')}; "
            f"rollout {(status.get('rollout') or {}).get('phase')}; conditions {conditions}"
        )
        return str(result.status), why

    def pods(self, role: str) -> list[str]:
        api = self.cluster.api_client()
        try:
            ips = kube.ready_pod_ips(api, self.namespace, NAME, role)
        finally:
            kube.close(api)
        assert all(ip.startswith("127.") for ip in ips), ips
        return ips

    def fault(self, role: str, faults: dict[str, Any] | None) -> None:
        for ip in self.pods(role):
            url = f"http://{ip}:{meta.ENGINE_PORT}/admin/faults"
            if faults is None:
                request = urllib.request.Request(url, method="DELETE")
            else:
                data = json.dumps(faults).encode()
                request = urllib.request.Request(
                    url, data=data, method="POST", headers={"content-type": "application/json"}
                )
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert answer.status == 200

    def failures_since(self, moment: float) -> list[str]:
        return [s.error for s in self.load.samples(since=moment) if not s.ok]


@pytest.fixture(scope="module")
def gray(cluster: ClusterHandle, operator: RestartableOperator, module_namespace: str) -> Iterator[Gray]:
    ns = module_namespace
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest("Colocated")))
    watch = harness.Watcher(cluster, ns, NAME).start()
    load: BackgroundLoad | None = None
    began = time.monotonic()
    try:
        watch.wait("gray Ready", lambda s: s.is_ready() and s.ready("colocated") >= 1, 180)
        print(f"\ngray Ready (colocated) in {time.monotonic() - began:.0f}s")
        load = BackgroundLoad(
            harness.router_url(cluster, ns, NAME), harness.MODEL, max_requests=4000, max_seconds=540
        )
        load.start(LOAD)
        yield Gray(cluster, operator, ns, watch, load)
    finally:
        if load is not None and load.running:
            load.stop(timeout=60)
        watch.stop()
        print(f"--- events of {NAME}")
        for e in harness.events(cluster, ns, NAME):
            print(f"  {e.get('reason')}: {e.get('message', '')[:240]}")


def test_colocated_to_pd_completes_step_by_step(gray: Gray) -> None:
    seen = gray.watch.latest()
    assert seen.status.get("mode") == "Colocated"
    assert (seen.replicas("prefill"), seen.replicas("decode")) == (0, 0), "the idle arm holds no pods"
    time.sleep(4)  # a few requests on the colocated arm before the change
    started = gray.set_mode("Disaggregated")
    gray.wait_phase("Preparing", 0, 20)
    kstat, why = gray.kstatus()
    assert kstat == "InProgress", why
    shifting = gray.wait_phase("Shifting", 50, ARM_TIMEOUT)
    assert shifting.status.get("mode") == "Colocated", "the source is the mode in effect until promoted"
    gray.wait_phase("Shifting", 100)
    done = gray.kubectl(
        "wait", f"pdd/{NAME}", "--for=jsonpath={.status.rollout.phase}=Promoted", f"--timeout={STEP_TIMEOUT}s"
    )
    assert done.returncode == 0
    promoted = gray.wait_phase("Promoted", 100, 10)
    took = promoted.at - started
    gray.figures["promote_s"] = round(took, 1)
    phases = gray.phases_since(started)
    print(f"colocated -> P/D promoted in {took:.0f}s: {phases}")
    assert phases[:4] == [("Preparing", 0), ("Shifting", 50), ("Shifting", 100), ("Promoted", 100)], phases
    verdicts = rollout(promoted)["verdicts"]
    passed = [v for v in verdicts if v["result"] == "Pass"]
    assert len(passed) >= 2, verdicts
    print("passing verdicts: " + "; ".join(v["reason"] for v in passed))
    assert all(v["figures"]["targetRequests"] >= 10 for v in passed)
    gray.wait("the colocated arm scaled to zero after the delay", lambda s: s.replicas("colocated") == 0, 30)
    assert gray.watch.latest().status.get("mode") == "Disaggregated"
    # A status the operator derived after the colocated pod went: Ready from before the scale-down
    # (read beside the StatefulSet's new size) can turn InProgress while the pod terminates.
    gray.wait(
        "Ready after the rollout, the colocated pod gone",
        lambda s: (
            s.is_ready()
            and s.status.get("phase") == "Healthy"
            and (s.status.get("pools") or {}).get("colocated", {}).get("replicas") == 0
            and (s.status.get("pools") or {}).get("colocated", {}).get("desiredReplicas") == 0
        ),
        60,
    )
    kstat, why = gray.kstatus()
    assert kstat == "Current", why
    assert gray.failures_since(started) == []


def test_pd_to_colocated_resumes_after_the_operator_is_killed(gray: Gray) -> None:
    started = gray.set_mode("Colocated")
    shifting = gray.wait_phase("Shifting", 50, ARM_TIMEOUT)
    assert rollout(shifting)["target"] == "Colocated"
    step_started = rollout(shifting)["stepStartedAt"]
    gray.operator.crash_and_restart()
    after = gray.wait(
        "the new operator's first pass",
        lambda s: s if gray.operator.starts == 2 and phase_of(s) is not None else None,
        30,
    )
    assert rollout(after).get("attempt") == 1
    resumed = gray.wait_phase("Shifting", 100, STEP_TIMEOUT + 30)
    assert rollout(resumed)["stepStartedAt"] > step_started, "moved on from the step it was in"
    promoted = gray.wait_phase("Promoted", 100, STEP_TIMEOUT)
    assert rollout(promoted)["attempt"] == 1
    assert rollout(promoted)["startedAt"] <= step_started
    phases = gray.phases_since(started)
    print(f"P/D -> colocated across a kill -9 in {promoted.at - started:.0f}s: {phases}")
    assert ("Preparing", 0) not in phases[phases.index(("Shifting", 50)) :], "not restarted from scratch"
    gray.wait("P/D scaled to zero", lambda s: s.replicas("prefill") == 0 and s.replicas("decode") == 0, 30)
    assert gray.watch.latest().status.get("mode") == "Colocated"
    assert gray.failures_since(started) == []


def test_decode_slowness_rolls_back_weight_first(gray: Gray) -> None:
    started = gray.set_mode("Disaggregated")
    gray.wait_phase("Shifting", 50, ARM_TIMEOUT)
    injected = time.time()
    gray.fault("decode", {"slowdown": SLOWDOWN})
    back = gray.wait_phase("RollingBack", 0, ROLLBACK_BOUND + 10)
    to_zero = back.at - injected
    gray.figures["breach_to_weight_0_s"] = round(to_zero, 1)
    r = rollout(back)
    print(f"decode slowed x{SLOWDOWN:g} -> weight 0 in {to_zero:.1f}s: {r['reason']}")
    assert to_zero <= ROLLBACK_BOUND, to_zero
    assert "below" in r["reason"], r["reason"]
    failed = [v for v in r["verdicts"] if v["result"] == "Fail"]
    assert failed
    # A decode pool 20x slower misses the SLO. Its KV pulls keep the link's pace (the link is slow
    # enough that what a loaded machine adds to a pull stays small beside it), so the SLO fails it.
    figures = failed[-1]["figures"]
    assert "SLO attainment" in r["reason"], r["reason"]
    assert figures["targetAttainment"] < 0.9, failed[-1]
    assert "KV bandwidth at" not in r["reason"], r["reason"]
    assert min(back.replicas("prefill"), back.replicas("decode")) >= 1, "P/D keeps its pods at first"
    rolled = gray.kubectl("wait", f"pdd/{NAME}", "--for=condition=RolledBack", "--timeout=10s")
    assert rolled.returncode == 0
    gray.wait_phase("RolledBack", 0, DELAY + 30)
    final = gray.wait(
        "P/D scaled to zero",
        lambda s: s if s.replicas("prefill") == 0 and s.replicas("decode") == 0 else None,
        30,
    )
    # weight 0 was published before P/D shrank: no reading shows P/D smaller while weight > 0
    for seen in gray.watch.since(injected):
        got = phase_of(seen)
        if got is not None and got[1] > 0:
            assert seen.replicas("decode") >= 1, (got, seen.sts)
    assert final.status.get("phase") == "Degraded"
    kstat, why = gray.kstatus()
    assert kstat == "Failed", why
    assert gray.failures_since(started) == []


def test_retry_promote_kv_failures_and_abort(gray: Gray) -> None:
    moment = time.time()
    gray.command("retry")
    preparing = gray.wait_phase("Preparing", 0, 20)
    assert rollout(preparing)["attempt"] == 2
    gray.wait_phase("Shifting", 50, ARM_TIMEOUT)  # the new decode pod starts without the fault
    gray.command("promote")
    promoted = gray.wait_phase("Shifting", 100, 20)
    assert rollout(promoted)["lastCommand"] == "promote"
    injected = time.time()
    gray.fault("decode", {"kv_pull_failure_rate": KV_FAILURE_RATE})
    back = gray.wait_phase("RollingBack", 0, ROLLBACK_BOUND + 10)
    gray.fault("decode", None)
    gray.figures["kv_failures_to_weight_0_s"] = round(back.at - injected, 1)
    reason = rollout(back)["reason"]
    print(f"KV pulls failing at {KV_FAILURE_RATE:.0%} -> weight 0 in {back.at - injected:.1f}s: {reason}")
    assert "KV-transfer failure rate" in reason, reason
    assert back.at - injected <= ROLLBACK_BOUND
    # The router re-prefills a request whose KV pull failed (up to 2 retries): a client sees a failure
    # only when all 3 attempts failed (about 1 in 1,000 P/D requests at this rate).
    kv_failures = gray.failures_since(injected)
    print(f"client failures while KV pulls failed: {len(kv_failures)} {kv_failures[:3]}")
    assert len(kv_failures) <= 2, kv_failures
    gray.wait_phase("RolledBack", 0, DELAY + 30)
    gray.command("retry/2")
    gray.wait_phase("Preparing", 0, 20)
    gray.command("abort")
    aborted = gray.wait(
        "aborted", lambda s: s if (phase_of(s) or ("", 1))[0] in ("RollingBack", "RolledBack") else None, 20
    )
    assert "abort" in rollout(aborted)["reason"]
    gray.wait_phase("RolledBack", 0, DELAY + 30)
    gray.command("bogus")
    bad = gray.wait(
        "the unknown command reported",
        lambda s: s if any("bogus" in p for p in rollout(s).get("problems") or []) else None,
        20,
    )
    assert phase_of(bad) == ("RolledBack", 0)
    assert rollout(bad)["attempt"] == 3
    print(f"retry, promote, KV failures, retry, abort: {gray.phases_since(moment)}; figures {gray.figures}")
    before = [s.error for s in gray.load.samples(since=moment, until=injected) if not s.ok]
    assert before == [], "no failure before the KV fault"
    after = [s.error for s in gray.load.samples(since=back.at + 5) if not s.ok]
    assert after == [], "no failure once the weight is back and the fault cleared"


def test_a_slow_link_during_a_step_rolls_back(gray: Gray) -> None:
    """retry (attempt 4) -> Shifting 50 %, and the decode engines run a slow link (kv_bandwidth_factor
    0.2) from the step's start: the step fails on the KV bandwidth ratio alone and rolls back by
    itself, weight first, within the bound; the verdict shows the ratio; no request fails (a slow pull
    is slow, not an error). The same link, healthy, passed every judged window of the module so far.

    The fault goes in as the step starts: a step passes on its first window that lies wholly in it,
    so waiting for a healthy verdict inside the step raced the step's own pass."""
    gray.wait_phase("RolledBack", 0, DELAY + 30)  # where the previous test leaves it, or on its way
    healthy = [
        ratio
        for seen in gray.watch.since(0)
        for v in rollout(seen).get("verdicts", [])
        if v["result"] == "Pass" and (ratio := v["figures"].get("targetKvBandwidthRatio")) is not None
    ]
    assert healthy, "the earlier P/D steps judged the healthy link"
    assert min(healthy) >= 0.5, healthy
    moment = time.time()
    gray.command("retry/3")
    gray.wait_phase("Shifting", 50, ARM_TIMEOUT + 20)
    injected = time.time()
    gray.fault("decode", {"kv_bandwidth_factor": SLOW_LINK_FACTOR})
    back = gray.wait_phase("RollingBack", 0, ROLLBACK_BOUND + 10)
    to_zero = back.at - injected
    gray.figures["slow_link_to_weight_0_s"] = round(to_zero, 1)
    r = rollout(back)
    print(f"slow link (x{SLOW_LINK_FACTOR:g}) -> weight 0 in {to_zero:.1f}s: {r['reason']}")
    print(f"the healthy link's judged ratios: {min(healthy):.2f} to {max(healthy):.2f}")
    assert to_zero <= ROLLBACK_BOUND, to_zero
    assert "KV bandwidth at" in r["reason"], r["reason"]
    failed = [v for v in r["verdicts"] if v["result"] == "Fail"]
    assert failed
    assert failed[-1]["figures"]["targetKvBandwidthRatio"] < 0.5, failed[-1]
    assert failed[-1]["figures"]["targetAttainment"] >= 0.9, "the SLO held: the link alone failed the step"
    assert min(back.replicas("prefill"), back.replicas("decode")) >= 1, "P/D keeps its pods at first"
    gray.wait_phase("RolledBack", 0, DELAY + 30)
    assert gray.failures_since(moment) == []
    # One Event per moment on the real apiserver, over the module's four rollbacks so far: no generic
    # "RolledBack" Warning beside RolloutRolledBack, and RolloutRollingBack once per rollback.
    reasons = [
        e.get("reason")
        for e in harness.wait_events(
            gray.cluster,
            gray.namespace,
            NAME,
            lambda found: [e.get("reason") for e in found].count("RolloutRolledBack") >= 4,
            "the fourth RolloutRolledBack Event",
        )
    ]
    assert "RolledBack" not in reasons
    assert reasons.count("RolloutRollingBack") == reasons.count("RolloutRolledBack") == 4, reasons


def test_a_pd_arm_that_loses_its_decode_pod_rolls_back(gray: Gray) -> None:
    """retry (attempt 5) -> Shifting 50 %, and the decode engine hangs: its readiness probe fails, the
    router stops sending P/D requests to it and the colocated arm serves the P/D share instead (no
    client sees that), each such request counted as stood in for. Those count as the P/D arm's failures,
    so the step fails on its error rate and rolls back, however few P/D requests finish in the window.
    Only requests caught on the hung engine (sent before the weight went back to 0) may fail."""
    gray.wait_phase("RolledBack", 0, DELAY + 30)
    gray.command("retry/4")
    gray.wait_phase("Shifting", 50, ARM_TIMEOUT + 20)
    injected = time.time()
    gray.fault("decode", {"hang": True})
    # Unready after the readiness probe's 3 failures 5 s apart; then a window of stood-in requests.
    back = gray.wait_phase("RollingBack", 0, ROLLBACK_BOUND + 30)
    r = rollout(back)
    print(f"decode hung -> weight 0 in {back.at - injected:.1f}s: {r['reason']}")
    assert "served by the other arm: no ready pod on this one" in r["reason"], r["reason"]
    failed = [v for v in r["verdicts"] if v["result"] == "Fail"]
    assert failed
    assert failed[-1]["figures"]["targetStoodIn"] >= 1, failed[-1]
    gray.wait_phase("RolledBack", 0, DELAY + 60)
    late = [s.error for s in gray.load.samples(since=back.at) if not s.ok]
    assert late == [], "no request sent after the weight went back to 0 failed"


def test_a_mode_change_without_rollout_waits_for_the_new_arm(gray: Gray) -> None:
    """Removing `spec.rollout` and the colocated pool in one commit while colocated serves (the last
    rollout rolled back): P/D starts, colocated keeps serving and keeps its pod until P/D is ready,
    then the mode switches and the colocated pool goes; no request fails."""
    before = gray.watch.latest()
    assert before.status.get("mode") == "Colocated"
    assert before.ready("colocated") >= 1
    moment = time.time()
    patch = json.dumps({"spec": {"rollout": None, "colocated": {"replicas": 0}}})
    gray.kubectl("patch", "pdd", NAME, "--type", "merge", "-p", patch)
    switched = gray.wait(
        "the mode switched to P/D",
        lambda s: s if s.status.get("mode") == "Disaggregated" else None,
        ARM_TIMEOUT,
    )
    gray.wait("the colocated pool gone", lambda s: s if "colocated" not in s.sts else None, 30)
    readings = gray.watch.since(moment)
    for seen in readings:
        if seen.at < switched.at:
            assert seen.status.get("mode") == "Colocated"
            assert seen.ready("colocated") >= 1, "the serving arm kept its pod until P/D was ready"
    assert min(switched.ready("prefill"), switched.ready("decode")) >= 1
    assert "rollout" not in switched.status
    print(f"cut-over without a rollout: P/D serving {switched.at - moment:.1f}s after the change")
    harness.wait_events(
        gray.cluster,
        gray.namespace,
        NAME,
        lambda found: any(e.get("reason") == "ModeSwitched" for e in found),
        "the ModeSwitched Event",
    )
    time.sleep(3)  # requests sent across the switch have finished
    assert gray.failures_since(moment) == []
