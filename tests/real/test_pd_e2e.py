"""P/D with real vLLM engines through the operator's router: a gray rollout from one colocated
engine, a killed decode that rolls it back, a retry that promotes, and answers equal token for token.

On the dev cluster with the CPU build of vLLM and the tiny model (docs/real-vllm.md), one
PDDeployment with all three pools and `spec.rollout`:
1. Colocated (one engine) answers every request through its router; the answers are recorded.
2. `spec.serving.mode` goes to Disaggregated under a streamed load through the router: the P/D arm
   (one prefill, one decode, NixlConnector over loopback) starts beside the colocated engine (three
   engines at once, the most this phase allows) and takes 50% of the requests. The decode engine is
   killed -9 mid-step (its whole process group, as a container's kill): the streams on it end with the
   router's error event, and while the engine starts again (a minute or more) the colocated arm serves
   the P/D share, each such request counted as the P/D arm's failure; the analysis reads the failures
   from Prometheus and the rollout rolls back, weight first; no request fails before the kill or once
   the weight is back on colocated.
3. `retry` starts the P/D arm again; it passes 50% and is promoted; the load stops (one P/D pair on
   these CPU engines does not keep up with all of it: a judged 100% step failed one clean-clone run)
   and colocated goes.
4. The P/D answers must equal the colocated ones token for token (temperature 0, --dtype float32):
   completions and chat, streamed and not, over PROMPTS prompts from 1 to about 1,300 tokens. The
   decode engine's counters must show the prompt's KV arrived by transfer, with no prompt token
   computed there, and the prefill engine's prefix cache must count a repeated prompt as hits.
   Prometheus scrapes the engines like any pod; every series and query tandem reads answers.
5. The prefill engine is killed -9 and restarted in the same pod (same IP and side-channel port) while
   decode still holds its NIXL peer: vLLM gives the new process a new engine_id, the router passes it
   to decode in `kv_transfer_params`, and decode handshakes again; the answers stay equal.
6. Abandoned requests: clients that leave 10-400 ms after sending, and prefills finished for a decode
   that never comes; how long the prefill engine holds their KV (real vLLM has no route the router
   can free it by; its lease bounds the hold).
7. A second prefill engine joins; one is killed -9 with the router's prefill legs in flight on it
   (frozen first, so they are): each leg is sent again to the other, and every answer stays equal.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tandem.api import meta
from tandem.demo import e2e as harness
from tandem.demo.load import BackgroundLoad, Phase
from tandem.demo.stats import Sample
from tandem.devcluster import kube, tinymodel
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess, eventually, metric_total, scratch_namespace
from tandem.metrics import queries
from tandem.versions import VLLM_IMAGE

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(2400)]

MODEL = "tiny-llama"
ROUTER_IMAGE = "ghcr.io/tandem-dev/tandem:0.1.0"
MAX_TOKENS = 24
PROMPTS = 24
FORMS = (("completions", False), ("completions", True), ("chat", False), ("chat", True))
# Engines on CPU start in about a minute alone; two at once on two busy cores take longer.
READY_TIMEOUT = 900
NAME = "tiny"
# The analysis: windows of 30 s with at least 8 requests on the target arm (the load below sends 1
# request/s, so about 15 a window at 50%); a step advances as soon as a window passes. At 1.5 requests/s
# a P/D pair at 100% fell behind in one clean-clone run of four; at 0.5 requests/s the kill cut too few
# P/D requests for a judged window before the requests stood in for were counted as the arm's failures.
WINDOW = 30
MIN_SAMPLES = 8
GRAY_LOAD = Phase(1.0, 120, 32, "gray")
# From the decode kill to the rollback's weight 0: the failures must reach Prometheus (scraped every
# 2 s) and a judged window (read every 5 s); generous for a busy machine.
ROLLBACK_TIMEOUT = 240


def prompts() -> list[str]:
    """PROMPTS prompts of mixed length (1 to about 900 words), from the tiny model's corpus words."""
    rng = random.Random(7)
    words = " ".join(tinymodel.corpus(11, lines=600)).split()
    lengths = [
        1,
        2,
        3,
        5,
        8,
        12,
        20,
        30,
        45,
        60,
        80,
        100,
        130,
        160,
        200,
        250,
        300,
        380,
        450,
        520,
        600,
        700,
        800,
        900,
    ]
    assert len(lengths) == PROMPTS
    out = []
    for n in lengths:
        start = rng.randrange(len(words) - n)
        out.append(" ".join(words[start : start + n]))
    return out


def held_back_prompts() -> list[str]:
    """Six prompts of 150 to 700 words the P/D engines see only after the prefill restart."""
    rng = random.Random(13)
    words = " ".join(tinymodel.corpus(17, lines=400)).split()
    out = []
    for n in (150, 250, 350, 450, 550, 700):
        start = rng.randrange(len(words) - n)
        out.append(" ".join(words[start : start + n]))
    return out


HELD_BACK_FORMS = (("completions", False), ("chat", True))


def manifest(prometheus_url: str) -> dict[str, Any]:
    """All three pools, serving colocated, with a gray rollout of one step judged on short windows."""
    pool = {
        "replicas": 1,
        "tensorParallelSize": 1,
        "resources": {"requests": {"cpu": "1", "memory": "6Gi"}},
    }
    spec: dict[str, Any] = {
        "model": {"name": MODEL, "uri": "file:///models/tiny-llama", "maxModelLen": 2048},
        "engine": {
            "type": "vllm",
            "image": VLLM_IMAGE,
            "extraArgs": ["--dtype", "float32", "--enforce-eager", "--max-num-seqs", "16", "--seed", "0"],
        },
        "kvTransfer": {"connector": "NixlConnector"},
        "network": {"rdma": {"enabled": False}},
        "router": {"replicas": 1, "image": ROUTER_IMAGE},
        "serving": {"mode": "Colocated"},
        "colocated": pool,
        "prefill": pool,
        "decode": pool,
        # Loose targets: three CPU engines share two cores with the control plane, so only a fault,
        # not the machine's speed, may fail a window. With TTFT 5 s a run on a busy machine (load
        # average 8-16) promoted P/D, then fell back to colocated by itself (steady P/D breach,
        # autoRollback) during the one-at-a-time requests: KV pulls over NIXL's TCP transport on
        # loopback took up to several seconds there.
        "slo": {"ttftMs": 30000, "tpotMs": 2000, "attainmentPercent": 80},
        "autoscaling": {"enabled": False, "prometheus": {"url": prometheus_url}},
        "rollout": {
            "steps": [{"weight": 50, "pauseSeconds": 0}],
            "analysis": {
                "windowSeconds": WINDOW,
                "minSamples": MIN_SAMPLES,
                "maxAttainmentDrop": 0.3,
                "inconclusivePauseSeconds": 600,
            },
            "scaleDownDelaySeconds": 5,
        },
    }
    return {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": {"name": NAME}, "spec": spec}


@dataclass
class Answer:
    """What a request's answer says, the part that must be equal: text, token ids, finish reason,
    token counts."""

    text: str
    token_ids: list[int] | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    chunks: int = field(default=0, compare=False)
    seconds: float = field(default=0.0, compare=False)


def body(endpoint: str, stream: bool, prompt: str) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "return_token_ids": True,
        "stream": stream,
    }
    if stream:
        b["stream_options"] = {"include_usage": True}
    if endpoint == "chat":
        b["messages"] = [{"role": "user", "content": prompt}]
    else:
        b["prompt"] = prompt
    return b


def ask(router: str, endpoint: str, stream: bool, prompt: str) -> Answer:
    url = urllib.parse.urlsplit(router)
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=300)
    try:
        conn.request(
            "POST", path, json.dumps(body(endpoint, stream, prompt)), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        raw = resp.read()
        assert resp.status == 200, raw[:1000]
    finally:
        conn.close()
    if not stream:
        data = json.loads(raw)
        choice = data["choices"][0]
        text = choice["message"]["content"] if endpoint == "chat" else choice["text"]
        return Answer(
            text,
            choice.get("token_ids"),
            choice.get("finish_reason"),
            data["usage"]["prompt_tokens"],
            data["usage"]["completion_tokens"],
            1,
        )
    text, ids, finish, usage, chunks = "", [], None, {}, 0
    saw_ids = False
    for line in raw.decode().splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[len("data: ") :])
        if event.get("usage"):
            usage = event["usage"]
        for choice in event.get("choices", []):
            chunks += 1
            text += (
                (choice.get("delta") or {}).get("content") or ""
                if endpoint == "chat"
                else choice.get("text", "")
            )
            if choice.get("token_ids") is not None:
                saw_ids = True
                ids += choice["token_ids"]
            finish = choice.get("finish_reason") or finish
    assert usage, raw[-500:]
    return Answer(
        text, ids if saw_ids else None, finish, usage["prompt_tokens"], usage["completion_tokens"], chunks
    )


def run_all(
    router: str, asked: list[str] | None = None, forms: tuple[tuple[str, bool], ...] = FORMS
) -> dict[tuple[int, str, bool], Answer]:
    """Every prompt in every form, one at a time (so batching is the same on both sides)."""
    out = {}
    for i, prompt in enumerate(prompts() if asked is None else asked):
        for endpoint, stream in forms:
            started = time.monotonic()
            answer = ask(router, endpoint, stream, prompt)
            answer.seconds = time.monotonic() - started
            out[(i, endpoint, stream)] = answer
    return out


def latency(answers: dict[tuple[int, str, bool], Answer]) -> str:
    times = sorted(a.seconds for a in answers.values())
    median, p90 = times[len(times) // 2], times[int(len(times) * 0.9)]
    return f"median {median:.3f} s, p90 {p90:.3f} s, max {times[-1]:.3f} s"


def engine_rss(pod: dict[str, Any]) -> float:
    """GB resident in the pod's processes: the runner starts each in its own process group, whose
    id is the pid the pod's containerID names (`tandem://PID`)."""
    statuses = pod["status"].get("containerStatuses") or []
    pgid = int(statuses[0]["containerID"].removeprefix("tandem://"))
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ..., rss at [21]
            total += int(fields[21]) * 4096
    return total / 1e9


@dataclass
class Deployed:
    cluster: ClusterHandle
    namespace: str
    name: str

    def ips(self, role: str) -> list[str]:
        with self.cluster.api_client() as api:
            ips = kube.ready_pod_ips(api, self.namespace, self.name, role)
        assert all(ip.startswith("127.") for ip in ips), ips
        return ips

    def router(self) -> str:
        return f"http://{self.ips('router')[0]}:{meta.ROUTER_PORT}"

    def metrics(self, role: str) -> str:
        ip = self.ips(role)[0]
        with urllib.request.urlopen(f"http://{ip}:{meta.ENGINE_PORT}/metrics", timeout=10) as answer:
            text: str = answer.read().decode()
        return text

    def pod(self, role: str) -> dict[str, Any]:
        return next(p for p in self.pods() if p["metadata"]["labels"].get(meta.LABEL_ROLE) == role)

    def pods(self, role: str | None = None) -> list[dict[str, Any]]:
        with self.cluster.api_client() as api:
            selector = f"{meta.LABEL_PDD}={self.name}" + (f",{meta.LABEL_ROLE}={role}" if role else "")
            listed = client.CoreV1Api(api).list_namespaced_pod(
                self.namespace, label_selector=selector, _preload_content=False
            )
            items: list[dict[str, Any]] = kube.raw(listed)["items"]
        return items

    def restarts(self, role: str) -> int:
        statuses = self.pod(role)["status"].get("containerStatuses") or []
        return sum(int(s.get("restartCount") or 0) for s in statuses)

    def kill_9(self, role: str) -> None:
        """SIGKILL to every process of the role's engine container, as a container runtime's kill:
        the runner starts each container in its own process group, named by `tandem://PGID`."""
        statuses = self.pod(role)["status"].get("containerStatuses") or []
        os.killpg(int(statuses[0]["containerID"].removeprefix("tandem://")), signal.SIGKILL)

    def set_mode(self, mode: str) -> None:
        patch = json.dumps({"spec": {"serving": {"mode": mode}}})
        self.cluster.kubectl("patch", "-n", self.namespace, "pdd", self.name, "--type", "merge", "-p", patch)

    def command(self, value: str) -> None:
        annotation = f"{meta.ANNOTATION_ROLLOUT_COMMAND}={value}"
        self.cluster.kubectl("annotate", "-n", self.namespace, "pdd", self.name, annotation, "--overwrite")


def undeploy(d: Deployed) -> None:
    d.cluster.kubectl("delete", "-n", d.namespace, "pdd", d.name, "--wait=true")
    # The runner removes an engine pod only once its process has stopped.
    eventually(lambda: not d.pods(), timeout=300, interval=2, what=f"the pods of {d.name} gone")


@dataclass
class Run:
    answers: dict[tuple[int, str, bool], Answer]
    seconds: float
    before: dict[str, str]
    after: dict[str, str]
    # Prompts P/D sees first after the prefill restart (so decode holds no cache of them).
    held_back: dict[tuple[int, str, bool], Answer] = field(default_factory=dict)


@pytest.fixture(scope="module")
def namespace(cluster: ClusterHandle) -> Iterator[str]:
    with scratch_namespace(cluster, f"t-real-{uuid.uuid4().hex[:6]}") as name:
        yield name


@pytest.fixture(scope="module")
def deployed(cluster: ClusterHandle, operator: OperatorProcess, namespace: str) -> Iterator[Deployed]:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest(cluster.prometheus_url))
    )
    d = Deployed(cluster, namespace, NAME)
    started = time.monotonic()
    eventually(
        lambda: bool(d.ips("colocated") and d.ips("router")),
        timeout=READY_TIMEOUT,
        interval=2,
        what=f"the colocated engine and the router of {NAME} Ready",
    )
    print(f"\n{NAME}: colocated engine Ready {time.monotonic() - started:.0f} s after apply")
    try:
        yield d
    finally:
        undeploy(d)


@pytest.fixture(scope="module")
def colocated(deployed: Deployed) -> Run:
    """The reference: the colocated engine's answers, recorded before any rollout."""
    before = {"colocated": deployed.metrics("colocated")}
    started = time.monotonic()
    answers = run_all(deployed.router())
    seconds = time.monotonic() - started
    after = {"colocated": deployed.metrics("colocated")}
    held_back = run_all(deployed.router(), held_back_prompts(), HELD_BACK_FORMS)
    print(f"colocated engine RSS {engine_rss(deployed.pod('colocated')):.2f} GB; latency {latency(answers)}")
    return Run(answers, seconds, before, after, held_back)


def rollout_phase(seen: harness.Seen) -> tuple[str, int]:
    r = seen.status.get("rollout") or {}
    return (str(r.get("phase", "")), int(r.get("weight", -1)))


@dataclass
class Gray:
    """What the gray rollout under load did: the phases it went through and what the clients saw."""

    phases: list[tuple[str, int]]
    killed_at: float
    running_at_kill: float
    weight_back_at: float
    rolled_back: dict[str, Any]
    promoted_at: float
    samples: list[Sample]
    events: list[str]


def streaming(d: Deployed) -> bool:
    text = d.metrics("decode")
    answered = metric_total(text, "vllm:request_success_total")
    return answered >= 3 and metric_total(text, "vllm:num_requests_running") >= 1


@pytest.fixture(scope="module")
def gray(cluster: ClusterHandle, deployed: Deployed, colocated: Run) -> Iterator[Gray]:
    d = deployed
    watch = harness.Watcher(cluster, d.namespace, NAME, period=1.0).start()
    load = BackgroundLoad(
        d.router(),
        MODEL,
        max_requests=20000,
        max_seconds=3000,
        request_timeout=300,
        vocab_size=tinymodel.VOCAB_SIZE,
    )
    try:
        began = time.time()
        load.start(GRAY_LOAD)
        d.set_mode("Disaggregated")
        shifting = watch.wait(
            "the P/D arm at 50%", lambda s: s if rollout_phase(s) == ("Shifting", 50) else None, READY_TIMEOUT
        )
        print(f"P/D arm Ready and at 50% {shifting.at - began:.0f} s after the mode change")
        # Kill the decode engine while it streams: once it has answered a few and runs one.
        eventually(lambda: streaming(d), timeout=180, interval=0.5, what="the decode engine streaming")
        running = metric_total(d.metrics("decode"), "vllm:num_requests_running")
        killed_at = time.time()
        d.kill_9("decode")
        back = watch.wait(
            "the rollback's weight 0",
            lambda s: s if rollout_phase(s)[0] in ("RollingBack", "RolledBack") else None,
            ROLLBACK_TIMEOUT,
        )
        since = back.at - killed_at
        print(f"decode killed -9 with {running:.0f} running; weight back on colocated {since:.1f} s later")
        rolled = watch.wait(
            "RolledBack", lambda s: s if rollout_phase(s)[0] == "RolledBack" else None, READY_TIMEOUT
        )
        d.command("retry")
        promoted = watch.wait(
            "Promoted", lambda s: s if rollout_phase(s)[0] == "Promoted" else None, 2 * READY_TIMEOUT
        )
        print(f"promoted {promoted.at - rolled.at:.0f} s after the retry")
        load.stop(timeout=400)
        # The rollout is done: spec.rollout goes (and the colocated pool with it, which would otherwise
        # start again without a rollout to hold it at 0), so that the steady P/D watch (autoRollback)
        # cannot fall back to colocated during the correctness tests that follow. One clean-clone run
        # fell back there: the P/D pair's slow requests on these CPU engines missed the loose SLO at its
        # fixed (maximum) size, which is the watch doing its job, not what these tests are about.
        done = [
            {"op": "remove", "path": "/spec/rollout"},
            {"op": "replace", "path": "/spec/colocated/replicas", "value": 0},
        ]
        d.cluster.kubectl("patch", "-n", d.namespace, "pdd", NAME, "--type", "json", "-p", json.dumps(done))
        eventually(lambda: not d.pods("colocated"), timeout=300, interval=2, what="the colocated pod gone")
        phases: list[tuple[str, int]] = []
        for seen in watch.since(began):
            got = rollout_phase(seen)
            if got[0] and (not phases or phases[-1] != got):
                phases.append(got)
        yield Gray(
            phases=phases,
            killed_at=killed_at,
            running_at_kill=running,
            weight_back_at=back.at,
            rolled_back=dict(rolled.status.get("rollout") or {}),
            promoted_at=promoted.at,
            samples=load.samples(since=began),
            events=[
                f"{e.get('reason')}: {e.get('message', '')}"
                for e in harness.events(cluster, d.namespace, NAME)
            ],
        )
    finally:
        if load.running:
            load.stop(timeout=60)
        watch.stop()


@pytest.fixture(scope="module")
def pd(deployed: Deployed, gray: Gray) -> Deployed:
    """The same PDDeployment once the rollout promoted P/D (one prefill, one decode)."""
    assert deployed.ips("prefill")
    assert deployed.ips("decode")
    return deployed


@pytest.fixture(scope="module")
def disaggregated(pd: Deployed) -> Run:
    before = {role: pd.metrics(role) for role in ("prefill", "decode")}
    started = time.monotonic()
    answers = run_all(pd.router())
    seconds = time.monotonic() - started
    after = {role: pd.metrics(role) for role in ("prefill", "decode")}
    # Still P/D throughout: a steady-P/D fall-back to colocated (autoRollback) would answer the same.
    seen = json.loads(pd.cluster.kubectl("get", "-n", pd.namespace, "pdd", pd.name, "-o", "json").stdout)
    assert seen["status"].get("mode") == "Disaggregated", seen["status"].get("rollout")
    rss = ", ".join(f"{role} {engine_rss(pd.pod(role)):.2f} GB" for role in ("prefill", "decode"))
    print(f"engine RSS: {rss}; P/D latency {latency(answers)}")
    return Run(answers, seconds, before, after)


def delta(run: Run, role: str, name: str, **labels: str) -> float:
    return metric_total(run.after[role], name, **labels) - metric_total(run.before[role], name, **labels)


def test_a_gray_rollout_rolls_back_on_a_killed_decode_and_promotes_on_retry(gray: Gray) -> None:
    print(f"\nrollout phases: {gray.phases}")
    print(f"rolled back: {gray.rolled_back.get('reason')}")
    failed = [s for s in gray.samples if not s.ok]
    for s in failed:
        print(f"  failed, sent at kill{s.sent_at - gray.killed_at:+.1f} s: {s.error}")
    print(f"{len(gray.samples)} requests during the rollouts, {len(failed)} failed")
    # The first attempt: the P/D arm prepared and took 50%, the kill rolled it back, weight first.
    first = gray.phases[: gray.phases.index(("RolledBack", 0)) + 1]
    assert [p for p, _ in first] == ["Preparing", "Shifting", "RollingBack", "RolledBack"], gray.phases
    assert ("Shifting", 50) in first
    assert ("RollingBack", 0) in first
    reason = str(gray.rolled_back.get("reason", ""))
    assert "error" in reason.lower(), reason  # the failed requests, read from the routers' series
    verdicts = [v for v in gray.rolled_back.get("verdicts") or [] if v.get("result") == "Fail"]
    assert verdicts, gray.rolled_back
    print(f"the failed window's figures: {verdicts[-1].get('figures')}")
    # The retry: prepared again, the step passed, promoted at 100%.
    retry = gray.phases[len(first) :]
    assert retry, gray.phases
    assert retry[0][0] == "Preparing", gray.phases
    assert ("Shifting", 50) in retry
    assert retry[-1] == ("Promoted", 100), gray.phases
    assert gray.rolled_back.get("attempt") == 1
    # Only what the kill cut failed: streams running on the decode engine (the router's error event)
    # and requests sent before the router saw it gone; nothing once the weight was back.
    assert failed, "the kill found the decode engine streaming, so some stream must have been cut"
    assert all(gray.killed_at - 300 < s.sent_at < gray.weight_back_at for s in failed), failed
    assert any("engine failed mid-answer" in s.error for s in failed), [s.error for s in failed]
    events = " | ".join(gray.events)
    assert "RolloutRolledBack" in events, events
    assert "RolloutPromoted" in events, events


def test_pd_answers_equal_the_colocated_ones_token_for_token(colocated: Run, disaggregated: Run) -> None:
    ref, got = colocated.answers, disaggregated.answers
    assert set(ref) == set(got)
    assert len(ref) == PROMPTS * len(FORMS)
    prompt_lengths = sorted({a.prompt_tokens for (_, e, _), a in ref.items() if e == "completions"})
    assert prompt_lengths[0] <= 3, prompt_lengths
    assert prompt_lengths[-1] >= 900, prompt_lengths
    # token ids come back in every form, so the comparison is of tokens, not only of text
    assert all(a.token_ids is not None and len(a.token_ids) == a.completion_tokens for a in ref.values())
    assert all(a.completion_tokens > 0 for a in ref.values())
    streamed = [a for (_, _, s), a in got.items() if s]
    assert all(a.chunks > 1 for a in streamed if a.completion_tokens > 1)
    different = {key: (ref[key], got[key]) for key in ref if ref[key] != got[key]}
    equal = len(ref) - len(different)
    print(
        f"\nP/D vs colocated: {equal}/{len(ref)} answers equal token for token "
        f"({PROMPTS} prompts x {len(FORMS)} forms); colocated {colocated.seconds:.1f} s, "
        f"P/D {disaggregated.seconds:.1f} s for the {len(ref)} requests, one at a time "
        f"({sum(a.completion_tokens for a in ref.values())} and "
        f"{sum(a.completion_tokens for a in got.values())} tokens generated)"
    )
    assert not different, different
    # the same prompt's streamed and unstreamed answers agree too
    for i in range(PROMPTS):
        for endpoint in ("completions", "chat"):
            assert ref[(i, endpoint, False)] == ref[(i, endpoint, True)]


def test_decode_received_the_prompt_kv_and_computed_none_of_it(disaggregated: Run) -> None:
    prompt = delta(disaggregated, "decode", "vllm:prompt_tokens_total")
    transferred = delta(
        disaggregated, "decode", "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
    )
    computed = delta(disaggregated, "decode", "vllm:prompt_tokens_by_source_total", source="local_compute")
    cached = delta(disaggregated, "decode", "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
    sent = sum(a.prompt_tokens for a in disaggregated.answers.values())
    print(
        f"\ndecode: {prompt:.0f} prompt tokens, {transferred:.0f} transferred, {cached:.0f} from its own "
        f"cache, {computed:.0f} computed; {sent} prompt tokens sent"
    )
    assert prompt == sent
    assert computed == 0
    assert transferred + cached == prompt
    # Each form of a prompt repeats what decode already holds from the form before; the first of
    # each (and every chat/completions switch) arrives by NIXL.
    assert transferred > 0.4 * prompt
    assert delta(disaggregated, "decode", "vllm:nixl_xfer_time_seconds_count") > 0
    assert delta(disaggregated, "decode", "vllm:nixl_num_failed_transfers_total") == 0
    # prefill computed the prompts
    assert delta(disaggregated, "prefill", "vllm:prompt_tokens_total") == sent


def test_prefill_prefix_cache_counts_a_repeated_prompt(pd: Deployed, disaggregated: Run) -> None:
    words = " ".join(tinymodel.corpus(99, lines=200)).split()
    prompt = " ".join(words[:700])
    router = pd.router()
    first = ask(router, "completions", False, prompt)
    before = pd.metrics("prefill")
    again = ask(router, "completions", False, prompt)
    after = pd.metrics("prefill")
    assert again == first
    hits = metric_total(after, "vllm:prefix_cache_hits_total") - metric_total(
        before, "vllm:prefix_cache_hits_total"
    )
    queries = metric_total(after, "vllm:prefix_cache_queries_total") - metric_total(
        before, "vllm:prefix_cache_queries_total"
    )
    print(f"\nprefill prefix cache on the repeat: {hits:.0f} hits of {queries:.0f} queried tokens")
    assert queries == first.prompt_tokens
    assert hits >= 0.9 * first.prompt_tokens


def test_prometheus_scrapes_the_engines(cluster: ClusterHandle, pd: Deployed, disaggregated: Run) -> None:
    names = {
        p["metadata"]["name"] for p in pd.pods() if p["metadata"]["labels"].get(meta.LABEL_ROLE) != "router"
    }

    def scraped() -> set[str] | None:
        query = urllib.parse.urlencode({"query": f'vllm:prompt_tokens_total{{namespace="{pd.namespace}"}}'})
        with urllib.request.urlopen(f"{cluster.prometheus_url}/api/v1/query?{query}", timeout=10) as answer:
            result = json.load(answer)["data"]["result"]
        pods = {r["metric"].get("pod") for r in result if float(r["value"][1]) > 0}
        return pods if names <= pods else None

    eventually(scraped, timeout=60, interval=2, what=f"Prometheus series of {sorted(names)}")


# --- the metric contract: what tandem reads from engines, against real vLLM -----------------------

ROOT = Path(__file__).resolve().parents[2]
# Where tandem reads engine metrics: the autoscaler's and KV-transport queries, rollout/revision
# analysis (tandem.metrics), the dashboard, the router's KV watch, the controller's KV status.
READERS = (
    "operator/tandem/metrics",
    "operator/tandem/dashboard",
    "operator/tandem/signals.py",
    "operator/tandem/router/kvwatch.py",
    "operator/tandem/controller/kv_transport.py",
    "charts/tandem/dashboards/tandem.json",
)
# Read only as a fallback for vLLM before 0.10 (router/kvwatch.py); real 0.32 has kv_cache_usage_perc.
LEGACY = {"vllm:gpu_cache_usage_perc"}
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


def names_tandem_reads() -> set[str]:
    found: set[str] = set()
    for entry in READERS:
        path = ROOT / entry
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            found |= set(re.findall(r"vllm:[a-z0-9_]+", f.read_text()))
    return found - LEGACY


def families(text: str) -> set[str]:
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line.startswith("vllm:")}


def exported(name: str, present: set[str]) -> bool:
    if name.endswith("_"):  # a family prefix in prose, e.g. vllm:nixl_*
        return any(p.startswith(name) for p in present)
    return any(name + suffix in present for suffix in SUFFIXES)


def test_every_engine_series_tandem_reads_is_exported_in_each_role(
    colocated: Run, pd: Deployed, disaggregated: Run
) -> None:
    names = names_tandem_reads()
    assert {
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:nixl_xfer_time_seconds_bucket",
    } <= names
    texts = {"colocated": colocated.after["colocated"], **{r: pd.metrics(r) for r in ("prefill", "decode")}}
    missing = {}
    for role, text in texts.items():
        present = families(text)
        # No KV connector on a colocated engine: no NIXL series there, by design.
        wanted = {n for n in names if role != "colocated" or not n.startswith("vllm:nixl")}
        missing[role] = sorted(n for n in wanted if not exported(n, present))
    assert missing == {"colocated": [], "prefill": [], "decode": []}, missing
    # cache_config_info carries num_gpu_blocks, which the prefill drain reads (held-KV estimate)
    for role, text in texts.items():
        info = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
        assert info, role
        assert re.search(r'num_gpu_blocks="[1-9][0-9]*"', info[0]), (role, info[0])


def test_every_engine_query_tandem_runs_answers_for_each_pool(
    cluster: ClusterHandle, pd: Deployed, disaggregated: Run
) -> None:
    """The autoscaler's engine queries, the drain's pod queries and the KV-transport queries, as
    tandem renders them, on the dev cluster's Prometheus: every one answers, for both pools where it
    groups by pool. tandem:kv_held_blocks is the sim engine's alone (queries.py estimates held KV from
    kv_cache_usage_perc x num_gpu_blocks on real vLLM)."""

    def query(promql: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{cluster.prometheus_url}/api/v1/query?{q}", timeout=10) as answer:
            data = json.load(answer)
        assert data["status"] == "success", (promql, data)
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    window = 600.0
    engine_queries = queries.snapshot_queries(pd.namespace, pd.name, window, 0.95)
    engine_queries = {q.name: engine_queries[q.name] for q in queries.ENGINE_QUERIES}
    pods = [p["metadata"]["name"] for p in pd.pods() if p["metadata"]["labels"][meta.LABEL_ROLE] != "router"]
    pod_queries = queries.pod_load_queries(pd.namespace, pods)
    kv_queries = queries.kv_transport_queries(pd.namespace, pd.name, window)
    # waiting_before and running_before look one window back: only once the pools are that old.
    wanted = {**engine_queries, **pod_queries, **kv_queries}
    sim_only = {"pod_kv_held_blocks"}
    empty: dict[str, str] = {}

    def all_answer() -> bool:
        empty.clear()
        for name, promql in wanted.items():
            if name in sim_only or name in ("waiting_before", "running_before"):
                continue
            result = query(promql)
            roles = {r["metric"].get(queries.LABEL_ROLE) for r in result}
            if not result or ("by (tandem_dev_role" in promql and not {"prefill", "decode"} <= roles):
                empty[name] = promql
        return not empty

    with contextlib.suppress(AssertionError):
        eventually(all_answer, timeout=60, interval=5, what="every engine query answering")
    assert not empty, empty
    assert query(pod_queries["pod_kv_held_blocks"]) == []  # sim-only: absent on real vLLM, by design


# --- a prefill restarted while decode holds its NIXL peer ------------------------------------------


def engine_id(ip: str) -> str:
    """The engine_id a prefill engine gives its KV (`remote_engine_id` in `kv_transfer_params`): what a
    decode engine knows its NIXL peer by. One token, prefilled for a remote decode that never comes
    (its blocks are freed at the engine's abort timeout)."""
    request = {
        "model": MODEL,
        "prompt": "engine id",
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    req = urllib.request.Request(
        f"http://{ip}:{meta.ENGINE_PORT}/v1/completions",
        data=json.dumps(request).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as answer:
        params = json.load(answer)["kv_transfer_params"]
    return str(params["remote_engine_id"])


def test_a_prefill_restarted_in_its_pod_while_decode_holds_its_nixl_peer(
    pd: Deployed, colocated: Run, disaggregated: Run
) -> None:
    """It restarts the prefill engine. The container is killed -9 and restarted
    by the runner in the same pod, so it comes back at the same IP and side-channel port; the decode
    engine still holds the NIXL agent of the process that died."""
    ip = pd.ips("prefill")[0]
    old_id = engine_id(ip)
    restarts = pd.restarts("prefill")
    killed_at = time.monotonic()
    pd.kill_9("prefill")
    eventually(
        lambda: pd.restarts("prefill") > restarts and pd.ips("prefill") == [ip],
        timeout=READY_TIMEOUT,
        interval=2,
        what="the prefill engine restarted in its pod and Ready",
    )
    print(f"\nprefill restarted and Ready {time.monotonic() - killed_at:.0f} s after the kill, at {ip}")
    new_id = engine_id(ip)
    print(f"prefill engine_id {old_id} before the kill, {new_id} after")
    assert new_id != old_id  # vLLM draws a new engine_id per start; tandem does not pin it
    before = pd.metrics("decode")
    got = run_all(pd.router(), held_back_prompts(), HELD_BACK_FORMS)
    after = pd.metrics("decode")

    def grew(name: str, **labels: str) -> float:
        return metric_total(after, name, **labels) - metric_total(before, name, **labels)

    transferred = grew("vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    print(f"after the restart: {transferred:.0f} prompt tokens arrived at decode by NIXL")
    assert got == colocated.held_back
    assert transferred > 0
    assert grew("vllm:nixl_num_failed_transfers_total") == 0


# --- abandoned requests: how long real vLLM holds a finished prefill's KV -------------------------

# Clients that leave 10 ms to 400 ms after sending (the router cancels their legs).
DROP_AFTER_S = (0.01, 0.05, 0.1, 0.2, 0.4)
DROPS_EACH = 8
# Prefills finished for a decode that never comes: what the router holds when its client leaves
# between the prefill's answer and the decode leg.
HELD_PREFILLS = 8
# vLLM >= 0.22 holds a finished prefill's blocks for a lease (`kv_lease_duration`, 30 s, render/
# lifecycle.py) that only a decode engine's heartbeats extend; nothing heartbeats for these.
LEASE_S = 30
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"


def drop_after(router: str, prompt: str, seconds: float) -> None:
    url = urllib.parse.urlsplit(router)
    payload = json.dumps(
        {"model": MODEL, "prompt": prompt, "max_tokens": 64, "stream": True, "temperature": 0}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {url.hostname}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname or "", url.port or 80), timeout=10) as sock:
        sock.sendall(head + payload)
        time.sleep(seconds)  # the client's patience, the fault under test


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, {}


def kv_usage(d: Deployed) -> float:
    return metric_total(d.metrics("prefill"), "vllm:kv_cache_usage_perc")


def test_abandoned_requests_hold_prefill_kv_for_at_most_one_lease(pd: Deployed) -> None:
    """The router frees the KV of an attempt its client abandoned by asking the prefill pod to
    (`POST /abort_requests`, which the sim engine serves). `vllm serve` 0.32 has no such route (only
    under `--tokens-only`, or `/inference/v1/abort_requests` with `--enable-scale-out`), so on real
    vLLM a finished prefill whose client left keeps its blocks until its lease lapses. Measured here:
    1. a burst of streaming requests whose clients leave 10-400 ms after sending, through the router;
    2. prefills finished for a decode that never comes (the router's state when its client leaves
       between the prefill's answer and the decode leg), sent to the prefill engine as the router
       sends them, then the router's release asked for: the blocks stay held until the lease."""
    words = " ".join(tinymodel.corpus(23, lines=400)).split()
    prompts = [" ".join(words[i * 40 : i * 40 + 700]) for i in range(len(DROP_AFTER_S) * DROPS_EACH)]
    router = pd.router()
    before = pd.metrics("prefill")
    threads = [
        threading.Thread(target=drop_after, args=(router, prompt, DROP_AFTER_S[i % len(DROP_AFTER_S)]))
        for i, prompt in enumerate(prompts)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    eventually(lambda: kv_usage(pd) == 0, timeout=LEASE_S + 90, interval=1, what="the burst's KV freed")
    after = pd.metrics("prefill")
    finished = metric_total(after, "vllm:request_success_total") - metric_total(
        before, "vllm:request_success_total"
    )
    print(
        f"\n{len(prompts)} requests abandoned 10-400 ms after sending: {finished:.0f} prefills finished; "
        f"{metric_total(after, EXPIRED) - metric_total(before, EXPIRED):.0f} leases expired"
    )

    ip = pd.ips("prefill")[0]
    engine = f"http://{ip}:{meta.ENGINE_PORT}"
    before = pd.metrics("prefill")
    ids = []
    for prompt in prompts[:HELD_PREFILLS]:
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True},
        }
        status, answer = post(f"{engine}/v1/completions", body)
        assert status == 200, answer
        ids.append(str(answer["id"]))
    held_from = time.monotonic()
    held = kv_usage(pd)
    release, _ = post(f"{engine}/abort_requests", {"request_ids": ids})
    samples: list[tuple[float, float]] = []

    def freed() -> bool:
        samples.append((time.monotonic() - held_from, kv_usage(pd)))
        return samples[-1][1] == 0

    eventually(freed, timeout=LEASE_S + 90, interval=1, what="the held prefills' KV freed")
    held_for = samples[-1][0]
    expired = metric_total(pd.metrics("prefill"), EXPIRED) - metric_total(before, EXPIRED)
    print(
        f"{HELD_PREFILLS} prefills held for a decode that never came: KV usage {held:.2%} after them; "
        f"the router's release (POST /abort_requests) answered {release}; freed {held_for:.0f} s later "
        f"(lease {LEASE_S} s); {expired:.0f} leases expired"
    )
    assert held > 0
    assert release == 404  # no route on `vllm serve`: the release the router asks for cannot happen
    # Held for the lease, not longer: the bound (plus the engine's expiry check and 1-s polling).
    assert LEASE_S - 5 <= held_for <= LEASE_S + 15, samples


# --- a prefill engine killed mid-prefill, its legs retried on the other -------------------------

# Prompts with colocated reference answers (130 to 520 words), asked at once as plain completions.
MID_PREFILL_PROMPTS = range(12, 20)
UPSTREAM_IN_FLIGHT = "tandem_router_upstream_in_flight_requests"


def router_metrics(d: Deployed) -> str:
    with urllib.request.urlopen(d.router() + "/metrics", timeout=10) as answer:
        text: str = answer.read().decode()
    return text


def signal_group(pod: dict[str, Any], sig: signal.Signals) -> None:
    """`sig` to every process of the pod's engine container (its process group, `tandem://PGID`)."""
    statuses = pod["status"].get("containerStatuses") or []
    os.killpg(int(statuses[0]["containerID"].removeprefix("tandem://")), sig)


def test_a_prefill_killed_mid_prefill_is_retried_on_the_other(
    pd: Deployed, colocated: Run, disaggregated: Run
) -> None:
    """Last in the module: a second prefill engine joins (prefill, prefill, decode: three engines).
    One prefill engine is frozen (SIGSTOP to its process group) so that the router's prefill legs sent
    to it stay in flight, mid-prefill; then it is killed -9 while they are. The router sees each of
    those legs fail and sends it again to the other prefill engine: every client gets its whole
    answer, equal to the colocated engine's token for token."""
    patch = json.dumps({"spec": {"prefill": {"replicas": 2}}})
    pd.cluster.kubectl("patch", "-n", pd.namespace, "pdd", pd.name, "--type", "merge", "-p", patch)
    started = time.monotonic()
    eventually(
        lambda: len(pd.ips("prefill")) == 2, timeout=READY_TIMEOUT, interval=2, what="a second prefill Ready"
    )
    print(f"\nsecond prefill engine Ready {time.monotonic() - started:.0f} s after the patch")
    router = pd.router()
    victim = pd.pods("prefill")[0]
    before = router_metrics(pd)
    answers: dict[int, Answer] = {}
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            answers[i] = ask(router, "completions", False, prompts()[i])
        except (AssertionError, OSError) as error:
            errors.append(f"prompt {i}: {error}")

    signal_group(victim, signal.SIGSTOP)
    threads = [threading.Thread(target=one, args=(i,)) for i in MID_PREFILL_PROMPTS]
    try:
        for t in threads:
            t.start()

        def stuck() -> bool:
            """Every request answered (by the other engine) or waiting on a prefill leg, and some are."""
            legs = metric_total(router_metrics(pd), UPSTREAM_IN_FLIGHT, role="prefill")
            return legs >= 1 and len(answers) + legs >= len(MID_PREFILL_PROMPTS)

        eventually(stuck, timeout=60, interval=0.2, what="prefill legs in flight on the frozen engine only")
    finally:
        signal_group(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    for t in threads:
        t.join(timeout=300)
    after = router_metrics(pd)
    retried = metric_total(after, "tandem_router_retries_total", leg="prefill") - metric_total(
        before, "tandem_router_retries_total", leg="prefill"
    )
    print(
        f"prefill {victim['metadata']['name']} killed -9 mid-prefill; {len(answers)} of "
        f"{len(MID_PREFILL_PROMPTS)} answered within {time.monotonic() - killed_at:.0f} s, "
        f"{retried:.0f} prefill legs retried"
    )
    assert errors == []
    assert retried >= 1, "a leg in flight on the killed engine was sent again"
    for i in MID_PREFILL_PROMPTS:
        assert answers[i] == colocated.answers[(i, "completions", False)], i
