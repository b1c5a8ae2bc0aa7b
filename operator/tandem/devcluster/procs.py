"""Local processes of the dev cluster: free ports, detached spawning, liveness and stopping.

Every process the cluster starts carries the environment variable `TANDEM_DEVCLUSTER=<cluster dir>`,
so that `cluster down` can find and stop anything left behind (grandchildren included) by reading
`/proc/<pid>/environ`, without matching process names.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

MARKER_ENV = "TANDEM_DEVCLUSTER"

# Popen objects of processes started by this Python process, so that stopping one also reaps it
# (otherwise a long-lived parent such as pytest would keep zombies until it exits).
_children: dict[int, subprocess.Popen[bytes]] = {}


# Ports for servers started here come from below the kernel's ephemeral range, so that no client
# socket is given one between the pick and its server's bind (a CI run lost KWOK's port that way: it
# was picked when the cluster began to start and bound 30 s later), and each is held in a registry
# every process on the machine shares, so that two pickers (pytest workers, a demo beside them) never
# get the same one while its server starts. A hold outlives any start; after it, a port still bound
# fails the bind check and is passed over.
PORT_REGISTRY = Path(tempfile.gettempdir()) / "tandem-ports.json"
PORT_HOLD_S = 3600.0
PORTS_BELOW_EPHEMERAL = 12000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _reservable_ports() -> range | None:
    """The ports below the ephemeral range that `free_port` hands out; None where there are too few."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    first = max(10000, low - PORTS_BELOW_EPHEMERAL)
    return range(first, low) if low - first >= 1000 else None


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP socket can bind `host:port` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_port(*, now: float | None = None) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and no other caller on this machine was
    given within `PORT_HOLD_S`."""
    return free_ports(1, now=now)


def free_ports(count: int, *, hosts: Sequence[str] = ("127.0.0.1",), now: float | None = None) -> int:
    """The first of `count` consecutive ports (a multi-port pod's ranks) that nothing listens on now on
    any of `hosts` and no other caller was given within `PORT_HOLD_S`; every one of them is held, so
    no other caller is handed one while its server starts."""
    ports = _reservable_ports()
    if ports is None or len(ports) < count:
        return _kernel_ports(count, hosts)
    at = time.time() if now is None else now
    lock_path = PORT_REGISTRY.with_suffix(".lock")
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            held = {int(p): float(until) for p, until in json.loads(PORT_REGISTRY.read_text()).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            held = {}
        held = {p: until for p, until in held.items() if until > at}
        starts = range(ports.start, ports.stop - count + 1)
        offset = random.randrange(len(starts))
        for i in range(len(starts)):
            first = starts[(offset + i) % len(starts)]
            run = range(first, first + count)
            if all(p not in held for p in run) and all(bindable(p, host) for p in run for host in hosts):
                break
        else:
            return _kernel_ports(count, hosts)
        for port in run:
            held[port] = at + PORT_HOLD_S
        tmp = PORT_REGISTRY.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(held))
        tmp.replace(PORT_REGISTRY)
        return first


def _kernel_ports(count: int, hosts: Sequence[str]) -> int:
    """Where the registry's range cannot serve: a kernel-picked port whose next `count - 1` are free."""
    for _ in range(50):
        first = _kernel_port()
        if all(bindable(first + i, host) for i in range(count) for host in hosts):
            return first
    raise RuntimeError(f"no {count} consecutive free ports on {', '.join(hosts)}")


def spawn(
    argv: Sequence[str],
    *,
    log: Path | None,
    marker: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Starts `argv` in its own session with stdout and stderr appended to `log` (a pipe if None)."""
    full_env = dict(os.environ if env is None else env)
    full_env[MARKER_ENV] = marker
    with contextlib.ExitStack() as stack:
        if log is None:
            out: Any = subprocess.PIPE
        else:
            log.parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(log.open("ab"))
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    _children[proc.pid] = proc
    return proc


def _reap(pid: int) -> None:
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        del _children[pid]


def has_marker(pid: int, marker: str) -> bool:
    """Whether `pid` is alive (not a zombie) and was started for the cluster in `marker`."""
    _reap(pid)
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return f"{MARKER_ENV}={marker}".encode() in environ.split(b"\0")


def markers() -> set[str]:
    """The TANDEM_DEVCLUSTER values of all live processes: the directories of running clusters."""
    prefix = f"{MARKER_ENV}=".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        for var in environ.split(b"\0"):
            if var.startswith(prefix):
                found.add(var[len(prefix) :].decode(errors="replace"))
    return found


def marked_pids(marker: str) -> list[int]:
    """All live processes that carry `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid() and has_marker(int(entry.name), marker):
            pids.append(int(entry.name))
    return pids


def stop(pids: Sequence[int], marker: str, *, grace: float = 10.0) -> None:
    """SIGTERM to each pid's process group, then SIGKILL to whatever is left after `grace` seconds."""
    live = [p for p in pids if has_marker(p, marker)]
    for pid in live:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        live = [p for p in live if has_marker(p, marker)]
        if not live:
            return
        time.sleep(0.1)
    for pid in live:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(has_marker(p, marker) for p in live):
        time.sleep(0.05)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            return
        if pgid == pid:
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)


def wait_until(
    check: Callable[[], bool], *, timeout: float, interval: float = 0.25, what: str = "condition"
) -> None:
    """Polls `check` until it returns True; raises TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if check():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def iter_lines(path: Path, last: int = 20) -> Iterator[str]:
    """The last `last` lines of a log file, for error messages."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return iter(())
    return iter(lines[-last:])
