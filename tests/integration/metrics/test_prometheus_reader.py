"""`PrometheusReader` against the dev cluster's real Prometheus, and against addresses that fail.

A small sim PDDeployment (1 prefill, 1 decode, 1 router) is made by a real `tandem operator`; its
pods run on loopback IPs and Prometheus scrapes them every 2 s. Requests go through the router's
pod IP; the reader must then see them on the disaggregated path, within SLO, with engine series
for both pools; after a quiet spell, zero rates and nothing missing. No part of Prometheus is
mocked. Set TANDEM_RECORD_PROMETHEUS_ANSWERS=PATH to save the answers the unit tests parse
(tests/unit/metrics/data/snapshot_answers.json), and next to it the answers to the rollout's and the
revision rollout's window queries and their KV reads, by PromQL (window_answers.json: the unit tests'
recorded Prometheus, `tandem.metrics.testing.RecordedPrometheus`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tandem.api import meta
from tandem.api.models import PDDeploymentSpec, SLOSpec
from tandem.devcluster import kube
from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess, eventually, pods
from tandem.metrics import PrometheusReader
from tandem.metrics.kv_transport import KvTransportReading, read_kv_transport
from tandem.metrics.queries import build_snapshot, kv_transport_queries, quantile_of, snapshot_queries
from tandem.metrics.revisions import revision_queries
from tandem.metrics.rollout import rollout_queries
from tandem.signals import PoolSize, Snapshot

PDD = "metrics"
MODEL_NAME = "llama-8b"
SLO = SLOSpec(ttft_ms=5000, tpot_ms=500, attainment_percent=95)


def pdd_object(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": meta.API_VERSION,
        "kind": meta.KIND,
        "metadata": {"name": PDD, "namespace": namespace},
        "spec": {
            "model": {
                "name": MODEL_NAME,
                "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
                "maxModelLen": 4096,
            },
            "engine": {
                "type": "sim",
                "image": "tandem/sim:dev",
                "env": [{"name": "TANDEM_SIM_TIME_SCALE", "value": "0.1"}],
            },
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1},
            "router": {"replicas": 1, "image": "tandem/router:dev"},
            "serving": {"mode": "Disaggregated"},
            "slo": {
                "ttftMs": SLO.ttft_ms,
                "tpotMs": SLO.tpot_ms,
                "attainmentPercent": SLO.attainment_percent,
            },
        },
    }


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class Deployed:
    """The PDDeployment's pods once all are Ready: name and IP by role."""

    def __init__(self, cluster: ClusterHandle, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.pods: dict[str, dict[str, Any]] = {}

    def refresh(self, core: client.CoreV1Api) -> bool:
        found = pods(core, self.namespace, f"{meta.LABEL_PDD}={PDD}")
        by_role = {p["metadata"]["labels"].get(meta.LABEL_ROLE): p for p in found}
        self.pods = by_role
        return set(by_role) >= {"prefill", "decode", "router"} and all(is_ready(p) for p in found)

    def name(self, role: str) -> str:
        return str(self.pods[role]["metadata"]["name"])

    @property
    def router_url(self) -> str:
        return f"http://{self.pods['router']['status']['podIP']}:{meta.ROUTER_PORT}"

    def sizes(self) -> dict[str, PoolSize]:
        return {role: PoolSize(1, 1) for role in ("prefill", "decode")}


@pytest.fixture(scope="module")
def deployed(
    cluster: ClusterHandle, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    """A namespace of its own, an operator watching only it, and the PDDeployment, all Ready."""
    namespace = f"t-metrics-{os.getpid()}"
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace, "labels": {"tandem.dev/test": "true"}}})
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    operator = OperatorProcess(cluster, ["--namespace", namespace, "--lease-namespace", namespace], log)
    try:
        operator.wait_leader(timeout=120)
        cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(pdd_object(namespace)))
        deployment = Deployed(cluster, namespace)
        eventually(
            lambda: deployment.refresh(core), timeout=300, what="prefill, decode and router pods Ready"
        )
        yield deployment
    except AssertionError:
        print(operator.log_text()[-5000:])
        raise
    finally:
        operator.stop()
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(namespace, propagation_policy="Background")
        kube.close(api)


def complete(router: str, stream: bool, prompt: str = "the autoscaler reads this") -> int:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 8, "stream": stream}
    request = urllib.request.Request(
        router + "/v1/completions", data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def read(reader: PrometheusReader, deployed: Deployed, window: float) -> Snapshot:
    return reader.snapshot(deployed.namespace, PDD, SLO, window, time.time(), sizes=deployed.sizes())


def test_snapshot_of_a_live_deployment(cluster: ClusterHandle, deployed: Deployed) -> None:
    reader = PrometheusReader(cluster.prometheus_url, timeout=10)

    # Requests before Prometheus' first scrape of a pod are invisible to rate() (its counters are
    # born with them): wait until every pod is scraped. Zero traffic then is data, not a gap.
    def scraped() -> Snapshot | None:
        snap = read(reader, deployed, 60)
        engines = all(snap.pools[role].scraped_targets == 1 for role in ("prefill", "decode"))
        return snap if engines and not snap.missing else None

    idle = eventually(scraped, timeout=180, what="Prometheus to scrape every pod")
    assert idle.paths["disaggregated"].request_rate == 0
    # The router serves once it has seen both pools.
    eventually(lambda: complete(deployed.router_url, True) == 200, timeout=120, what="a first answer")
    statuses = [complete(deployed.router_url, stream=i % 4 != 3) for i in range(8)]
    assert statuses == [200] * 8

    def traffic_seen() -> Snapshot | None:
        snap = read(reader, deployed, 60)
        pd = snap.paths["disaggregated"]
        seen = pd.request_rate > 0 and pd.within_slo_rate > 0 and pd.ttft_seconds is not None
        # Each target is scraped on its own schedule: the router's counters may be seen before the
        # engines' are, so wait for both sides of the requests.
        engines = all(snap.pools[role].scraped_targets == 1 for role in ("prefill", "decode")) and (
            snap.pools["decode"].generation_tokens_rate > 0
            and snap.pools["prefill"].prompt_tokens_rate > 0
            and snap.pools["decode"].local_prompt_tokens_rate > 0
        )
        return snap if seen and engines and not snap.missing else None

    snap = eventually(traffic_seen, timeout=180, what="Prometheus to scrape the requests")
    pd = snap.paths["disaggregated"]
    assert 0 < pd.within_slo_rate <= pd.request_rate
    assert pd.attainment is not None
    assert pd.attainment > 0
    assert pd.tpot_seconds is not None
    assert pd.tpot_seconds < SLO.tpot_ms / 1000
    assert snap.pools["decode"].generation_tokens_rate > 0
    assert snap.pools["prefill"].prompt_tokens_rate > 0
    assert snap.pools["prefill"].mean_prompt_tokens > 0
    # Every prompt has the same length, so one of vLLM's 1-2-5 buckets holds them all: E[n^2] read from
    # vllm:request_prompt_tokens_bucket is mean^2 times that bucket's uniform ratio (at most 1.061).
    prefill = snap.pools["prefill"]
    assert (
        prefill.mean_prompt_tokens**2
        < prefill.prompt_tokens_second_moment
        <= 1.07 * prefill.mean_prompt_tokens**2
    )
    assert snap.pools["decode"].mean_output_tokens == pytest.approx(8)
    # Every output is 8 tokens, in vLLM's bucket (5, 10]: E[n^2] read from
    # vllm:request_generation_tokens_bucket is 64 times that bucket's uniform ratio (1.037); and a
    # decode pod this light preempts nothing (the rate of vllm:num_preemptions_total is 0).
    assert 64 < snap.pools["decode"].output_tokens_second_moment <= 1.07 * 64
    assert snap.pools["decode"].preemptions_rate == 0
    # vllm:prompt_tokens_by_source{source="local_compute"}: prefill computes its prompts; decode (every
    # request pulled, Always) only the one last prompt token per request it recomputes.
    decode = snap.pools["decode"]
    assert (
        0.5 * prefill.prompt_tokens_rate
        < prefill.local_prompt_tokens_rate
        <= prefill.prompt_tokens_rate * 1.01
    )
    assert 0 < decode.local_prompt_tokens_rate <= 2 * decode.request_rate
    assert snap.paths["colocated"].request_rate == 0

    # status.slo's latencies by bucket, from the router's bucketed histograms (one request at a time,
    # short prompts, 8 output tokens): one bucket each, at the SLO's quantile. Their series are born
    # with their bucket's first request, an increase rate() cannot see, so every look sends one more
    # streamed request until the router's scrapes show the increases (a CI run on a busy machine did
    # not see all five within 60 s of a single round of four).
    def bucketed() -> Snapshot | None:
        assert complete(deployed.router_url, stream=True) == 200
        later = read(reader, deployed, 60)
        return later if len(later.latency_by_bucket) == 7 else None

    by_bucket = eventually(bucketed, timeout=180, interval=2, what="latencies by bucket").latency_by_bucket
    assert {name: set(found) for name, found in by_bucket.items()} == {
        "ttft_by_input_length": {"0-1024"},
        "tpot_by_output_length": {"0-128"},
        "tpot_by_concurrency": {"0-4"},
        "itl_by_output_length": {"0-128"},
        "itl_by_concurrency": {"0-4"},
        # P/D with the mode absent (Always): every prompt prefilled remotely; the local series exist
        # from zero (NaN quantile: left out).
        "ttft_by_prefill": {"remote"},
        "tpot_by_prefill": {"remote"},
    }
    assert all(0 < s < SLO.ttft_ms / 1000 for found in by_bucket.values() for s in found.values())
    if record := os.environ.get("TANDEM_RECORD_PROMETHEUS_ANSWERS"):
        now = time.time()
        queries = snapshot_queries(deployed.namespace, PDD, 60, quantile_of(SLO.attainment_percent))
        results, errors = reader.run(queries, now)
        assert not errors
        assert (
            build_snapshot(results, errors, now=now, window_seconds=60, slo_set=True)
            .paths["disaggregated"]
            .request_rate
            > 0
        )
        Path(record).write_text(json.dumps({"now": now, "window_seconds": 60, "results": results}, indent=1))
        record_windows(reader, deployed.namespace, Path(record).with_name("window_answers.json"))

    # The TTFT's parts, from the router's leg timings and the engines' queue and KV read histograms:
    # the legs fit in the client's TTFT, and the sim engines export the engine-side parts.
    parts = pd.ttft_breakdown
    assert parts is not None
    assert 0 < parts.prefill_leg + parts.decode_first_token <= parts.ttft * 1.05
    assert parts.prefill_queue is not None
    assert 0 <= parts.prefill_queue <= parts.prefill_leg
    assert parts.kv_transfer is not None
    assert 0 < parts.kv_transfer <= parts.decode_first_token
    # The decode engines' own TTFT holds their KV read (both from one scrape of the same pods).
    assert parts.decode_engine_first_token is not None
    assert parts.kv_transfer <= parts.decode_engine_first_token
    # Always (the mode absent): every request prefilled remotely, from the routers' count by side.
    assert parts.local_share == 0.0

    # Quiet: a 10 s window with no request in it reads zero, and zero is data, not a gap. The router
    # and the engines are scraped on their own schedules, so the router's window may empty a scrape
    # before the engines' does: wait for both.
    def quiet() -> Snapshot | None:
        snap = read(reader, deployed, 10)
        engines_quiet = all(
            snap.pools[role].generation_tokens_rate == 0 and snap.pools[role].prompt_tokens_rate == 0
            for role in ("prefill", "decode")
        )
        router_quiet = snap.paths["disaggregated"].request_rate == 0
        return snap if router_quiet and engines_quiet and not snap.missing else None

    snap = eventually(quiet, timeout=120, what="a quiet window")
    assert snap.has_data
    assert snap.pools["prefill"].scraped_targets == snap.pools["decode"].scraped_targets == 1
    assert snap.pools["decode"].generation_tokens_rate == 0
    assert snap.pools["prefill"].waiting_requests == 0
    assert snap.paths["disaggregated"].ttft_seconds is None

    loads = reader.pod_load(deployed.namespace, [deployed.name("prefill"), deployed.name("decode")])
    assert set(loads) == {deployed.name("prefill"), deployed.name("decode")}
    for load in loads.values():
        assert (load.running, load.waiting) == (0, 0)
    assert loads[deployed.name("prefill")].kv_blocks_held == 0  # every prefill's KV was pulled
    reader.close()


def record_windows(reader: PrometheusReader, namespace: str, path: Path) -> None:
    """The answers to a 60 s analysis window of both kinds of rollout (paths; revisions, where every
    P/D request is the legacy revision's) and to the KV reads they make (the whole deployment's, the
    legacy pods'), by PromQL, at one time."""
    now, quantile = time.time(), quantile_of(SLO.attainment_percent)
    answers: dict[str, Any] = {}
    for queries in (
        rollout_queries(namespace, PDD, 60, quantile),
        revision_queries(namespace, PDD, 60, quantile),
        kv_transport_queries(namespace, PDD, 60),
        kv_transport_queries(namespace, PDD, 60, revision=""),
    ):
        results, errors = reader.run(queries, now)
        assert not errors
        answers |= {queries[name]: result for name, result in results.items()}
    requests = answers[rollout_queries(namespace, PDD, 60, quantile)["rollout_requests"]]
    assert [s["metric"].get("path") for s in requests if float(s["value"][1]) > 0] == ["disaggregated"]
    record = {"now": now, "namespace": namespace, "name": PDD, "window_seconds": 60, "answers": answers}
    path.write_text(json.dumps(record, indent=1))


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_prometheus_is_missing_data_fast() -> None:
    reader = PrometheusReader(f"http://127.0.0.1:{closed_port()}", timeout=3)
    started = time.monotonic()
    snap = reader.snapshot("ns", "llm", SLO, 60, time.time(), sizes={"decode": PoolSize(1, 1)})
    # Refused connections fail at once; the bound only has to tell "no wait" from a wait per query
    # (several queries of 3 s each), with room for a busy machine.
    assert time.monotonic() - started < 3 + 5
    assert not snap.has_data
    (line,) = snap.missing  # every query failed alike: said once, with the address
    assert line.startswith(f"Prometheus at {reader.url} unreachable (ConnectionError)")
    assert "queries: " in line
    with pytest.raises(RuntimeError, match="pod_running"):
        reader.pod_load("ns", ["llm-decode-0"])
    reader.close()


def test_a_prometheus_that_never_answers_times_out() -> None:
    # A socket that accepts connections (the kernel's backlog) but never answers a byte.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        reader = PrometheusReader(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=2)
        started = time.monotonic()
        snap = asyncio.run(reader.snapshot_async("ns", "llm", None, 60, time.time()))
        # Capped at the timeout + 1 s (snapshot_async), not a timeout per query; 4 s of room for a
        # busy machine still fails a sequential pass over the queries.
        assert time.monotonic() - started < 2 + 1 + 4
        assert not snap.has_data
        assert all("within 2s" in m or "Timeout" in m for m in snap.missing), snap.missing
        reader.close()


def set_faults(ip: str, faults: dict[str, Any] | None) -> None:
    url = f"http://{ip}:{meta.ENGINE_PORT}/admin/faults"
    data, method = (json.dumps(faults).encode(), "POST") if faults is not None else (None, "DELETE")
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


WINDOW = 20  # seconds: the KV-transport reads' window (10 scrapes)


def test_kv_transport_of_a_live_deployment(cluster: ClusterHandle, deployed: Deployed) -> None:
    """`read_kv_transport` over the decode engine's real NIXL series: large pulls judged (1100-token
    prompts: 137.5 MiB of Llama-3.1-8B KV each, over the default 128 MiB minimum), injected pull
    failures counted, the sim's time scale in the link figure (400 Gb/s x 1/0.1)."""
    reader = PrometheusReader(cluster.prometheus_url, timeout=10)
    spec = PDDeploymentSpec.model_validate(pdd_object(deployed.namespace)["spec"])
    # Pulls before Prometheus' first scrape of the decode engine are invisible to increase() (its
    # NIXL counters are born with it): wait until both engines are scraped.
    eventually(
        lambda: all(
            read(reader, deployed, 60).pools[role].scraped_targets == 1 for role in ("prefill", "decode")
        ),
        timeout=180,
        what="Prometheus to scrape both engines",
    )
    # A window of only these pulls (the module's other test pulls short prompts): wait for a quiet one.
    eventually(
        lambda: (
            read_kv_transport(reader, deployed.namespace, PDD, WINDOW, time.time(), spec=spec).transfers == 0
        ),
        timeout=120,
        what=f"a {WINDOW}s window without KV transfers",
    )
    # Each request a prompt of its own from its first word: the engines cache prefixes, and a decode
    # pod that already holds a prompt's blocks pulls nothing (no transfer to judge).
    words = " ".join(f"w{i}" for i in range(1100))
    prompts = (f"request-{n} {words}" for n in itertools.count())
    eventually(
        lambda: complete(deployed.router_url, False, next(prompts)) == 200, timeout=120, what="a first answer"
    )
    statuses = [complete(deployed.router_url, stream=False, prompt=next(prompts)) for _ in range(6)]
    assert statuses == [200] * 6
    decode_ip = deployed.pods["decode"]["status"]["podIP"]
    set_faults(decode_ip, {"kv_pull_failure_rate": 1.0})
    try:
        failed = [complete(deployed.router_url, stream=False, prompt=next(prompts)) for _ in range(2)]
    finally:
        set_faults(decode_ip, None)
    assert all(status >= 500 for status in failed), failed

    last: list[KvTransportReading] = []

    def seen() -> KvTransportReading | None:
        got = read_kv_transport(reader, deployed.namespace, PDD, WINDOW, time.time(), spec=spec)
        last[:] = [got]
        enough = got.judged_transfers >= 5.5 and got.failed_transfers >= 1.5
        return got if enough and not got.missing else None

    try:
        reading = eventually(seen, timeout=120, what="Prometheus to scrape the pulls")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last reading: {last}") from None
    assert reading.nixl_metrics
    assert reading.judged_above_bytes == 128 * 1024 * 1024
    assert reading.link_gbps == pytest.approx(4000)
    assert reading.failure_rate is not None
    assert 0 < reading.failure_rate < 1
    assert reading.effective_gbps is not None
    assert reading.effective_gbps_floor is not None
    # Every pull in the window is over the minimum: bytes and seconds are exact, the bounds meet.
    assert reading.effective_gbps_floor == pytest.approx(reading.effective_gbps)
    assert reading.effective_gbps > 0
    assert reading.bandwidth_ratio == pytest.approx(reading.effective_gbps / 4000)
    print(
        f"KV transport: {reading.transfers:.1f} transfers, {reading.failed_transfers:.1f} failed,"
        f" {reading.judged_transfers:.1f} judged, {reading.effective_gbps_floor:.1f}"
        f"..{reading.effective_gbps:.1f} Gb/s against {reading.link_gbps:g}"
    )
    reader.close()
