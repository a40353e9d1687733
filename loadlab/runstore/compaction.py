"""Compaction: a table's many small parts rewritten as one, atomically and safe to interrupt.

An hour-long run leaves thousands of parts per table (the Recorder flushes every
5 s, the collector every 5 s per endpoint). Every part, and every row group in it,
costs a reader ~1 ms of setup whatever its size, so reading 1M request rows from 3,600
parts takes ~5 s of CPU, from 720 ~1.6 s and from one compacted part ~0.3 s
(benchmarks/bench_analyze.py). :func:`compact_run` runs once a run's writers are closed:
at the end of ``loadlab run`` (the tables it wrote), ``loadlab collect`` (metrics and
scrapes) and ``sim replay``; readers need not know whether it ran.

Steps of :func:`compact`:

1. Take ``.compact.lock`` in the table directory (``flock``, non-blocking: when another
   process is compacting, return and leave the table as it is).
2. The live parts, in name order (what :func:`live_parts` lists: parts already
   replaced by a compacted part are left out), are streamed part by part into a
   hidden ``.compact-<id>.tmp`` file in row groups of up to ``row_group_bytes``; string
   columns dictionary-encoded, the others plain. Memory: about one row group.
3. The file's Parquet key-value metadata ``loadlab.replaces`` lists the names of the
   parts it holds; it is renamed to ``<first part's stem>~<id>.parquet``, which sorts
   where its first part sorted, so the table's row order is kept.
4. The replaced parts are deleted.

Interrupted after 3 and before 4 (a crash, a kill), both the compacted part and some
of the parts it replaces exist: :func:`live_parts` skips every part named in a
compacted part's ``loadlab.replaces``, so no row is read twice, and the next
compaction deletes them. Interrupted before 3, only a hidden temporary file is left,
which readers never see and the next compaction removes. A part whose footer cannot
be read (truncated, empty, not Parquet) is left where it is, with a warning; one that
fails deeper while being copied stops the compaction with nothing changed.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from loadlab.runstore.encoding import column_options, string_columns
from loadlab.runstore.layout import (
    CLIENT_TABLE,
    METRICS_TABLE,
    REQUESTS_TABLE,
    SCRAPES_TABLE,
    STEP_ENDS_TABLE,
)
from loadlab.runstore.schema import CLIENT, METRICS, REQUESTS, SCRAPES, STEP_ENDS

MARK = "~"                       # in the name of a compacted part, and only there
REPLACES = b"loadlab.replaces"   # Parquet key-value metadata: JSON list of part names
LOCK = ".compact.lock"
NOTICE_PARTS = 500               # compact_run tells progress from this many parts...
NOTICE_BYTES = 256 << 20         # ...or bytes (below both it takes about a second at most)
TABLES = {REQUESTS_TABLE: REQUESTS, METRICS_TABLE: METRICS, SCRAPES_TABLE: SCRAPES,
          CLIENT_TABLE: CLIENT, STEP_ENDS_TABLE: STEP_ENDS}


def live_parts(table_dir: str | Path) -> list[Path]:
    """The part files a reader should read, in name order (replaced parts left out)."""
    path = Path(table_dir)
    parts = sorted(path.glob("part-*.parquet")) if path.is_dir() else []
    replaced: set[str] = set()
    for part in parts:
        if MARK in part.name:
            replaced.update(_replaces(part))
    return [p for p in parts if p.name not in replaced]


def compact(
    table_dir: str | Path, schema: pa.Schema, *, row_group_bytes: int = 64 << 20
) -> Path | None:
    """Rewrite the live parts of a table as one part; returns it, or None if nothing was done.

    Nothing to do: no table, at most one live part and no leftovers, or another process
    holds the lock. ``schema``: the table's schema (parts written before a column was
    added get nulls in it, as :func:`~loadlab.runstore.read_table` reads them).
    """
    path = Path(table_dir)
    if not path.is_dir():
        return None
    with _locked(path) as held:
        if not held:
            return None
        for stale in path.glob(".compact-*.tmp"):
            stale.unlink()
        live = live_parts(path)
        names = {p.name for p in live}                   # a set: thousands of parts
        leftovers = [p for p in path.glob("part-*.parquet") if p.name not in names]
        parts = [p for p in live if _readable(p)]
        if len(parts) <= 1:
            _remove(leftovers)
            return parts[0] if parts else None
        tag = uuid.uuid4().hex[:8]
        tmp = path / f".compact-{tag}.tmp"
        try:
            _rewrite(parts, tmp, schema, row_group_bytes)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        final = path / f"{parts[0].stem}{MARK}{tag}.parquet"
        os.replace(tmp, final)
        _remove(parts + leftovers)
        return final


def compact_run(run_dir: str | Path, tables: Iterable[str] = tuple(TABLES),
                progress: Callable[[str], None] | None = None) -> list[Path]:
    """Compact the tables of a run folder (default all five); each table's part afterwards.

    ``tables``: the table directory names to compact (a writer compacts what it wrote:
    another process may still be adding to the rest). ``progress(line)`` is told before
    and after when there is enough to take noticeable time (NOTICE_PARTS parts or
    NOTICE_BYTES: an hour-long run's ~6,000 parts and 2 GB take ~15 s). A table that
    fails to compact (a full disk, a part that breaks while copied) is left as its parts,
    with a warning: they read as before.
    """
    run_dir = Path(run_dir)
    names = [name for name in tables if name in TABLES]
    parts = [p for name in names for p in live_parts(run_dir / name)]
    size = sum(_size(p) for p in parts)
    loud = progress is not None and (len(parts) >= NOTICE_PARTS or size >= NOTICE_BYTES)
    if loud and progress is not None:
        progress(f"compacting {len(parts):,} part files ({size / 2**20:,.0f} MiB) in {run_dir}...")
    t0 = time.perf_counter()
    done: list[Path] = []
    for name in names:
        try:
            if (part := compact(run_dir / name, TABLES[name])) is not None:
                done.append(part)
        except (OSError, pa.ArrowException) as exc:
            warnings.warn(
                f"{run_dir / name}: not compacted, its parts are kept as they are ({exc})",
                stacklevel=2,
            )
    if loud and progress is not None:
        progress(
            f"compacted {len(parts):,} part files into {len(done)} "
            f"in {time.perf_counter() - t0:.1f} s"
        )
    return done


def _rewrite(parts: list[Path], dest: Path, schema: pa.Schema, row_group_bytes: int) -> None:
    coded = _dictionary_schema(schema)
    meta = {**(schema.metadata or {}), REPLACES: json.dumps([p.name for p in parts]).encode()}
    with pq.ParquetWriter(dest, coded, use_dictionary=string_columns(schema),
                          **column_options(coded)) as writer:
        writer.add_key_value_metadata(meta)   # without Arrow's schema, its metadata is not kept
        for group in _row_groups(parts, coded, row_group_bytes):
            writer.write_table(group, row_group_size=group.num_rows)


def _dictionary_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its string columns as dictionaries of strings.

    Parts are read and rewritten that way: a string column is a few hundred distinct
    values over a million rows (metrics' series, requests' point and status), stored as
    Parquet dictionary pages, and materialising every row's string to hash it again on
    the way out was four fifths of compacting an hour-long replay's metrics
    (benchmarks/README.md, "Eighth pass"). Written without Arrow's schema
    (:func:`~loadlab.runstore.encoding.column_options`), the part reads back as strings.
    """
    strings = set(string_columns(schema))
    return pa.schema([f.with_type(pa.dictionary(pa.int32(), f.type)) if f.name in strings else f
                      for f in schema], metadata=schema.metadata)


def _row_groups(parts: list[Path], schema: pa.Schema, limit: int) -> Iterator[pa.Table]:
    """Batches of the parts in order, gathered into tables of about ``limit`` bytes;
    ``schema``'s dictionary columns read as dictionaries."""
    batches: list[pa.RecordBatch] = []
    size = 0
    coded = [f.name for f in schema if pa.types.is_dictionary(f.type)]
    form = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=coded))
    for part in parts:
        for batch in ds.dataset(str(part), schema=schema, format=form).to_batches(
            use_threads=False
        ):
            batches.append(batch)
            size += batch.nbytes
            if size >= limit:
                yield pa.Table.from_batches(batches, schema)
                batches, size = [], 0
    if batches:
        yield pa.Table.from_batches(batches, schema)


def _readable(part: Path) -> bool:
    """Whether a part's footer reads; one that does not stays as it is, outside the
    compacted part."""
    try:
        pq.read_metadata(part)
    except (pa.ArrowException, OSError) as exc:
        warnings.warn(f"{part}: unreadable part left out of compaction ({exc})", stacklevel=3)
        return False
    return True


def _replaces(part: Path) -> list[str]:
    meta = pq.read_schema(part).metadata or {}
    return json.loads(meta.get(REPLACES, b"[]"))


def _size(part: Path) -> int:
    try:
        return part.stat().st_size
    except OSError:              # compacted away by another process meanwhile
        return 0


def _remove(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


@contextmanager
def _locked(path: Path) -> Iterator[bool]:
    fd = os.open(path / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
