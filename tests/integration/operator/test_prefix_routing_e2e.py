"""The prefix-aware prefill choice through the router the operator deployed, on the local cluster: a
conversation sent again, and its next turn, land on the prefill pod that holds it; that pod's
vllm:prefix_cache_hits rise, the other's queries do not move; the repeat's TTFT (the client's view)
drops by most of the prefill it no longer computes.

Compressed settings: sim engines at TANDEM_SIM_TIME_SCALE=10, so a 3,000-token prefill takes about
0.7 s of modelled Llama-3.1-8B H100 time and its cached repeat about 0.07 s; 2 prefill pods, 1
decode pod, 1 router, spec.router.prefixAware at its defaults (64-character chunks). Each
conversation has a system prompt of its own, so the idle pool spreads them (a shared one held by
one pod would draw them all there while load is low, docs/router.md). Loopback addresses only.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tandem.api import meta
from tandem.demo import e2e
from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess, eventually, metric_total, scratch_namespace
from tandem.perf import PrefillChunk, load_profile

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(400)]

NAME = "prefix"
MODEL = e2e.MODEL
TIME_SCALE = 10
CONVERSATIONS = 4
TURN_WORDS = 2900  # with the system prompt and the chat template: about 3,000 prompt tokens


def manifest() -> dict[str, Any]:
    return e2e.pddeployment(
        NAME,
        {
            "engine": {
                "type": "sim",
                "image": e2e.IMAGE,
                "env": [{"name": "TANDEM_SIM_TIME_SCALE", "value": str(TIME_SCALE)}],
            },
            "kvTransfer": {"connector": "NixlConnector"},
            "prefill": e2e.pool(2, requests=e2e.SMALL_POD_REQUESTS),
            "decode": e2e.pool(1, requests=e2e.SMALL_POD_REQUESTS),
            "router": {"replicas": 1, "image": e2e.IMAGE, "prefixAware": {"enabled": True}},
        },
    )


@dataclass
class Deployed:
    cluster: ClusterHandle
    namespace: str

    def ips(self, role: str) -> list[str]:
        with self.cluster.api_client() as api:
            ips = kube.ready_pod_ips(api, self.namespace, NAME, role)
        assert all(ip.startswith("127.") for ip in ips), ips
        return ips

    def counters(self) -> dict[str, tuple[float, float]]:
        """Prefill pod IP -> (vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total)."""
        out = {}
        for ip in self.ips("prefill"):
            with urllib.request.urlopen(f"http://{ip}:{meta.ENGINE_PORT}/metrics", timeout=10) as answer:
                text = answer.read().decode()
            out[ip] = (
                metric_total(text, "vllm:prefix_cache_queries_total"),
                metric_total(text, "vllm:prefix_cache_hits_total"),
            )
        return out


@pytest.fixture(scope="module")
def deployed(cluster: ClusterHandle, operator: OperatorProcess) -> Iterator[Deployed]:
    with scratch_namespace(cluster, f"t-prefix-{uuid.uuid4().hex[:6]}") as namespace:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest()))
        d = Deployed(cluster, namespace)
        eventually(
            lambda: len(d.ips("prefill")) == 2 and d.ips("decode") and d.ips("router"),
            timeout=240,
            what="2 prefill, 1 decode and 1 router pod Ready",
        )
        yield d


def ttft(router: str, body: dict[str, Any]) -> tuple[float, int]:
    """(seconds to the first content token, prompt tokens) of one streamed chat request."""
    url = urllib.parse.urlsplit(router)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=120)
    try:
        started = time.monotonic()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        answer = conn.getresponse()
        assert answer.status == 200, answer.read()[:500]
        first: float | None = None
        prompt_tokens = 0
        for raw in answer:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[len("data: ") :])
            if first is None and any((c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                first = time.monotonic() - started
            if event.get("usage"):
                prompt_tokens = int(event["usage"]["prompt_tokens"])
        assert first is not None
        return first, prompt_tokens
    finally:
        conn.close()


def conversation(n: int, turns: int) -> dict[str, Any]:
    system = f"You are assistant number {n} of the prefix e2e; your users ask about topic {n}."
    words = " ".join(f"t{n}w{i}" for i in range(TURN_WORDS))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Please summarise document {n}: {words}"},
    ]
    if turns > 1:
        messages += [
            {"role": "assistant", "content": "It is about numbered words."},
            {"role": "user", "content": "Which word comes first?"},
        ]
    return {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_a_repeated_conversation_lands_on_its_pod_and_its_ttft_drops(deployed: Deployed) -> None:
    router = f"http://{deployed.ips('router')[0]}:{meta.ROUTER_PORT}"
    eventually(
        lambda: ttft(router, {**conversation(99, 1), "max_tokens": 1}),
        timeout=60,
        what="the router to serve",
    )
    profile = load_profile("meta-llama/Llama-3.1-8B-Instruct", "H100", 1)
    holders: dict[int, str] = {}
    figures: list[tuple[float, float, float, float]] = []
    for n in range(CONVERSATIONS):
        before = deployed.counters()
        first, tokens = ttft(router, conversation(n, 1))
        after = deployed.counters()
        moved = [ip for ip in after if after[ip][0] > before[ip][0]]
        assert len(moved) == 1, (before, after)  # one prefill pod computed it
        holder = moved[0]
        holders[n] = holder

        repeat, _ = ttft(router, conversation(n, 1))
        again = deployed.counters()
        hit = int(again[holder][1] - after[holder][1])
        assert hit == (tokens - 1) // 16 * 16, (hit, tokens)  # all its full blocks but the last token's
        assert all(again[ip] == after[ip] for ip in again if ip != holder)  # the other pod saw nothing

        next_turn, _ = ttft(router, conversation(n, 2))
        last = deployed.counters()
        assert last[holder][1] - again[holder][1] >= (tokens - 1) // 16 * 16  # the next turn too
        assert all(last[ip] == again[ip] for ip in last if ip != holder)

        cold = profile.step_seconds([PrefillChunk(0, tokens)], 0, 0) * TIME_SCALE
        warm = profile.step_seconds([PrefillChunk(hit, tokens - hit)], 0, 0) * TIME_SCALE
        figures.append((first, repeat, next_turn, cold - warm))
        print(
            f"conversation {n}: {tokens} prompt tokens on {holder}: TTFT first {first * 1000:.0f} ms, "
            f"repeat {repeat * 1000:.0f} ms, next turn {next_turn * 1000:.0f} ms "
            f"(modelled prefill saved {(cold - warm) * 1000:.0f} ms)"
        )
    print(f"holders: {holders}")
    for first, repeat, _, saved in figures:
        # The repeat skips its prefill: most of the modelled saving shows at the client, whatever
        # the machine adds around it.
        assert first - repeat > 0.5 * saved, figures
