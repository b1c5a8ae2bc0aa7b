"""The tenants stage of a gray rollout end to end: named tenants on the new arm first, everyone else on
the stable one, through the operator's router on the local control plane.

One sim PDDeployment `first` serving colocated, with two tenants named by the trusted tenant header
(`spec.router.tenants`: team-a, team-b) and `spec.rollout` whose first step has weight 0 (the tenants
stage, here a manual gate: no `pauseSeconds`) for `tenants: [team-a]`, then 100 %. Two streamed loads
go through the operator's router at its pod IP (127.0.0.0/8), one per tenant, 3 requests/s each of
100-token prompts and 16 output tokens. The router counts every request by tenant and path
(`tandem_router_tenant_requests_total{tenant, path}`), read from its /metrics.

Changing `spec.serving.mode` to Disaggregated: Preparing, then the tenants stage (Shifting, step 0,
weight 0). While it lasts, every request of team-a takes P/D and every one of team-b colocated; its
analysis judges P/D on team-a's requests alone (10 s windows, at least 10 requests) and, passing,
waits for `promote` (Paused, AwaitingPromote, still weight 0 with team-a on P/D). `promote`: 100 %,
then Promoted, and team-b's requests reach P/D too. No request may fail.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tandem.api import meta
from tandem.demo import e2e as harness
from tandem.demo.load import BackgroundLoad, Phase
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import RestartableOperator, eventually, metric_total

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

NAME = "first"
WINDOW = 10
LOAD = Phase(3.0, 100, 16, "steady")
TENANTS = ("team-a", "team-b")
# Settings as in test_rollout_e2e.py: a step lasts its window, an analysis period (5 s) and a scrape
# or two; a new arm's pods start in 3 s (sim loading) plus scheduling, on a shared 2-core machine.
ARM_TIMEOUT = 60
STEP_TIMEOUT = 45
# Longer than any request of this load takes (its TTFT target is 2 s): a request counted after this
# long since the router saw a change was routed after it.
SETTLE = 4.0
COUNTER = "tandem_router_tenant_requests_total"


def manifest() -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": {"type": "sim", "image": harness.IMAGE, "env": harness.engine_env(1, 3)},
        "prefill": harness.pool(1),
        "decode": harness.pool(1),
        "colocated": harness.pool(1),
        "serving": {"mode": "Colocated"},
        "slo": {"ttftMs": 2000, "tpotMs": 100, "attainmentPercent": 90},
        "router": {"replicas": 1, "image": harness.IMAGE, "tenants": [{"name": t} for t in TENANTS]},
        "rollout": {
            "steps": [{"weight": 0}, {"weight": 100, "pauseSeconds": 0}],
            "tenants": ["team-a"],
            "analysis": {
                "windowSeconds": WINDOW,
                "minSamples": 10,
                "maxAttainmentDrop": 0.2,
                "inconclusivePauseSeconds": 120,
            },
            "scaleDownDelaySeconds": 5,
        },
    }
    doc: dict[str, Any] = harness.pddeployment(NAME, spec)
    return doc


def rollout(seen: Any) -> dict[str, Any]:
    return dict(seen.status.get("rollout") or {})


@dataclass
class Stage:
    cluster: ClusterHandle
    namespace: str
    watch: Any
    router: str  # the router pod's base URL
    loads: dict[str, BackgroundLoad]

    def kubectl(self, *args: str) -> Any:
        return self.cluster.kubectl(*args, "-n", self.namespace)

    def wait_rollout(self, what: str, check: Any, timeout: float) -> Any:
        return self.watch.wait(what, lambda s: s if rollout(s) and check(rollout(s)) else None, timeout)

    def served(self) -> dict[tuple[str, str], float]:
        """(tenant, path) -> requests the router finished, from its /metrics (every status class)."""
        with urllib.request.urlopen(self.router + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return {
            (tenant, path): metric_total(text, COUNTER, tenant=tenant, path=path)
            for tenant in TENANTS
            for path in ("disaggregated", "colocated")
        }

    def failures(self) -> list[str]:
        return [s.error for load in self.loads.values() for s in load.samples() if not s.ok]


def delta(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]) -> dict[str, float]:
    return {f"{tenant}/{path}": after[tenant, path] - before[tenant, path] for tenant, path in after}


@pytest.fixture(scope="module")
def stage(cluster: ClusterHandle, operator: RestartableOperator, module_namespace: str) -> Iterator[Stage]:
    ns = module_namespace
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest()))
    watch = harness.Watcher(cluster, ns, NAME).start()
    loads: dict[str, BackgroundLoad] = {}
    try:
        watch.wait("first Ready", lambda s: s.is_ready() and s.ready("colocated") >= 1, 180)
        router = harness.router_url(cluster, ns, NAME)
        for tenant in TENANTS:
            loads[tenant] = BackgroundLoad(
                router, harness.MODEL, max_requests=1500, max_seconds=360, headers={"X-Tenant": tenant}
            )
            loads[tenant].start(LOAD)
        yield Stage(cluster, ns, watch, router, loads)
    finally:
        for load in loads.values():
            if load.running:
                load.stop(timeout=60)
        watch.stop()
        print(f"--- events of {NAME}")
        for e in harness.events(cluster, ns, NAME):
            print(f"  {e.get('reason')}: {e.get('message', '')[:240]}")


def test_named_tenants_reach_the_new_arm_first(stage: Stage) -> None:
    time.sleep(4)  # both tenants on the colocated arm before the change
    assert stage.served()["team-a", "colocated"] > 0
    patch = json.dumps({"spec": {"serving": {"mode": "Disaggregated"}}})
    stage.kubectl("patch", "pdd", NAME, "--type", "merge", "-p", patch)
    began = time.monotonic()
    in_stage = stage.wait_rollout(
        "the tenants stage", lambda r: (r["phase"], r["step"], r["weight"]) == ("Shifting", 0, 0), ARM_TIMEOUT
    )
    print(f"\ntenants stage after {time.monotonic() - began:.0f}s: {rollout(in_stage)['reason']}")
    step0 = "step 0: spec.rollout.tenants only to the target arm"
    harness.wait_events(
        stage.cluster,
        stage.namespace,
        NAME,
        lambda found: any(
            e.get("reason") == "RolloutShifting" and str(e.get("message", "")).endswith(step0) for e in found
        ),
        "the RolloutShifting Event of the tenants stage",
    )
    assert in_stage.status.get("mode") == "Colocated", "the source is the mode in effect"

    eventually(lambda: stage.served()["team-a", "disaggregated"] > 0, timeout=20, what="team-a on P/D")
    time.sleep(SETTLE)
    before = stage.served()
    passed = stage.wait_rollout(
        "the tenants stage judged and waiting for promote",
        lambda r: r["phase"] == "Paused" and r.get("pauseCause") == "AwaitingPromote",
        STEP_TIMEOUT,
    )
    time.sleep(2)  # more of the stage's traffic: Paused holds it
    after = stage.served()
    moved = delta(after, before)
    print(f"in the tenants stage: {moved}")
    r = rollout(passed)
    assert (r["step"], r["weight"]) == (0, 0)
    assert r["reason"].endswith("paused in the tenants stage (weight 0)"), r["reason"]
    verdict = next(v for v in r["verdicts"] if v["step"] == 0 and v["result"] == "Pass")
    assert verdict["figures"]["targetRequests"] >= 10, verdict
    # team-a: every request on the new arm; team-b: every one on the stable arm, none ever on P/D.
    assert moved["team-a/disaggregated"] >= 10
    assert moved["team-a/colocated"] == 0
    assert moved["team-b/colocated"] >= 10
    assert after["team-b", "disaggregated"] == 0

    stage.kubectl("annotate", "pdd", NAME, f"{meta.ANNOTATION_ROLLOUT_COMMAND}=promote", "--overwrite")
    stage.wait_rollout("step 1 (100 %)", lambda r: (r["phase"], r["weight"]) == ("Shifting", 100), 30)
    stage.wait_rollout("Promoted", lambda r: r["phase"] == "Promoted", STEP_TIMEOUT)
    eventually(lambda: stage.served()["team-b", "disaggregated"] >= 10, timeout=30, what="team-b on P/D")
    assert stage.failures() == []
