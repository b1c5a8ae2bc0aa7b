"""kstatus conformance of the operator's PDDeployment status on the local cluster, through
apply -> Ready -> spec change -> Ready, checked on every version a watch delivers; `kubectl wait
--for=condition=Ready` waits for the new generation; the Argo CD health check agrees throughout."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.devcluster.handle import ClusterHandle
from tandem.devcluster.testing import OperatorProcess

from .kstatus import compute
from .recorder import Recorder

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "sim-pd.yaml"
ARGO_FOR_KSTATUS = {"Current": "Healthy", "InProgress": "Progressing", "Failed": "Degraded"}


def _argo_health() -> Callable[[dict[str, Any]], tuple[str, str]]:
    spec = importlib.util.spec_from_file_location("lua_health", REPO / "tests" / "chart" / "lua_health.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("lua_health", module)
    spec.loader.exec_module(module)
    health: Callable[[dict[str, Any]], tuple[str, str]] = module.health
    return health


@pytest.fixture
def operator(cluster: ClusterHandle, crd: None, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    # The shared `crd` fixture installs the CRD and waits for Established, retrying while the new CRD
    # has no conditions yet (a bare `kubectl wait` fails at once then, more often the larger the schema).
    # Watching only the test's namespace, with its lease there too: other tests' objects are not its.
    args = ["--namespace", namespace, "--lease-namespace", namespace, "--resync-seconds", "20"]
    proc = OperatorProcess(cluster, args, tmp_path / "operator.log")
    try:
        proc.wait_leader(timeout=60)
        yield proc
    finally:
        proc.stop()


def kubectl_wait_ready(cluster: ClusterHandle, namespace: str, name: str) -> None:
    out = cluster.run(
        "kubectl", "wait", "-n", namespace, "--for=condition=Ready", f"pdd/{name}", "--timeout=300s",
        check=False, timeout=400,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


def get(cluster: ClusterHandle, namespace: str, name: str) -> dict[str, Any]:
    pdd: dict[str, Any] = json.loads(
        cluster.kubectl("get", "-n", namespace, f"pdd/{name}", "-o", "json").stdout
    )
    return pdd


def check_version(obj: dict[str, Any], health: Callable[[dict[str, Any]], tuple[str, str]]) -> str:
    """Every rule a GitOps tool relies on, for one version of the object; returns its kstatus."""
    result = compute(obj)
    status = obj.get("status") or {}
    where = f"rv {obj['metadata']['resourceVersion']} gen {obj['metadata']['generation']}: {status}"
    if not status:
        return result.status
    assert isinstance(status.get("observedGeneration"), int), where
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    if status["observedGeneration"] > 0:  # 0 is the CRD's default: the operator has not looked yet
        assert {"Ready", "Reconciling", "Stalled"} <= set(conditions), where  # present from the first pass
        assert not (
            conditions["Reconciling"]["status"] == "True" and conditions["Stalled"]["status"] == "True"
        ), where
    assert result.status in ("InProgress", "Current"), f"{result} at {where}"
    if result.status == "Current":
        # Current must mean the desired topology is there, for this generation.
        assert status["observedGeneration"] == obj["metadata"]["generation"], where
        assert conditions["Ready"]["status"] == "True", where
        assert status["phase"] == "Healthy", where
        for role, pool in (status.get("pools") or {}).items():
            assert pool.get("readyReplicas", 0) == pool.get("desiredReplicas", 0), f"{role} at {where}"
    if status.get("observedGeneration") == obj["metadata"]["generation"] and "conditions" in status:
        assert health(obj)[0] == ARGO_FOR_KSTATUS[result.status], f"{health(obj)} vs {result} at {where}"
    return result.status


def test_apply_ready_change_ready(cluster: ClusterHandle, namespace: str, operator: OperatorProcess) -> None:
    health = _argo_health()
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"].pop("namespace", None)
    name = doc["metadata"]["name"]
    api = cluster.api_client()
    recorder = Recorder(api, namespace, name)
    recorder.start()
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
        kubectl_wait_ready(cluster, namespace, name)
        first = get(cluster, namespace, name)
        assert compute(first).status == "Current"
        assert first["metadata"]["generation"] == 1

        decode = doc["spec"]["decode"]["replicas"]
        patch = json.dumps({"spec": {"decode": {"replicas": decode + 1}}})
        out = cluster.kubectl(
            "patch", "-n", namespace, f"pdd/{name}", "--type=merge", "-p", patch, "-o", "json"
        )
        patched = json.loads(out.stdout)
        # The moment the spec changes, before the operator has looked, kstatus says InProgress.
        assert patched["metadata"]["generation"] == 2
        assert compute(patched).status == "InProgress"
        assert compute(patched).reason == "LatestGenerationNotObserved"
        assert health(patched)[0] == "Progressing"
        kubectl_wait_ready(cluster, namespace, name)
        final = get(cluster, namespace, name)
        assert compute(final).status == "Current"
        assert final["status"]["observedGeneration"] == 2
        assert final["status"]["pools"]["decode"]["readyReplicas"] == decode + 1
    finally:
        versions = recorder.stop()
        api.close()

    statuses = [(v["metadata"]["generation"], check_version(v, health)) for v in versions]
    with_status = [v for v in versions if v.get("status")]
    assert with_status, "the watch saw no status"
    # For each generation: the operator said InProgress while working on it, then Current.
    for generation in (1, 2):
        seen = [
            compute(v).status
            for v in with_status
            if v["metadata"]["generation"] == generation and v["status"]["observedGeneration"] == generation
        ]
        assert "InProgress" in seen, (generation, statuses)
        assert seen[-1] == "Current", (generation, statuses)
    assert statuses[-1] == (2, "Current")


def test_fresh_object_is_in_progress_before_the_first_reconcile(
    cluster: ClusterHandle, namespace: str
) -> None:
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds" / "pddeployment.yaml")
    )
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"].pop("namespace", None)
    out = cluster.kubectl(
        "create", "-n", namespace, "--dry-run=server", "-o", "json", "-f", "-", input=yaml.safe_dump(doc)
    )
    created = json.loads(out.stdout)
    assert compute(created).status == "InProgress", created.get("status")
