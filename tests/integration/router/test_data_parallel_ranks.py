"""The router choosing data-parallel ranks, against sim engine groups over real HTTP.

Each "pod" is a `tandem engine serve` process with the data-parallel flags render gives a
LeaderWorkerSet group's pod (`render.command.parallel_args`, its variables expanded), on its own
loopback address (127.x.y.z, so every pod has the same ports, as pods do). Prefill: two
MultiPortExternal groups of 2 pods x 2 ranks (8 rank endpoints on ports P and P + 1); decode: one
External group of 2 pods (2 endpoints). No cluster runs: a small kubelet stand-in probes each pod's
readiness endpoint (the supervisor's /health for a multi-port pod, /health otherwise) as the rendered
readiness probe would, and feeds the router the pods as its pod watcher would
(`RouterState.on_pods`), so discovery, the group rule and the balancer are the router's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import aiohttp
import pytest

from tandem.api import meta
from tandem.api.meta import Role
from tandem.api.models import PDDeployment
from tandem.devcluster.procs import bindable, free_ports
from tandem.engine.group import HEARTBEATS_PER_TIMEOUT
from tandem.kube.pods import PodInfo
from tandem.render.command import LEADER_ADDRESS, POD_IP, WORKER_INDEX, parallel_args

from .harness import RunningRouter, running_router, until
from .sim import MAX_MODEL_LEN, MODEL, NAME

pytestmark = pytest.mark.timeout(240)

PDD = "llm"
GROUP_TIMEOUT_S = 3.0  # the sim group's heartbeat deadline (TANDEM_SIM_GROUP_TIMEOUT_SECONDS)
PROBE_PERIOD_S = 0.25
PROBE_TIMEOUT_S = 1.0
PROBE_FAILURES = 2  # failureThreshold
START_S = 90.0


@dataclass
class Pod:
    name: str
    role: str
    group: str
    ip: str
    ranks: int  # API ports (MultiPortExternal: one per local rank)
    probe_port: int
    proc: subprocess.Popen[bytes]
    log: str
    ready: bool = False
    failures: int = 0

    def info(self) -> PodInfo:
        running = self.proc.poll() is None
        return PodInfo(
            name=self.name,
            pddeployment=PDD,
            role=self.role,
            ip=self.ip,
            phase="Running" if running else "Failed",
            ready=running and self.ready,
            terminating=False,
            group=self.group,
            group_size=2,
            serves=True,
            api_ports=self.ranks,
        )

    def output(self) -> str:
        with open(self.log) as text:
            return text.read()[-3000:]


@dataclass
class Cluster:
    engine_port: int
    pods: list[Pod] = field(default_factory=list)

    def by_group(self, group: str) -> list[Pod]:
        return [pod for pod in self.pods if pod.group == group]

    def logs(self) -> str:
        return "\n".join(f"--- {pod.name}:\n{pod.output()}" for pod in self.pods)

    def urls(self, group: str) -> list[str]:
        return sorted(
            f"http://{pod.ip}:{self.engine_port + i}"
            for pod in self.by_group(group)
            for i in range(pod.ranks)
        )


# The pools' shapes; each pod's data-parallel flags are the ones render gives it (`parallel_args`).
SHAPES = PDDeployment.model_validate(
    {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": PDD, "namespace": "ns", "uid": "uid-1"},
        "spec": {
            "model": {"name": NAME, "uri": f"hf://{MODEL}"},
            "engine": {"image": "vllm/vllm-openai:v0.33.0"},
            "prefill": {"replicas": 2, "nodesPerInstance": 2,
                        "parallelism": {"data": 4, "loadBalancing": "MultiPortExternal"}},
            "decode": {"replicas": 1, "nodesPerInstance": 2,
                       "parallelism": {"data": 2, "loadBalancing": "External"}},
        },
    }
)  # fmt: skip


def _rendered_flags(role: Role, index: int, ip: str, leader: str) -> list[str]:
    """The pod's data-parallel and multi-node flags as rendered, LeaderWorkerSet's variables expanded."""
    values = {POD_IP: ip, LEADER_ADDRESS: leader, WORKER_INDEX: str(index)}
    return [values.get(arg, arg) for arg in parallel_args(SHAPES, role, "leader" if index == 0 else "worker")]


def _start_group(cluster: Cluster, role: Role, group: str, ips: list[str], *, side: int) -> None:
    """A 2-pod group of `role`'s shape, its pods on `ips`."""
    kv_role = {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
    ranks = SHAPES.spec.pool(role).shape.ports_per_pod
    for index, ip in enumerate(ips):
        args = ["--host", ip, "--port", str(cluster.engine_port), "--served-model-name", NAME]
        args += ["--max-model-len", str(MAX_MODEL_LEN), "--tensor-parallel-size", "1"]
        args += _rendered_flags(role, index, ip, ips[0])
        args += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role})]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_SIM_", "VLLM_"))}
        env.update(
            TANDEM_SIM_TIME_SCALE="0",
            TANDEM_SIM_GROUP_TIMEOUT_SECONDS=str(GROUP_TIMEOUT_S),
            VLLM_NIXL_SIDE_CHANNEL_HOST=ip,
            VLLM_NIXL_SIDE_CHANNEL_PORT=str(side),
        )
        name = f"{group}" if index == 0 else f"{group}-{index}"
        command = [sys.executable, "-m", "tandem.cli", "engine", "serve", MODEL, *args]
        with tempfile.NamedTemporaryFile(prefix=f"rank-{name}-", suffix=".log", delete=False) as log:
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        probe = meta.DP_SUPERVISOR_PORT if ranks > 1 else cluster.engine_port
        cluster.pods.append(Pod(name, role, f"{group}-key", ip, ranks, probe, proc, log.name))


async def _probe(session: aiohttp.ClientSession, pod: Pod) -> None:
    """One readiness probe: 200 within the timeout is a success (Kubernetes' httpGet probe)."""
    ok = False
    if pod.proc.poll() is None:
        with suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
            async with session.get(
                f"http://{pod.ip}:{pod.probe_port}/health",
                timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
            ) as answer:
                ok = answer.status == 200
    if ok:
        pod.ready, pod.failures = True, 0
    else:
        pod.failures += 1
        if pod.failures >= PROBE_FAILURES:
            pod.ready = False


async def _kubelet(cluster: Cluster, router: RunningRouter) -> None:
    """Probes every pod each period and hands the router the pod list (a SYNC, as a relist)."""
    async with aiohttp.ClientSession() as session:
        while True:
            await asyncio.gather(*(_probe(session, pod) for pod in cluster.pods))
            router.state.on_pods("SYNC", [pod.info() for pod in cluster.pods])
            await asyncio.sleep(PROBE_PERIOD_S)


@asynccontextmanager
async def ranked_cluster() -> AsyncIterator[tuple[Cluster, RunningRouter]]:
    base = f"127.{random.randrange(100, 200)}.{random.randrange(256)}"
    ips = {name: [f"{base}.{i}", f"{base}.{i + 1}"] for name, i in (("pa", 1), ("pb", 3), ("d", 5))}
    every = [ip for pair in ips.values() for ip in pair]
    for port in (meta.DP_SUPERVISOR_PORT, meta.DP_RPC_PORT):  # rendered fixed ports, as in a pod
        assert all(bindable(port, ip) for ip in every), f"port {port} is taken on a loopback address"
    cluster = Cluster(engine_port=free_ports(2, hosts=every))
    side = free_ports(4, hosts=every)
    try:
        for group in ("pa", "pb"):
            _start_group(cluster, "prefill", group, ips[group], side=side)
        _start_group(cluster, "decode", "d", ips["d"], side=side)
        async with running_router(
            pddeployment=PDD, engine_port=cluster.engine_port, model=NAME, max_model_len=MAX_MODEL_LEN
        ) as router:
            kubelet = asyncio.create_task(_kubelet(cluster, router))
            try:
                await until(
                    lambda: (
                        len(router.state.endpoints["prefill"]) == 8
                        and len(router.state.endpoints["decode"]) == 2
                    ),
                    START_S,
                    "every rank routable",
                    detail=cluster.logs,
                )
                yield cluster, router
            finally:
                kubelet.cancel()
    finally:
        for pod in cluster.pods:
            with suppress(ProcessLookupError):
                pod.proc.send_signal(signal.SIGCONT)
            if pod.proc.poll() is None:
                pod.proc.send_signal(signal.SIGTERM)
        for pod in cluster.pods:
            try:
                pod.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pod.proc.kill()
                pod.proc.wait()


def legs(router: RunningRouter, role: str) -> dict[str, float]:
    """Legs sent so far per endpoint (`pod:port`) of `role`, from the router's own counter."""
    found: dict[str, float] = {}
    for family in router.state.metrics.registry.collect():
        if family.name != "tandem_router_endpoint_legs":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels["role"] == role:
                found[f"{sample.labels['pod']}:{sample.labels['port']}"] = sample.value
    return found


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    changed = {key: value - before.get(key, 0.0) for key, value in after.items()}
    return {key: value for key, value in changed.items() if value}


async def complete(session: aiohttp.ClientSession, router: RunningRouter, prompt: str) -> None:
    body = {"model": NAME, "prompt": prompt, "max_tokens": 4}
    async with session.post(router.url + "/v1/completions", json=body) as answer:
        assert answer.status == 200, await answer.text()
        assert (await answer.json())["choices"][0]["text"]


async def test_requests_spread_over_ranks_a_prefix_stays_on_its_rank_and_a_killed_rank_takes_its_group(
) -> None:  # fmt: skip
    async with ranked_cluster() as (cluster, router), aiohttp.ClientSession() as session:
        ranks = {f"{pod.name}:{cluster.engine_port + i}" for pod in cluster.pods for i in range(pod.ranks)}
        # Distinct prompts over idle ranks: the prefill choice spreads them (rendezvous ties), on both
        # groups and on both ports of a pod; decode legs go to both External ranks.
        for i in range(32):
            await complete(session, router, f"request {i}: " + f"topic {i} " * 30)
        prefill, decode = legs(router, "prefill"), legs(router, "decode")
        assert set(prefill) <= ranks
        assert sum(prefill.values()) == 32
        assert len(prefill) >= 6, prefill
        assert {key.split(":")[1] for key in prefill} == {
            str(cluster.engine_port),
            str(cluster.engine_port + 1),
        }
        assert {key.split(":")[0].split("-")[0] for key in prefill} == {"pa", "pb"}
        assert sorted(decode) == [f"d-1:{cluster.engine_port}", f"d:{cluster.engine_port}"]

        # A conversation that grows: its prefix is on the rank that prefilled it, which gets every turn.
        shared = "You are a careful assistant. " * 40
        before = legs(router, "prefill")
        for turn in range(6):
            await complete(session, router, shared + " user turn " * (turn + 1))
        chosen = delta(legs(router, "prefill"), before)
        assert len(chosen) == 1, chosen
        assert next(iter(chosen.values())) == 6

        # Kill one pod of the group that held the prefix: all four of its ranks leave the choice.
        holder = next(iter(chosen)).split(":")[0]
        victim = next(pod for pod in cluster.pods if pod.name == holder)
        survivors = cluster.urls("pb-key" if victim.group == "pa-key" else "pa-key")
        victim.proc.send_signal(signal.SIGKILL)
        gone = await until(
            lambda: router.state.endpoints["prefill"] == survivors,
            what="the killed rank's group out",
            detail=cluster.logs,
        )
        # The other pod of the group exits too (its group broke), as vLLM's ranks do.
        partner = next(pod for pod in cluster.by_group(victim.group) if pod is not victim)
        await until(lambda: partner.proc.poll() is not None, what="the partner's exit", detail=cluster.logs)
        assert partner.proc.returncode == 1
        victim_led = victim.name == victim.group.removesuffix("-key")
        assert ("leader is gone" if victim_led else "left the group") in partner.output()
        before = legs(router, "prefill")
        for turn in range(6):
            await complete(session, router, shared + " user turn " * (turn + 7))
        moved = delta(legs(router, "prefill"), before)
        assert sum(moved.values()) == 6
        assert all(key.split(":")[0] not in (victim.name, partner.name) for key in moved), moved
        print(f"killed {victim.name}: its group left the router's choice {gone:.2f}s later")


async def test_a_hung_rank_takes_its_group_out_at_the_probe_deadline() -> None:
    async with ranked_cluster() as (cluster, router), aiohttp.ClientSession() as session:
        victim = next(pod for pod in cluster.pods if pod.name == "pb-1")  # a worker pod of group pb
        survivors = cluster.urls("pa-key")
        victim.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        out = await until(
            lambda: router.state.endpoints["prefill"] == survivors,
            what="the hung rank's group out",
            detail=cluster.logs,
        )
        # Out by failed probes: not before a probe has timed out (no upper bound but `until`'s 30 s: on
        # a busy machine the probe loop itself runs late; the figure is printed below).
        assert out >= PROBE_TIMEOUT_S, out
        before = legs(router, "prefill")
        for i in range(8):
            await complete(session, router, f"after the hang {i}: " + "words " * 40)
        moved = delta(legs(router, "prefill"), before)
        assert all(key.startswith("pa") for key in moved), moved
        # The leader of the hung pod's group breaks the group at the group timeout, as a hung rank's
        # collectives do: the group does not come back while its rank hangs.
        leader = next(pod for pod in cluster.pods if pod.name == "pb")
        await until(
            lambda: leader.proc.poll() is not None, what="the hung group's leader exits", detail=cluster.logs
        )
        assert "has not answered" in leader.output()
        # (Silence counts from the worker's last ping, up to one heartbeat before the stop.)
        assert time.monotonic() - stopped >= GROUP_TIMEOUT_S * (1 - 1 / HEARTBEATS_PER_TIMEOUT)
        print(f"SIGSTOP {victim.name}: its group left the router's choice {out:.2f}s later")
