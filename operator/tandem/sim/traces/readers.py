"""Trace files -> `Request` lists, sorted by arrival, times in seconds from the first request.

Formats: the Azure LLM inference trace 2023 (code and conversation CSV), Mooncake's JSONL (`.gz` or not,
`hash_ids` kept), and a plain format of our own (CSV with a header, or JSONL): `timestamp` (seconds),
`input_tokens`, `output_tokens`, optional `tenant`. A gzip file is recognised by its magic bytes.

Every malformed line is an error (`TraceError`) naming the file and line and saying what is wrong; an
empty trace is an error too. Token counts must be whole numbers >= 1.
"""

from __future__ import annotations

import csv
import datetime
import gzip
import io
import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tandem.sim.requests import Request


class TraceError(ValueError):
    """A trace file cannot be read; the message names the file and the line."""


def numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a trace file, gzip or not; unreadable files raise TraceError."""
    try:
        with path.open("rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
        with (
            gzip.open(path, "rb") if gzipped else path.open("rb") as binary,
            io.TextIOWrapper(binary, encoding="utf-8", newline="") as text,
        ):
            yield from enumerate(text, start=1)
    except (OSError, EOFError, zlib.error) as exc:  # missing file, broken or truncated gzip stream
        raise TraceError(f"{path}: cannot read: {exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text: {exc}") from None


def _tokens(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool):
        raise TraceError(f"{where}: {what} must be a whole number >= 1, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            raise TraceError(f"{where}: {what} must be a whole number >= 1, got {value!r}") from None
    else:
        raise TraceError(f"{where}: {what} must be a whole number >= 1, got {value!r}")
    if number < 1:
        raise TraceError(f"{where}: {what} must be a whole number >= 1, got {value!r}")
    return number


def _seconds(value: Any, where: str, what: str = "timestamp") -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {what} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number) or number < 0:
        raise TraceError(f"{where}: {what} must be a finite number >= 0, got {value!r}")
    return number


def _finish(path: Path, requests: list[Request]) -> list[Request]:
    if not requests:
        raise TraceError(f"{path}: the trace has no requests")
    if any(requests[i].arrival > requests[i + 1].arrival for i in range(len(requests) - 1)):
        requests.sort(key=lambda r: r.arrival)
    start = requests[0].arrival
    if start:
        requests = [r._replace(arrival=r.arrival - start) for r in requests]
    return requests


# --- Azure LLM inference trace 2023 -------------------------------------------------------------------
_AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def _azure_time(text: str, where: str) -> tuple[int, float]:
    """`YYYY-MM-DD HH:MM:SS.fffffff` (100 ns digits; no zone) -> (day ordinal, seconds into the day).

    Kept apart so that seconds since the first day keep their 100 ns digits in a float."""
    try:
        day, clock = text.strip().split(" ")
        hours, minutes, seconds = clock.split(":")
        ordinal = datetime.date.fromisoformat(day).toordinal()
        into_day = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    except ValueError:
        raise TraceError(
            f"{where}: TIMESTAMP must look like 2023-11-16 18:17:03.9799600, got {text!r}"
        ) from None
    return ordinal, into_day


def read_azure(path: str | Path) -> list[Request]:
    """The Azure LLM inference trace 2023 (`AzureLLMInferenceTrace_code.csv` / `_conv.csv`)."""
    path = Path(path)
    requests: list[Request] = []
    first_day: int | None = None
    lines = numbered_lines(path)
    for number, line in lines:
        header = next(csv.reader([line]), [])
        if [h.strip() for h in header] != _AZURE_HEADER:
            raise TraceError(
                f"{path}:{number}: expected the header {','.join(_AZURE_HEADER)}, got {line.strip()!r}"
            )
        break
    for number, line in lines:
        if not line.strip():
            continue
        where = f"{path}:{number}"
        fields = line.rstrip("\r\n").split(",")
        if len(fields) != 3:
            raise TraceError(f"{where}: expected 3 comma-separated fields, got {len(fields)}")
        ordinal, into_day = _azure_time(fields[0], where)
        if first_day is None:
            first_day = ordinal
        requests.append(
            Request(
                (ordinal - first_day) * 86400 + into_day,
                _tokens(fields[1], "ContextTokens", where),
                _tokens(fields[2], "GeneratedTokens", where),
            )
        )
    return _finish(path, requests)


# --- Mooncake (FAST'25) JSONL -------------------------------------------------------------------------
def _json_object(line: str, where: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON: {exc.msg}") from None
    if not isinstance(record, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


def _field(record: dict[str, Any], name: str, where: str) -> Any:
    if name not in record:
        raise TraceError(f"{where}: missing field {name!r}")
    return record[name]


def read_mooncake(path: str | Path) -> list[Request]:
    """Mooncake's traces: `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (512-token blocks)."""
    path = Path(path)
    requests: list[Request] = []
    for number, line in numbered_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        record = _json_object(line, where)
        hashes = _field(record, "hash_ids", where)
        if not isinstance(hashes, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in hashes
        ):
            raise TraceError(f"{where}: hash_ids must be a list of integers")
        requests.append(
            Request(
                _seconds(_field(record, "timestamp", where), where) / 1000,
                _tokens(_field(record, "input_length", where), "input_length", where),
                _tokens(_field(record, "output_length", where), "output_length", where),
                None,
                tuple(hashes),
            )
        )
    return _finish(path, requests)


# --- the plain format ---------------------------------------------------------------------------------
PLAIN_FIELDS = ("timestamp", "input_tokens", "output_tokens")


def _plain_request(record: dict[str, Any], where: str) -> Request:
    tenant = record.get("tenant")
    if tenant is not None and not isinstance(tenant, str | int):
        raise TraceError(f"{where}: tenant must be a string, got {tenant!r}")
    return Request(
        _seconds(_field(record, "timestamp", where), where),
        _tokens(_field(record, "input_tokens", where), "input_tokens", where),
        _tokens(_field(record, "output_tokens", where), "output_tokens", where),
        str(tenant) if tenant not in (None, "") else None,
    )


def read_plain(path: str | Path) -> list[Request]:
    """Our plain format: JSONL when the first non-blank line starts with `{`, else CSV with a header
    naming at least `timestamp,input_tokens,output_tokens` (seconds, tokens, tokens; `tenant` optional)."""
    path = Path(path)
    requests: list[Request] = []
    lines = numbered_lines(path)
    header: list[str] | None = None
    for number, line in lines:
        if not line.strip():
            continue
        where = f"{path}:{number}"
        if header is None and line.lstrip().startswith("{"):
            header = []  # JSONL
        if header is None:
            header = [h.strip() for h in next(csv.reader([line]))]
            missing = [f for f in PLAIN_FIELDS if f not in header]
            if missing:
                raise TraceError(
                    f"{where}: the CSV header must name {', '.join(PLAIN_FIELDS)} (and optionally tenant); "
                    f"missing {', '.join(missing)}"
                )
            continue
        if not header:
            requests.append(_plain_request(_json_object(line, where), where))
            continue
        fields = next(csv.reader([line]))
        if len(fields) != len(header):
            raise TraceError(f"{where}: expected {len(header)} fields as the header says, got {len(fields)}")
        requests.append(_plain_request(dict(zip(header, fields, strict=True)), where))
    return _finish(path, requests)
