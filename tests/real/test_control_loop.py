"""The autoscaler's loop on real vLLM engines: a load step adds a pod from the real TTFT, the new pod
serves, and the scale-in drains real streams with none failed.

One Colocated PDDeployment (the CPU build and the tiny model, docs/real-vllm.md), autoscaled between
1 and 2 engines, so at most two engines run at once. The autoscaler reads the engines' and the
router's series from the dev cluster's Prometheus, which scrapes the pods the operator created;
the load goes through the router the operator deployed.

Compressed settings: decisions every 5 s (rates over the operator's minimum window, 60 s), scale-in
after 60 s of stability.
`--max-num-seqs 2` makes one CPU engine queue what two streams cannot take: the step (4 requests/s
of 200-token prompts and 300-token answers, at most 8 in flight) keeps both of its sequences busy
with more waiting, on an idle machine or a busy one; once the scale-out is decided, a lighter load
(1 request/s, 300-token answers: more than two sequences at once on a busy machine, about two on an
idle one) goes on while the new engine starts and then serves. The
autoscaler's profile knows neither the tiny model nor a CPU (it falls back to the sim's model on an
H100, so its token rates say one engine is plenty, and the decision's figures say `profileFallback`),
but it sizes a pool by sequences too, from the engine's own `--max-num-seqs`: the engine's running
and waiting gauges ask for a second engine (measured: 27 s after the step, before any request's TTFT
went over the 2 s target). Then the load drops to long streams only,
one at a time, and after the stabilization the pool goes back to one engine: the drain waits for
the streams on the pod it removes; every stream must end with its tokens.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tandem.api import meta
from tandem.demo import e2e as harness
from tandem.demo.load import BackgroundLoad, Phase
from tandem.devcluster import tinymodel
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess, eventually, metric_total, scratch_namespace
from tandem.versions import VLLM_IMAGE

pytestmark = [pytest.mark.cluster, pytest.mark.real_long, pytest.mark.timeout(1800)]

NAME = "loop"
MODEL = "tiny-llama"
ROUTER_IMAGE = "ghcr.io/tandem-dev/tandem:0.1.0"
INTERVAL = 5
TTFT_MS = 2000
# The step is more than one engine can take whatever the machine's speed (an idle one runs a stream at
# about 5 ms a token, a busy one at 20 or more), bounded by the client's 8 requests in flight so its
# backlog stays small; once the second engine is decided, a lighter load both engines serve.
STEP = Phase(4.0, 200, 300, "step")
IN_FLIGHT = 8
BOTH = Phase(1.0, 200, 300, "both")
# After the step: long streams, one at a time, so the scale-in has streams in flight to drain.
STREAMS = Phase(0.25, 50, 400, "streams")
# Long enough that the pool does not shrink before the second engine has served: on a busy machine it
# took 157 s to start, and with a lighter load while it started (0.5 requests/s of 120 tokens) the pool
# was back at one engine, the new pod removed, before it answered a request.
SCALE_IN_AFTER = 60
# Engines on CPU start in about a minute alone; with another engine serving and other work on two
# busy cores, longer.
START_TIMEOUT = 600


def manifest(prometheus_url: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": MODEL, "uri": "file:///models/tiny-llama", "maxModelLen": 2048},
        "engine": {
            "type": "vllm",
            "image": VLLM_IMAGE,
            "extraArgs": ["--dtype", "float32", "--enforce-eager", "--max-num-seqs", "2", "--seed", "0"],
        },
        "network": {"rdma": {"enabled": False}},
        "router": {"replicas": 1, "image": ROUTER_IMAGE},
        "serving": {"mode": "Colocated"},
        "colocated": {
            "replicas": 1,
            "resources": {"requests": {"cpu": "1", "memory": "6Gi"}},
            "autoscaling": {"minReplicas": 1, "maxReplicas": 2},
        },
        "slo": {"ttftMs": TTFT_MS, "tpotMs": 1000, "attainmentPercent": 90},
        "autoscaling": {
            "enabled": True,
            "intervalSeconds": INTERVAL,
            "prometheus": {"url": prometheus_url},
            "scaleUp": {"stabilizationSeconds": 0, "maxStep": 1},
            "scaleDown": {"stabilizationSeconds": SCALE_IN_AFTER, "maxStep": 1},
        },
    }
    return {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": {"name": NAME}, "spec": spec}


@pytest.fixture(scope="module")
def namespace(cluster: ClusterHandle, operator: OperatorProcess) -> Iterator[str]:
    with scratch_namespace(cluster, f"t-loop-{uuid.uuid4().hex[:6]}") as name:
        yield name


def router_if_ready(cluster: ClusterHandle, namespace: str) -> str | None:
    try:
        return harness.router_url(cluster, namespace, NAME)
    except AssertionError:
        return None


def engine_successes(ip: str) -> float:
    with urllib.request.urlopen(f"http://{ip}:{meta.ENGINE_PORT}/metrics", timeout=10) as answer:
        return metric_total(answer.read().decode(), "vllm:request_success_total")


def engine_ips(cluster: ClusterHandle, namespace: str) -> dict[str, str]:
    """The colocated pods' names and IPs, Ready or not."""
    out = cluster.kubectl(
        "get",
        "pods",
        "-n",
        namespace,
        "-l",
        f"{meta.LABEL_PDD}={NAME},{meta.LABEL_ROLE}=colocated",
        "-o",
        "json",
    ).stdout
    pods = json.loads(out)["items"]
    return {p["metadata"]["name"]: p["status"].get("podIP", "") for p in pods}


def test_a_load_step_adds_a_real_engine_that_serves_and_the_scale_in_drains_streams(
    cluster: ClusterHandle, namespace: str
) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest(cluster.prometheus_url))
    )
    watch = harness.Watcher(cluster, namespace, NAME, period=2.0).start()
    load: BackgroundLoad | None = None
    try:
        started = time.monotonic()
        watch.wait(
            "one engine Ready",
            lambda s: s if s.ready("colocated") >= 1 else None,
            START_TIMEOUT,
        )
        print(f"\none engine Ready {time.monotonic() - started:.0f} s after apply")
        first_pods = engine_ips(cluster, namespace)
        router = eventually(
            lambda: router_if_ready(cluster, namespace), timeout=120, what="a Ready router pod"
        )
        load = BackgroundLoad(
            router,
            MODEL,
            max_seconds=1500,
            max_in_flight=IN_FLIGHT,
            request_timeout=600,
            vocab_size=tinymodel.VOCAB_SIZE,
        )

        step = time.time()
        load.start(STEP)
        decided = watch.wait(
            "the autoscaler adds an engine",
            lambda s: s if (s.desired("colocated") or 0) >= 2 else None,
            300,
        )
        decision = decided.autoscaling("colocated")["lastDecision"]
        print(f"scaled out {decided.at - step:.0f} s after the step: {decision['reason']}")
        print(f"  figures: {json.dumps(decision.get('figures', {}), sort_keys=True)}")
        assert decision["from"] == 1
        assert decision["to"] == 2
        # Decided from what the real engine and router reported: its running and waiting sequences
        # against its own --max-num-seqs, its queued prompt tokens, the routers' TTFT.
        figures = decision.get("figures", {})
        assert figures["capacitySequences"] == 2, figures  # the engine's --max-num-seqs
        assert (
            figures["runningRequests"] + figures.get("waitingRequests", 0) > 2 or figures["sloRatio"] > 1
        ), figures
        assert figures["profileFallback"] == 1, figures  # no profile for the tiny model on a CPU
        # Which of the two fires first depends on when a pass lands after the step: the engine's queue (a
        # pass within seconds reads running 2 + waiting 4 against --max-num-seqs 2 and queued prompt
        # tokens: cause "load"), or the routers' TTFT p90 over its target once the window holds the
        # queued requests (an SLO cause). Either is read from the real engine and router.
        queued = figures.get("waitingRequests", 0) > 0 and figures.get("queuedPromptTokens", 0) > 0
        over_ttft = figures.get("sloRatio", 0) > 1 and "TTFT p90" in decision["reason"]
        assert queued or over_ttft, decision

        load.set(BOTH)
        ready = watch.wait(
            "the second engine Ready", lambda s: s if s.ready("colocated") >= 2 else None, START_TIMEOUT
        )
        print(f"second engine Ready {ready.at - step:.0f} s after the step")
        new = {name: ip for name, ip in engine_ips(cluster, namespace).items() if name not in first_pods}
        assert len(new) == 1, new
        [(new_name, new_ip)] = new.items()
        before = engine_successes(new_ip)
        deadline = time.monotonic() + 120
        while engine_successes(new_ip) < before + 5:
            assert time.monotonic() < deadline, (
                f"{new_name} served {engine_successes(new_ip) - before} requests"
            )
            time.sleep(2)
        print(f"{new_name} serves: {engine_successes(new_ip):.0f} requests finished there")

        # Down to long streams only: after the stabilization the pool shrinks, draining a pod
        # with streams in flight.
        calm = time.time()
        load.set(STREAMS)
        shrunk = watch.wait(
            "the scale-in to one engine", lambda s: s if s.desired("colocated") == 1 else None, 420
        )
        down = shrunk.autoscaling("colocated")["lastDecision"]
        print(f"scaled in {shrunk.at - calm:.0f} s after the load dropped: {down['reason']}")
        watch.wait(
            "one engine left",
            lambda s: s if s.replicas("colocated") == 1 and s.ready("colocated") == 1 else None,
            420,
        )
        gone_at = time.time()
        time.sleep(5)
        load.stop(timeout=700)
        streams = load.samples(since=calm, label="streams")
        in_flight_at_drain = [s for s in streams if s.sent_at < gone_at]
        failed = [s for s in load.samples(since=step) if not s.ok]
        print(
            f"{len(load.samples(since=step))} requests since the step, {len(failed)} failed; "
            f"{len(in_flight_at_drain)} streams sent before the drained pod went"
        )
        assert not failed, [s.error for s in failed][:5]
        assert in_flight_at_drain
        assert all(s.output_tokens == STREAMS.output_tokens for s in streams)

        def scaled(found: list[dict[str, Any]]) -> list[str]:
            return [str(e["reason"]) for e in found if e.get("reason") in ("ScaledUp", "ScaledDown")]

        harness.wait_events(
            cluster,
            namespace,
            NAME,
            lambda found: scaled(found)[-2:] == ["ScaledUp", "ScaledDown"],
            "ScaledUp then ScaledDown as the last scale Events",
        )
    finally:
        if load is not None and load.running:
            load.stop(timeout=60)
        watch.stop()
        for e in harness.events(cluster, namespace, NAME):
            print(f"  {e.get('reason')}: {e.get('message', '')[:300]}")
