"""A broken target stops the run with a reason: status failed, stop_reason, exit 1, rows kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from runs import fault_server_process, start_run, wait_for_rows

from loadlab.loadgen.guards import REJECT_STREAK


def _analyze(out) -> dict:
    res = subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(out), "--json", "-"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_launched_server_that_dies_stops_the_run(load, tiny_profile, tmp_path) -> None:
    out = tmp_path / "died"
    proc = start_run("--launch", "sim", "--profile", str(tiny_profile), "--concurrency", "2",
                     "--step-duration", "30", "--warmup", "0", "--workers", "0", "--out", str(out),
                     "--", "--max-num-seqs", "2")
    wait_for_rows(proc, out)
    os.kill(load(out)[1]["target"]["launch"]["pid"], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    df, manifest = load(out)
    assert manifest["status"] == "failed"
    assert "killed by signal 9" in manifest["stop_reason"] and "killed by signal 9" in err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        "loadlab: error: run stopped"
    )
    assert len(df) > 0 and "ok" in set(df.status)
    step = manifest["steps"][0]
    assert step["t_end"] - step["t_start"] < 30


def test_url_target_that_goes_away_stops_the_run_and_its_failures_count(
    load, tiny_profile, tmp_path
) -> None:
    out = tmp_path / "gone"
    with fault_server_process("ok", 5, 2) as (server, url):
        proc = start_run(
            "--target",
            url,
            "--model",
            "m",
            "--profile",
            str(tiny_profile),
            "--concurrency",
            "2",
            "--step-duration",
            "60",
            "--warmup",
            "0",
            "--workers",
            "0",
            "--out",
            str(out),
        )
        wait_for_rows(proc, out)
        server.kill()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    df, manifest = load(out)
    assert manifest["status"] == "failed" and manifest["stop_reason"].startswith(
        "no connection to the target"
    )
    assert "cannot connect" in manifest["stop_reason"]
    refused = df[df.status == "client_error"]
    assert len(refused) >= 10 and refused.t_issued.notna().all()
    step = _analyze(out)["steps"][0]
    assert step["n_err"] >= len(refused) and step["n_ok"] == (df.status == "ok").sum()


@pytest.mark.parametrize("pattern,needle", [
    ("401", "401 from the target (Unauthorized): check LOADLAB_API_KEY (or --api-key-env)"),
    ("html404", "404 from the target (an HTML page): check --target"),
    ("500", f"{REJECT_STREAK} requests in a row failed, the last with HTTP 500 (injected 500)"),
])
def test_target_refusing_every_request_stops_early_with_the_cause(cli, load, tiny_profile, tmp_path,
                                                                  pattern, needle) -> None:
    out = tmp_path / pattern
    with fault_server_process(pattern) as (_, url):
        res = cli(
            "--target",
            url,
            "--model",
            "m",
            "--profile",
            str(tiny_profile),
            "--concurrency",
            "4",
            "--step-duration",
            "30",
            "--warmup",
            "0",
            "--workers",
            "1",
            "--out",
            str(out),
        )
    assert res.returncode == 1, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert needle in last and "Traceback" not in res.stderr, res.stderr
    df, manifest = load(out)
    assert manifest["status"] == "failed" and needle in manifest["stop_reason"]
    # Stopped after the streak, not hammering: the streak plus what the 4 users had in flight.
    assert REJECT_STREAK <= len(df) <= REJECT_STREAK + 4, len(df)
    assert manifest["records"]["missing_by_worker"] == {}
