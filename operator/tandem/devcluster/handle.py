"""A handle on a running dev cluster for tests and scripts: paths, URLs, clients, kubectl and helm."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client

from tandem.devcluster import kube, layout
from tandem.devcluster.cluster import load_state
from tandem.devcluster.layout import ClusterDir


@dataclass(frozen=True)
class ClusterHandle:
    """What a test needs to talk to the cluster. `owned` is True when this process started it."""

    dir: Path
    kubeconfig: Path
    apiserver_url: str
    prometheus_url: str
    bin_dir: Path
    owned: bool = False

    @classmethod
    def from_dir(cls, path: Path, *, owned: bool = False) -> ClusterHandle:
        cdir = ClusterDir(path)
        state = load_state(cdir)
        if state is None:
            raise FileNotFoundError(f"no running dev cluster in {path} (no state.json)")
        return cls(
            dir=path,
            kubeconfig=cdir.kubeconfig,
            apiserver_url=state.apiserver_url,
            prometheus_url=state.prometheus_url,
            bin_dir=Path(state.bin_dir),
            owned=owned,
        )

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path) -> ClusterHandle:
        """A cluster someone else started; its directory is the kubeconfig's (for state.json)."""
        kubeconfig = kubeconfig.resolve()
        state = load_state(ClusterDir(kubeconfig.parent))
        prometheus = os.environ.get("TANDEM_PROMETHEUS_URL") or (state.prometheus_url if state else "")
        api = kube.client_from(kubeconfig)
        try:
            server = str(api.configuration.host)
        finally:
            kube.close(api)
        return cls(
            dir=kubeconfig.parent,
            kubeconfig=kubeconfig,
            apiserver_url=server,
            prometheus_url=prometheus,
            bin_dir=Path(state.bin_dir) if state else layout.bin_dir(),
        )

    def api_client(self) -> client.ApiClient:
        """A new ApiClient for this cluster; close it (or use it as a context manager)."""
        return kube.client_from(self.kubeconfig)

    def env(self) -> dict[str, str]:
        """The environment for CLI tools against this cluster (kubectl, helm), hermetic for helm."""
        env = dict(os.environ)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        helm_home = self.dir / "helm"
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            PATH=f"{self.bin_dir}:{env.get('PATH', '')}",
            HELM_CACHE_HOME=str(helm_home / "cache"),
            HELM_CONFIG_HOME=str(helm_home / "config"),
            HELM_DATA_HOME=str(helm_home / "data"),
        )
        return env

    def run(
        self, tool: str, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / tool), *args],
            env=self.env(),
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", *args, check=check, input=input)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("helm", *args, check=check, timeout=300)
