"""The run folder: the one contract every stage reads and writes.

Layout of one point (``reports/<run>/<point>/``), every name in :mod:`.layout`::

    manifest.json        what was run: scenario as resolved, server flags, versions,
                         host, start/end, per-step windows, status (see manifest.py)
    analysis.json        the analyzer's verdict (see analysis_model.py)
    requests.parquet/    one row per request (schema.REQUESTS), a directory of part files
    metrics.parquet/     long-format /metrics samples (schema.METRICS), likewise
    scrapes.parquet/     one row per scrape attempt (schema.SCRAPES): gaps and their cause
    client.parquet/      the load generator's own CPU and scheduling lag (schema.CLIENT)
    step_ends.parquet/   a replay's step-end timelines (schema.STEP_ENDS): its requests'
                         token times point into them instead of listing every offset

The two JSON files have typed models (:class:`~.manifest.RunManifest`,
:class:`~.manifest.SweepManifest`, :class:`~.analysis_model.Analysis`); readers load them
with :func:`load_manifest` / :func:`read_analysis`, which name the file and the field
when one does not fit.

Each ``*.parquet`` is a directory of part files because a part is only written
whole (to a temporary name, then renamed): a crash, a kill or Ctrl-C loses at most
the rows not yet flushed, and several writers (Locust workers, collectors) add to
one table without coordinating. ``pandas.read_parquet(dir)`` and pyarrow read the
directory as one table; :func:`read_table` does that (in one pass, also right after an
interrupted compaction) and returns an empty frame with the right columns when
nothing was written. Once a run's writers are closed,
:func:`compact_run` rewrites each table's parts as one (readers need not know).

Times are unix seconds (float64) everywhere; durations end in ``_s``.
"""

from loadlab.runstore.analysis_model import Analysis, read_analysis
from loadlab.runstore.compaction import compact, compact_run
from loadlab.runstore.manifest import load_manifest, read_manifest, update_manifest, write_manifest
from loadlab.runstore.schema import (
    CLIENT,
    METRICS,
    REQUEST_STATUSES,
    REQUESTS,
    SCRAPES,
    STEP_ENDS,
)
from loadlab.runstore.writer import PartWriter, read_table

__all__ = [
    "Analysis",
    "CLIENT",
    "METRICS",
    "REQUESTS",
    "REQUEST_STATUSES",
    "SCRAPES",
    "STEP_ENDS",
    "PartWriter",
    "compact",
    "compact_run",
    "load_manifest",
    "read_analysis",
    "read_manifest",
    "read_table",
    "update_manifest",
    "write_manifest",
]
