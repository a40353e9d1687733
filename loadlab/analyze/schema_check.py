"""requests.parquet's parts checked before they are read: columns and provenance.

The table reader fills a column a part lacks with nulls (a part written before the
column was added must stay readable). For the columns every writer of requests has
always written (:data:`REQUIRED`) that is damage, not age: a part without ``status``
read as a run where nothing succeeded and nothing failed, at confidence "high". So a
part missing one is an :class:`~loadlab.errors.InputError` (exit 2) naming the part and
the column.

A part from another run (copied in by hand, a folder reused) has no run id to betray
it, but its footer does: Parquet keeps each column's min and max per row group. A part
whose requests were all sent outside this run's steps (more than :data:`SLACK_S` away),
or whose ``point`` is another sweep point's, is left out with a warning naming it.
Only footers are read (one small read per part), never the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from loadlab.errors import InputError
from loadlab.runstore.compaction import live_parts
from loadlab.runstore.layout import REQUESTS_TABLE
from loadlab.runstore.writer import UNREADABLE

REQUIRED = ("step", "status", "t_sent", "t_done", "ttft_s", "e2e_s")
# A request may be sent this long before its step's window opens (the clock of another
# worker host) or after it closes (the drain): beyond it, the row is not this run's.
SLACK_S = 600.0


@dataclass
class PartCheck:
    """The parts to leave out, and the warnings saying why."""

    skip: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_requests(run_dir: Path, manifest: dict[str, Any]) -> PartCheck:
    """Check every live part of ``run_dir``'s requests table (module docstring)."""
    out = PartCheck()
    span = _run_span(manifest)
    point = manifest.get("point")
    for part in live_parts(run_dir / REQUESTS_TABLE):
        try:
            meta = pq.read_metadata(part)
        except UNREADABLE:
            continue   # the reader names a damaged part itself
        names = set(meta.schema.to_arrow_schema().names)
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise InputError(
                f"part {part.name} has no column {', '.join(map(repr, missing))}",
                source=part, field=missing[0],
                fix=f"restore the part from the run, or move it out of {REQUESTS_TABLE} and "
                    "rerun (its rows are then left out)")
        why = _foreign(meta, span, point)
        if why:
            out.skip.append(part.name)
            out.warnings.append(f"{REQUESTS_TABLE}/{part.name}: its {meta.num_rows} rows {why}: "
                                "from another run, left out (move the part out of the folder)")
    return out


def _run_span(manifest: dict[str, Any]) -> tuple[float, float] | None:
    try:
        starts = [float(s["t_start"]) for s in manifest.get("steps") or []]
        ends = [float(s.get("t_end") or s["t_start"]) for s in manifest.get("steps") or []]
    except (KeyError, TypeError, ValueError):
        return None
    return (min(starts) - SLACK_S, max(ends) + SLACK_S) if starts else None


def _foreign(meta: pq.FileMetaData, span: tuple[float, float] | None,
             point: str | None) -> str | None:
    """Why the part's rows are not this run's, from its column statistics; None if they may be."""
    sent = _range(meta, "t_sent")
    if span is not None and sent is not None and (sent[1] < span[0] or sent[0] > span[1]):
        return (f"were sent at {sent[0]:.0f}-{sent[1]:.0f} (unix s), outside this run's steps "
                f"({span[0] + SLACK_S:.0f}-{span[1] - SLACK_S:.0f})")
    points = _range(meta, "point")
    if point is not None and points is not None and points[0] == points[1] != point:
        return f"belong to point {points[0]!r}, this folder to {point!r}"
    return None


def _range(meta: pq.FileMetaData, name: str) -> tuple[Any, Any] | None:
    """(min, max) of a flat column over the part's row groups; None when not recorded."""
    index = next((i for i in range(meta.num_columns)
                  if meta.schema.column(i).path == name), None)
    if index is None or meta.num_row_groups == 0:
        return None
    lows, highs = [], []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None or not stats.has_min_max:
            if stats is not None and stats.null_count == meta.row_group(g).num_rows:
                continue   # all null: says nothing
            return None
        lows.append(stats.min)
        highs.append(stats.max)
    return (min(lows), max(highs)) if lows else None
