"""An engine image change rolls prefill and decode together, as a new serving revision, under load.

On the local control plane (the rollout module's cluster and operator fixtures): one sim
PDDeployment `rev` in P/D mode without `spec.rollout`, load through the operator's router at its pod
IP (127.0.0.0/8). The first revision keeps today's names (`rev-prefill`, `rev-decode`) and pods; an
operator restart replaces none of them. Changing `spec.engine.image` starts the new revision's pair
(`rev-<id>-prefill`, `rev-<id>-decode`, labelled `tandem.dev/revision`) beside the old one; the
weight moves to it only once both its StatefulSets are Ready; the old pair is deleted once its
engines report nothing in flight (checked from 10 s after its weight went to 0; the drain timeout,
300 s, is the bound), which the RevisionRemoved Event says. Every decode engine refuses KV held by
a prefill engine of another revision (`tandem:kv_revision_mismatch_refusals_total`), so a mixed
pair would show as a refusal and a failed leg: none may happen, and no client request may fail.

Then with `spec.rollout` (second test, settings at ROLLOUT_SPEC): a second image change moves by
the steps (Preparing, 50%, 100%, Promoted) judged from the routers' per-revision counters and the
old pair goes; a third, whose decode engines are slowed 20x at 50%, rolls back by itself: weight
to the old revision first, then the new pair deleted, the old one current again and not
re-rendered from the spec that names the rejected revision.

Compressed settings: `TANDEM_SIM_TIME_SCALE=1`, `TANDEM_SIM_LOAD_SECONDS=3` (a new pod is not Ready
for 3 s), prefill 1, decode 1, load 4 requests/s of 200-token prompts and 16 output tokens.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tandem.api import meta
from tandem.controller.revisions import DEFAULT_DRAIN_SECONDS
from tandem.demo import e2e as harness
from tandem.demo.load import BackgroundLoad, Phase
from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import RestartableOperator

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

NAME = "rev"
NEW_IMAGE = "ghcr.io/tandem-dev/tandem:0.1.1"
LOAD = Phase(4.0, 200, 16, "steady")
START_TIMEOUT = 180
SWITCH_TIMEOUT = 90  # new pods scheduled, 3 s of loading, Ready, one operator pass
REFUSALS = "tandem:kv_revision_mismatch_refusals"


def manifest(image: str) -> dict[str, Any]:
    spec = {
        "engine": {"type": "sim", "image": image, "env": harness.engine_env(1, 3)},
        "prefill": harness.pool(1),
        "decode": harness.pool(1),
        "serving": {"mode": "Disaggregated"},
        # Set from the start (no effect without spec.rollout): the second test's analysis then reads
        # windows in which the routers counted requests within the SLO all along.
        "slo": {"ttftMs": 1500, "tpotMs": 100, "attainmentPercent": 90},
    }
    doc: dict[str, Any] = harness.pddeployment(NAME, spec)
    return doc


@dataclass
class Cluster:
    cluster: ClusterHandle
    namespace: str

    def _core(self, fn: str, **kwargs: Any) -> list[dict[str, Any]]:
        api = self.cluster.api_client()
        try:
            items: list[dict[str, Any]] = kube.raw(
                getattr(client.CoreV1Api(api), fn)(self.namespace, _preload_content=False, **kwargs)
            )["items"]
        finally:
            kube.close(api)
        return items

    def pdd(self) -> dict[str, Any]:
        api = self.cluster.api_client()
        try:
            obj: dict[str, Any] = kube.raw(
                client.CustomObjectsApi(api).get_namespaced_custom_object(
                    meta.GROUP, meta.VERSION, self.namespace, meta.PLURAL, NAME, _preload_content=False
                )
            )
        finally:
            kube.close(api)
        return obj

    def revisions(self) -> dict[str, Any]:
        return dict((self.pdd().get("status") or {}).get("revisions") or {})

    def statefulsets(self) -> dict[str, dict[str, Any]]:
        api = self.cluster.api_client()
        try:
            items = kube.raw(
                client.AppsV1Api(api).list_namespaced_stateful_set(
                    self.namespace, label_selector=f"{meta.LABEL_PDD}={NAME}", _preload_content=False
                )
            )["items"]
        finally:
            kube.close(api)
        return {item["metadata"]["name"]: item for item in items}

    def engine_pods(self) -> list[dict[str, Any]]:
        selector = f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE} in (prefill,decode)"
        return self._core("list_namespaced_pod", label_selector=selector)

    def router_ip(self) -> str:
        url: str = harness.router_url(self.cluster, self.namespace, NAME)
        return url.split("//", 1)[1].rsplit(":", 1)[0]


def ready_pods(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in pods if kube.is_ready(p) and p["status"].get("podIP")}


def scrape(ip: str, port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    assert ip.startswith("127."), ip
    with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, found), value in samples.items()
        if sample == name and all((k, v) in found for k, v in labels.items())
    )


def wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture(scope="module")
def rev(cluster: ClusterHandle, operator: RestartableOperator, module_namespace: str) -> Cluster:
    cluster.kubectl("apply", "-n", module_namespace, "-f", "-", input=yaml.safe_dump(manifest(harness.IMAGE)))
    return Cluster(cluster, module_namespace)


def test_image_change_rolls_prefill_and_decode_as_one_revision(
    rev: Cluster, operator: RestartableOperator
) -> None:
    began = time.monotonic()

    def legacy_ready() -> Any:
        revisions = rev.revisions()
        pods = ready_pods(rev.engine_pods())
        roles = {p["metadata"]["labels"][meta.LABEL_ROLE] for p in pods.values()}
        current = revisions.get("current") or {}
        return pods if current.get("legacy") and roles == {"prefill", "decode"} else None

    first = wait("the first revision Ready", legacy_ready, START_TIMEOUT)
    print(f"\nrev Ready in {time.monotonic() - began:.0f}s: {rev.revisions()}")
    old_id = rev.revisions()["current"]["id"]
    assert set(rev.statefulsets()) == {f"{NAME}-prefill", f"{NAME}-decode"}, "today's names"
    assert all(meta.LABEL_REVISION not in p["metadata"]["labels"] for p in first.values())
    uids = {name: p["metadata"]["uid"] for name, p in first.items()}
    generations = {n: s["metadata"]["generation"] for n, s in rev.statefulsets().items()}

    # An operator restart (as an upgrade does) replaces no pod and rewrites no StatefulSet's template.
    operator.crash_and_restart()
    time.sleep(6)  # its first passes run at once
    assert {n: p["metadata"]["uid"] for n, p in ready_pods(rev.engine_pods()).items()} == uids
    assert {n: s["metadata"]["generation"] for n, s in rev.statefulsets().items()} == generations

    router_ip = rev.router_ip()
    load = BackgroundLoad(f"http://{router_ip}:{meta.ROUTER_PORT}", harness.MODEL, max_requests=2000)
    load.start(LOAD)
    try:
        time.sleep(5)
        changed = time.time()
        patch = json.dumps({"spec": {"engine": {"image": NEW_IMAGE}}})
        rev.cluster.kubectl("patch", "pdd", NAME, "-n", rev.namespace, "--type", "merge", "-p", patch)

        def recorded() -> Any:
            r = rev.revisions()
            return r if (r.get("previous") or {}).get("id") == old_id else None

        started = wait("the new revision recorded", recorded, 30)
        new_id, prefix = started["current"]["id"], started["current"]["prefix"]
        assert new_id != old_id
        assert prefix == f"{NAME}-{new_id}"
        assert started["previous"]["legacy"] is True

        # Traffic moves only once the new pair is Ready: every reading with weight > 0 shows it Ready.
        def switched() -> Any:
            r, sts = rev.revisions(), rev.statefulsets()
            if r.get("weight", 0) > 0:
                for role in ("prefill", "decode"):
                    new = sts[f"{prefix}-{role}"]
                    assert (new.get("status") or {}).get("readyReplicas", 0) >= new["spec"]["replicas"], new
                return r
            return None

        wait("the weight on the new revision", switched, SWITCH_TIMEOUT)
        switch_s = time.time() - changed
        new_pods = {
            n: p
            for n, p in ready_pods(rev.engine_pods()).items()
            if p["metadata"]["labels"].get(meta.LABEL_REVISION) == new_id
        }
        assert {p["metadata"]["labels"][meta.LABEL_ROLE] for p in new_pods.values()} == {"prefill", "decode"}
        for pod in new_pods.values():
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert env["TANDEM_SERVING_REVISION"] == new_id
        # The old pair still runs while it drains: read its engines' refusal counters now.
        refusals = 0.0
        for pod in first.values():
            samples = scrape(pod["status"]["podIP"], meta.ENGINE_PORT)
            refusals += total(samples, f"{REFUSALS}_total")
        time.sleep(5)  # requests on the new pair only

        removed = wait(
            "the old pair deleted",
            lambda: rev.statefulsets() if f"{NAME}-prefill" not in rev.statefulsets() else None,
            DEFAULT_DRAIN_SECONDS + 45,
        )
        removed_s = time.time() - changed
        assert set(removed) == {f"{prefix}-prefill", f"{prefix}-decode"}
        removals = [
            str(e.get("message", ""))
            for e in harness.wait_events(
                rev.cluster,
                rev.namespace,
                NAME,
                lambda found: any(e.get("reason") == "RevisionRemoved" for e in found),
                "the RevisionRemoved Event",
            )
            if e.get("reason") == "RevisionRemoved"
        ]
        assert len(removals) == 1, removals
        assert f"revision {old_id} idle (" in removals[0], "removed because idle, not at the timeout"
        print(f"old pair removed: {removals[0]}")
        assert "previous" not in rev.revisions() or rev.revisions()["previous"] is None
        router = scrape(router_ip, meta.ROUTER_PORT)
    finally:
        load.stop(timeout=60)
    for pod in new_pods.values():
        refusals += total(scrape(pod["status"]["podIP"], meta.ENGINE_PORT), f"{REFUSALS}_total")
    samples = load.samples(since=changed)
    failures = [s.error for s in samples if not s.ok]
    served = {
        revision: total(router, "tandem_router_revision_requests_total", revision=revision, code="2xx")
        for revision in ("legacy", new_id)
    }
    print(
        f"image change: weight on the new revision after {switch_s:.1f}s, old pair deleted after "
        f"{removed_s:.1f}s; {len(samples)} requests since the change, {len(failures)} failed; served by "
        f"revision {served}; KV refusals {refusals:g}"
    )
    assert failures == []
    assert refusals == 0
    assert served["legacy"] > 0
    assert served[new_id] > 0
    # TTFT and TPOT per revision (a revision rollout's analysis reads their quantiles)
    for revision in ("legacy", new_id):
        for histogram in ("time_to_first_token", "time_per_output_token"):
            name = f"tandem_router_revision_{histogram}_seconds_count"
            assert total(router, name, revision=revision) > 0, (name, revision)
    assert total(router, "tandem_router_failures_total", role="decode") == 0


# With spec.rollout (compressed: steps 50% and 100% without pause, 10 s windows, 10 samples, a 20%
# attainment drop allowed against the old revision, 5 s scale-down delay; SLO TTFT 1500 ms, TPOT
# 100 ms, 90%): the same machine and analysis as a mode rollout, arms = the two revisions.
ROLLOUT_SPEC = {
    "slo": {"ttftMs": 1500, "tpotMs": 100, "attainmentPercent": 90},
    # Two decode replicas: at 50% each pair runs one (capacity traded between the revisions).
    "decode": harness.pool(2),
    "colocated": harness.pool(1),  # a rollout needs both arms' replicas; idle (0 pods) in P/D mode
    "rollout": {
        "steps": [{"weight": 50, "pauseSeconds": 0}, {"weight": 100, "pauseSeconds": 0}],
        "analysis": {
            "windowSeconds": 10,
            "minSamples": 10,
            "maxAttainmentDrop": 0.2,
            "inconclusivePauseSeconds": 120,
        },
        "scaleDownDelaySeconds": 5,
    },
}
STEP_TIMEOUT = 45
ROLLBACK_BOUND = 2 * 10 + 5 + 15  # as the mode rollout's e2e: two windows, a period, slack


def follow(
    rev: Cluster, seen: list[tuple[str, int]], what: str, until: Any, timeout: float
) -> dict[str, Any]:
    """Polls status.revisions once a second, appending each new (phase, weight), until `until(r)`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = rev.revisions()
        ro = r.get("rollout") or {}
        got = (str(ro.get("phase")), int(r.get("weight", 100)))
        if ro and (not seen or seen[-1] != got):
            seen.append(got)
        if until(r):
            return r
        time.sleep(1)
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for {what}; seen {seen}; last {r}; "
        f"status.mode {rev.pdd()['status'].get('mode')}, "
        f"status.rollout {rev.pdd()['status'].get('rollout')}; "
        f"Prometheus: {prometheus(rev, 'tandem_router_revision_requests_total')}"
    )


def prometheus(rev: Cluster, query: str) -> Any:
    url = f"{rev.cluster.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())["data"]["result"]


def pd_statefulsets(rev: Cluster) -> set[str]:
    return {n for n in rev.statefulsets() if n != f"{NAME}-colocated"}


def set_image(rev: Cluster, image: str) -> float:
    patch = json.dumps({"spec": {"engine": {"image": image}}})
    rev.cluster.kubectl("patch", "pdd", NAME, "-n", rev.namespace, "--type", "merge", "-p", patch)
    return time.time()


def phase_is(phase: str, weight: int | None = None) -> Any:
    def check(r: dict[str, Any]) -> bool:
        ro = r.get("rollout") or {}
        return ro.get("phase") == phase and (weight is None or r.get("weight") == weight)

    return check


def test_with_rollout_revisions_move_by_steps_and_a_failed_step_rolls_back(rev: Cluster) -> None:
    def serving() -> Any:  # alone, or after the test above
        r = rev.revisions()
        roles = {p["metadata"]["labels"][meta.LABEL_ROLE] for p in ready_pods(rev.engine_pods()).values()}
        return r if r.get("current") and not r.get("previous") and roles == {"prefill", "decode"} else None

    before = wait("one revision serving", serving, START_TIMEOUT)
    router_ip = rev.router_ip()
    load = BackgroundLoad(f"http://{router_ip}:{meta.ROUTER_PORT}", harness.MODEL, max_requests=3000)
    load.start(LOAD)
    patch = json.dumps({"spec": ROLLOUT_SPEC})
    rev.cluster.kubectl("patch", "pdd", NAME, "-n", rev.namespace, "--type", "merge", "-p", patch)
    time.sleep(5)
    assert rev.revisions()["current"] == before["current"], "rollout settings are not a revision"
    assert rev.pdd()["status"].get("mode") == "Disaggregated"
    assert not rev.pdd()["status"].get("rollout"), "no fall-back to colocated"
    seen: list[tuple[str, int]] = []
    try:
        time.sleep(5)
        changed = set_image(rev, "ghcr.io/tandem-dev/tandem:0.1.2")
        r = follow(rev, seen, "Shifting 50", phase_is("Shifting", 50), SWITCH_TIMEOUT)
        second = r["current"]
        assert r["previous"]["id"] == before["current"]["id"]
        old_decode, new_decode = f"{before['current']['prefix']}-decode", f"{second['prefix']}-decode"

        def traded() -> Any:
            sts = rev.statefulsets()
            sizes = {n: sts[n]["spec"]["replicas"] for n in (old_decode, new_decode) if n in sts}
            return sizes if sizes == {old_decode: 1, new_decode: 1} else None

        shares = wait("each pair at its share of decode (1 + 1, not 2 + 2)", traded, 20)
        print(f"decode replicas at 50%: {shares}")
        follow(rev, seen, "Shifting 100", phase_is("Shifting", 100), STEP_TIMEOUT)
        promoted = follow(rev, seen, "Promoted", phase_is("Promoted", 100), STEP_TIMEOUT)
        assert len([v for v in promoted["rollout"]["verdicts"] if v["result"] == "Pass"]) >= 2
        follow(rev, seen, "the old pair removed", lambda r: not r.get("previous"), 30)
        promote_s = time.time() - changed
        assert rev.statefulsets()[new_decode]["spec"]["replicas"] == 2, "promoted: the full size"
        assert seen[:4] == [("Preparing", 0), ("Shifting", 50), ("Shifting", 100), ("Promoted", 100)], seen
        assert pd_statefulsets(rev) == {f"{second['prefix']}-prefill", f"{second['prefix']}-decode"}
        print(f"\nrevision rollout promoted and the old pair removed in {promote_s:.0f}s: {seen}")

        seen.clear()
        bad_at = set_image(rev, "ghcr.io/tandem-dev/tandem:0.1.3")
        r = follow(rev, seen, "Shifting 50", phase_is("Shifting", 50), SWITCH_TIMEOUT)
        third = r["current"]
        injected = time.time()
        for pod in rev.engine_pods():
            labels = pod["metadata"]["labels"]
            if labels.get(meta.LABEL_REVISION) == third["id"] and labels[meta.LABEL_ROLE] == "decode":
                ip = pod["status"]["podIP"]
                assert ip.startswith("127."), ip
                request = urllib.request.Request(
                    f"http://{ip}:{meta.ENGINE_PORT}/admin/faults",
                    data=json.dumps({"slowdown": 20.0}).encode(),
                    method="POST",
                    headers={"content-type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=10) as answer:
                    assert answer.status == 200
        back = follow(rev, seen, "RollingBack 0", phase_is("RollingBack", 0), ROLLBACK_BOUND + 10)
        to_zero = time.time() - injected
        assert "below" in back["rollout"]["reason"], back["rollout"]["reason"]
        assert back["previous"]["id"] == second["id"], "both pairs kept while the weight returns"
        rolled = follow(rev, seen, "RolledBack", phase_is("RolledBack"), 30)
        assert rolled["current"] == second, "the old revision serves again"
        assert rolled["weight"] == 100
        assert rolled["rollout"]["target"] == third["id"]

        def new_pair_gone() -> Any:
            found = rev.statefulsets()
            return found if f"{third['prefix']}-decode" not in found else None

        gone = wait("the new pair deleted", new_pair_gone, 30)
        assert pd_statefulsets(rev) == {f"{second['prefix']}-prefill", f"{second['prefix']}-decode"}
        # Held: the spec still names the rejected revision, the serving pair is not re-rendered from it.
        # (The idle colocated StatefulSet, 0 pods and outside the revisions, may follow the spec.)
        pair = {f"{second['prefix']}-prefill", f"{second['prefix']}-decode"}
        generations = {n: s["metadata"]["generation"] for n, s in gone.items() if n in pair}
        assert set(generations) == pair
        time.sleep(6)
        later = {n: s["metadata"]["generation"] for n, s in rev.statefulsets().items() if n in pair}
        assert later == generations
        assert rev.revisions()["current"] == second
        print(
            f"decode of the new revision slowed x20 at 50% -> weight 0 in {to_zero:.1f}s, "
            f"new pair deleted {time.time() - bad_at:.0f}s after the change: {seen}"
        )
        router = scrape(router_ip, meta.ROUTER_PORT)
    finally:
        load.stop(timeout=60)
    failures = [s.error for s in load.samples(since=changed) if not s.ok]
    print(f"{len(load.samples(since=changed))} requests since the first change, {len(failures)} failed")
    assert failures == []
    assert total(router, "tandem_router_failures_total", role="decode") == 0, "no refused (mixed) pair"
    # Weight only ever went to a revision whose pair was ready: none stood in for another.
    assert any(name == "tandem_router_revision_stood_in_total" for name, _ in router)
    assert total(router, "tandem_router_revision_stood_in_total") == 0
    assert total(router, "tandem_router_revision_requests_total", revision=third["id"], code="2xx") > 0
