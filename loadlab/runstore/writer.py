"""Append-only Parquet tables made of whole part files.

A part is written to ``.<name>.tmp`` and renamed into place, so a reader never sees
a half-written file. Its name, ``part-<writer>-<pid>x<nonce>-<n>.parquet``, is this
writer's alone: the pid and a random nonce mean two writers (two processes, or two
writers in one process) given the same ``writer_id`` can never replace each other's
parts, and ``n`` keeps one writer's parts in the order it wrote them. Rows stay in
memory until the part holding them is on disk, so a failed write loses nothing and
``rows_written`` counts only rows a reader can see.

When rows are written:

- on the adding thread, once ``flush_rows`` rows are buffered;
- every ``flush_interval_s`` seconds on a background timer thread, started with the
  first buffered row (rows that stop arriving still reach disk; ``math.inf`` turns
  the timer off). Under Locust's gevent patching the thread is a greenlet; a write
  does not yield, so it runs whole between two other greenlets' steps;
- on :meth:`PartWriter.close`, which stops the timer first.

One flush runs at a time (parts keep the order rows arrived in; a row never goes
into two parts). A write that fails (disk full, read-only folder) leaves its rows
buffered ahead of newer ones; the timer and the next flush retry them, the adding
thread only after another ``flush_rows`` rows (a full disk costs one attempt per
batch, not per row). :meth:`flush` and :meth:`close` raise
:class:`~loadlab.errors.StoreError`; a failure on the timer or the adding thread is
logged once per distinct error and kept in ``error``. A row that does not fit the
schema can never be written: it goes to ``_rejected-<writer>.jsonl`` beside the parts
(a name Parquet readers skip) and stays in ``rejected``; the rest of its batch is
written and the flush raises StoreError naming the column.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from loadlab.errors import InputError, StoreError
from loadlab.runstore.compaction import live_parts
from loadlab.runstore.encoding import column_options
from loadlab.runstore.layout import STEP_ENDS_TABLE
from loadlab.runstore.schema import STEP_ENDS
from loadlab.runstore.token_steps import pointer_columns, with_offsets

log = logging.getLogger(__name__)

# What building or writing a part can raise for a reason outside this module's code:
# a value Arrow cannot convert to the column's type, or the file system refusing.
ROW_ERRORS = (
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    OverflowError,
    TypeError,
)
WRITE_ERRORS = (OSError, pa.ArrowException)
UNREADABLE = (OSError, pa.ArrowException)  # what reading a damaged part file raises


class PartWriter:
    """Buffer rows (dicts) and write them as Parquet parts of one table directory.

    ``writer_id`` goes into part names to tell the writers of a table apart (Locust
    workers, collectors); uniqueness comes from the pid and nonce beside it.
    Thread-safe: Locust greenlets and collector threads may add concurrently.
    Subclasses with their own buffer (whole scrapes, columns) override
    :meth:`_snapshot`, :meth:`_forget`, :meth:`_pending_rows` and :meth:`_to_table` and
    call :meth:`_buffered` after queueing; the flush protocol (module docstring) stays here.
    """

    def __init__(
        self,
        table_dir: str | Path,
        schema: pa.Schema,
        *,
        writer_id: str | None = None,
        flush_rows: int = 2000,
        flush_interval_s: float = 2.0,
    ) -> None:
        self.table_dir = Path(table_dir)
        self.table_dir.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.writer_id = writer_id or uuid.uuid4().hex[:8]
        self._stamp = f"{self.writer_id}-{os.getpid()}x{uuid.uuid4().hex[:8]}"
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self._rows: list[Mapping[str, Any]] = []
        self._lock = threading.Lock()          # the buffer and the counters
        self._flush_lock = threading.Lock()    # one flush at a time
        self._due_rows = flush_rows            # buffered rows that make the adding thread flush
        self._part = 0
        self._closing = threading.Event()
        self._timer: threading.Thread | None = None
        self._timed = flush_interval_s < threading.TIMEOUT_MAX  # math.inf: no timer
        self._logged = ""
        self.rows_written = 0
        self.rejected: list[Mapping[str, Any]] = []
        self.error: str | None = None          # the last failed write, None once one succeeds

    # -- adding ----------------------------------------------------------------------
    def add(self, row: Mapping[str, Any]) -> None:
        """Queue one row; flushes when ``flush_rows`` are buffered. Never raises for a
        failed write."""
        with self._lock:
            self._rows.append(row)
            pending = len(self._rows)
        self._buffered(pending)

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.add(row)

    @property
    def rows_pending(self) -> int:
        """Rows buffered and not yet on disk (also those a failed write kept)."""
        with self._lock:
            return self._pending_rows()

    def pending(self) -> list[dict[str, Any]]:
        """A copy of the rows not yet on disk, for a caller that saves them elsewhere."""
        with self._lock:
            return [dict(row) for row in self._rows]

    @property
    def rows_rejected(self) -> int:
        with self._lock:
            return len(self.rejected)

    def _buffered(self, pending: int) -> None:
        """After queueing: start the timer; flush here when ``pending`` rows reach the mark."""
        if self._timer is None and self._timed:
            self._start_timer()
        if pending < self._due_rows or not self._flush_lock.acquire(blocking=False):
            return  # not due, or a flush is running (the next add or tick takes the rest)
        try:
            self._flush_locked()
        except StoreError as exc:
            self._log(str(exc))
        finally:
            self._flush_lock.release()

    def _start_timer(self) -> None:
        with self._lock:
            if self._timer is not None or self._closing.is_set():
                return
            self._timer = threading.Thread(
                target=self._tick, name=f"flush {self.table_dir.name}", daemon=True
            )
        self._timer.start()

    def _tick(self) -> None:
        while not self._closing.wait(self.flush_interval_s):
            try:
                self.flush()
            except StoreError as exc:
                self._log(str(exc))

    def _log(self, message: str) -> None:
        # once per distinct cause: the message's row count grows at every retry
        cause = self.error or message
        if cause != self._logged:
            self._logged = cause
            log.warning("%s", message)

    # -- writing ---------------------------------------------------------------------
    def flush(self) -> None:
        """Write buffered rows as one part (no-op when empty); StoreError when they could not be."""
        with self._flush_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        with self._lock:
            items, batch = self._snapshot()
        if not items:
            return
        try:
            table, rejected = self._to_table(batch)
            if table.num_rows:
                self._write_part(table)
        except WRITE_ERRORS as exc:
            kept = self.rows_pending
            with self._lock:
                self.error = f"cannot write {self.table_dir}: {exc}"
                self._due_rows = kept + self.flush_rows
            raise StoreError(
                f"{self.error}; {kept} rows kept in memory and retried at the next flush "
                "(free space or fix the folder's permissions)"
            ) from exc
        with self._lock:
            self._forget(items)
            self._due_rows = self.flush_rows
            self.error = None
            self._logged = ""
        if rejected:
            self._reject(rejected, table.num_rows)

    def _snapshot(self) -> tuple[int, Any]:
        """Under the buffer lock: (items buffered, a copy of them) for one part."""
        return len(self._rows), self._rows[:]

    def _forget(self, items: int) -> None:
        """Under the buffer lock: drop the first ``items``, now on disk."""
        del self._rows[:items]

    def _pending_rows(self) -> int:
        """Under the buffer lock: rows not yet on disk."""
        return len(self._rows)

    def _to_table(
        self, rows: list[Mapping[str, Any]]
    ) -> tuple[pa.Table, list[tuple[Mapping[str, Any], str]]]:
        """The part's table and the rows that cannot fit the schema, each with the reason."""
        try:
            return pa.Table.from_pylist(rows, schema=self.schema), []
        except ROW_ERRORS:
            pass
        good: list[Mapping[str, Any]] = []
        bad: list[tuple[Mapping[str, Any], str]] = []
        for row in rows:
            reason = self._misfit(row)
            if reason is None:
                good.append(row)
            else:
                bad.append((row, reason))
        return pa.Table.from_pylist(good, schema=self.schema), bad

    def _misfit(self, row: Mapping[str, Any]) -> str | None:
        """Why ``row`` cannot be written (the first column that refuses its value), else None."""
        for field in self.schema:
            try:
                pa.array([row.get(field.name)], type=field.type)
            except ROW_ERRORS as exc:
                return f"column {field.name!r} ({field.type}): {exc}"
        return None

    def _reject(self, rejected: list[tuple[Mapping[str, Any], str]], written: int) -> None:
        """Keep rows that can never fit, on disk as JSON lines if possible, and raise."""
        path = self.table_dir / f"_rejected-{self.writer_id}.jsonl"
        with self._lock:
            self.rejected.extend(row for row, _ in rejected)
        try:
            with path.open("a") as f:
                for row, _ in rejected:
                    f.write(json.dumps(dict(row), default=repr) + "\n")
            where = f"saved in {path}"
        except OSError as exc:
            where = f"kept in memory only ({exc})"
        raise StoreError(
            f"{len(rejected)} rows do not fit {self.table_dir.name}'s schema, first: "
            f"{rejected[0][1]}; {where}; the other {written} rows of the part were written"
        )

    def write_table(self, table: pa.Table, *, dictionary_columns: list[str] | None = None) -> None:
        """Write a table its owner built column-wise as one part, now (rows from add() stay
        buffered).

        For writers whose rows are cheaper to build as columns (from_pylist costs ~4 us a
        row, far more for list columns). The table must have this writer's schema.
        ``dictionary_columns``: the only columns to dictionary-encode (default: all, as
        add() does); Parquet's dictionary attempt on millions of distinct floats costs
        3x the rest of the write and is then dropped anyway. Raises StoreError when the
        part could not be written (the caller still holds the table).
        """
        if not table.schema.equals(self.schema):
            raise ValueError(f"table schema differs from {self.table_dir.name}'s schema")
        if table.num_rows == 0:
            return
        try:
            self._write_part(table, True if dictionary_columns is None else dictionary_columns)
        except WRITE_ERRORS as exc:
            raise StoreError(f"cannot write {self.table_dir}: {exc}") from exc

    def part_name(self, number: int) -> str:
        """The file name of this writer's ``number``-th part (from 1)."""
        return f"part-{self._stamp}-{number:06d}.parquet"

    def _write_part(self, table: pa.Table, use_dictionary: bool | list[str] = True) -> None:
        with self._lock:
            self._part += 1
            name = self.part_name(self._part)
        tmp = self.table_dir / f".{name}.tmp"
        try:
            pq.write_table(table, tmp, use_dictionary=use_dictionary,
                           **column_options(table.schema))
            os.replace(tmp, self.table_dir / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:
            self.rows_written += table.num_rows

    # -- closing ---------------------------------------------------------------------
    def close(self) -> None:
        """Stop the timer and write the rest; StoreError (rows kept) when that fails.

        Safe to call again, e.g. to retry after freeing space or for rows added since.
        """
        self._closing.set()
        timer = self._timer
        if timer is not None and timer is not threading.current_thread():
            timer.join()
        self.flush()

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_table(
    table_dir: str | Path,
    schema: pa.Schema,
    *,
    columns: Sequence[str] | None = None,
    where: pc.Expression | None = None,
    categorical: Sequence[str] = (),
    skip: Collection[str] = (),
) -> pd.DataFrame:
    """Read a table directory as one DataFrame; empty (with columns) if absent.

    Hidden temporary files are skipped, so a table can be read while it is written, and
    so are parts a compacted part replaces (:func:`~loadlab.runstore.compaction.live_parts`).
    All parts are read in one pass (a dataset scan: an hour-long run writes thousands
    of parts, and opening them one by one cost more than the rows), in part-name order.
    ``columns``: only these (a long run's ``chunk_offsets_s`` alone is 2e8 floats);
    ``where``: only rows matching a pyarrow expression, e.g.
    ``pc.field("family").isin([...])``; ``categorical``: string columns returned as
    pandas Categoricals, read straight from Parquet's dictionary pages (a long-format
    METRICS table repeats a few hundred strings millions of times: 10x less memory, and
    comparisons and groupbys on codes; categories sorted, unused ones dropped). A part
    written before a column was added reads as nulls in it. A part that cannot be read
    (truncated, empty, not Parquet) is an :class:`~loadlab.errors.InputError` (exit 2)
    naming it, found part by part only when the one-pass scan fails: a verdict computed
    without its rows would pass for the run's, so the reader stops and says which file to
    move out of the table (its rows are then knowingly lost) or restore. ``skip``: names of
    parts to leave out (a reader that found them foreign to the run). A replay's
    ``chunk_offsets_s`` stored as pointers into its step-end timelines come back as the
    list they stand for (:mod:`~loadlab.runstore.token_steps`), read from the
    step_ends.parquet beside ``table_dir``.
    """
    read_schema = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type))
                             if f.name in categorical else f for f in schema])
    names = list(columns) if columns is not None else schema.names
    pointers = pointer_columns(schema, names)
    table = _scan(table_dir, read_schema, names + (pointers or []), where, categorical, skip)
    if table is None:
        return read_schema.empty_table().select(names).to_pandas()
    if pointers is not None:
        if table.column("token_timeline").null_count < table.num_rows:
            table = _offsets_rebuilt(table, Path(table_dir).parent / STEP_ENDS_TABLE)
        table = table.select(names)
    frame = table.to_pandas(self_destruct=True)
    for name in set(categorical) & set(names):
        frame[name] = _sorted_categories(frame[name].array)
    return frame


def _offsets_rebuilt(table: pa.Table, ends_dir: Path) -> pa.Table:
    """``table`` with its rows' token offsets read off the step ends in ``ends_dir``."""
    ends = _scan(ends_dir, STEP_ENDS, STEP_ENDS.names, None, (), ())
    try:
        return with_offsets(table, ends if ends is not None else STEP_ENDS.empty_table())
    except ValueError as exc:
        raise InputError(str(exc), source=ends_dir,
                         fix="restore the run's step_ends.parquet beside its requests") from None


def _scan(table_dir: str | Path, read_schema: pa.Schema, names: list[str],
          where: pc.Expression | None, categorical: Sequence[str],
          skip: Collection[str]) -> pa.Table | None:
    """The live parts of a table as one Arrow table (None when there are none)."""
    parts = [p for p in live_parts(table_dir) if p.name not in skip]
    if not parts:
        return None
    fmt = ds.ParquetFileFormat(
        read_options=ds.ParquetReadOptions(dictionary_columns=list(categorical))
    )

    def scan(paths: list[Path]) -> pa.Table:
        return ds.dataset([str(p) for p in paths], schema=read_schema, format=fmt).to_table(
            columns=names, filter=where)

    try:
        return scan(parts)
    except UNREADABLE as exc:
        raise _damaged(table_dir, parts, scan, exc) from None


def _damaged(table_dir: str | Path, parts: list[Path], scan: Callable[[list[Path]], Any],
             error: Exception) -> InputError:
    """The InputError naming the first part that cannot be read on its own."""
    for part in parts:
        try:
            scan([part])
        except UNREADABLE as exc:
            return _unreadable(table_dir, part, exc)
    return _unreadable(table_dir, Path(table_dir), error)  # only together: name the table


def _unreadable(table_dir: str | Path, path: Path, error: Exception) -> InputError:
    why = " ".join(str(error).split())  # Arrow's messages span lines; the error is one line
    return InputError(f"unreadable Parquet ({why})", source=path,
                      fix=f"restore it, or move it out of {table_dir} and rerun "
                      "(its rows are then left out)")


def _sorted_categories(values: pd.Categorical) -> pd.Categorical:
    """The same values with only the used categories, in string order.

    So that groupbys and sorts order groups as they do on plain strings. Recoded with
    one numpy take (pandas' ``reorder_categories`` took ~0.3 s per 5M rows).
    """
    codes = values.codes
    used = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(values.categories)))
    names = values.categories[used]
    if len(used) == len(values.categories) and names.is_monotonic_increasing:
        return values
    order = np.argsort(names.to_numpy(dtype=object), kind="stable")
    rank = np.full(len(values.categories), -1, dtype=codes.dtype)
    rank[used[order]] = np.arange(len(order), dtype=codes.dtype)
    return pd.Categorical.from_codes(np.where(codes >= 0, rank[codes], -1), names[order])
