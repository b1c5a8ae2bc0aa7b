"""The Argo CD resource actions docs/rollout.md gives for rollout commands, run in a real Lua 5.1
interpreter with Argo CD's sandbox (base, table and a safe os): which actions are enabled in each
phase, and the command each one writes, scoped to the rollout in progress."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa.lua51 import LuaRuntime

DOC = Path(__file__).resolve().parents[2] / "docs" / "rollout.md"
KEY = "resource.customizations.actions.tandem.dev_PDDeployment"

_RUN = """
function(source, obj)
  local chunk, err = loadstring(source, "=action.lua")
  if chunk == nil then error(err) end
  local env = {
    obj = obj, ipairs = ipairs, pairs = pairs, tostring = tostring, type = type, table = table,
    os = {date = function(format) return "20261130T160000Z" end},
  }
  setfenv(chunk, env)
  return chunk()
end
"""


def recipe() -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    (block,) = [b for b in blocks if KEY in b]
    actions: dict[str, Any] = yaml.safe_load(yaml.safe_load(block)[KEY])
    return actions


def run(source: str, obj: dict[str, Any]) -> Any:
    lua = LuaRuntime(unpack_returned_tuples=True)
    return lua.eval(_RUN)(source, lua.table_from(obj, recursive=True))


def pdd(rollout: str | None = None, revision_rollout: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if rollout is not None:
        status["rollout"] = {"phase": rollout}
    if revision_rollout is not None:
        status["revisions"] = {"current": {"id": "b"}, "rollout": {"phase": revision_rollout}}
    return {"metadata": {"name": "x"}, "status": status}


ENABLED = [
    (pdd(), set()),
    (pdd("Shifting"), {"promote", "abort"}),
    (pdd("Paused"), {"promote", "abort", "retry"}),
    (pdd("RolledBack"), {"retry"}),
    (pdd("Promoted"), set()),
    (pdd(None, "Preparing"), {"abort"}),
    (pdd("Promoted", "Shifting"), {"promote", "abort"}),  # a promoted mode rollout: the revision's
]


@pytest.mark.parametrize(("obj", "enabled"), ENABLED)
def test_discovery(obj: dict[str, Any], enabled: set[str]) -> None:
    actions = run(recipe()["discovery.lua"], obj)
    got = {name for name in ("promote", "abort", "retry") if not actions[name]["disabled"]}
    assert got == enabled


@pytest.mark.parametrize(
    ("obj", "scope"),
    [
        (pdd("Shifting"), "mode:"),
        (pdd("Promoted", "Paused"), "revision:"),
        (pdd("Paused", "Paused"), "mode:"),
    ],
)
def test_actions_write_a_scoped_command(obj: dict[str, Any], scope: str) -> None:
    for definition in recipe()["definitions"]:
        out = run(definition["action.lua"], obj)
        value = out["metadata"]["annotations"]["tandem.dev/rollout-command"]
        assert value == f"{scope}{definition['name']}/20261130T160000Z"
