"""Where request rows and client samples go: one :class:`Recorder` per run folder.

The recorder lives in the process that owns the run folder (the only process in
a local run, the Locust master in a distributed one). Workers never write the
folder: their :class:`BatchSender` ships rows to the master in batches with
``runner.send_message`` (``ll_rows`` / ``ll_client``, ordered per worker by ZeroMQ),
so workers on other machines need no shared filesystem. At a stop each worker
flushes and then sends ``ll_done`` with the number of rows it shipped and of
requests it began; the master waits for every ``ll_done`` before it closes the
tables, and :meth:`Recorder.missing` compares the counts (every request begun must
have a row: a shortfall is a lost record, and the manifest says so).

The recorder also keeps the live figures the progress line shows (per step:
ok / error counts, TTFT median) and the client samples that
:meth:`Recorder.client_achieved` turns into the load a window achieved.
"""

from __future__ import annotations

import statistics
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadlab.loadgen.achieved import Achieved, summarise
from loadlab.runstore.failures import SERVER_FAILURES

# Seconds between requests parts: a crash (SIGKILL, power) loses at most this much of
# finished requests (a stop, Ctrl-C or SIGTERM flushes everything). An hour at 1 s made
# 3,600 parts whose reading cost the analyzer ~5 s of CPU, at 5 s ~1.6 s (the run is
# compacted at its end anyway: benchmarks/bench_analyze.py).
REQUESTS_FLUSH_S = 5.0

ROWS_MSG = "ll_rows"
CLIENT_MSG = "ll_client"
DONE_MSG = "ll_done"


class Recorder:
    """Writes ``requests.parquet`` and ``client.parquet`` of one run folder."""

    def __init__(self, run_dir: str | Path, writer_id: str = "master") -> None:
        # Imported here: workers only ship rows and should not pay for pandas/pyarrow.
        from loadlab.runstore import CLIENT, REQUESTS, PartWriter
        from loadlab.runstore.layout import CLIENT_TABLE, REQUESTS_TABLE

        run_dir = Path(run_dir)
        self.requests = PartWriter(run_dir / REQUESTS_TABLE, REQUESTS, writer_id=writer_id,
                                   flush_rows=2000, flush_interval_s=REQUESTS_FLUSH_S)
        self.client = PartWriter(run_dir / CLIENT_TABLE, CLIENT, writer_id=writer_id,
                                 flush_rows=500, flush_interval_s=2.0)
        self._lock = threading.Lock()
        self.ok: dict[int, int] = defaultdict(int)
        self.errors: dict[int, int] = defaultdict(int)
        self._ttfts: dict[int, list[float]] = defaultdict(list)
        self._samples: list[dict[str, Any]] = []
        # (t_issued, failed server-side) per row, for the share of a window that failed
        self._issued: list[tuple[float | None, bool]] = []
        self._last_sample: dict[str, float] = {}
        self.rows_by_worker: dict[str, int] = defaultdict(int)
        self.done_workers: dict[str, int] = {}
        self.issued_by_worker: dict[str, int] = {}
        self.fit_counts: dict[str, int] = {}    # summed over workers (workload.fit)
        self.calibration: dict[str, dict[str, Any]] = {}

    def add_rows(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            for row in rows:
                step = row["step"]
                self.rows_by_worker[row["worker"]] += 1
                self._issued.append((row.get("t_issued"), row.get("failure") in SERVER_FAILURES))
                if row["status"] == "ok":
                    self.ok[step] += 1
                    if row["ttft_s"] is not None:
                        self._ttfts[step].append(row["ttft_s"])
                else:
                    self.errors[step] += 1
        self.requests.extend(rows)

    def add_client(self, samples: list[dict[str, Any]]) -> None:
        with self._lock:
            self._samples.extend(samples)
            for s in samples:
                self._last_sample[s["worker"]] = max(
                    s["t"], self._last_sample.get(s["worker"], 0.0)
                )
        self.client.extend(samples)

    def mark_done(self, worker: str, rows_sent: int, issued: int | None = None,
                  fit: dict[str, int] | None = None) -> None:
        with self._lock:
            self.done_workers[worker] = rows_sent
            if issued is not None:
                self.issued_by_worker[worker] = issued
            for key, n in (fit or {}).items():
                self.fit_counts[key] = self.fit_counts.get(key, 0) + n

    def missing(self) -> dict[str, int]:
        """Rows short per finished worker: requests begun (else rows shipped) minus rows
        received."""
        with self._lock:
            expected = {
                w: max(n, self.issued_by_worker.get(w, n)) for w, n in self.done_workers.items()
            }
            return {w: n - self.rows_by_worker.get(w, 0) for w, n in expected.items()
                    if n != self.rows_by_worker.get(w, 0)}

    def records_entry(self) -> dict[str, Any]:
        """The manifest's ``records`` block: ``rows`` on disk in requests.parquet, ``received``
        from the workers (``by_worker``), ``missing_by_worker`` (see :meth:`missing`),
        ``unwritten`` (received, not on disk: kept in memory after a failed write, or set
        aside as not fitting the schema) and ``write_errors`` saying why."""
        errors = []
        for table in (self.requests, self.client):
            if table.rows_pending and table.error:
                errors.append(f"{table.rows_pending} rows not written: {table.error}")
            if table.rows_rejected:
                errors.append(f"{table.rows_rejected} rows did not fit the schema: see "
                              f"{table.table_dir}/_rejected-{table.writer_id}.jsonl")
        with self._lock:
            by_worker = dict(self.rows_by_worker)
            issued = dict(self.issued_by_worker)
        return {
            "rows": self.requests.rows_written,
            "received": sum(by_worker.values()),
            "by_worker": by_worker,
            "issued_by_worker": issued,
            "missing_by_worker": self.missing(),
            "unwritten": self.requests.rows_pending + self.requests.rows_rejected,
            "write_errors": errors,
        }

    def unwritten(self) -> str | None:
        """After :meth:`close`: why request rows are still not on disk (the file system
        refused them), or None when every one is."""
        if not (self.requests.rows_pending and self.requests.error):
            return None
        return f"{self.requests.rows_pending} request rows not written: {self.requests.error}"

    def note_calibration(self, report: dict[str, Any]) -> None:
        """Keep a worker's latest calibration report (``ll_ready`` / ``ll_done`` data)."""
        if "calibration" in report:
            with self._lock:
                self.calibration[report["worker"]] = report["calibration"]

    def workload_summary(self) -> dict[str, Any]:
        """The manifest's workload keys ``calibrated``, ``calibration_reason``,
        ``uncalibrated_prompts``."""
        from loadlab.loadgen.prepare import merge_calibrations

        with self._lock:
            return merge_calibrations(list(self.calibration.values()))

    def ttft_p50(self, step: int) -> float | None:
        values = self._ttfts.get(step)
        return statistics.median(values) if values else None

    def client_achieved(self, t_start: float, t_end: float, concurrency: int | None = None,
                        due: int | None = None) -> Achieved:
        """What the client did in a window (:func:`loadlab.loadgen.achieved.summarise`), and
        the share of the requests begun in it that failed server-side."""
        with self._lock:
            samples = list(self._samples)
            failed = [bad for t, bad in self._issued if t is not None and t_start <= t < t_end]
        out = summarise(samples, t_start, t_end, concurrency=concurrency, due=due)
        out.server_failed_share = sum(failed) / len(failed) if failed else None
        return out

    def covers(self, t: float, n_workers: int) -> bool:
        """True once ``n_workers`` workers have sent samples reaching ``t``."""
        with self._lock:
            return sum(last >= t for last in self._last_sample.values()) >= n_workers

    def forget_before(self, t: float) -> None:
        """Drop samples that ended before ``t`` (every window up to it is summarised)."""
        with self._lock:
            self._samples = [s for s in self._samples if s["t"] >= t]
            self._issued = [i for i in self._issued if i[0] is None or i[0] >= t]

    def flush(self) -> None:
        self._each_table("flush")

    def close(self) -> None:
        self._each_table("close")

    def _each_table(self, method: str) -> None:
        """flush / close both tables. A failed write does not stop the run: its rows stay in
        the writer (its ``error`` says why) and :meth:`records_entry` reports them."""
        from loadlab.errors import StoreError

        for table in (self.requests, self.client):
            try:
                getattr(table, method)()
            except StoreError:
                pass


class BatchSender:
    """Worker side: buffers rows and ships them through ``send(kind, payload)``.

    ``tick`` is called by a timer greenlet (every ``FLUSH_S``), ``flush`` on stop.
    """

    def __init__(self, send: Callable[[str, Any], None]) -> None:
        self._send = send
        self._rows: list[dict[str, Any]] = []
        self._client: list[dict[str, Any]] = []
        self.rows_sent = 0

    def add_row(self, row: dict[str, Any]) -> None:
        self._rows.append(row)

    def add_client(self, sample: dict[str, Any]) -> None:
        self._client.append(sample)

    def flush(self) -> None:
        rows, self._rows = self._rows, []
        samples, self._client = self._client, []
        if rows:
            self._send(ROWS_MSG, rows)
            self.rows_sent += len(rows)
        if samples:
            self._send(CLIENT_MSG, samples)

    tick = flush


class LocalSink:
    """Same interface as :class:`BatchSender`, writing straight into a recorder."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.rows_sent = 0

    def add_row(self, row: dict[str, Any]) -> None:
        self.recorder.add_rows([row])
        self.rows_sent += 1

    def add_client(self, sample: dict[str, Any]) -> None:
        self.recorder.add_client([sample])

    def tick(self) -> None:
        """Nothing to ship: the recorder's part writers flush by size and age themselves."""

    def flush(self) -> None:
        self.recorder.flush()
