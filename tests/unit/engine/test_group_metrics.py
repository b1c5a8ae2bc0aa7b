"""A data-parallel leader's /metrics: every rank's series, each under its own `engine` label, in one
family per metric (`tandem.engine.group.merge_expositions`)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tandem.engine.group import merge_expositions

OWN = """# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# HELP vllm:prompt_tokens_total Prompt tokens.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
"""
WORKER = OWN.replace("2.0", "3.0").replace("100.0", "40.0")


def sums(text: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("engine", ""))
            out[key] = out.get(key, 0.0) + sample.value
    return out


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        ({}, {("vllm:num_requests_running", "0"): 2.0, ("vllm:prompt_tokens_total", "0"): 100.0}),
        (
            {1: WORKER},
            {
                ("vllm:num_requests_running", "0"): 2.0,
                ("vllm:num_requests_running", "1"): 3.0,
                ("vllm:prompt_tokens_total", "0"): 100.0,
                ("vllm:prompt_tokens_total", "1"): 40.0,
            },
        ),
        (  # a sample without an engine label gets the rank's; without labels at all, too
            {2: '# TYPE tandem:x gauge\ntandem:x{a="b"} 1.0\n# TYPE tandem:y gauge\ntandem:y 5.0\n'},
            {
                ("vllm:num_requests_running", "0"): 2.0,
                ("vllm:prompt_tokens_total", "0"): 100.0,
                ("tandem:x", "2"): 1.0,
                ("tandem:y", "2"): 5.0,
            },
        ),
    ],
    ids=["alone", "a-worker", "labels-added"],
)
def test_every_rank_once_under_its_engine_label(workers: dict[int, str], expected: dict[Any, float]) -> None:
    merged = merge_expositions(OWN, workers)
    assert sums(merged) == expected


def test_a_family_stays_in_one_block() -> None:
    """The text format wants a family's samples together under its HELP and TYPE."""
    merged = merge_expositions(OWN, {1: WORKER, 2: WORKER})
    lines = merged.splitlines()
    running = [i for i, line in enumerate(lines) if line.startswith("vllm:num_requests_running")]
    assert running == list(range(running[0], running[0] + 3))
    assert sum(1 for line in lines if line.startswith("# TYPE vllm:num_requests_running")) == 1
