"""`loadlab run --server-cpus/--client-cpus`: a real run on the simulator, each side on its CPUs.

While the run goes, its process tree is read from the kernel: every thread of the load
generator and of its worker process on the client's CPUs, every thread of the launched
server (and its guardian) on the server's; afterwards the manifest records the placement
and the /metrics scraper's keys and tables are there, compacted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from loadlab.experiment.cpus import default_split, format_cpu_list

SPLIT = default_split()
pytestmark = pytest.mark.skipif(SPLIT.client_cpus is None, reason="needs 2 usable CPUs")


def _affinities(proc: psutil.Process) -> set[frozenset[int]]:
    """The CPU sets of every thread of ``proc`` (empty once it has ended)."""
    try:
        return {frozenset(os.sched_getaffinity(t.id)) for t in proc.threads()}
    except (psutil.NoSuchProcess, ProcessLookupError):
        return set()


def _argv(proc: psutil.Process) -> list[str]:
    """Its command line; empty for one that has just ended (a zombie, or gone)."""
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _placement(run: subprocess.Popen, timeout_s: float = 120) -> dict[str, set[frozenset[int]]]:
    """Once the worker process has joined: the CPU sets of each side's threads."""
    me = psutil.Process(run.pid)
    deadline = time.monotonic() + timeout_s
    while True:
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no worker process in time"
        argvs = {c: _argv(c) for c in me.children(recursive=True)}
        workers = [c for c, argv in argvs.items() if "--join" in argv]
        servers = [
            c for c, argv in argvs.items() if "serve" in argv or "guardian.py" in " ".join(argv)
        ]
        if workers and len(servers) >= 2:   # the guardian and the simulator under it
            break
        time.sleep(0.05)  # polling the process tree, not synchronising on a sleep
    return {"client": _affinities(me) | set().union(*(_affinities(w) for w in workers)),
            "server": set().union(*(_affinities(s) for s in servers))}


def test_run_places_server_and_client_on_their_cpus_and_records_it(tiny_profile, tmp_path) -> None:
    assert SPLIT.server_cpus is not None and SPLIT.client_cpus is not None
    out = tmp_path / "isolated"
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadlab",
            "run",
            "--launch",
            "sim",
            "--server-cpus",
            format_cpu_list(SPLIT.server_cpus),
            "--client-cpus",
            format_cpu_list(SPLIT.client_cpus),
            "--profile",
            str(tiny_profile),
            "--concurrency",
            "2",
            "--step-duration",
            "3",
            "--warmup",
            "1",
            "--workers",
            "1",
            "--collect",
            "--interval",
            "0.5",
            "--out",
            str(out),
            "--",
            "--max-num-seqs",
            "8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        placement = _placement(run)
    finally:
        _, stderr = run.communicate(timeout=180)
    assert run.returncode in (0, 3), stderr[-3000:]  # 3: the pinned client fell short on a busy box
    assert placement["client"] == {SPLIT.client_cpus}, placement
    assert placement["server"] == {SPLIT.server_cpus}, placement
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["records"]["rows"] > 0
    assert manifest["isolation"] == {"server_cpus": sorted(SPLIT.server_cpus),
                                     "client_cpus": sorted(SPLIT.client_cpus)}
    # the scraper started once the manifest existed (its keys kept) and its tables were compacted
    assert manifest["metrics"]["interval_s"] == 0.5 and manifest["metrics"]["names_found"]
    for table in ("metrics.parquet", "scrapes.parquet"):
        assert len(list(Path(out, table).glob("part-*.parquet"))) == 1, table
