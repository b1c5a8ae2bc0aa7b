"""A rollout of spec.router.disaggregation.mode on a P/D-only deployment, end to end: the operator on
the local control plane with its real Prometheus, sim engines, the operator's router.

One sim PDDeployment `pdonly`: prefill 1, decode 1, no colocated pool, mode absent (Always), a 1 Gb/s
KV link (a 200-token prompt moves 25 MiB of Llama-3.1-8B KV, about 210 ms: Auto's estimate prefers
prefilling such short prompts on the decode pod), two tenants by the trusted tenant header and
`spec.rollout` with a tenants stage for team-a (weight 0, at least 30 s), then 50 % and 100 % (10 s
windows, at least 10 requests). Two streamed loads go through the router at its pod IP (127.0.0.0/8),
3 requests/s per tenant of 200-token prompts and 16 output tokens. The router counts P/D requests by
the mode that decided them (`tandem_router_disaggregation_requests_total{mode, prefill, code}`, what
the analysis reads) and every request by tenant (`tandem_router_tenant_requests_total{tenant}`), read
from its /metrics.

1. Always -> Auto: the tenants stage (team-a's requests, all of them and only them, decided by Auto),
   50 % (both modes), 100 %, Promoted; `status.phase` Progressing while it moves (kstatus InProgress),
   Healthy once promoted (kstatus Current); Auto prefilled some requests on the decode pod; no request
   fails.
2. Back to Always at once (spec.rollout removed), then a decode engine that cannot prefill for itself
   (the sim's `local_prefill_error_rate` fault: requests with remote KV are served, local prefills
   answered 500) and the same change again: team-a's Auto requests fail in the tenants stage, the
   analysis fails it on the error rate and rolls back to Always (weight first; Degraded, Stalled,
   RolledBack, kstatus Failed); team-b never sees a failure, and team-a none once rolled back.
"""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api import meta
from tandem.dashboard.model import Dashboard, panel_queries
from tandem.dashboard.panels import CHART_FILE
from tandem.demo import e2e as harness
from tandem.demo.load import BackgroundLoad, Phase
from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import RestartableOperator, eventually, load_file, metric_total
from tandem.metrics.prometheus import PrometheusReader

kstatus: Any = load_file("disagg_e2e_kstatus", Path(__file__).parent.parent / "gitops" / "kstatus.py")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

NAME = "pdonly"
WINDOW = 10
STAGE_SECONDS = 30  # measured 10 s and more after its start, which a busy machine sees late
LOAD = Phase(3.0, 200, 16, "steady")
TENANTS = ("team-a", "team-b")
MODES = ("Always", "Auto")
LINK_GBPS = 1
MIN_JUDGED_BYTES = 8 * 1024 * 1024  # as test_rollout_e2e.py: KV transport judged on pulls of 8 MiB+
# As test_tenants_stage_e2e.py: a step lasts its window, an analysis period (5 s) and a scrape or two,
# on a 2-core machine shared with other sessions; no pod to start (both arms are the same pods).
STEP_TIMEOUT = 45
SETTLE = 4.0  # longer than a request of this load takes: one counted after this was routed after a change
REQUESTS = "tandem_router_disaggregation_requests_total"
TENANT_REQUESTS = "tandem_router_tenant_requests_total"
ROLLOUT: dict[str, Any] = {
    "tenants": ["team-a"],
    "steps": [
        {"weight": 0, "pauseSeconds": STAGE_SECONDS},
        {"weight": 50, "pauseSeconds": 0},
        {"weight": 100, "pauseSeconds": 0},
    ],
    "analysis": {
        "windowSeconds": WINDOW,
        "minSamples": 10,
        "maxAttainmentDrop": 0.2,
        "inconclusivePauseSeconds": 120,
    },
    "scaleDownDelaySeconds": 5,
}


def manifest() -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": {"type": "sim", "image": harness.IMAGE, "env": harness.engine_env(1, 3)},
        "kvTransfer": {
            "connector": "NixlConnector",
            "bandwidthGbps": LINK_GBPS,
            "minJudgedTransferBytes": MIN_JUDGED_BYTES,
        },
        "prefill": harness.pool(1),
        "decode": harness.pool(1),
        "colocated": {"replicas": 0},
        "serving": {"mode": "Disaggregated"},
        "slo": {"ttftMs": 2000, "tpotMs": 100, "attainmentPercent": 90},
        "router": {"replicas": 1, "image": harness.IMAGE, "tenants": [{"name": t} for t in TENANTS]},
        "rollout": ROLLOUT,
    }
    doc: dict[str, Any] = harness.pddeployment(NAME, spec)
    return doc


def record(seen: Any) -> dict[str, Any]:
    return dict((seen.status.get("disaggregation") or {}).get("rollout") or {})


def at(seen: Any) -> tuple[str, int, int] | None:
    r = record(seen)
    return (str(r["phase"]), int(r["step"]), int(r["weight"])) if r else None


Counts = dict[str, float]


@dataclass
class Pd:
    cluster: ClusterHandle
    namespace: str
    watch: Any
    router: str
    loads: dict[str, BackgroundLoad]

    def kubectl(self, *args: str) -> Any:
        return self.cluster.kubectl(*args, "-n", self.namespace)

    def patch(self, spec: dict[str, Any]) -> float:
        self.kubectl("patch", "pdd", NAME, "--type", "merge", "-p", json.dumps({"spec": spec}))
        return time.time()

    def wait(self, what: str, check: Callable[[Any], bool], timeout: float = STEP_TIMEOUT) -> Any:
        return self.watch.wait(what, lambda s: s if check(s) else None, timeout)

    def wait_at(self, phase: str, step: int, weight: int, timeout: float = STEP_TIMEOUT) -> Any:
        return self.wait(
            f"disaggregation rollout {phase} {step} {weight}%",
            lambda s: at(s) == (phase, step, weight),
            timeout,
        )

    def counts(self) -> Counts:
        """The router's counters: P/D requests by mode (and by mode and side, and 5xx), and by tenant."""
        with urllib.request.urlopen(self.router + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        out: Counts = {}
        for mode in MODES:
            out[mode] = metric_total(text, REQUESTS, mode=mode)
            out[f"{mode}/5xx"] = metric_total(text, REQUESTS, mode=mode, code="5xx")
            for side in ("remote", "local"):
                out[f"{mode}/{side}"] = metric_total(text, REQUESTS, mode=mode, prefill=side)
        for tenant in TENANTS:
            out[tenant] = metric_total(text, TENANT_REQUESTS, tenant=tenant)
        return out

    def counted_over(self, seconds: float) -> Counts:
        before = self.counts()
        time.sleep(seconds)
        after = self.counts()
        return {key: after[key] - before[key] for key in after}

    def kstatus(self) -> tuple[str, str]:
        obj = json.loads(self.kubectl("get", "pdd", NAME, "-o", "json").stdout)
        result = kstatus.compute(obj)
        status = obj.get("status") or {}
        return str(result.status), f"{result.reason}: {result.message}; phase {status.get('phase')}"

    def condition(self, seen: Any, kind: str) -> tuple[str, str, str]:
        c = seen.condition(kind)
        return str(c.get("status")), str(c.get("reason")), str(c.get("message"))

    def fault(self, faults: dict[str, Any] | None) -> None:
        api = self.cluster.api_client()
        try:
            ips = kube.ready_pod_ips(api, self.namespace, NAME, "decode")
        finally:
            kube.close(api)
        assert ips, "no ready decode pod"
        assert all(ip.startswith("127.") for ip in ips), ips
        for ip in ips:
            url = f"http://{ip}:{meta.ENGINE_PORT}/admin/faults"
            if faults is None:
                request = urllib.request.Request(url, method="DELETE")
            else:
                request = urllib.request.Request(
                    url,
                    data=json.dumps(faults).encode(),
                    method="POST",
                    headers={"content-type": "application/json"},
                )
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert answer.status == 200

    def failures(self, tenant: str, since: float = 0.0, until: float = float("inf")) -> list[str]:
        return [s.error for s in self.loads[tenant].samples(since=since, until=until) if not s.ok]


@pytest.fixture(scope="module")
def pd(cluster: ClusterHandle, operator: RestartableOperator, module_namespace: str) -> Iterator[Pd]:
    ns = module_namespace
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest()))
    watch = harness.Watcher(cluster, ns, NAME).start()
    loads: dict[str, BackgroundLoad] = {}
    began = time.monotonic()
    try:
        watch.wait("pdonly Ready", lambda s: s.is_ready() and s.ready("decode") >= 1, 180)
        print(f"\npdonly Ready in {time.monotonic() - began:.0f}s")
        router = harness.router_url(cluster, ns, NAME)
        loads = {
            t: BackgroundLoad(
                router, harness.MODEL, max_requests=2500, max_seconds=540, headers={"X-Tenant": t}
            )
            for t in TENANTS
        }
        for load in loads.values():
            load.start(LOAD)
        yield Pd(cluster, ns, watch, router, loads)
    finally:
        _teardown(cluster, ns, watch, loads)


def _teardown(cluster: ClusterHandle, ns: str, watch: Any, loads: dict[str, BackgroundLoad]) -> None:
    watch.stop()
    for load in (running for running in loads.values() if running.running):
        load.stop(timeout=60)
    lines = [f"  {e.get('reason')}: {e.get('message', '')[:240]}" for e in harness.events(cluster, ns, NAME)]
    print("\n".join([f"--- events of {NAME}", *lines]))


def test_always_to_auto_goes_tenants_first_then_by_weight_and_promotes(pd: Pd) -> None:
    seen = pd.watch.latest()
    assert seen.status.get("phase") == "Healthy", seen.brief()
    assert "disaggregation" not in seen.status, "no field, no record"
    assert seen.replicas("colocated") == 0
    time.sleep(6)  # the router measures its remote legs (Auto's estimate starts from them)
    assert pd.counts()["Always"] > 0
    started = pd.patch({"router": {"disaggregation": {"mode": "Auto"}}})

    stage = pd.wait_at("Shifting", 0, 0)
    assert stage.status["disaggregation"]["mode"] == "Always", "the mode in effect until promoted"
    assert stage.status.get("phase") == "Progressing"
    assert pd.condition(stage, "RolloutProgressing")[:2] == ("True", "Shifting")
    assert pd.condition(stage, "Reconciling")[:2] == ("True", "RolloutShifting")
    kstat, why = pd.kstatus()
    assert kstat == "InProgress", why
    assert "rollout" not in stage.status, "no serving-mode rollout"
    time.sleep(SETTLE)
    # 10 s (was 6): at load average 11-15 in CI a tenant finished 8 requests in 6 s; the 30-s stage
    # still holds the count (checked next)
    moved = pd.counted_over(10)
    assert at(pd.watch.latest()) == ("Shifting", 0, 0), "measured within the tenants stage"
    print(f"tenants stage: {moved}")
    # team-a's requests, all of them and only them, decided by Auto; team-b's by Always. Each request
    # bumps both counters at its end, not atomically: a scrape may fall between the two.
    assert moved["team-a"] >= 10, moved
    assert moved["team-b"] >= 10, moved
    assert abs(moved["Auto"] - moved["team-a"]) <= 2, moved
    assert abs(moved["Always"] - moved["team-b"]) <= 2, moved

    pd.wait_at("Shifting", 1, 50, STAGE_SECONDS + STEP_TIMEOUT)
    time.sleep(SETTLE)
    moved = pd.counted_over(6)
    print(f"50 %: {moved}")
    assert moved["Always"] >= 3, moved
    assert moved["Auto"] >= moved["team-a"] - 2, moved

    pd.wait_at("Shifting", 2, 100)
    promoted = pd.wait_at("Promoted", 2, 100)
    print(f"Always -> Auto promoted in {promoted.at - started:.0f}s")
    assert promoted.status["disaggregation"]["mode"] == "Auto"
    passed = [v for v in record(promoted)["verdicts"] if v["result"] == "Pass"]
    assert len(passed) >= 3, passed
    assert all(v["figures"]["targetRequests"] >= 10 for v in passed), passed
    done = pd.wait("Healthy once promoted", lambda s: s.status.get("phase") == "Healthy", 30)
    assert pd.condition(done, "RolloutProgressing")[:2] == ("False", "Promoted")
    kstat, why = pd.kstatus()
    assert kstat == "Current", why
    time.sleep(SETTLE)
    moved = pd.counted_over(6)
    print(f"promoted: {moved}")
    assert moved["Always"] == 0, moved
    assert moved["Auto"] >= 20, moved
    total = pd.counts()
    print(
        f"Auto's requests by side so far: remote {total['Auto/remote']:.0f}, local {total['Auto/local']:.0f}"
    )
    assert total["Auto/local"] > 0, "Auto prefilled some short prompts on the decode pod"
    assert pd.failures("team-a") == []
    assert pd.failures("team-b") == []


ROW = (
    "Share of P/D requests by prefill side",
    "Prefill choices by reason",
    "TTFT by prefill side",
    "TPOT by prefill side",
)


def test_the_dashboard_row_of_prefill_sides_answers_from_the_local_prometheus(pd: Pd) -> None:
    """The shipped dashboard's "Remote or local prefill" panels (charts/tandem/dashboards/tandem.json,
    variables set to this deployment, `$__rate_interval` 2m: the rollout above inside it): every query
    answers from the cluster's Prometheus with a finite value, rates above zero, and the share panel
    shows Always's requests prefilled remotely and Auto's locally."""
    model = Dashboard.model_validate(json.loads(CHART_FILE.read_text()))
    values = {"namespace": pd.namespace, "pddeployment": NAME, "__rate_interval": "2m"}
    queries = {name: q for name, q in panel_queries(model, values).items() if name.startswith(ROW)}
    assert len(queries) == 1 + 1 + 3 + 3, sorted(queries)
    reader = PrometheusReader(pd.cluster.prometheus_url, timeout=20)
    try:

        def answered() -> dict[str, list[dict[str, Any]]] | None:
            results, errors = reader.run(queries, time.time())
            assert not errors, errors
            for name, result in results.items():
                finite = [float(r["value"][1]) for r in result if math.isfinite(float(r["value"][1]))]
                if not finite or ("histogram_quantile" not in queries[name] and max(finite) <= 0):
                    return None
            return results

        results = eventually(answered, timeout=60, interval=3, what="every query of the row")
    finally:
        reader.close()
    share = {
        (r["metric"].get("mode"), r["metric"].get("prefill")): float(r["value"][1])
        for r in results["Share of P/D requests by prefill side [A]"]
    }
    print(f"dashboard share by mode and side: {share}")
    assert share[("Always", "remote")] > 0
    assert share[("Auto", "local")] > 0
    assert sum(v for v in share.values() if math.isfinite(v)) == pytest.approx(1.0, abs=0.01)


def test_a_decode_engine_that_cannot_prefill_rolls_back_to_always(pd: Pd) -> None:
    pd.patch({"rollout": None, "router": {"disaggregation": {"mode": "Always"}}})
    pd.wait(
        "Always at once without spec.rollout",
        lambda s: s.status.get("disaggregation") == {"mode": "Always"},
        30,
    )
    time.sleep(SETTLE)
    pd.fault({"local_prefill_error_rate": 1.0})
    clean = pd.counted_over(4)
    assert clean["Always/5xx"] == 0, "remote prefills are served"
    assert clean["Always"] >= 10, clean
    injected = pd.patch({"rollout": ROLLOUT, "router": {"disaggregation": {"mode": "Auto"}}})

    pd.wait_at("Shifting", 0, 0, 30)
    back = pd.wait("rolled back to weight 0", lambda s: (at(s) or ("",))[0] in ("RollingBack", "RolledBack"))
    to_zero = back.at - injected
    r = record(back)
    print(f"local prefills refused -> weight 0 in {to_zero:.1f}s: {r['reason']}")
    failed = next(v for v in r["verdicts"] if v["result"] == "Fail")
    assert failed["figures"]["targetErrorRate"] > 0.01, failed
    rolled = pd.wait_at("RolledBack", 0, 0, 30)
    rolled_at = rolled.at
    assert rolled.status["disaggregation"]["mode"] == "Always"
    assert rolled.status.get("phase") == "Degraded"
    assert pd.condition(rolled, "Stalled")[:2] == ("True", "RolledBack")
    assert pd.condition(rolled, "RolledBack")[:2] == ("True", "RolledBack")
    kstat, why = pd.kstatus()
    assert kstat == "Failed", why
    pd.fault(None)

    refused = pd.failures("team-a", since=injected, until=rolled_at)
    print(f"team-a's failed requests while Auto decided for them: {len(refused)}")
    assert refused, "the fault reached team-a's Auto requests"
    assert pd.failures("team-b") == [], "team-b stayed on Always: never a failure"
    time.sleep(SETTLE)
    after = pd.counted_over(6)
    assert after["Auto"] == 0, after
    assert after["Always/5xx"] == 0, after
    assert after["team-a"] >= 10, after
    assert pd.failures("team-a", since=rolled_at + SETTLE) == []
    # The spec back at the mode in effect ends it: healthy again.
    pd.patch({"router": {"disaggregation": {"mode": "Always"}}})
    pd.wait("Healthy with Always", lambda s: s.status.get("phase") == "Healthy" and not record(s), 30)


# -- multi-turn sessions, Auto beside Always in the same run ---------------------------------------

DECISIONS = "tandem_router_disaggregation_total"
SESSIONS = 6  # per tenant, one request at a time, the tenants taking turns
WARM_UP = 6  # single-turn Always requests before the sessions
FIRST_TURN, NEXT_TURN, REPLY = 1500, 40, 16  # words (the sim's tokens); 1500 > maxLocalTokens 1024


def words(tag: str, count: int) -> str:
    """`count` distinct words: `count` of the sim tokenizer's tokens (no punctuation in `tag`)."""
    tag = "".join(c for c in tag if c.isalnum())
    return " ".join(f"{tag}w{i}" for i in range(count))


def streamed_chat(router: str, tenant: str, messages: list[dict[str, str]]) -> tuple[float, str]:
    """(client TTFT, the reply's text) of one streamed chat request through the router."""
    body = {"model": harness.MODEL, "messages": messages, "max_tokens": REPLY, "stream": True}
    request = urllib.request.Request(
        router + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "X-Tenant": tenant},
        method="POST",
    )
    started, first, text = time.monotonic(), None, []
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 200
        for line in answer:
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            content = choices[0]["delta"].get("content") if choices else None
            if content:
                first = time.monotonic() if first is None else first
                text.append(content)
    assert first is not None, "no token streamed"
    return first - started, "".join(text)


def decisions(router: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(router + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith(DECISIONS + "{"):
            series, _, value = line.rpartition(" ")
            labels = dict(part.split("=", 1) for part in series[len(DECISIONS) + 1 : -1].split(","))
            key = (labels["prefill"].strip('"'), labels["reason"].strip('"'))
            out[key] = out.get(key, 0.0) + float(value)
    return out


def test_multi_turn_sessions_prefill_later_turns_on_decode_under_auto(pd: Pd) -> None:
    """Chat sessions of 3 turns (a 1,500-word first turn, 16-token replies, 40 more words a turn), one
    request at a time, team-a's decided by Auto and team-b's by Always in the same run (the tenants
    stage of an Always -> Auto rollout, held at its manual gate). Robust facts only: every request is
    decided once; Auto prefills turn 1 remotely (too_long) and every later turn on the decode pod that
    holds the conversation, the next turn sent as soon as the last one's answer is whole (the router
    records the reply before it reads the engine's end of body: `_Tally.on_answered`); Always
    prefills every turn remotely. The TTFTs are printed, not judged."""
    for load in pd.loads.values():  # the router's decision counters then move with these requests only
        load.stop(timeout=60)
    pd.patch({"router": {"disaggregation": {"mode": "Always"}}})
    pd.wait(
        "Always in effect",
        lambda s: (s.status.get("disaggregation") or {}).get("mode", "Always") == "Always" and not record(s),
        30,
    )
    # A stage that never reaches a verdict (too few requests for one): the routing is under test
    # here, not the SLO (a 1,500-word first turn on this link takes most of the 2 s TTFT target, and
    # one request in ten past it would fail the stage, as it did once).
    analysis = {**ROLLOUT["analysis"], "minSamples": 100000, "inconclusivePauseSeconds": 3600}
    gate = {**ROLLOUT, "steps": [{"weight": 0}, {"weight": 100, "pauseSeconds": 0}], "analysis": analysis}
    pd.patch({"rollout": gate, "router": {"disaggregation": {"mode": "Auto"}}})
    pd.wait(
        "the tenants stage",
        lambda s: (at(s) or ("",))[0] in ("Shifting", "Paused") and record(s)["step"] == 0,
        30,
    )
    # Auto's cost lines learn from every leg, Always's too (`unmeasured` until they weigh enough):
    # the warm-up goes through Always (team-b), and Auto's first decision is already an estimate.
    for k in range(WARM_UP):
        streamed_chat(pd.router, "team-b", [{"role": "user", "content": words(f"warm{k}", 200)}])
    ttfts: dict[tuple[str, int], list[float]] = {}
    sides: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for session in range(SESSIONS):
        for tenant in TENANTS:
            messages = [{"role": "user", "content": words(f"s{session}{tenant}t0", FIRST_TURN)}]
            for turn in range(1, 4):
                before = decisions(pd.router)
                seconds, reply = streamed_chat(pd.router, tenant, messages)
                after = decisions(pd.router)
                moved = [key for key in after if after[key] - before.get(key, 0.0) > 0]
                assert sum(after[k] - before.get(k, 0.0) for k in after) == 1, (tenant, turn, moved)
                ttfts.setdefault((tenant, turn), []).append(seconds)
                sides.setdefault((tenant, turn), []).append(moved[0])
                messages += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": words(f"s{session}{tenant}t{turn}", NEXT_TURN)},
                ]
    assert (at(pd.watch.latest()) or ("", -1, -1))[1:] == (0, 0), "the run stayed in the tenants stage"
    for tenant, mode in zip(TENANTS, ("Auto", "Always"), strict=True):
        row = []
        for turn in range(1, 4):
            got = sorted(ttfts[tenant, turn])
            row.append(
                f"turn {turn} {got[len(got) // 2] * 1000:.0f} ms ({dict(Counter(sides[tenant, turn]))})"
            )
        print(f"{mode} ({tenant}), client TTFT p50 of {SESSIONS}: " + "; ".join(row))
    for turn in range(1, 4):
        auto, always = (sorted(ttfts[t, turn])[SESSIONS // 2] for t in TENANTS)
        print(f"turn {turn}: Auto / Always TTFT p50 = {auto / always:.2f}")
    for session in range(SESSIONS):
        print(
            f"session {session}, Auto: " + ", ".join("/".join(sides["team-a", t][session]) for t in (1, 2, 3))
        )
    assert set(sides["team-a", 1]) == {("remote", "too_long")}
    assert all(key == ("local", "local_faster") for turn in (2, 3) for key in sides["team-a", turn]), sides
    assert all(key == ("remote", "always") for turn in (1, 2, 3) for key in sides["team-b", turn]), sides
