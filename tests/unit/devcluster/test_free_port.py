"""`procs.free_port`: below the ephemeral range, never handed out twice within its hold, never a bound
port; the registry is shared through a file, as between pytest workers."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tandem.devcluster import procs


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ports.json"
    monkeypatch.setattr(procs, "PORT_REGISTRY", path)
    return path


def test_ports_come_from_below_the_ephemeral_range(registry: Path) -> None:
    ports = procs._reservable_ports()
    if ports is None:
        pytest.skip("this kernel's ephemeral range leaves no room below it")
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert ports.stop == low
    assert all(procs.free_port(now=0.0) in ports for _ in range(20))


def test_a_port_is_not_handed_out_twice_within_its_hold(
    registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = _unbound_run(3)
    monkeypatch.setattr(procs, "_reservable_ports", lambda: range(base, base + 3))
    first = {procs.free_port(now=100.0) for _ in range(3)}
    assert first == {base, base + 1, base + 2}
    # All three held: the kernel picks one (outside the small range) rather than a repeat.
    assert procs.free_port(now=100.0 + procs.PORT_HOLD_S - 1) not in first
    # After the hold every one of them can be handed out again.
    assert procs.free_port(now=100.0 + procs.PORT_HOLD_S + 1) in first


def test_a_bound_port_is_passed_over(registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _unbound_run(2)
    monkeypatch.setattr(procs, "_reservable_ports", lambda: range(base, base + 2))
    with socket.socket() as server:
        server.bind(("127.0.0.1", base))
        server.listen(1)
        assert procs.free_port(now=0.0) == base + 1
        assert base not in {procs.free_port(now=0.0) for _ in range(3)}
        # Its hold long over, a port still bound is still passed over.
        assert base not in {procs.free_port(now=procs.PORT_HOLD_S * 2) for _ in range(3)}


def test_a_run_of_ports_is_held_whole(registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-port pod's ports: every one of the run is held, so none is handed to another caller
    while the pod starts (only its first used to be; the rest were merely bindable when picked)."""
    base = _unbound_run(5)
    monkeypatch.setattr(procs, "_reservable_ports", lambda: range(base, base + 5))
    first = procs.free_ports(2, now=0.0)
    assert first in (base, base + 1, base + 2, base + 3)
    run = {first, first + 1}
    singles = {procs.free_port(now=0.0) for _ in range(3)}
    assert singles == set(range(base, base + 5)) - run
    # Nothing left: a run of two comes from the kernel's range, outside the held ones.
    assert procs.free_ports(2, now=1.0) not in range(base - 1, base + 5)


def test_a_run_passes_over_a_bound_port_inside_it(registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _unbound_run(4)
    monkeypatch.setattr(procs, "_reservable_ports", lambda: range(base, base + 4))
    with socket.socket() as server:
        server.bind(("127.0.0.1", base + 1))
        server.listen(1)
        assert procs.free_ports(2, now=0.0) == base + 2


def test_a_broken_registry_is_started_afresh(registry: Path) -> None:
    registry.write_text("{not json")
    port = procs.free_port(now=0.0)
    assert str(port) in registry.read_text()


def _unbound_run(n: int) -> int:
    """The first of `n` consecutive ports nothing on this machine has bound (below the ephemeral
    range, where the tests' own sockets do not land)."""
    for base in range(15000, 30000, 97):
        if all(procs.bindable(p) for p in range(base, base + n)):
            return base
    raise AssertionError("no free run of ports")
