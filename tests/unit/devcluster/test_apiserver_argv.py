"""The dev cluster's apiserver command line: profiling served only where `up(profiling=True)` asked."""

from __future__ import annotations

from pathlib import Path

from tandem.devcluster import cluster, pki
from tandem.devcluster.layout import ClusterDir


def _argv(tmp_path: Path) -> list[str]:
    cdir = ClusterDir(tmp_path)
    state = cluster.State(
        dir=str(tmp_path),
        bin_dir="/bin",
        apiserver_port=6443,
        etcd_port=2379,
        prometheus_port=9090,
        kwok_port=10247,
        started_at=0.0,
    )
    return cluster._apiserver_argv(cdir, state, pki.Pki(cdir.pki))


def test_the_apiserver_serves_no_profiles_by_default(tmp_path: Path) -> None:
    argv = _argv(tmp_path)
    assert "--profiling=false" in argv
    assert "--profiling=true" not in argv


def test_the_marker_turns_the_apiserver_profiles_on(tmp_path: Path) -> None:
    ClusterDir(tmp_path).apiserver_profiling.touch()
    argv = _argv(tmp_path)
    assert "--profiling=true" in argv
    assert "--profiling=false" not in argv
