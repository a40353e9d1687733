"""Append-only Parquet tables made of whole part files.

A part is written to ``.<name>.tmp`` and renamed into place, so a reader never sees
a half-written file and a crash loses only the rows still in memory. Flushing is
by row count or by age, whichever comes first; the owner calls :meth:`PartWriter.close`
(also safe from a signal handler's cleanup path) to flush the rest.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from loadlab.runstore.compaction import live_parts


class PartWriter:
    """Buffer rows (dicts) and write them as Parquet parts of one table directory.

    ``writer_id`` goes into part names so several processes can share a table
    (Locust workers, collectors); it must be unique per process.
    Thread-safe: Locust greenlets and collector threads may add concurrently.
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
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self._rows: list[Mapping[str, Any]] = []
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        self._part = 0
        self.rows_written = 0

    def add(self, row: Mapping[str, Any]) -> None:
        """Queue one row; flushes when the buffer is big or old enough."""
        with self._lock:
            self._rows.append(row)
            due = (
                len(self._rows) >= self.flush_rows
                or time.monotonic() - self._last_flush >= self.flush_interval_s
            )
        if due:
            self.flush()

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.add(row)

    def flush(self) -> None:
        """Write buffered rows as one part file (no-op when empty)."""
        with self._lock:
            rows, self._rows = self._rows, []
            self._last_flush = time.monotonic()
            if not rows:
                return
            self._part += 1
            part = self._part
        self._write_part(pa.Table.from_pylist(list(rows), schema=self.schema), part)

    def write_table(self, table: pa.Table, *, dictionary_columns: list[str] | None = None) -> None:
        """Write a table its owner built column-wise as one part, now (rows from add() stay buffered).

        For writers whose rows are cheaper to build as columns (from_pylist costs ~4 us a
        row, far more for list columns). The table must have this writer's schema.
        ``dictionary_columns``: the only columns to dictionary-encode (default: all, as
        add() does); Parquet's dictionary attempt on millions of distinct floats costs
        3x the rest of the write and is then dropped anyway.
        """
        if not table.schema.equals(self.schema):
            raise ValueError(f"table schema differs from {self.table_dir.name}'s schema")
        if table.num_rows == 0:
            return
        with self._lock:
            self._part += 1
            part = self._part
        self._write_part(table, part, True if dictionary_columns is None else dictionary_columns)

    def _write_part(self, table: pa.Table, part: int, use_dictionary: bool | list[str] = True) -> None:
        name = f"part-{self.writer_id}-{part:06d}.parquet"
        tmp = self.table_dir / f".{name}.tmp"
        pq.write_table(table, tmp, use_dictionary=use_dictionary)
        os.replace(tmp, self.table_dir / name)
        with self._lock:
            self.rows_written += table.num_rows

    def close(self) -> None:
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
    comparisons and groupbys on codes; categories sorted, unused ones dropped). A part written before a column was added
    reads as nulls in it.
    """
    parts = live_parts(table_dir)
    read_schema = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type))
                             if f.name in categorical else f for f in schema])
    names = list(columns) if columns is not None else schema.names
    if not parts:
        return read_schema.empty_table().select(names).to_pandas()
    fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=list(categorical)))
    dataset = ds.dataset([str(p) for p in parts], schema=read_schema, format=fmt)
    frame = dataset.to_table(columns=names, filter=where).to_pandas(self_destruct=True)
    for name in set(categorical) & set(names):
        frame[name] = _sorted_categories(frame[name].array)
    return frame


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
