"""What the analyzer reads of a run folder, and how: the columns it uses, strings as categoricals.

An hour-long run holds ~1M request rows and ~5M metric samples in thousands of part
files (benchmarks/bench_analyze.py). Read naively, two things dominate the analysis:

- ``chunk_offsets_s``: one float per streamed chunk, ~2e8 of them for 1M chat
  requests; decoding that list column alone takes ~12 s and ~3 GB. The analyzer needs
  no single offset: a stream's span (last chunk minus first) is
  ``itl_mean_s * (n_chunks - 1)``, which every writer of requests.parquet stores.
- plain string columns: METRICS repeats a few hundred family / metric / label strings
  millions of times, and pandas filters chunked Arrow strings slowly (a boolean filter
  of one family out of 5M rows took ~1 s). Read as categoricals (Parquet's own
  dictionary pages), the frame is ~10x smaller and filters and groupbys work on codes.

Both readers return the same values as ``read_table(dir, schema)`` would, with string
columns as categoricals (categories in string order); requests only in the columns the
analyzer reads (about half: reading costs per column and per part file), metrics too
when asked (:data:`METRIC_COLUMNS`, as :func:`loadlab.analyze.steps.load_run` does).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from loadlab.runstore import METRICS, REQUESTS, read_table
from loadlab.runstore.encoding import string_columns
from loadlab.runstore.layout import METRICS_TABLE, REQUESTS_TABLE

# The request columns the analyzer reads: add one here when it starts to use it. Reading
# costs per column and per part (~0.1 ms each on an hour's 3,600 parts), and the rest is
# never aggregated: above all ``chunk_offsets_s`` (above), and ``request_id`` (one distinct
# string per row, for joining with server logs). ``t_issued`` once the schema has it.
ANALYZED = ("step", "concurrency", "target_rate", "status", "error", "t_issued", "t_sent", "t_done",
            "send_lag_s", "ttft_s", "e2e_s", "itl_mean_s", "itl_p50_s", "itl_p99_s", "n_chunks",
            "prompt_tokens", "output_tokens", "target_prompt_tokens", "target_output_tokens",
            "http_status", "failure")
REQUEST_COLUMNS = [name for name in REQUESTS.names if name in ANALYZED]
# The metric columns the analyzer reads (``scrape_s``, ``type`` and ``source`` it never
# uses: leaving them out saves a third of reading an hour's ~2,900 metrics parts).
METRIC_COLUMNS = ["t", "endpoint", "family", "metric", "labels", "value"]


def _strings(schema: pa.Schema, names: Iterable[str]) -> list[str]:
    wanted = set(names)
    return [name for name in string_columns(schema) if name in wanted]


def read_requests(run_dir: str | Path, skip: Collection[str] = ()) -> pd.DataFrame:
    """requests.parquet, the columns the analyzer reads (:data:`REQUEST_COLUMNS`), without
    the parts named in ``skip``."""
    return read_table(Path(run_dir) / REQUESTS_TABLE, REQUESTS, columns=REQUEST_COLUMNS,
                      categorical=_strings(REQUESTS, REQUEST_COLUMNS), skip=skip)


def read_metrics(run_dir: str | Path, families: Iterable[str] | None = None,
                 columns: Sequence[str] | None = None) -> pd.DataFrame:
    """metrics.parquet, all columns unless ``columns`` (the analyzer's: :data:`METRIC_COLUMNS`);
    only the given families' rows when ``families`` is set."""
    where = None if families is None else pc.field("family").isin(sorted(set(families)))
    names = list(columns) if columns is not None else METRICS.names
    return read_table(Path(run_dir) / METRICS_TABLE, METRICS, columns=names, where=where,
                      categorical=_strings(METRICS, names))


def chunk_span_s(requests: pd.DataFrame) -> pd.Series:
    """Seconds from a stream's first content chunk to its last; NaN below two chunks."""
    return requests["itl_mean_s"] * (requests["n_chunks"] - 1)
