"""`tandem.render` is pure: no Kubernetes client, network, process, clock, randomness or env access
(`cli.py`, the command-line shell, may read files)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tandem.render

PACKAGE = Path(tandem.render.__file__).parent
FORBIDDEN = {
    "kubernetes",
    "kopf",
    "httpx",
    "aiohttp",
    "asyncio",
    "socket",
    "subprocess",
    "time",
    "datetime",
    "random",
    "os",
    "uuid",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("module", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_render_modules_import_nothing_impure(module: Path) -> None:
    assert not (_imports(module) & FORBIDDEN)
