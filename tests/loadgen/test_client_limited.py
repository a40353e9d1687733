"""Every step records the load it achieved; a starved client is told apart from a healthy one.

Real runs of ``loadlab run`` against the simulator: healthy ones, closed and open loop
(not client limited, exit 0), and one whose client is starved for real: server and client
on CPUs of their own, and after it started the client's threads drop to nice 19 while two
busy loops take its CPU (client limited, exit 3, everything written). The healthy runs
leave placement to the kernel: on a box other work keeps busy, a client pinned to one CPU
cannot step aside from a busy loop there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import psutil
import pytest

from loadlab.analyze.gauge_lag import client_inflight
from loadlab.experiment.cpus import default_split, format_cpu_list
from loadlab.loadgen.achieved import LOOP_LAG_MEAN_MAX_S

SPLIT = default_split()
needs_two_cpus = pytest.mark.skipif(SPLIT.client_cpus is None, reason="needs 2 usable CPUs")
HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def _cpus() -> list[str]:
    assert SPLIT.server_cpus is not None and SPLIT.client_cpus is not None
    return ["--server-cpus", format_cpu_list(SPLIT.server_cpus), "--client-cpus",
            format_cpu_list(SPLIT.client_cpus)]


def _manifest(out: Path) -> dict:
    try:
        return json.loads((out / "manifest.json").read_text())
    except (FileNotFoundError, ValueError):  # not written yet, or mid-write
        return {}


def _client(run: subprocess.Popen) -> psutil.Process:
    """The process that runs the load: ``loadlab run``'s child (loadlab.experiment.child),
    which wrote the manifest, so it exists once the run is "running"."""
    children = psutil.Process(run.pid).children()
    return next(c for c in children if "loadlab.experiment.child" in c.cmdline())


def _wait_for(cond: Callable[[], bool], proc: subprocess.Popen, timeout_s: float) -> None:
    """Until ``cond()`` (read from the run folder the process writes) or the process ends."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.05)


def test_healthy_run_applies_its_load(cli, load, tiny_profile, tmp_path) -> None:
    out = tmp_path / "healthy"
    res = cli("--launch", "sim", "--profile", str(tiny_profile), "--concurrency", "2,8",
              "--step-duration", "4", "--warmup", "1", "--workers", "0", "--out", str(out),
              "--", "--max-num-seqs", "16")
    assert res.returncode == 0, res.stderr
    df, manifest = load(out)
    assert manifest["isolation"] is None and manifest["client_limited_steps"] == []
    assert "load achieved per step" in res.stderr
    for step in manifest["steps"]:
        users = step["concurrency"]
        assert step["client_limited"] is False and step["client_limited_reasons"] == [], step
        assert 0.9 <= step["achieved_ratio"] <= 1.0 and step["inflight_mean"] == pytest.approx(
            users * step["achieved_ratio"])
        assert step["loop_lag_mean_s"] < LOOP_LAG_MEAN_MAX_S and step["send_lag_p99_s"] is None
        # the client's own integral agrees with the in-flight count read back from its rows
        # (the rows' t_sent comes after connecting, the integral's start before)
        window = pd.DataFrame(
            {"t_start": [step["t_start"] + step["warmup_s"]], "t_end": [step["t_end"]]}
        )
        from_rows = client_inflight(df, window)[0]
        assert step["inflight_mean"] == pytest.approx(from_rows, abs=0.05 * users), (
            step,
            from_rows,
        )


def test_open_loop_records_rate_against_its_schedule_and_send_lag(
    cli, load, tiny_profile, tmp_path
) -> None:
    out = tmp_path / "rate"
    res = cli(
        "--launch",
        "sim",
        "--profile",
        str(tiny_profile),
        "--rate",
        "30",
        "--step-duration",
        "4",
        "--warmup",
        "1",
        "--workers",
        "1",
        "--out",
        str(out),
        "--",
        "--max-num-seqs",
        "64",
    )
    assert res.returncode == 0, res.stderr
    df, manifest = load(out)
    step = manifest["steps"][0]
    start, end = step["t_start"] + step["warmup_s"], step["t_end"]
    due = df[(df.t_scheduled >= start) & (df.t_scheduled < end)]
    assert step["scheduled_count"] == len(due) and step["client_limited"] is False
    assert step["scheduled_rate"] == pytest.approx(len(due) / (end - start))
    assert step["achieved_ratio"] == pytest.approx(1.0, abs=0.1)
    assert 0 <= step["send_lag_p50_s"] <= step["send_lag_p99_s"] <= step["send_lag_max_s"]
    assert manifest["isolation"] is None


@needs_two_cpus
def test_starved_client_is_marked_client_limited_and_exits_3(tiny_profile, tmp_path) -> None:
    out = tmp_path / "starved"
    argv = [
        sys.executable,
        "-m",
        "loadlab",
        "run",
        "--launch",
        "sim",
        *_cpus(),
        "--profile",
        str(tiny_profile),
        "--concurrency",
        "4,4",
        "--step-duration",
        "4",
        "--warmup",
        "1",
        "--workers",
        "0",
        "--drain",
        "5",
        "--out",
        str(out),
        "--",
        "--max-num-seqs",
        "16",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hogs: list[subprocess.Popen] = []
    try:
        _wait_for(lambda: _manifest(out).get("status") == "running", proc, 120)
        for thread in _client(proc).threads():  # the client only, not its server
            os.setpriority(os.PRIO_PROCESS, thread.id, 19)
        cpu = str(min(SPLIT.client_cpus))
        hogs = [subprocess.Popen([sys.executable, "-c", HOG, cpu]) for _ in range(2)]
        _wait_for(lambda: len(_manifest(out).get("steps", [])) == 2, proc, 240)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr[-3000:]
    manifest = _manifest(out)
    assert manifest["status"] == "complete" and manifest["records"]["rows"] > 0
    assert manifest["isolation"] == {"server_cpus": sorted(SPLIT.server_cpus),
                                     "client_cpus": sorted(SPLIT.client_cpus)}
    assert manifest["client_limited_steps"] == [0, 1]
    # A loop starved for the whole window never wakes inside it: its oversleep is measured
    # when it does wake, in the next window, so a step may have no lag figure of its own.
    lags = [step["loop_lag_mean_s"] for step in manifest["steps"]]
    assert all(step["client_limited"] is True for step in manifest["steps"]), manifest["steps"]
    assert all(lag is None or lag > LOOP_LAG_MEAN_MAX_S for lag in lags), lags
    assert any(lag is not None for lag in lags), lags
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(
        "loadlab: error: the client did not apply the load asked for at step 0 (4 users)"
    )
    assert "event-loop lag mean" in last and "step 1 (4 users)" in last
    assert "run complete" in stdout


TARGET = ["--target", "http://127.0.0.1:9", "--model", "m"]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        ([*TARGET, "--client-cpus", "x"], "--client-cpus"),
        ([*TARGET, "--client-cpus", "4096"], "--client-cpus"),
        ([*TARGET, "--server-cpus", "0"], "--server-cpus"),
        (["--launch", "sim", "--server-cpus", "4096"], "--server-cpus"),
        (
            ["--launch", "sim", "--server-cpus", "0", "--client-cpus", "0"],
            "--server-cpus/--client-cpus",
        ),
    ],
)
def test_bad_cpu_flags_exit_2_naming_the_flag(cli, tmp_path, args, flag) -> None:
    out = tmp_path / "never"
    res = cli(*args, "--concurrency", "1", "--out", str(out))
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and f"{flag}:" in res.stderr, res.stderr
    assert not out.exists()
