"""Replay's request records: token times per request, and REQUESTS rows built column-wise.

:class:`TokenTimes` keeps each request's token times as a slice of the step-end
timeline. :class:`RequestRows` buffers rows and writes them as REQUESTS parts through
:meth:`PartWriter.write_table`: the per-token ``chunk_offsets_s`` list column is built
from one flat float array and its offsets (``pa.ListArray.from_arrays``), not from a
Python list per row, which was most of the cost of writing requests.parquet
(``benchmarks/bench_sim_replay.py``), and it is written without dictionary encoding
(a dictionary of per-token floats is costly and useless). Every row carries every other
column, so one ``itemgetter`` call per row and a ``zip`` transpose (both in C) turn the
rows into columns: ``pa.Table.from_pylist`` looked each key up row by row in Python, and
cost as much as the parquet write. Flushing: every ``flush_rows``
rows or when the oldest buffered row is ``flush_interval_s`` wall seconds old, and at
:meth:`close`.
"""

from __future__ import annotations

import time
from collections.abc import Set as AbstractSet
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from loadlab.runstore import REQUESTS, PartWriter
from loadlab.sim.engine.types import StepOutput

_OFFSETS = "chunk_offsets_s"
_OFFSETS_INDEX = REQUESTS.get_field_index(_OFFSETS)
_SCALARS = pa.schema([f for f in REQUESTS if f.name != _OFFSETS])
_IN_SCHEMA_ORDER = itemgetter(*_SCALARS.names)


class TokenTimes:
    """Each request's token times, without touching every request at every step.

    A decoding request nearly always emits at every step end from its first token to
    its last, so its times are a slice of the step-end timeline (a numpy view, no copy).
    Only a request that skips a step while alive (preempted, or left without token
    budget) gets its own list, from the skip on. Per step: a few set operations.
    """

    def __init__(self) -> None:
        self._ends = np.empty(4096)
        self._n = 0
        self._first: dict[str, int] = {}          # id -> index of its first-token step
        self._own: dict[str, list[float]] = {}    # ids that skipped a step: explicit times
        self._prev: AbstractSet[str] = set()      # ids that emitted at the last step end
        self._gone: set[str] = set()              # ids popped since the last step

    def observe(self, out: StepOutput) -> None:
        j, t = self._n, out.t_end
        if j == len(self._ends):
            self._ends = np.concatenate((self._ends, np.empty(j)))
        self._ends[j] = t
        self._n = j + 1
        new = out.new_tokens
        emit = (new.keys() if not out.batch.num_prefill_requests or sum(new.values()) == len(new)
                else {r for r, n in new.items() if n})  # (no prefill request: all decoded one)
        first = out.first_token
        for rid in first:
            self._first[rid] = j
        prev, gone = self._prev, self._gone
        # While no request has its own times nobody resumes after a gap, so
        # len(prev) - (len(emit) - len(first)) ids stopped; when those are all done ones,
        # skip the set difference (it reads every id's string object, every step).
        if (self._own or any(rid in emit for rid in gone)
                or len(prev) - len(emit) + len(first) != sum(1 for rid in gone if rid in prev)):
            for rid in prev - emit:
                if rid in self._first and rid not in self._own:
                    self._own[rid] = self._ends[self._first[rid]:j].tolist()
        if self._own:
            for rid in emit & self._own.keys():
                self._own[rid].append(t)
        gone.clear()
        self._prev = emit

    def pop(self, rid: str) -> np.ndarray:
        """Token times of a request that is done (finished, or aborted after the last step)."""
        first = self._first.pop(rid, None)
        own = self._own.pop(rid, None)
        self._gone.add(rid)
        if own is not None:
            return np.array(own)
        return self._ends[first:self._n] if first is not None else np.empty(0)


def quantile(sorted_values: np.ndarray, q: float) -> float:
    """Linear-interpolation quantile of sorted values (numpy's default method, ~20x cheaper)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))



class RequestRows:
    """REQUESTS rows: scalars as dicts, chunk offsets as arrays, one table per part."""

    def __init__(self, writer: PartWriter, flush_rows: int = 20_000,
                 flush_interval_s: float = 30.0) -> None:
        self.writer = writer
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self._rows: list[dict[str, Any]] = []
        self._offsets: list[np.ndarray] = []
        self._last_flush = time.monotonic()

    def add(self, row: dict[str, Any], chunk_offsets_s: np.ndarray) -> None:
        """Queue one row: every REQUESTS column but chunk_offsets_s (None where it has no
        value; a missing one is a KeyError at the flush), which comes apart."""
        self._rows.append(row)
        self._offsets.append(chunk_offsets_s)
        if (len(self._rows) >= self.flush_rows
                or time.monotonic() - self._last_flush >= self.flush_interval_s):
            self.flush()

    def flush(self) -> None:
        rows, offsets = self._rows, self._offsets
        self._rows, self._offsets = [], []
        self._last_flush = time.monotonic()
        if not rows:
            return
        bounds = np.zeros(len(offsets) + 1, dtype=np.int32)
        np.cumsum([len(a) for a in offsets], out=bounds[1:])
        values = np.concatenate(offsets).astype(np.float64, copy=False)
        column = pa.ListArray.from_arrays(pa.array(bounds), pa.array(values))
        columns = zip(*map(_IN_SCHEMA_ORDER, rows), strict=True)
        table = pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, _SCALARS)],
                                     schema=_SCALARS)
        self.writer.write_table(table.add_column(_OFFSETS_INDEX, REQUESTS.field(_OFFSETS), column),
                                dictionary_columns=_SCALARS.names)

    def close(self) -> None:
        self.flush()
