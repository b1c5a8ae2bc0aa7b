"""Where things are: the repository's e2e/ files, the binary cache and a cluster's directory."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

# operator/tandem/devcluster/layout.py -> the repository root
REPO_ROOT = Path(__file__).resolve().parents[3]
E2E_DIR = REPO_ROOT / "e2e"
NODES_DIR = E2E_DIR / "nodes"
KWOK_STAGES = E2E_DIR / "kwok" / "stages.yaml"
PROMETHEUS_CONFIG = E2E_DIR / "prometheus" / "prometheus.yml"

# In the order a cluster starts them (`cluster.START_ORDER`, then the pod runner).
CONTROL_PLANE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "prometheus",
)


def default_cluster_dir() -> Path:
    """`$TANDEM_CLUSTER_DIR`, else `.tandem/cluster` at the repository root (git-ignored)."""
    env = os.environ.get("TANDEM_CLUSTER_DIR")
    return Path(env).resolve() if env else REPO_ROOT / ".tandem" / "cluster"


def bin_dir() -> Path:
    """`$TANDEM_BIN_DIR`, else `$TANDEM_CACHE/bin` (default ~/.cache/tandem/bin), filled by build-tools.sh."""
    if env := os.environ.get("TANDEM_BIN_DIR"):
        return Path(env)
    cache = os.environ.get("TANDEM_CACHE") or str(Path.home() / ".cache" / "tandem")
    return Path(cache) / "bin"


def missing_binaries(directory: Path, names: tuple[str, ...] = CONTROL_PLANE_BINARIES) -> list[str]:
    return [n for n in names if not os.access(directory / n, os.X_OK)]


def tandem_executable() -> str:
    """The `tandem` console script of the running interpreter's environment (the repo's venv)."""
    candidate = Path(sys.executable).parent / "tandem"
    if candidate.exists():
        return str(candidate)
    raise FileNotFoundError(
        f"no `tandem` executable next to {sys.executable}; install the package (pip -e .)"
    )


@dataclass(frozen=True)
class ClusterDir:
    """The files of one running cluster."""

    path: Path

    @property
    def state(self) -> Path:
        return self.path / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.path / "kubeconfig.yaml"

    @property
    def pki(self) -> Path:
        return self.path / "pki"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def audit_policy(self) -> Path:
        """The apiserver's audit policy; the apiserver audits only when it exists (`up(audit=True)`)."""
        return self.path / "audit-policy.yaml"

    @property
    def apiserver_profiling(self) -> Path:
        """A marker: while it exists the apiserver serves /debug/pprof (`up(profiling=True)`)."""
        return self.path / "apiserver-profiling"

    @property
    def audit_log(self) -> Path:
        """The apiserver's audit log (JSON lines), when it audits."""
        return self.logs / "audit.log"

    @property
    def pod_logs(self) -> Path:
        return self.path / "pods"

    @property
    def etcd_data(self) -> Path:
        return self.path / "etcd"

    @property
    def prometheus_config(self) -> Path:
        return self.path / "prometheus.yml"

    @property
    def scrape_targets(self) -> Path:
        """Prometheus file_sd files (`*.json`) of processes outside the cluster (a local operator)."""
        return self.path / "scrape-targets"

    @property
    def prometheus_data(self) -> Path:
        return self.path / "prometheus"

    @property
    def kwok_workdir(self) -> Path:
        return self.path / "kwok"

    @property
    def runner_ready(self) -> Path:
        """Touched by the pod runner once it has listed pods and is about to watch."""
        return self.path / "runner.ready"

    @property
    def vllm_setup(self) -> Path:
        """The runner's `realvllm.EngineSetup` when the cluster runs real vLLM pods (tests/real/)."""
        return self.path / "vllm-engines.json"

    @property
    def marker(self) -> str:
        """The value of TANDEM_DEVCLUSTER in every process of this cluster."""
        return str(self.path)
