"""Runs the chart's Argo CD health check (`charts/tandem/health.lua`) in a real Lua 5.1 interpreter.

Argo CD runs health checks in gopher-lua (Lua 5.1) with only the base, table and a safe os library
open unless `useOpenLibs` is set; the script runs here under the same restriction, with the
object as the global `obj`, and must return `{status, message}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lupa.lua51 import LuaRuntime

HEALTH_LUA = Path(__file__).resolve().parents[2] / "charts" / "tandem" / "health.lua"
STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}

_SANDBOXED_RUN = """
function(source, obj)
  local chunk, err = loadstring(source, "=health.lua")
  if chunk == nil then error(err) end
  local env = {
    obj = obj, assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs,
    pcall = pcall, select = select, tonumber = tonumber, tostring = tostring, type = type,
    unpack = unpack, table = table,
    os = {time = os.time, date = os.date, clock = os.clock},
  }
  setfenv(chunk, env)
  local hs = chunk()
  return hs.status, hs.message
end
"""


def health(obj: dict[str, Any], script: Path = HEALTH_LUA) -> tuple[str, str]:
    """(status, message) that Argo CD would show for `obj`."""
    lua = LuaRuntime(unpack_returned_tuples=True)
    run = lua.eval(_SANDBOXED_RUN)
    table = lua.table_from(obj, recursive=True)
    status, message = run(script.read_text(), table)
    assert status in STATUSES, status
    return str(status), str(message)
