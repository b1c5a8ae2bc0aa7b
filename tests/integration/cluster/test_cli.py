"""`tandem dev cluster up|status|down` as a user runs it: a second, separate cluster in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.devcluster import cluster as devcluster
from tandem.devcluster import layout, procs

pytestmark = pytest.mark.cluster


def _tandem(*args: str, cluster_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TANDEM_CLUSTER_DIR": str(cluster_dir)}
    tandem = str(Path(sys.executable).parent / "tandem")
    return subprocess.run([tandem, *args], env=env, capture_output=True, text=True, timeout=300)


def test_up_twice_status_and_down_leaves_no_process(tmp_path: Path) -> None:
    cdir = layout.ClusterDir(tmp_path / "c")
    try:
        first = _tandem("dev", "cluster", "up", cluster_dir=cdir.path)
        assert first.returncode == 0, first.stderr + first.stdout
        assert "h100-rdma-3" in first.stdout
        assert cdir.kubeconfig.exists()
        pids = procs.marked_pids(cdir.marker)
        assert len(pids) >= 7
        # Other clusters on this machine (the session's, a demo) hand out other pod IPs.
        octet = devcluster.load_state(cdir).pod_octet  # type: ignore[union-attr]
        assert f"podCIDR=127.{octet}.1.0/24" in first.stdout
        for other in procs.markers() - {cdir.marker}:
            state = devcluster.load_state(layout.ClusterDir(Path(other)))
            assert state is None or state.pod_octet != octet

        second = _tandem("dev", "cluster", "up", cluster_dir=cdir.path)
        assert second.returncode == 0, second.stderr
        assert "already running" in second.stdout
        assert sorted(procs.marked_pids(cdir.marker)) == sorted(pids)

        status = _tandem("dev", "cluster", "status", cluster_dir=cdir.path)
        assert status.returncode == 0, status.stderr
        for component in ("etcd", "kube-apiserver", "kwok", "prometheus", "pod-runner"):
            assert component in status.stdout
        assert str(cdir.kubeconfig) in status.stdout
    finally:
        down = _tandem("dev", "cluster", "down", cluster_dir=cdir.path)
    assert down.returncode == 0, down.stderr
    assert procs.marked_pids(cdir.marker) == []
    assert _tandem("dev", "cluster", "status", cluster_dir=cdir.path).returncode == 1
