"""Hostile clients against a real router process with real sim engines (issue 14, item 3).

One router process (`tandem router`, static pods: one prefill, one decode, both sim engines in
real time) for the module, so its RSS can be read. Compressed setting: `--read-timeout 2` (the
default is 30 s) and `--max-body-bytes` 256 KiB (default 4 MiB), so a slowloris is cut in seconds
and a body over the limit is small to send. What every test checks at the end: the router's
in-flight gauges are back at 0 and the prefill engine holds no KV (`tandem:kv_held_blocks` 0).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tandem.devcluster.testing import eventually, metric_total
from tandem.engine.settings import DEFAULT_LEASE_SECONDS
from tandem.router.front import MAX_HEAD_BYTES

from .harness import until
from .sim import LOOPBACK, MAX_MODEL_LEN, NAME, SimEngine, free_port, start_sim

pytestmark = pytest.mark.timeout(240)

READ_TIMEOUT_S = 2.0
MAX_BODY = 256 * 1024
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@dataclass
class Setup:
    prefill: SimEngine
    decode: SimEngine
    router: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def rss_kib(self) -> int:
        with open(f"/proc/{self.router.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    prefill = start_sim("prefill", time_scale=1.0)
    decode = start_sim("decode", time_scale=1.0)
    port = free_port()
    command = [sys.executable, "-m", "tandem.cli", "router", "--host", LOOPBACK, "--port", str(port)]
    command += ["--prefill", prefill.url, "--decode", decode.url, "--max-model-len", str(MAX_MODEL_LEN)]
    command += ["--read-timeout", str(READ_TIMEOUT_S), "--max-body-bytes", str(MAX_BODY)]
    router = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ready = Setup(prefill, decode, router, port)
    try:

        def learned() -> bool:
            assert router.poll() is None, "router exited"
            models = json.loads(_get(ready.url + "/v1/models"))["data"]
            return [m["id"] for m in models] == [NAME]

        eventually(learned, timeout=60, what="the router to learn the model")
        yield ready
    finally:
        router.terminate()
        try:
            router.wait(timeout=20)
        except subprocess.TimeoutExpired:
            router.kill()
        prefill.stop()
        decode.stop()


@pytest.fixture(autouse=True)
def no_faults(setup: Setup) -> Iterator[None]:
    yield
    setup.prefill.clear_faults()
    setup.decode.clear_faults()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        yield client


def held_blocks(engine: SimEngine) -> float:
    return metric_total(_get(engine.url + "/metrics"), "tandem:kv_held_blocks")


def running(engine: SimEngine) -> float:
    text = _get(engine.url + "/metrics")
    return metric_total(text, "vllm:num_requests_running") + metric_total(text, "vllm:num_requests_waiting")


def quiet(setup: Setup) -> bool:
    """Nothing in flight in the router, nothing running or held on the engines."""
    text = _get(setup.url + "/metrics")
    router_idle = (
        metric_total(text, "tandem_router_in_flight_requests") == 0
        and metric_total(text, "tandem_router_upstream_in_flight_requests") == 0
    )
    return (
        router_idle
        and held_blocks(setup.prefill) == 0
        and running(setup.prefill) == 0
        and running(setup.decode) == 0
    )


async def raw_exchange(port: int, data: bytes) -> tuple[int, dict[str, Any]]:
    """Sends raw bytes, reads one answer: (status, JSON body)."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length"))
        body = await asyncio.wait_for(reader.readexactly(length), 30)
        return int(lines[0].split(" ")[1]), json.loads(body)
    finally:
        writer.close()


def post_bytes(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body


def _j(payload: Any) -> bytes:
    return json.dumps(payload).encode()


# (path, raw body, status, error type, param): every one answered by the router itself.
HOSTILE: list[tuple[str, bytes, int, str, str | None]] = [
    (COMPLETIONS, b"{not json", 400, "BadRequestError", None),
    (COMPLETIONS, b"\xff\xfe\x00garbage", 400, "BadRequestError", None),
    (COMPLETIONS, b"[" * 100_000, 400, "BadRequestError", None),  # nested past the recursion limit
    (COMPLETIONS, b"", 400, "BadRequestError", None),
    (COMPLETIONS, _j([1, 2]), 400, "BadRequestError", None),
    (COMPLETIONS, _j({"prompt": "hi"}), 400, "BadRequestError", "model"),
    (COMPLETIONS, _j({"model": 7, "prompt": "hi"}), 400, "BadRequestError", "model"),
    (COMPLETIONS, _j({"model": "gpt-nope", "prompt": "hi"}), 404, "NotFoundError", "model"),
    (COMPLETIONS, _j({"model": NAME}), 400, "BadRequestError", "prompt"),
    (COMPLETIONS, _j({"model": NAME, "prompt": {"a": 1}}), 400, "BadRequestError", "prompt"),
    (COMPLETIONS, _j({"model": NAME, "prompt": [[["deep"]]]}), 400, "BadRequestError", "prompt"),
    (COMPLETIONS, _j({"model": NAME, "prompt": "hi", "stream": "yes"}), 400, "BadRequestError", "stream"),
    (
        COMPLETIONS,
        _j({"model": NAME, "prompt": "hi", "max_tokens": "9"}),
        400,
        "BadRequestError",
        "max_tokens",
    ),
    (
        COMPLETIONS,
        _j({"model": NAME, "prompt": "hi", "max_tokens": -1}),
        400,
        "BadRequestError",
        "max_tokens",
    ),
    (
        COMPLETIONS,
        _j({"model": NAME, "prompt": "hi", "max_tokens": 1e30}),
        400,
        "BadRequestError",
        "max_tokens",
    ),
    (
        COMPLETIONS,
        _j({"model": NAME, "prompt": "hi", "max_tokens": 10**40}),
        400,
        "BadRequestError",
        "max_tokens",
    ),
    (COMPLETIONS, _j({"model": NAME, "prompt": "w " * MAX_MODEL_LEN}), 400, "BadRequestError", "prompt"),
    (CHAT, _j({"model": NAME}), 400, "BadRequestError", "messages"),
    (CHAT, _j({"model": NAME, "messages": "hi"}), 400, "BadRequestError", "messages"),
    (CHAT, _j({"model": NAME, "messages": [7]}), 400, "BadRequestError", "messages"),
    (
        CHAT,
        _j({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}),
        400,
        "BadRequestError",
        "max_tokens",
    ),
    (COMPLETIONS, _j({"model": NAME, "prompt": "x" * (MAX_BODY + 1)}), 413, "RequestTooLargeError", None),
]


async def test_hostile_bodies_get_openai_errors_naming_the_field(setup: Setup) -> None:
    before = metric_total(_get(setup.prefill.url + "/metrics"), "vllm:request_success_total")
    for path, raw, status, kind, param in HOSTILE:
        got, body = await raw_exchange(setup.port, post_bytes(path, raw))
        assert (got, body["error"]["type"], body["error"]["param"]) == (status, kind, param), (raw[:80], body)
        assert body["error"]["code"] == status
        assert body["error"]["message"]
    # A head over the limit: 431; a GET on a generation path: 405; an unknown path: 404.
    status, body = await raw_exchange(
        setup.port, b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 1 - 29)
    )
    assert (status, body["error"]["code"]) == (431, 431)
    status, _ = await raw_exchange(setup.port, b"GET /v1/completions HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == 405
    status, _ = await raw_exchange(setup.port, b"GET /v2/anything HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == 404
    assert before == metric_total(_get(setup.prefill.url + "/metrics"), "vllm:request_success_total")
    assert await asyncio.to_thread(quiet, setup)


async def test_a_slowloris_is_cut_while_other_clients_are_served(
    setup: Setup, session: aiohttp.ClientSession
) -> None:
    readers = []
    for _ in range(20):  # twenty slow clients, each a header line that never ends
        reader, writer = await asyncio.open_connection(LOOPBACK, setup.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nX-Slow: a")
        readers.append((reader, writer))
    started = time.monotonic()
    served = 0
    while time.monotonic() - started < READ_TIMEOUT_S + 1:
        for _, writer in readers:
            writer.write(b"a")  # a byte a second each: the deadline does not move
        body = {"model": NAME, "prompt": f"meanwhile {served}", "max_tokens": 4}
        async with session.post(setup.url + COMPLETIONS, json=body) as response:
            assert response.status == 200, await response.text()
        served += 1
        await asyncio.sleep(1)
    for reader, writer in readers:
        head = await asyncio.wait_for(reader.read(), 10)
        assert head.startswith(b"HTTP/1.1 408 "), head[:60]
        writer.close()
    cut_after = time.monotonic() - started
    assert served >= 2
    assert cut_after < READ_TIMEOUT_S + 5
    text = _get(setup.url + "/metrics")
    assert metric_total(text, "tandem_router_rejected_requests_total", reason="read_timeout") >= 20


async def _open_stream(
    setup: Setup, body: dict[str, Any]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(LOOPBACK, setup.port)
    writer.write(post_bytes(COMPLETIONS, _j(body)).replace(b"Connection: close\r\n", b""))
    await writer.drain()
    return reader, writer


async def test_a_client_gone_during_its_prefill_leaves_nothing_behind(setup: Setup) -> None:
    setup.prefill.set_faults(slowdown=200.0)  # a prefill of seconds
    _, writer = await _open_stream(setup, {"model": NAME, "prompt": "w " * 2000, "max_tokens": 50})
    await until(lambda: running(setup.prefill) > 0, 20, "prefill running", every_s=1.0, blocking=True)
    writer.close()
    waited = await until(
        lambda: quiet(setup), 20, "quiet after an abandoned prefill", every_s=1.0, blocking=True
    )
    assert waited < 10
    assert running(setup.decode) == 0


async def test_a_client_gone_before_its_decode_leg_frees_the_prefill_kv_at_once(setup: Setup) -> None:
    """The decode pod hangs (its request never reaches its scheduler, so it never tells P to free):
    the router, seeing the client leave with P's KV untaken, asks P to free it."""
    setup.decode.set_faults(hang=True)
    _, writer = await _open_stream(setup, {"model": NAME, "prompt": "held " * 500, "max_tokens": 20})
    await until(lambda: held_blocks(setup.prefill) > 0, 20, "P holding the KV", every_s=1.0, blocking=True)
    assert held_blocks(setup.prefill) > 0
    writer.close()
    gone = time.monotonic()
    await until(
        lambda: held_blocks(setup.prefill) == 0,
        DEFAULT_LEASE_SECONDS,
        "P freeing the KV",
        every_s=1.0,
        blocking=True,
    )
    freed_after = time.monotonic() - gone
    print(f"held KV freed {freed_after:.1f} s after the client left (lease {DEFAULT_LEASE_SECONDS:g} s)")
    assert freed_after < 3.0
    setup.decode.clear_faults()
    await until(lambda: quiet(setup), 20, "quiet", every_s=1.0, blocking=True)


async def test_clients_gone_10_ms_after_sending_leave_no_kv_held(setup: Setup) -> None:
    """Streaming requests dropped by their clients 10 ms after sending, 20 at a time: some leave
    while their prefill runs, some as it finishes. No prefill may keep KV for its lease. Two paths
    once did: the engine's handler cancelled, or answering onto a closing connection, after the
    prefill finished (the sim engine frees that KV itself); and the router's prefill leg cancelled
    with P's answer written but not yet read (the router releases the attempt by its X-Request-Id)."""
    abandoned = 1000

    async def drop(index: int) -> None:
        # Prompts of 20 to 2,000 words: prefills that end before, around and after the 10 ms.
        words = 20 + (index * 97) % 1980
        body = {"model": NAME, "prompt": f"drop {index} " + "w " * words, "max_tokens": 20, "stream": True}
        _, writer = await _open_stream(setup, body)
        await asyncio.sleep(0.01)
        writer.close()

    for start in range(0, abandoned, 20):
        await asyncio.gather(*(drop(i) for i in range(start, start + 20)))
    expired_before = json.loads(_get(setup.prefill.url + "/debug/kv"))["expired_total"]
    # Far below the 30 s lease: every held KV was freed by a release, none by its lease.
    waited = await until(
        lambda: quiet(setup), 20, f"quiet after {abandoned} abandoned requests", every_s=1.0, blocking=True
    )
    print(f"quiet {waited:.0f} s after {abandoned} requests dropped 10 ms after sending")
    assert json.loads(_get(setup.prefill.url + "/debug/kv"))["expired_total"] == expired_before


async def test_a_client_gone_mid_stream_stops_the_decode(setup: Setup) -> None:
    reader, writer = await _open_stream(
        setup, {"model": NAME, "prompt": "stream me", "max_tokens": 3000, "stream": True}
    )
    seen = b""
    while seen.count(b"data: ") < 5:
        seen += await asyncio.wait_for(reader.read(4096), 30)
    assert running(setup.decode) == 1
    writer.close()
    waited = await until(
        lambda: quiet(setup), 20, "quiet after a stream was abandoned", every_s=1.0, blocking=True
    )
    assert waited < 5


async def test_rss_stays_bounded_over_hostile_requests(setup: Setup) -> None:
    """N rounds of the hostile table, slow and abandoned clients: RSS within 16 MiB of before."""

    async def round_of_abuse(index: int) -> None:
        for path, raw, status, _, _ in HOSTILE:
            assert (await raw_exchange(setup.port, post_bytes(path, raw)))[0] == status
        # An abandoned stream and a big valid body to an unknown model.
        reader, writer = await _open_stream(
            setup, {"model": NAME, "prompt": f"gone {index}", "max_tokens": 500, "stream": True}
        )
        await asyncio.wait_for(reader.read(1), 30)
        writer.close()
        big = _j({"model": "nope", "prompt": "y" * (MAX_BODY - 100)})
        assert (await raw_exchange(setup.port, post_bytes(COMPLETIONS, big)))[0] == 404

    for index in range(5):  # warm up: caches, pools and the allocator's arenas
        await round_of_abuse(index)
    await until(lambda: quiet(setup), 30, "quiet after the warm-up", every_s=1.0, blocking=True)
    before = setup.rss_kib()
    rounds = 40
    for index in range(rounds):
        await round_of_abuse(index)
    await until(lambda: quiet(setup), 30, "quiet after the abuse", every_s=1.0, blocking=True)
    after = setup.rss_kib()
    requests = rounds * (len(HOSTILE) + 2)
    print(f"router RSS {before / 1024:.1f} MiB -> {after / 1024:.1f} MiB over {requests} hostile requests")
    assert after - before < 16 * 1024
