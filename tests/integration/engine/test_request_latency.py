"""TANDEM_SIM_REQUEST_LATENCY_SECONDS: each generation request waits that long (x the time scale)
before the scheduler sees it, so a client's TTFT grows by it and the engine's steps do not; requests
sent together are taken one at a time, as by one serving process."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from .harness import NAME, Engine, start_engine

LATENCY_S = 1.5  # far above a one-token step and a busy machine's HTTP round trip


def _first_token_seconds(engine: Engine) -> float:
    started = time.monotonic()
    status, answer = engine.post("/v1/completions", {"model": NAME, "prompt": "hello", "max_tokens": 1})
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == 1
    return time.monotonic() - started


def test_the_latency_adds_to_ttft_and_not_to_the_engines_own_time() -> None:
    env = {"TANDEM_SIM_TIME_SCALE": "1", "TANDEM_SIM_REQUEST_LATENCY_SECONDS": str(LATENCY_S)}
    engine = start_engine(env=env)
    try:
        assert _first_token_seconds(engine) >= LATENCY_S
        # The engine's own TTFT (from the request reaching the scheduler) has no part of it.
        seconds = engine.metric("vllm:time_to_first_token_seconds_sum")
        requests = engine.metric("vllm:time_to_first_token_seconds_count")
        assert requests == 1
        assert seconds < LATENCY_S / 2
    finally:
        engine.stop()


def test_scaled_by_the_time_scale() -> None:
    env = {"TANDEM_SIM_TIME_SCALE": "0", "TANDEM_SIM_REQUEST_LATENCY_SECONDS": str(LATENCY_S)}
    engine = start_engine(env=env)
    try:
        assert _first_token_seconds(engine) < LATENCY_S / 2
    finally:
        engine.stop()


def test_requests_sent_together_are_taken_one_at_a_time() -> None:
    latency = 1.0
    env = {"TANDEM_SIM_TIME_SCALE": "1", "TANDEM_SIM_REQUEST_LATENCY_SECONDS": str(latency)}
    engine = start_engine(env=env)
    try:
        with ThreadPoolExecutor(3) as pool:
            seconds = sorted(pool.map(lambda _: _first_token_seconds(engine), range(3)))
        # Each behind the ones before it: 1, 2 and 3 latencies (in parallel, all three near 1).
        assert seconds[1] >= 2 * latency
        assert seconds[2] >= 3 * latency
    finally:
        engine.stop()
