"""The names of the files in a run folder and in a sweep folder, each spelled once.

Every stage finds the others' output by these names alone (no index file lists them),
so a name changed in one writer and not in its readers would leave a reader looking at
an empty table. Readers and writers import the name from here instead.

A run folder (one point)::

    manifest.json        what was run and how it went (runstore.manifest)
    analysis.json        the analyzer's verdict (runstore.analysis_model)
    requests.parquet/    one row per request (schema.REQUESTS), part files
    metrics.parquet/     /metrics samples (schema.METRICS), part files
    scrapes.parquet/     one row per scrape attempt (schema.SCRAPES), part files
    client.parquet/      the load generator's own CPU and lag (schema.CLIENT), part files
    step_ends.parquet/   a replay's step-end timelines its requests' token times point
                         into (schema.STEP_ENDS), part files
    <kind>-server.log    stdout and stderr of a server loadlab launched (sim | vllm)
    report.html          ``loadlab report`` of the folder
    .claim               locked by the run writing the folder, who it is (runstore.claim)

A sweep folder holds ``manifest.json`` (kind "sweep"), ``report.html``, ``.claim`` and one
run folder per point, named by the manifest's ``points[].dir``.
"""

from __future__ import annotations

MANIFEST = "manifest.json"
ANALYSIS = "analysis.json"
REPORT = "report.html"
CLAIM = ".claim"

REQUESTS_TABLE = "requests.parquet"
METRICS_TABLE = "metrics.parquet"
SCRAPES_TABLE = "scrapes.parquet"
CLIENT_TABLE = "client.parquet"
STEP_ENDS_TABLE = "step_ends.parquet"

LOADGEN_TABLES = (REQUESTS_TABLE, CLIENT_TABLE)
"""Written by the load generator (and, for requests, by the virtual-time replay)."""
SCRAPER_TABLES = (METRICS_TABLE, SCRAPES_TABLE)
"""Written by the /metrics collector."""
REPLAY_TABLES = (REQUESTS_TABLE, METRICS_TABLE, STEP_ENDS_TABLE)
"""Written by the virtual-time replay (``loadlab sim replay``)."""
TABLES = (REQUESTS_TABLE, METRICS_TABLE, SCRAPES_TABLE, CLIENT_TABLE, STEP_ENDS_TABLE)

SERVER_LOG_SUFFIX = "-server.log"


def server_log(kind: str) -> str:
    """The log file of a launched server of ``kind`` (sim | vllm): one per kind, so a
    folder that somehow saw both keeps both logs."""
    return f"{kind}{SERVER_LOG_SUFFIX}"
