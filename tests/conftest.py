"""Shared pytest fixtures: the local control plane (`cluster`), the CRD on it (`crd`), and a fresh
namespace per test, and how `make test` splits the suite between its three workers.

`cluster` (session-scoped) starts a dev cluster with the same code as `tandem dev cluster up`, in a
temporary directory, and stops it at the end of the session; with `TANDEM_KUBECONFIG` set it uses
that running cluster instead and leaves it alone. Tests that use it get the `cluster` marker.
Missing binaries are a failure, not a skip: `make tools` builds them.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

from tandem.devcluster import cluster as devcluster
from tandem.devcluster import layout
from tandem.devcluster.handle import ClusterHandle

# CI (and `make test` under CI=true) runs every property test on the same examples, so a red run is
# reproducible and never a roll of the dice; a developer's run explores new examples each time.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


# `make test` runs three pytest-xdist workers (`-n 3`), each with its own dev cluster (clusters
# pick distinct loopback pod octets): most e2e time is spent waiting on clusters and engines, so a
# third worker uses the two cores' idle time; the load e2e unit holds one worker throughout. A
# module is one unit of work, so its module-scoped fixtures are built once and its tests run in
# order; the modules that drive load through a whole deployed stack form a single unit, so at most
# one of them loads the machine at a time. (The scheduler does this
# itself: pytest 9.2 ignores the nodeid suffix xdist's `--dist loadgroup` relies on, pytest-xdist
# issue 1386, so xdist_group marks would be silently dropped.)
LOAD_E2E_DIRS: tuple[str, ...] = (
    "tests/integration/autoscale/",
    "tests/integration/rollout/",
    "tests/integration/kvlink/",
)


REAL_DIR = Path(__file__).resolve().parent / "real"
REAL_UNIT_DIR = "tests/real/"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/real/ (real vLLM engines on CPU, `make test-real`) is collected only when a command-line
    argument names it or a path inside it: `make test`'s `pytest tests` leaves it out."""
    if collection_path.resolve() != REAL_DIR:
        return None
    base = config.invocation_params.dir
    for arg in config.invocation_params.args:
        path = (base / arg.split("::", 1)[0]).resolve()
        if not arg.startswith("-") and (path == REAL_DIR or REAL_DIR in path.parents):
            return None
    return True


def work_unit(nodeid: str) -> str:
    """The unit a test is scheduled in: its module, the one unit of the load e2e modules, or the one
    unit of the real-engine modules (they share one dev cluster with vLLM pods, a session fixture)."""
    module = nodeid.split("::", 1)[0]
    if module.startswith(LOAD_E2E_DIRS):
        return "load-e2e"
    return "real-engines" if module.startswith(REAL_UNIT_DIR) else module


class ModuleScheduling(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadScopeScheduling:
    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
    # The longest unit first (with --no-loadscope-reorder xdist hands units out in collection order),
    # so it does not start last and run alone, then the real engines' (when `make test` names
    # tests/real), which wait on engine starts and slow P/D requests more than they compute; a stable
    # sort keeps each module's tests in order.
    first = {"load-e2e": 0, "real-engines": 1}
    items.sort(key=lambda item: first.get(work_unit(item.nodeid), 2))


# Each work unit's span (first test's start to last test's end, setup and teardown included) and the
# worker that ran it, gathered from the test reports and printed at the end of the session: the
# figures that say which unit is the critical path of `make test`.
_UNIT_SPANS: dict[str, tuple[str, float, float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # the xdist worker that sent it, on the controller
    worker = str(node.gateway.id) if node is not None else "main"
    unit = work_unit(report.nodeid)
    _, start, stop = _UNIT_SPANS.get(unit, (worker, report.start, report.stop))
    _UNIT_SPANS[unit] = (worker, min(start, report.start), max(stop, report.stop))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _UNIT_SPANS:
        return
    begin = min(start for _, start, _ in _UNIT_SPANS.values())
    by_worker: dict[str, list[tuple[float, float, str]]] = {}
    for unit, (worker, start, stop) in _UNIT_SPANS.items():
        by_worker.setdefault(worker, []).append((start - begin, stop - begin, unit))
    terminalreporter.section("work units by worker (seconds from the first test's start)")
    for worker, spans in sorted(by_worker.items()):
        spans.sort()
        busy = sum(stop - start for start, stop, _ in spans)
        terminalreporter.write_line(
            f"{worker}: {len(spans)} units, busy {busy:.0f} s, last ends at {spans[-1][1]:.0f} s"
        )
        for start, stop, unit in sorted(spans, key=lambda span: span[0] - span[1])[:5]:
            terminalreporter.write_line(f"  {stop - start:6.0f} s  [{start:4.0f}-{stop:4.0f}]  {unit}")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    if kubeconfig := os.environ.get("TANDEM_KUBECONFIG"):
        yield ClusterHandle.from_kubeconfig(Path(kubeconfig))
        return
    bins = layout.bin_dir()
    missing = layout.missing_binaries(bins, (*layout.CONTROL_PLANE_BINARIES, "kubectl", "helm"))
    if missing:
        pytest.fail(
            f"dev cluster binaries missing in {bins}: {', '.join(missing)}. "
            "Run `make tools` (e2e/build-tools.sh) first, or set TANDEM_BIN_DIR.",
            pytrace=False,
        )
    for orphan in devcluster.reap_orphans():
        print(f"stopped the cluster of a test session that is gone: {orphan}")
    cdir = layout.ClusterDir(tmp_path_factory.mktemp("cluster"))
    try:
        devcluster.up(cdir, owner_pid=os.getpid())
    except devcluster.ClusterError as e:
        pytest.fail(f"dev cluster did not start: {e}", pytrace=False)
    try:
        yield ClusterHandle.from_dir(cdir.path, owned=True)
    finally:
        devcluster.down(cdir)


@pytest.fixture
def namespace(cluster: ClusterHandle, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new namespace (with its default ServiceAccount) for one test, deleted afterwards."""
    from tandem.devcluster.testing import scratch_namespace

    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    with scratch_namespace(cluster, f"t-{base}-{uuid.uuid4().hex[:6]}") as name:
        yield name


CRD = Path(__file__).parents[1] / "crds" / "pddeployment.yaml"


@pytest.fixture(scope="session")
def lws(cluster: ClusterHandle) -> ClusterHandle:
    """The worker's cluster with the LeaderWorkerSet controller running (started on first use, kept
    after; `devcluster.start_lws` is a no-op while it runs)."""
    try:
        devcluster.start_lws(layout.ClusterDir(cluster.dir))
    except devcluster.ClusterError as e:
        pytest.fail(f"the LeaderWorkerSet controller did not start: {e}", pytrace=False)
    return cluster


@pytest.fixture(scope="session")
def crd(cluster: ClusterHandle) -> None:
    """The PDDeployment CRD, installed once and Established. tests/real/ overrides it with its own (a
    session fixture is cached once per worker: used first from tests/real/, this one would have
    installed the CRD on the real engines' cluster and never on the suite's)."""
    from tandem.devcluster.testing import install_crd

    install_crd(cluster, CRD)
