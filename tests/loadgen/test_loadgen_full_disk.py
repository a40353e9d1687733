"""A run folder that refuses writes (a full disk): exit 5 in one line, the manifest says
``failed`` with the reason, and every request measured is on disk or in a named recovery file.

The point's process gets a file-size limit (``RLIMIT_FSIZE`` through the child's test-only
variable, SIGXFSZ ignored): its writes past the limit fail with EFBIG as they would with
ENOSPC, while ``loadlab run`` itself, unlimited, is where the rows handed back can land.
"""

from __future__ import annotations

import json
import os

from loadlab.experiment.child import FSIZE_ENV
from loadlab.experiment.recovery import RECOVERY_NAME
from loadlab.runstore import REQUESTS, read_table

ARGS = ("--model", "m", "--profile", "sharegpt", "--concurrency", "4", "--step-duration", "3",
        "--warmup", "0.5", "--workers", "0", "--no-calibrate")


def _limited(limit: int) -> dict[str, str]:
    return {**os.environ, FSIZE_ENV: str(limit)}


def test_rows_the_disk_refused_are_saved_and_named_and_the_manifest_says_failed(
        fault, cli, tmp_path) -> None:
    """16 kB: the manifest (under 4 kB) fits, a requests part (a sharegpt row is ~2.5 kB) does
    not. On main this exited 0, "run complete: 0 requests recorded", the rows gone."""
    out = tmp_path / "run"
    with fault("ok") as url:
        r = cli("--target", url, *ARGS, "--out", str(out), env=_limited(16_000))
    assert r.returncode == 5, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    recovery = out / RECOVERY_NAME
    assert last.startswith("loadlab: error: ") and "File too large" in last, last
    assert f"saved in {recovery}" in last, last
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert "request rows not written" in manifest["error"]
    on_disk = len(read_table(out / "requests.parquet", REQUESTS))
    saved = [json.loads(line) for line in recovery.read_text().splitlines()]
    assert saved and all(row["status"] == "ok" for row in saved)
    assert on_disk + len(saved) == manifest["records"]["received"] > 0
    assert not list(out.glob(".*.tmp"))


def test_a_manifest_the_disk_refuses_at_the_start_is_one_line_exit_5_and_no_temporary_file(
        fault, cli, tmp_path) -> None:
    """On main: two tracebacks, exit 1, and a 0-byte ``.manifest.json.*.tmp`` left behind."""
    out = tmp_path / "run"
    with fault("ok") as url:
        r = cli("--target", url, *ARGS, "--out", str(out), env=_limited(500))
    assert r.returncode == 5, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"loadlab: error: cannot write {out / 'manifest.json'}: File too large"), r.stderr
    assert not list(out.glob(".*.tmp")) and not (out / "manifest.json").exists()
