"""`loadlab analyze` on a damaged or unfinished run folder: one line, never a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from loadlab.runstore import REQUESTS, PartWriter, write_manifest

STEP = {"step": 0, "concurrency": 1, "t_start": 100.0, "t_end": 110.0, "warmup_s": 0.0}


def _run_dir(tmp_path, **manifest):
    write_manifest(tmp_path, {"kind": "run", "status": "complete", "steps": [STEP], **manifest})
    with PartWriter(tmp_path / "requests.parquet", REQUESTS) as writer:
        writer.add(
            {
                "step": 0,
                "worker": "w",
                "seq": 0,
                "t_issued": 101.0,
                "t_sent": 101.0,
                "t_done": 101.5,
                "status": "ok",
                "ttft_s": 0.1,
                "e2e_s": 0.5,
                "output_tokens": 4,
            }
        )
    return tmp_path


def _analyze(run_dir) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadlab", "analyze", str(run_dir)],
        capture_output=True,
        text=True,
        check=False,
    )


def _damage(run_dir, how: str) -> str:
    part = next((run_dir / "requests.parquet").glob("part-*.parquet"))
    if how == "json":
        (run_dir / "manifest.json").write_text('{"steps": [')
        return "manifest.json: not valid JSON"
    if how == "window":
        (run_dir / "manifest.json").write_text(
            json.dumps({"status": "complete", "steps": [{"step": 0}]})
        )
        return "manifest.json: steps[0].t_start: field required"
    if how == "truncated":
        part.write_bytes(part.read_bytes()[:100])
    else:
        part.write_bytes(b"")
    return part.name


@pytest.mark.parametrize("how", ["json", "window", "truncated", "empty"])
def test_damaged_folder_is_one_line_exit_2(tmp_path, how) -> None:
    needle = _damage(_run_dir(tmp_path), how)
    res = _analyze(tmp_path)
    err = res.stderr.strip()
    if res.returncode == 0:  # a damaged part skipped with a warning naming it is fine too
        assert how in ("truncated", "empty") and needle in err and "Traceback" not in err, err
        return
    assert res.returncode == 2 and "\n" not in err and err.startswith("loadlab: error:"), res.stderr
    assert needle in err


def test_running_manifest_of_a_live_writer_is_reported_as_still_going(tmp_path) -> None:
    run = _run_dir(
        tmp_path, status="running", owner={"pid": os.getpid(), "hostname": socket.gethostname()}
    )
    res = _analyze(run)
    assert res.returncode == 0 and res.stderr.startswith("warning: the run is still going"), (
        res.stderr
    )
