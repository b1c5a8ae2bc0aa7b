"""The sim engine as a multi-node group (`tandem.engine.group`): real processes on 127.0.0.1 with the
flags a LeaderWorkerSet group's pods get. The leader is not healthy until its worker has joined,
the leader of a data-parallel group gives the worker its share of requests, and a rank that dies
takes the group down (the other member exits with status 1), as vLLM's ranks do."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tandem.devcluster.testing import eventually

from .harness import LOOPBACK, NAME, Engine, free_port, start_engine

DEADLINE_S = 60.0


def member(rank: int, rpc_port: int, *, data: int = 2, **kw: Any) -> Engine:
    """One pod of a 2-node group: a rank per pod (data 2, Internal: the worker headless), or one rank
    over both (data 1: multi-node TP, rendezvous at the master address)."""
    args = ["--nnodes", "2", "--node-rank", str(rank)]
    if data > 1:
        args += ["--data-parallel-size", str(data), "--data-parallel-size-local", "1"]
        args += ["--data-parallel-address", LOOPBACK, "--data-parallel-rpc-port", str(rpc_port)]
    else:
        args += ["--master-addr", LOOPBACK, "--master-port", str(rpc_port)]
    if rank > 0:
        args.append("--headless")
    return start_engine(*args, healthy=False, **kw)


def health(engine: Engine) -> int:
    return engine.request("GET", "/health", timeout=5)[0]


def state(engine: Engine) -> dict[str, Any]:
    status, body = engine.get("/debug/state")
    assert status == 200
    return dict(body)


def exit_output(engine: Engine) -> tuple[int, str]:
    code = engine.proc.wait(timeout=DEADLINE_S)
    return code, engine.proc.stdout.read() if engine.proc.stdout else ""


def outputs(engines: list[Engine]) -> str:
    """What each process printed (a running one is stopped first), for a failure's message."""
    texts = []
    for i, engine in enumerate(engines):
        code = engine.stop()
        text = engine.proc.stdout.read() if engine.proc.stdout else ""
        texts.append(f"--- process {i} (exit {code}):\n{text[-3000:]}")
    return "\n".join(texts)


@pytest.fixture
def group() -> Iterator[tuple[Engine, Engine]]:
    rpc = free_port()
    # Simulated time runs (the default time scale is 0 in the harness), so requests overlap.
    env = {"TANDEM_SIM_TIME_SCALE": "1"}
    leader = member(0, rpc, env=env)
    started: list[Engine] = [leader]
    try:
        # The leader's API is up but the group has not formed: not healthy.
        assert eventually(lambda: health(leader) == 503, timeout=DEADLINE_S, what="the leader's API")
        time.sleep(1.0)
        assert health(leader) == 503
        assert state(leader)["group"]["formed"] is False
        worker = member(1, rpc, env=env)
        started.append(worker)
        eventually(
            lambda: health(leader) == 200,
            timeout=DEADLINE_S,
            what="the leader healthy once the worker joined",
        )
        yield leader, worker
    finally:
        for engine in started:
            engine.stop()


def test_a_data_parallel_group_serves_on_both_ranks(group: tuple[Engine, Engine]) -> None:
    leader, worker = group
    assert state(leader)["group"]["formed"] is True
    body = {"model": NAME, "prompt": "hello " * 64, "max_tokens": 48}

    def send(_: int) -> int:
        return leader.post("/v1/completions", body)[0]

    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(send, range(16)))
    assert codes == [200] * 16
    served_by_worker = state(worker)["requests_seen"]
    print(f"\nworker served {served_by_worker} of 16 requests sent to the leader")
    assert 0 < served_by_worker < 16
    # The leader's /metrics holds both ranks (engine "0" its own, "1" the worker's), each counting what
    # its engine served, as vLLM's API server reports every engine it balances over.
    status, _, raw = leader.request("GET", "/metrics")
    assert status == 200
    finished: dict[str, float] = {}
    for family in text_string_to_metric_families(raw.decode()):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total":
                engine = sample.labels["engine"]
                finished[engine] = finished.get(engine, 0.0) + sample.value
    assert set(finished) == {"0", "1"}
    assert finished["1"] == served_by_worker
    assert finished["0"] + finished["1"] == 16
    # A streamed request through the leader arrives whole, whichever rank serves it.
    status, events = leader.stream("/v1/completions", {**body, "stream": True, "max_tokens": 8})
    assert status == 200
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"]]


def test_a_killed_worker_takes_the_leader_down(group: tuple[Engine, Engine]) -> None:
    leader, worker = group
    worker.proc.send_signal(signal.SIGKILL)
    code, output = exit_output(leader)
    assert code == 1
    assert "node rank 1 left the group" in output


def test_a_killed_leader_takes_the_worker_down(group: tuple[Engine, Engine]) -> None:
    leader, worker = group
    leader.proc.send_signal(signal.SIGKILL)
    code, output = exit_output(worker)
    assert code == 1
    assert "the group's leader is gone" in output


def test_multi_node_tp_leader_waits_for_its_worker_and_serves_alone() -> None:
    rpc = free_port()
    leader = member(0, rpc, data=1)
    try:
        assert eventually(lambda: health(leader) == 503, timeout=DEADLINE_S, what="the leader's API")
        worker = member(1, rpc, data=1)
        try:
            eventually(lambda: health(leader) == 200, timeout=DEADLINE_S, what="the leader healthy")
            assert leader.post("/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 4})[0] == 200
            assert state(worker)["requests_seen"] == 0
        finally:
            worker.stop()
        code, output = exit_output(leader)
        assert code == 1, output
    finally:
        leader.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--nnodes", "2", "--data-parallel-size", "4", "--data-parallel-size-local", "2"],
            "one data-parallel rank",
        ),
        (["--nnodes", "2", "--data-parallel-size", "2", "--data-parallel-hybrid-lb"], "Internal"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank 2 is not in 0..1"),
        (["--headless"], "--headless needs --nnodes > 1"),
    ],
)
def test_group_flags_the_sim_cannot_run_are_refused(args: list[str], message: str) -> None:
    engine = start_engine(*args, healthy=False)
    code, output = exit_output(engine)
    assert code == 1
    assert message in output
    assert isinstance(engine.proc, subprocess.Popen)


def test_a_hung_worker_takes_the_leader_down_at_the_group_timeout() -> None:
    """SIGSTOP keeps the worker's connection open: only its silence tells the leader."""
    rpc = free_port()
    env = {"TANDEM_SIM_GROUP_TIMEOUT_SECONDS": "2"}
    leader = member(0, rpc, env=env)
    worker = member(1, rpc, env=env)
    try:
        eventually(lambda: health(leader) == 200, timeout=DEADLINE_S, what="the group formed")
        time.sleep(3.0)  # longer than the timeout: heartbeats keep a live group formed
        assert health(leader) == 200
        worker.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        code, output = exit_output(leader)
        assert code == 1
        assert "node rank 1 has not answered for 2s" in output
        assert time.monotonic() - stopped < 2 + DEADLINE_S / 4
    finally:
        worker.proc.send_signal(signal.SIGCONT)
        worker.stop()
        leader.stop()


def test_a_multi_port_group_serves_each_rank_on_its_own_port() -> None:
    """MultiPortExternal, 2 pods x 2 ranks: a port per rank, the supervisor's /health up only once
    the group formed, every rank serving its own requests; a killed pod takes the other down."""
    rpc = free_port()
    supervisors = [free_port(), free_port()]
    pods: list[Engine] = []
    try:
        for rank in (0, 1):
            args = ["--nnodes", "2", "--node-rank", str(rank), "--data-parallel-size", "4"]
            args += ["--data-parallel-size-local", "2", "--data-parallel-address", LOOPBACK]
            args += ["--data-parallel-rpc-port", str(rpc), "--data-parallel-multi-port-external-lb"]
            args += ["--data-parallel-supervisor-port", str(supervisors[rank])]
            pods.append(start_engine(*args, healthy=False, ports=2))
        supervised = [Engine(pod.proc, port, None) for pod, port in zip(pods, supervisors, strict=True)]
        try:
            eventually(
                lambda: all(health(s) == 200 for s in supervised),
                timeout=DEADLINE_S,
                what="both supervisors healthy",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{outputs(pods)}") from None
        ranks = [Engine(pod.proc, pod.port + i, None) for pod in pods for i in (0, 1)]
        for rank in ranks:
            body = {"model": NAME, "prompt": "hi", "max_tokens": 2}
            assert rank.post("/v1/completions", body)[0] == 200
        assert [state(rank)["requests_seen"] for rank in ranks] == [1, 1, 1, 1]
        pods[1].proc.send_signal(signal.SIGKILL)
        code, output = exit_output(pods[0])
        assert code == 1
        assert "node rank 1 left the group" in output
    finally:
        for pod in pods:
            pod.stop()
