"""The line that says why a container failed, from the end of its log (pure).

Engine containers render `terminationMessagePolicy: FallbackToLogsOnError`: vLLM writes no
termination message, so a kubelet puts the end of the failed container's log (at most 80 lines or
2,048 bytes) in `lastState.terminated.message`. That tail is mostly a traceback or an argparse usage
text; the status quotes one line of it, the error itself:

- the last exception line (`ValueError: ...`, `RuntimeError: ...`) that is not only a pointer to an
  earlier one (vLLM's front end ends with `RuntimeError: Engine core initialization failed. See root
  cause above.` after the engine core's own traceback: the root cause is the line to show);
- else an argparse error (`api_server.py: error: unrecognized arguments: --bogus`);
- else the last pointer line, else the last line that is not blank.

The kubelet's 2,048 bytes are about ten of vLLM's prefixed lines: when vLLM's engine core fails, the
root cause (e.g. the KV cache too small for `--max-model-len`) is about 60 lines above the end, and
the tail holds only the pointer; `docs/real-vllm.md` says so.

Log prefixes (vLLM's `(EngineCore_DP0 pid=12) ERROR 12-01 10:00:00 [core.py:700] `) are removed.
"""

from __future__ import annotations

import re
from typing import Final

# What a kubelet keeps of the log for FallbackToLogsOnError.
FALLBACK_MAX_LINES: Final = 80
FALLBACK_MAX_BYTES: Final = 2048
# How much of the chosen line the status quotes.
MAX_LINE_CHARS: Final = 400

_EXCEPTION = re.compile(r"\b((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)): (.+)$")
_ARGPARSE = re.compile(r"^\S+: error: .+$")
_LOG_PREFIX = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s+)?"  # the process: (EngineCore_DP0 pid=12)
    # the level, the time, the file: ERROR 12-01 10:00:00 [core.py:700]
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d\s+\[[^\]]*\]\s+)?"
)
# Lines that only point at an error reported above them.
_POINTERS: Final = ("see root cause above", "see stack trace for root cause", "see the error above")


def fallback_message(lines: list[str]) -> str:
    """What a kubelet writes as the termination message under FallbackToLogsOnError: the log's last
    80 lines or 2,048 bytes, whichever is smaller (cut at a line start where the bytes run out)."""
    tail = lines[-FALLBACK_MAX_LINES:]
    text = "\n".join(line.rstrip("\n") for line in tail)
    data = text.encode()
    if len(data) <= FALLBACK_MAX_BYTES:
        return text
    cut = data[-FALLBACK_MAX_BYTES:].decode(errors="ignore")
    newline = cut.find("\n")
    return cut[newline + 1 :] if 0 <= newline < len(cut) - 1 else cut


def error_line(message: str) -> str | None:
    """The line of a failed container's log tail that says why (see the module docstring); None for a
    tail with nothing but blank lines."""
    lines = [_LOG_PREFIX.sub("", line).strip() for line in message.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return None
    pointer: str | None = None
    for line in reversed(lines):
        match = _EXCEPTION.search(line)
        if not match:
            continue
        found = f"{match.group(1)}: {match.group(2)}"
        if not any(p in line.lower() for p in _POINTERS):
            return _clip(found)
        pointer = pointer or found
    for line in reversed(lines):
        if _ARGPARSE.match(line):
            return _clip(line)
    # Only a pointer to a cause the tail no longer holds: still the error, not a warning after it.
    return _clip(pointer or lines[-1])


def _clip(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..."
