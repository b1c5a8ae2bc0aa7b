"""What the real-vLLM P/D modules share: the tiny-model PDDeployment, the prompts, asking the operator's
router and reading the answers, the deployed object's pods and engines (docs/real-vllm.md).

`test_pd_e2e.py` (in `make test`) checks correctness on one P/D pair; `test_pd_rollout_e2e.py` (in
`make test-real`) runs the gray rollout colocated -> P/D with a killed decode engine.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tandem.api import meta
from tandem.devcluster import kube, tinymodel
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import eventually
from tandem.versions import VLLM_IMAGE

MODEL = "tiny-llama"
ROUTER_IMAGE = "ghcr.io/tandem-dev/tandem:0.1.0"
MAX_TOKENS = 24
PROMPTS = 24
FORMS = (("completions", False), ("completions", True), ("chat", False), ("chat", True))
# Engines on CPU start in about a minute alone; two at once on two busy cores take longer.
READY_TIMEOUT = 900
NAME = "tiny"


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
# The 24 prompts (1 to 900 words), each in the four forms: 96 requests a side, the P/D answers checked
# token for token against the colocated ones (test_pd_e2e.py).
CHECKED = prompts()
# Prompts (130 to 520 words) asked at once as plain completions while a prefill engine is killed
# mid-prefill (test_pd_failures_e2e.py), by their index in prompts().
MID_PREFILL_PROMPTS = range(12, 20)
MID_PREFILL_FORM = ("completions", False)


def manifest(prometheus_url: str, rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    """All three pools, serving colocated; with `rollout`, its `spec.rollout`."""
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
    }
    if rollout is not None:
        spec["rollout"] = rollout
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
    d.cluster.kubectl("delete", "-n", d.namespace, "pdd", d.name, "--wait=true", "--ignore-not-found")
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
    # MID_PREFILL_PROMPTS as MID_PREFILL_FORM, by (index in prompts(), *form).
    mid_prefill: dict[tuple[int, str, bool], Answer] = field(default_factory=dict)


def deploy(cluster: ClusterHandle, namespace: str, doc: dict[str, Any]) -> Deployed:
    """Applies `doc` and waits for its colocated engine and its router."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
    d = Deployed(cluster, namespace, NAME)
    started = time.monotonic()
    eventually(
        lambda: bool(d.ips("colocated") and d.ips("router")),
        timeout=READY_TIMEOUT,
        interval=2,
        what=f"the colocated engine and the router of {NAME} Ready",
    )
    print(f"\n{NAME}: colocated engine Ready {time.monotonic() - started:.0f} s after apply")
    return d
