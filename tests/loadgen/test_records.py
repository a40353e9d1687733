"""The recorder's counts in the manifest are rows on disk, not rows handed to it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from loadlab.loadgen.records import Recorder
from loadlab.runstore import REQUESTS, read_table


def _row(seq: int, **over) -> dict:
    return {"step": 0, "worker": "w1", "status": "ok", "ttft_s": 0.01, "seq": seq, **over}


def test_summary_counts_only_rows_written_and_says_why_the_rest_are_not(tmp_path):
    rec = Recorder(tmp_path)
    parts = tmp_path / "requests.parquet"
    (parts / f".{rec.requests.part_name(1)}.tmp").symlink_to("/dev/full")  # the first write
    rec.add_rows([_row(0), _row(1, http_status="two hundred"), _row(2)])
    rec.mark_done("w1", 4)  # the worker shipped one more than arrived
    rec.flush()  # disk full: the run goes on, the rows stay in memory
    assert (
        rec.records_entry()["rows"] == 0
        and "No space left" in rec.records_entry()["write_errors"][0]
    )
    rec.close()  # space again: written, but the row that cannot fit is set aside
    summary = rec.records_entry()
    assert read_table(parts, REQUESTS).seq.tolist() == [0, 2]
    assert summary["rows"] == 2 and summary["received"] == 3 and summary["unwritten"] == 1
    assert summary["missing_by_worker"] == {"w1": 1}
    assert any("_rejected-master.jsonl" in e for e in summary["write_errors"]), summary


def test_a_lone_row_reaches_disk_on_the_timer_while_the_run_goes_on(
    fault, load, tiny_profile, tmp_path
):
    """Under Locust's gevent patching the writer's timer thread is a greenlet of the master.

    Two requests finish ms apart, the third hangs: the first row may flush as it arrives, the
    second has no row after it to trigger a flush; it must be on disk while the run goes on."""
    out = tmp_path / "lone"
    with fault("ok,ok,hang") as url:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loadlab", "run", "--target", url, "--model", "m", "--profile",
             str(tiny_profile), "--concurrency", "1", "--step-duration", "600", "--warmup", "0",
             "--timeout", "600", "--no-calibrate", "--workers", "1", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while len(read_table(out / "requests.parquet", REQUESTS)) < 2:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the row never reached disk"
                time.sleep(0.05)  # polling the folder, not synchronising on a sleep
            on_disk = read_table(out / "requests.parquet", REQUESTS)
            assert proc.poll() is None  # written while the run was still going
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
    assert on_disk.status.tolist() == ["ok", "ok"]
    assert proc.returncode == 130, err
    df, manifest = load(out)
    assert sorted(df.status) == ["aborted", "ok", "ok"]
    assert manifest["records"]["rows"] == 3 and manifest["records"]["unwritten"] == 0
    assert manifest["workload"]["calibrated"] is False
    assert "--no-calibrate" in manifest["workload"]["calibration_reason"]
