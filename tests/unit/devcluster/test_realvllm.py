"""How the pod runner runs a rendered `vllm serve` command with the CPU build of vLLM (tests/real/):
exactly the changes `realvllm.CPU_CHANGES` names (and docs/real-vllm.md lists), nothing else; the
KWOK stages of a real-vLLM cluster; `make test` leaving tests/real/ out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.models import PDDeployment
from tandem.devcluster import cluster, expand, layout, realvllm
from tandem.render.command import engine_command

ROOT = Path(__file__).resolve().parents[3]
SETUP = realvllm.EngineSetup(python="/venv/bin/python", models={"/models/tiny-llama": "/cache/tiny"})


def pdd(mode: str) -> PDDeployment:
    pool = {"replicas": 1, "tensorParallelSize": 1}
    spec: dict[str, Any] = {
        "model": {"name": "tiny-llama", "uri": "file:///models/tiny-llama", "maxModelLen": 2048},
        "engine": {"type": "vllm", "image": "vllm/vllm-openai:v0.33.0", "extraArgs": ["--dtype", "float32"]},
        "kvTransfer": {"connector": "NixlConnector"},
        "network": {"rdma": {"enabled": False}},
        "serving": {"mode": mode},
        "router": {"replicas": 1},
    }
    if mode == "Colocated":
        spec["colocated"] = pool
    else:
        spec |= {"prefill": pool, "decode": pool}
    doc = {"apiVersion": "tandem.dev/v1alpha1", "kind": "PDDeployment", "metadata": {"name": "t"}}
    doc["spec"] = spec
    return PDDeployment.model_validate(doc)


CASES = [("Disaggregated", "prefill"), ("Disaggregated", "decode"), ("Colocated", "colocated")]
ENTRY = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]


@pytest.mark.parametrize(("mode", "role"), CASES)
def test_the_rendered_command_runs_with_only_the_listed_changes(mode: str, role: Any) -> None:
    rendered = engine_command(pdd(mode), role)
    assert rendered[:3] == ["vllm", "serve", "/models/tiny-llama"]
    mapped = realvllm.command(rendered, SETUP)
    # entrypoint and model
    assert mapped[:5] == [*ENTRY, "--model", "/cache/tiny"]
    rest, rendered_rest = mapped[5:], rendered[3:]
    assert len(rest) == len(rendered_rest)
    for got, want in zip(rest, rendered_rest, strict=True):
        if want.startswith("{"):  # kv_buffer_device, and only that, added
            assert json.loads(got) == {**json.loads(want), "kv_buffer_device": "cpu"}
        else:
            assert got == want
    has_kv = "--kv-transfer-config" in rendered
    assert has_kv == (role != "colocated")


def test_changes_listed_are_the_changes_made() -> None:
    assert set(realvllm.CPU_CHANGES) == {"entrypoint", "model", "kv_buffer_device", *realvllm.CPU_ENV}
    env = realvllm.environment({"UCX_NET_DEVICES": "all", "POD_IP": "127.0.0.9"}, SETUP)
    assert env == {
        "POD_IP": "127.0.0.9",
        "UCX_NET_DEVICES": "lo",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "TANDEM_NIXL_PROGRESS_DELAY_US": "1000",
        "TANDEM_VLLM_SHM_BUSY_LOOP_S": "0.01",
        "TANDEM_VLLM_SHM_RECHECK_MS": "20",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "PYTHONPATH": str(realvllm.CPU_SITE),
    }
    docs = (ROOT / "docs" / "real-vllm.md").read_text()
    for name in realvllm.CPU_ENV:
        assert f"`{name}" in docs, name
    assert "kv_buffer_device" in docs
    assert "vllm.entrypoints.openai.api_server" in docs


def test_a_user_kv_buffer_device_is_kept_and_the_equals_form_is_mapped() -> None:
    argv = ["vllm", "serve", "/models/tiny-llama", '--kv-transfer-config={"kv_role":"kv_consumer"}']
    assert realvllm.command(argv, SETUP)[-1] == (
        '--kv-transfer-config={"kv_role":"kv_consumer","kv_buffer_device":"cpu"}'
    )
    argv = ["vllm", "serve", "/models/tiny-llama", "--kv-transfer-config", '{"kv_buffer_device":"cuda"}']
    assert realvllm.command(argv, SETUP)[-1] == '{"kv_buffer_device":"cuda"}'


def test_an_unknown_model_or_a_foreign_command_is_a_config_error() -> None:
    with pytest.raises(expand.ConfigError, match="no local model"):
        realvllm.command(["vllm", "serve", "meta-llama/Llama-3.1-8B"], SETUP)
    with pytest.raises(expand.ConfigError, match="not a `vllm serve"):
        realvllm.command(["tandem", "engine", "serve", "x"], SETUP)


def test_setup_round_trips(tmp_path: Path) -> None:
    SETUP.save(tmp_path / "s.json")
    assert realvllm.EngineSetup.load(tmp_path / "s.json") == SETUP


def test_a_real_vllm_cluster_runs_vllm_pods_through_the_runner_stages() -> None:
    original = layout.KWOK_STAGES.read_text()
    changed = {d["metadata"]["name"]: d for d in yaml.safe_load_all(cluster.vllm_pod_stages(original)) if d}
    before = {d["metadata"]["name"]: d for d in yaml.safe_load_all(original) if d}
    assert set(changed) == set(before)
    touched = set()
    for name, doc in changed.items():
        for expr in doc["spec"].get("selector", {}).get("matchExpressions", []):
            if expr["key"] == cluster.COMMAND_KEY:
                assert expr["values"] == ["tandem", "vllm"], name
                touched.add(name)
        if name not in touched:
            assert doc == before[name], name
    assert touched == {"tandem-pod-start", "tandem-pod-delete", "pod-complete"}


def test_make_test_does_not_collect_the_real_engine_tests() -> None:
    def collect(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )

    others = ["--ignore=tests/unit", "--ignore=tests/integration", "--ignore=tests/chart"]
    whole = collect("tests", *others)  # `make test` names `tests`; only tests/real/ is left to collect
    assert "tests/real" not in whole.stdout, whole.stdout
    assert whole.returncode == 5, whole.stdout + whole.stderr  # no tests collected
    named = collect("tests/real")
    assert named.returncode == 0, named.stdout + named.stderr
    assert "tests/real/" in named.stdout


def test_without_avx2_every_real_engine_test_is_skipped_loudly(tmp_path: Path) -> None:
    """On a machine that cannot run vllm-cpu, `pytest tests/real` starts nothing and reports each test
    as skipped with the reason (a plugin makes this machine look like one without AVX2)."""
    (tmp_path / "no_avx2.py").write_text(
        "from tandem.devcluster import realvllm\nrealvllm.has_avx2 = lambda: False\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "operator")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no_avx2", "-p", "no:cacheprovider", "-rs", "tests/real"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = done.stdout.splitlines()[-1]
    assert "skipped" in summary, summary
    assert "passed" not in summary, summary
    assert "failed" not in summary, summary
    assert done.stdout.count("SKIPPED") >= 1
    assert "REAL vLLM TESTS SKIPPED: vllm-cpu needs an x86-64 CPU with AVX2" in done.stdout
    assert "dev cluster" not in done.stdout  # no cluster was started


# --- cpu_site/sitecustomize.py: the pauses, on stand-ins for vLLM's and NIXL's modules --------------

FAKE_SHM = """
SHM_READER_RECHECK_INTERVAL_MS = 5000
class SpinCondition:
    def __init__(self, is_reader, context, notify_address, busy_loop_s: float = 1):
        self.busy_loop_s = busy_loop_s
"""
FAKE_NIXL = """
class nixlAgentConfig:
    pass
"""
PROBE = """
import nixl_cu13._bindings as b
import vllm.distributed.device_communicators.shm_broadcast as m
c = b.nixlAgentConfig()
c.pthrDelay = 0
print(c.pthrDelay, m.SpinCondition(True, None, "ipc://x").busy_loop_s, m.SHM_READER_RECHECK_INTERVAL_MS)
"""


def run_probe(tmp_path: Path, env: dict[str, str], shm: str = FAKE_SHM) -> subprocess.CompletedProcess[str]:
    shm_file = tmp_path / "vllm" / "distributed" / "device_communicators" / "shm_broadcast.py"
    shm_file.parent.mkdir(parents=True)
    for package in (shm_file.parents[2], shm_file.parents[1], shm_file.parent):
        (package / "__init__.py").write_text("")
    shm_file.write_text(shm)
    (tmp_path / "nixl_cu13").mkdir()
    (tmp_path / "nixl_cu13" / "__init__.py").write_text("")
    (tmp_path / "nixl_cu13" / "_bindings.py").write_text(FAKE_NIXL)
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": f"{realvllm.CPU_SITE}:{tmp_path}", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "seen"),
    [
        ({}, "0 1 5000"),
        (
            {k: v for k, v in realvllm.CPU_ENV.items() if k.startswith("TANDEM_")},
            f"{realvllm.NIXL_PROGRESS_DELAY_US} {realvllm.SHM_BUSY_LOOP_S} {realvllm.SHM_RECHECK_MS}",
        ),
        ({"TANDEM_VLLM_SHM_RECHECK_MS": "7"}, "0 1 7"),
    ],
)
def test_the_engine_pauses_are_the_variables(tmp_path: Path, env: dict[str, str], seen: str) -> None:
    probe = run_probe(tmp_path, env)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == seen.split()


def test_a_spin_condition_of_another_shape_is_left_alone_and_said(tmp_path: Path) -> None:
    drifted = FAKE_SHM.replace("busy_loop_s: float = 1):", "busy_loop_s: float = 1, spin: bool = True):")
    probe = run_probe(tmp_path, {"TANDEM_VLLM_SHM_BUSY_LOOP_S": "0.01"}, drifted)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split()[1] == "1"
    assert "SpinCondition has no trailing busy_loop_s" in probe.stderr
