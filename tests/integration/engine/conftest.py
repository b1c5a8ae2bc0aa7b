"""Fixtures: engine processes shared by a module (starting one costs about a second)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Engine, kv_config, start_engine


@pytest.fixture(scope="module")
def colocated() -> Iterator[Engine]:
    engine = start_engine("--enable-chunked-prefill", "--max-num-batched-tokens", "2048")
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def prefill() -> Iterator[Engine]:
    engine = start_engine("--kv-transfer-config", kv_config("kv_producer"), side_channel=True)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def decode() -> Iterator[Engine]:
    engine = start_engine("--kv-transfer-config", kv_config("kv_consumer"), side_channel=True)
    yield engine
    engine.stop()
