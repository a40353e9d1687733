"""Per-column Parquet options shared by every writer of a table: parts and their compaction.

What is stored is the same whatever these say (a reader gets the same values); they only
decide what the writer spends work on, measured on a 10-minute replay's tables
(benchmarks/bench_sim_replay.py, "Fifth pass" in benchmarks/README.md):

- Per-item float lists (``chunk_offsets_s``: one float per streamed chunk, 2.5M of them
  for 6k requests of a load-generator run; a replay writes most as pointers, see
  :mod:`.token_steps`) are written uncompressed and without statistics. Snappy saved 2% of
  their bytes (offsets have full-width mantissas) and then cost a decompression at every
  read; the min / max of a list's elements is never read.
- METRICS' series strings carry no statistics: every part and every compacted row group
  holds every family, so their min and max prune nothing, and computing them over each
  row's string was a fifth of a metrics part's write. Nor do its values and scrape
  durations (~1 ms of a ten-minute replay's part): no reader selects by them. Its ``t``
  keeps them, for a reader that selects a time range. The statistics loadlab reads are
  requests' ``t_sent`` and ``point`` (:mod:`loadlab.analyze.schema_check`), kept.
- Only string columns are dictionary-encoded (:func:`string_columns`): a few hundred
  distinct values over many rows. Times, lengths and ids are nearly all distinct, so
  Parquet's dictionary attempt on them was hashing for nothing and a larger file (a
  10-minute replay's requests part: 9.1 ms and 0.77 MB with every column tried, 5.5 ms
  and 0.69 MB with strings only).
- A table whose string columns come as dictionary arrays (the metrics sink's: a few
  hundred distinct series strings over every row) is written without Arrow's own schema,
  so that it reads back as plain strings; Parquet stores such columns as dictionary
  pages either way.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

RAW_COLUMNS = frozenset({"chunk_offsets_s", "send_lags_s"})
UNSUMMARISED_COLUMNS = RAW_COLUMNS | {"family", "type", "metric", "labels", "value", "scrape_s"}
CODEC = "snappy"   # pyarrow's default, for every other column


def column_options(schema: pa.Schema) -> dict[str, Any]:
    """``write_statistics``, ``compression`` and ``store_schema`` for ``pq.write_table`` /
    ``ParquetWriter`` writing a table of ``schema``."""
    return {
        "store_schema": not any(pa.types.is_dictionary(f.type) for f in schema),
        "write_statistics": [n for n in schema.names if n not in UNSUMMARISED_COLUMNS],
        "compression": {n: "none" if n in RAW_COLUMNS else CODEC for n in schema.names},
    }


def string_columns(schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` to dictionary-encode: its strings (module docstring)."""
    return [f.name for f in schema if pa.types.is_string(f.type)]
