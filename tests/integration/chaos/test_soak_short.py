"""The soak's 2-minute CI version: `bench/soak.py`'s own functions, with a fault every 25 s.

A sim PDDeployment (2 prefill, 2 decode, 2 routers, run by the dev cluster's pod runner) deployed by
`tandem operator` (a local process, watching this module's namespace only), the Azure conversation
trace replayed through its routers at 0.3 times the trace's rate for 2 minutes, and one of each
fault in turn at +25, +50, +75 and +100 s: the operator killed -9 and restarted, a decode pod
deleted, a prefill pod deleted, a router pod deleted. The checks are the bench's (see its docstring):
every request accounted for; failures only those the router's failure rules allow around a fault;
zero KV held on every engine and nothing in flight at the routers once quiet; the operator's and the
routers' asyncio task counts back to their idle floor (+3); RSS under 300 MB (the operator and the
routers measure about 70-80 MB; two minutes are too short for a slope, which the 30-minute bench
checks).

Wall time alone: about 3 minutes (2 minutes of load, the stack's start, the quiet wait).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import RestartableOperator, load_file, scratch_namespace

ROOT = Path(__file__).resolve().parents[3]


def _bench() -> ModuleType:
    return load_file("bench_soak", ROOT / "bench" / "soak.py")


soak = _bench()


@pytest.fixture(scope="module")
def soak_operator(
    cluster: ClusterHandle, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RestartableOperator, str]]:
    """A namespace, and the operator for it alone (fixed identity, so the soak can kill -9 it)."""
    with scratch_namespace(cluster, f"chaos-soak-{uuid.uuid4().hex[:6]}") as namespace:
        args = [
            "--namespace", namespace,
            "--resync-seconds", "20",
            "--lease-namespace", namespace,
            "--lease-name", "tandem-soak",
        ]  # fmt: skip
        operator = RestartableOperator(
            cluster, args, tmp_path_factory.mktemp("soak-operator"), identity="soak"
        )
        try:
            operator.current.wait_leader(timeout=120)
            yield operator, namespace
        finally:
            operator.stop()


def test_two_minutes_of_trace_with_a_fault_every_25_seconds(
    cluster: ClusterHandle, soak_operator: tuple[RestartableOperator, str]
) -> None:
    operator, namespace = soak_operator
    settings = soak.Settings(
        minutes=2,
        fault_every=25,
        report_every=15,
        rate_scale=0.3,
        max_rss_mb=300,
        max_rss_slope=None,
        last_fault_margin=10,
    )
    result = soak.soak(cluster, namespace, operator, settings, say=print)
    soak.report(result)
    assert [f.kind for f in result.faults] == list(soak.FAULTS), "one fault of each kind, in turn"
    assert result.sent >= 30, f"the load sent only {result.sent} requests"
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    assert not failed, "\n".join(failed) + "\n" + operator.log_text()[-3000:]
