"""Read request traces (Azure CSV, Mooncake JSONL, or any CSV/JSONL with named columns).

Formats
- ``azure``: CSV with header ``TIMESTAMP,ContextTokens,GeneratedTokens``; timestamps
  like ``2023-11-16 18:15:46.6805900`` (any number of fractional digits).
- ``mooncake``: JSON Lines ``{"timestamp": ms, "input_length", "output_length",
  "hash_ids": [...]}``; each hash id names one 512-token prefix block.
- ``csv`` / ``jsonl``: the user names the input, output and (optional) time columns.
  Times may be numbers (seconds, or ``time_unit`` ms) or ISO-8601 date-times.

Every bad row raises InputError naming the file, the line and the column, so a user
can fix line 17 instead of guessing. Rows are kept in file order; timestamps are
shifted to start at 0 and need not be sorted (replay sorts them).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np

from loadlab.errors import InputError

TraceFormat = Literal["azure", "mooncake", "csv", "jsonl"]
FORMATS: tuple[str, ...] = ("azure", "mooncake", "csv", "jsonl")
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceData:
    """Per-request lengths (and, where recorded, times and prefix-block ids) of a trace."""

    path: str
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    timestamps_s: np.ndarray | None = None
    hash_ids: list[list[int]] | None = None
    block_tokens: int | None = None

    def __len__(self) -> int:
        return int(self.input_tokens.size)


@dataclass(frozen=True)
class Columns:
    input: str
    output: str
    time: str | None = None
    time_unit: Literal["s", "ms"] = "s"
    hash_ids: str | None = None


AZURE = Columns("ContextTokens", "GeneratedTokens", "TIMESTAMP")
MOONCAKE = Columns("input_length", "output_length", "timestamp", "ms", "hash_ids")


def guess_format(path: Path) -> TraceFormat:
    """Format from the file's first line (Azure header, Mooncake keys), else its suffix."""
    try:
        with path.open(encoding="utf-8") as fh:
            first = fh.readline()
    except (OSError, UnicodeDecodeError):
        first = ""
    if all(col in first for col in (AZURE.input, AZURE.output)):
        return "azure"
    if all(f'"{key}"' in first for key in (MOONCAKE.input, MOONCAKE.output)):
        return "mooncake"
    return "jsonl" if path.name.lower().endswith((".jsonl", ".json")) else "csv"


def read_trace(
    path: str | Path, fmt: TraceFormat | None = None, columns: Columns | None = None
) -> TraceData:
    """Parse a trace file into lengths, times and block ids."""
    p = Path(path)
    fmt = fmt or guess_format(p)
    if fmt not in FORMATS:
        raise InputError(
            f"unknown trace format '{fmt}'",
            field="--format",
            fix=f"use one of: {', '.join(FORMATS)}",
        )
    if columns is None:
        if fmt in ("csv", "jsonl"):
            raise InputError(
                "this format needs the column names",
                source=p,
                field="--input-col/--output-col",
                fix="pass --input-col and --output-col (and --time-col if it has times)",
            )
        columns = AZURE if fmt == "azure" else MOONCAKE
    if not p.is_file():
        raise InputError("trace file not found", source=p, fix="check the path")
    rows = _csv_rows(p, columns) if fmt in ("azure", "csv") else _jsonl_rows(p, columns)
    inputs: list[int] = []
    outputs: list[int] = []
    times: list[float] = []
    blocks: list[list[int]] = []
    try:
        for line, row in rows:
            inputs.append(_length(row.get(columns.input), p, line, columns.input))
            outputs.append(_length(row.get(columns.output), p, line, columns.output))
            if columns.time:
                times.append(_time(row.get(columns.time), p, line, columns.time, columns.time_unit))
            if columns.hash_ids and columns.hash_ids in row:
                blocks.append(_ids(row[columns.hash_ids], p, line, columns.hash_ids))
    except (UnicodeDecodeError, csv.Error) as exc:  # a binary file, or bytes a CSV cannot hold
        raise InputError(f"not a text trace ({exc})", source=p,
                         fix="give a CSV or JSON Lines file (UTF-8 text)") from None
    if not inputs:
        raise InputError(
            "the trace has no request rows",
            source=p,
            fix="give a file with a header and at least one row",
        )
    ts = np.asarray(times, dtype=float) - min(times) if times else None
    has_blocks = bool(blocks) and len(blocks) == len(inputs)
    return TraceData(
        str(p),
        np.asarray(inputs, dtype=np.int64),
        np.asarray(outputs, dtype=np.int64),
        ts,
        blocks if has_blocks else None,
        MOONCAKE_BLOCK_TOKENS if has_blocks else None,
    )


def _csv_rows(path: Path, columns: Columns) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        found = [c.strip() for c in (reader.fieldnames or [])]
        _check_columns(path, columns, found)
        reader.fieldnames = found
        for row in reader:
            yield reader.line_num, row


def _jsonl_rows(path: Path, columns: Columns) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        checked = False
        for line_no, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"not valid JSON: {exc.msg}",
                    source=path,
                    field=f"line {line_no}",
                    fix="each line must be one JSON object",
                ) from None
            if not isinstance(row, dict):
                raise InputError(
                    "a line must be a JSON object",
                    source=path,
                    field=f"line {line_no}",
                    fix="write one object per line, "
                    'e.g. {"input_length": 812, "output_length": 97}',
                )
            if not checked:
                _check_columns(path, columns, list(row))
                checked = True
            yield line_no, row


def _check_columns(path: Path, columns: Columns, found: list[str]) -> None:
    wanted = [c for c in (columns.input, columns.output, columns.time) if c]
    missing = [c for c in wanted if c not in found]
    if missing:
        raise InputError(
            f"column(s) {', '.join(missing)} not found; "
            f"columns found: {', '.join(found) or '(none)'}",
            source=path,
            field=missing[0],
            fix="name the right columns with --input-col/--output-col/--time-col, or pick --format",
        )


def _length(value: Any, path: Path, line: int, col: str) -> int:
    try:
        number = float(value)
        ok = number.is_integer() and number >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise InputError(
            f"length {value!r} is not a positive integer",
            source=path,
            field=f"line {line}, column {col}",
            fix="token lengths must be whole numbers >= 1; fix or drop that row",
        )
    return int(number)


def _time(value: Any, path: Path, line: int, col: str, unit: str) -> float:
    try:
        t = float(value)
        return t / 1000.0 if unit == "ms" else t
    except (TypeError, ValueError):
        pass
    if isinstance(value, str):
        base, _, rest = value.strip().partition(".")
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        try:
            dt = datetime.fromisoformat((base + rest[len(digits) :]).replace("Z", "+00:00"))
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            return dt.timestamp() + (int(digits) / 10 ** len(digits) if digits else 0.0)
        except ValueError:
            pass
    raise InputError(
        f"time {value!r} is neither a number nor an ISO-8601 date-time",
        source=path,
        field=f"line {line}, column {col}",
        fix="use seconds (or --time-unit ms) or e.g. 2023-11-16 18:15:46.68",
    )


def _ids(value: Any, path: Path, line: int, col: str) -> list[int]:
    if isinstance(value, list) and all(isinstance(x, int) for x in value):
        return value
    raise InputError(
        "hash_ids must be a list of integers",
        source=path,
        field=f"line {line}, column {col}",
        fix="give the prefix-block ids as a JSON list, e.g. [0, 17, 18]",
    )
