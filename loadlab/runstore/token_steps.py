"""``chunk_offsets_s`` of a replay's rows rebuilt from its step-end timelines.

A replay's request nearly always emits at every step end from its first token to its
last, so its token times are a slice of its replica's step-end timeline. The replay
stores that slice as pointers (schema.REQUESTS ``token_timeline``, ``token_step``,
``n_chunks``, ``t_sent_clock_s``) beside the timelines (schema.STEP_ENDS) instead of one
float per token: writing those 2.5M floats (20 MB) was the largest part of a 10-minute
replay's own work (benchmarks/README.md, "Sixth pass"). A reader gets the list column
back from :func:`with_offsets`, by the same float subtraction the replay made before
(step end minus send time, both on the replay's clock), so every offset is bit for bit
what the list column held. Rows that hold explicit offsets (the load generator's; a
replay's preempted requests) are left as they are.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

OFFSETS = "chunk_offsets_s"
POINTERS = ("token_timeline", "token_step", "n_chunks", "t_sent_clock_s")


def pointer_columns(schema: pa.Schema, names: list[str]) -> list[str] | None:
    """The columns a reader of ``names`` must read too to rebuild the offsets; None when
    ``names`` has no offsets to rebuild (or the table has no pointers)."""
    if OFFSETS not in names or not set(POINTERS) <= set(schema.names):
        return None
    return [c for c in POINTERS if c not in names]


def _ints(column: pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(column, 0).to_numpy().astype(np.int64)


def with_offsets(table: pa.Table, ends: pa.Table) -> pa.Table:
    """``table`` (with the POINTERS columns) whose rows that point into ``ends`` (a
    STEP_ENDS table) hold their token offsets in ``chunk_offsets_s``."""
    pointed = table.column("token_timeline").is_valid().to_numpy(zero_copy_only=False)
    if not pointed.any():
        return table
    lists = table.column(OFFSETS).combine_chunks()
    own = pc.fill_null(pc.list_value_length(lists), 0).to_numpy().astype(np.int64)
    rows = np.flatnonzero(pointed)
    count = _ints(table.column("n_chunks"))[rows]
    lens = own.copy()
    lens[rows] = count
    bounds = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=bounds[1:])
    from_steps = np.repeat(pointed, lens)
    flat = np.empty(bounds[-1])
    flat[~from_steps] = pc.list_flatten(lists).to_numpy()
    t, start = _locate(ends, _ints(table.column("token_timeline"))[rows],
                       _ints(table.column("token_step"))[rows], count)
    within = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    clock = table.column("t_sent_clock_s").to_numpy()[rows]
    flat[from_steps] = t[np.repeat(start, count) + within] - np.repeat(clock, count)
    offsets = pa.ListArray.from_arrays(pa.array(bounds.astype(np.int32)), pa.array(flat))
    return table.set_column(table.schema.get_field_index(OFFSETS), OFFSETS, offsets)


def _locate(ends: pa.Table, timeline: np.ndarray, step: np.ndarray,
            count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The end times in (timeline, step) order, and each pointing row's first step as an
    index into them. ValueError when a timeline's steps are not 0, 1, ... or a row points
    past its timeline's end (a step_ends part lost or foreign)."""
    tl, st = _ints(ends.column("timeline")), _ints(ends.column("step"))
    order = np.lexsort((st, tl))
    tl, st = tl[order], st[order]
    ids, base, size = np.unique(tl, return_index=True, return_counts=True)
    if not np.array_equal(st, np.arange(len(st)) - np.repeat(base, size)):
        raise ValueError("step_ends.parquet: a timeline's steps are not 0, 1, 2, ...")
    at = np.minimum(np.searchsorted(ids, timeline), max(len(ids) - 1, 0))
    if len(ids) == 0 or (ids[at] != timeline).any() or (step + count > size[at]).any():
        raise ValueError("requests.parquet points past the step ends in step_ends.parquet")
    return ends.column("t").to_numpy()[order], base[at] + step
