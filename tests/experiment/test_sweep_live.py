"""A live sweep on the simulator: a point whose server is killed mid-step fails with its
reason and the sweep goes on; Ctrl-C leaves a readable, reported folder; --resume finishes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from loadlab.runstore.manifest import RunManifest, SweepManifest, load_manifest

SCENARIO = """\
name: live-test
description: three simulator arms, two short steps each
target:
  launch: sim
  model: llama-3.1-8b
flags:
  gpu: h100
  max-num-seqs: 4
workload:
  profile: azure-conv
  seed: 2
load:
  concurrency: [2, 6]
  step_duration_s: 4
  warmup_s: 1
loadgen:
  drain_s: 2
  collect_interval_s: 0.5
sweep:
  arms:
    a: {block-size: 16}
    b: {block-size: 32}
    c: {max-num-batched-tokens: 4096}
"""


def wait_for(what: str, predicate, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Block until ``predicate()`` holds (polling the folder the sweep writes)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"the sweep ended before {what}: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def recording(folder: Path) -> bool:
    """The point's load is running: request records are on disk."""
    return any((folder / "requests.parquet").glob("*.parquet"))


def sweep(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "loadlab", "sweep", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_point_fails_interrupt_reports_and_resume_finishes(tmp_path):
    scenario = tmp_path / "live.yaml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "run"
    proc = sweep(str(scenario), "--out", str(out))
    wait_for("point b recording", lambda: recording(out / "b"), proc)
    server_pid = load_manifest(out / "b").target.launch.pid
    os.kill(server_pid, signal.SIGKILL)
    wait_for("point c recording", lambda: recording(out / "c"), proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]

    manifest = load_manifest(out)
    assert isinstance(manifest, SweepManifest) and manifest.status == "interrupted"
    by_name = {p.name: p for p in manifest.points}
    assert by_name["a"].status == "complete" and (out / "a" / "analysis.json").exists()
    assert by_name["b"].status == "failed"
    assert "signal 9" in by_name["b"].error and "sim server" in by_name["b"].error
    assert "2/3 b] failed" in err and "the sweep goes on" in err
    assert (out / "report.html").exists(), "an interrupted sweep still writes its report"
    assert by_name["c"].status == "interrupted"
    killed = load_manifest(out / "b")
    assert isinstance(killed, RunManifest) and killed.status == "failed" and killed.stop_reason
    assert (out / "b" / "sim-server.log").exists()
    a_manifest = (out / "a" / "manifest.json").read_text()

    resumed = sweep("--resume", str(out))
    stdout, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    manifest = load_manifest(out)
    assert manifest.status == "complete"
    assert [(p.name, p.status) for p in manifest.points] == [("a", "complete"), ("b", "complete"),
                                                            ("c", "complete")]
    assert (out / "a" / "manifest.json").read_text() == a_manifest, "a finished point is not rerun"
    assert "point 1/3" not in err and "point 2/3 b" in err and "point 3/3 c" in err
    for name in ("b", "c"):   # the earlier attempts are kept beside the new runs
        earlier = json.loads((out / f"{name}.attempt-1" / "manifest.json").read_text())
        assert earlier["status"] in ("failed", "interrupted")
        assert load_manifest(out / name).status == "complete"
    assert "a: complete" in stdout and "c: complete" in stdout


ISOLATED = """\
name: isolated-test
description: two simulator arms, the load generator on CPUs of its own
target:
  launch: sim
flags:
  max-num-seqs: 4
load:
  concurrency: [2]
  step_duration_s: 3
  warmup_s: 1
loadgen:
  workers: 1
  drain_s: 2
  collect_interval_s: 0.5
isolation:
  client_cpus: "{client}"
sweep:
  arms:
    a: {{block-size: 16}}
    b: {{block-size: 32}}
"""


def test_points_run_the_client_on_its_cpus_and_the_next_server_is_not_confined_there(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        import pytest

        pytest.skip("needs 2 usable CPUs")
    scenario = tmp_path / "iso.yaml"
    scenario.write_text(ISOLATED.format(client=allowed[-1]))
    out = tmp_path / "run"
    proc = sweep(str(scenario), "--out", str(out))
    wait_for("point b recording", lambda: recording(out / "b"), proc)
    # the first point's client CPUs were given back: b's server was started on all of them
    server_cpus = os.sched_getaffinity(load_manifest(out / "b").target.launch.pid)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert server_cpus == set(allowed)
    for name in ("a", "b"):
        point = json.loads((out / name / "manifest.json").read_text())
        assert point["status"] == "complete"
        assert point["isolation"] == {"server_cpus": None, "client_cpus": allowed[-1:]}
        # the scraper started after the manifest was written: its keys are kept
        assert point["metrics"]["interval_s"] == 0.5 and point["metrics"]["names_found"]
        assert len(list((out / name / "scrapes.parquet").glob("part-*.parquet"))) == 1
