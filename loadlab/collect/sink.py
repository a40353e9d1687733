"""METRICS part files written column-wise, one writer per endpoint.

A vLLM page holds ~330 kept samples; at 4 endpoints x 10 Hz that is 13,000 rows
a second. Building a dict per row and handing it to ``PartWriter.add`` costs
more CPU than the whole rest of the collector (``pa.Table.from_pylist`` alone
is ~4 us a row), so this writer keeps, per scrape, only the parser's series ids
and values, and at flush time builds each string column as a dictionary array: the
distinct strings once, and a code per row. Parquet writes those as its own dictionary
pages without hashing each row's string (a third of a 10-minute replay's metrics part:
benchmarks/README.md, "Fifth pass"), and the part reads back as plain strings
(:func:`loadlab.runstore.encoding.column_options`). Part names, the write-then-rename
step, the flush timer and keeping scrapes buffered until their part is on disk are
PartWriter's, so readers see one ``metrics.parquet/`` table whatever wrote it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from loadlab.collect.parse import ExpositionParser, Scrape
from loadlab.runstore import METRICS, PartWriter


class MetricsSink(PartWriter):
    """Buffers whole scrapes of one endpoint and writes them as METRICS parts."""

    def __init__(
        self,
        table_dir: str | Path,
        parser: ExpositionParser,
        *,
        endpoint: str,
        source: str = "direct",
        writer_id: str | None = None,
        flush_interval_s: float = 2.0,
        flush_rows: int = 200_000,
    ) -> None:
        super().__init__(table_dir, METRICS, writer_id=writer_id,
                         flush_rows=flush_rows, flush_interval_s=flush_interval_s)
        self.parser = parser
        self.endpoint = endpoint
        self.source = source
        self._scrapes: list[tuple[float, float | None, Scrape]] = []
        self._n_buffered = 0

    def add(self, row: object) -> None:
        """Not for this writer: rows come whole scrapes at a time (:meth:`add_scrape`)."""
        raise NotImplementedError("MetricsSink takes whole scrapes: call add_scrape()")

    def add_scrape(self, t: float, scrape_s: float | None, scrape: Scrape) -> None:
        """Queue one parsed page; flushes when the buffer is big (and on PartWriter's timer)."""
        with self._lock:
            self._scrapes.append((t, scrape_s, scrape))
            self._n_buffered += len(scrape.ids)
            pending = self._n_buffered
        self._buffered(pending)

    def _snapshot(self) -> tuple[int, list[tuple[float, float | None, Scrape]]]:
        return len(self._scrapes), self._scrapes[:]

    def _forget(self, items: int) -> None:
        self._n_buffered -= sum(len(s.ids) for _, _, s in self._scrapes[:items])
        del self._scrapes[:items]

    def _pending_rows(self) -> int:
        return self._n_buffered

    def _to_table(  # type: ignore[override]  # the batch is _snapshot's scrapes, not rows
        self, scrapes: list[tuple[float, float | None, Scrape]]
    ) -> tuple[pa.Table, list]:
        if not any(s.ids for _, _, s in scrapes):
            return METRICS.empty_table(), []
        return self._table(scrapes), []

    def _table(self, scrapes: list[tuple[float, float | None, Scrape]]) -> pa.Table:
        """METRICS rows of ``scrapes``, string columns dictionary-encoded (module docstring)."""
        counts = np.array([len(s.ids) for _, _, s in scrapes])
        ids = np.concatenate(_id_arrays([s.ids for _, _, s in scrapes]))
        n = len(ids)
        series = self.parser.series
        durations = np.array([d for _, d, _ in scrapes], dtype=np.float64)   # None: NaN
        scrape_s = (pa.nulls(n, pa.float64()) if np.isnan(durations).all()   # a replay's
                    else pa.array(np.repeat(durations, counts), from_pandas=True))
        columns = {
            "t": pa.array(np.repeat([t for t, _, _ in scrapes], counts)),
            "scrape_s": scrape_s,
            "endpoint": _constant(self.endpoint, n),
            "value": pa.array(
                np.concatenate([np.asarray(s.values, dtype=np.float64) for _, _, s in scrapes])
            ),
            "source": _constant(self.source, n),
            **{col: _dictionary([getattr(s, col) for s in series], ids)
               for col in ("family", "type", "metric", "labels")},
        }
        return pa.Table.from_arrays([columns[f.name] for f in METRICS], names=METRICS.names)


def _id_arrays(ids: list[list[int]]) -> list[np.ndarray]:
    """Each scrape's series ids as an array, converted once per distinct list: a replay's
    scrapes all share one (the engine's series never change), a live scrape has its own."""
    arrays: dict[int, np.ndarray] = {}
    out = []
    for i in ids:
        a = arrays.get(id(i))
        if a is None:
            a = arrays[id(i)] = np.asarray(i, dtype=np.int64)
        out.append(a)
    return out


def _constant(value: str, n: int) -> pa.DictionaryArray:
    """``value`` ``n`` times, as a dictionary array of one string."""
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                          pa.array([value], pa.string()))


def _dictionary(per_series: list[str], ids: np.ndarray) -> pa.DictionaryArray:
    """The strings ``per_series[ids]`` as a dictionary array of their distinct values."""
    codes: dict[str, int] = {}
    code = np.array([codes.setdefault(v, len(codes)) for v in per_series], np.int32)
    return pa.DictionaryArray.from_arrays(pa.array(code[ids]), pa.array(list(codes), pa.string()))
