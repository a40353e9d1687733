"""Plain Locust is a way in: ``locust -f loadlab/loadgen/locustfile.py --headless`` with
LOADLAB_CONCURRENCY writes a run folder (rows, manifest with one window per step) that
``loadlab analyze`` judges, as it judges one of ``loadlab run``.

Locust runs in a subprocess (it gevent-patches whatever imports it; tests/conftest.py),
against the built-in simulator; the test waits for each process to exit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from loadlab.runstore import REQUESTS, read_manifest, read_table
from loadlab.sim.serve.testing import running_sim

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadlab" / "loadgen" / "locustfile.py"
LEVELS = [2, 4]


def _headless_locust(profile: Path, out: Path, stop_at_level: int | None = None) -> int:
    """LOADLAB_CONCURRENCY=2,4 steps of 3 s (1 s warm-up) against the simulator, to its exit;
    with ``stop_at_level``, SIGINT (Ctrl-C) as soon as Locust logs that the shape moved to it.
    Returns Locust's exit code."""
    env = {**os.environ, "LOADLAB_MODEL": "m", "LOADLAB_PROFILE": str(profile),
           "LOADLAB_CONCURRENCY": ",".join(map(str, LEVELS)), "LOADLAB_STEP_DURATION": "3",
           "LOADLAB_WARMUP": "1", "LOADLAB_OUT": str(out)}
    with running_sim(served_model_name="m", max_num_seqs=2, time_scale=5) as url:
        argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", url,
                "--only-summary"]
        with subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) as locust:
            assert locust.stderr is not None
            log = []
            for line in locust.stderr:   # until Locust exits (or closes its stderr)
                log.append(line)
                if stop_at_level is not None and f"updating to {stop_at_level} users" in line:
                    locust.send_signal(signal.SIGINT)
            code = locust.wait(timeout=60)
    assert stop_at_level is not None or code == 0, "".join(log[-40:])
    return code


def test_headless_locust_steps_land_in_a_manifest_that_analyze_judges(tiny_profile, tmp_path):
    out = tmp_path / "locust"
    _headless_locust(tiny_profile, out)

    manifest = read_manifest(out)
    assert manifest["kind"] == "run" and manifest["status"] == "complete"
    assert manifest["locust"] == {"runner": "local"}
    steps = manifest["steps"]
    assert [(s["step"], s["concurrency"], s["warmup_s"]) for s in steps] == [(0, 2, 1.0),
                                                                             (1, 4, 1.0)]
    assert steps[0]["t_end"] <= steps[1]["t_start"] < steps[1]["t_end"]
    for s in steps:
        assert s["t_end"] - s["t_start"] >= 2.5, s   # the 3 s asked (the shape ticks every 1 s)
        assert s["inflight_mean"] is not None and "client_limited" in s, s  # achieved load joined
    requests = read_table(out / "requests.parquet", REQUESTS)
    records = manifest["records"]
    assert records["rows"] == len(requests) == sum(records["issued_by_worker"].values())
    assert records["missing_by_worker"] == {}
    ok = requests[requests.status == "ok"]
    assert sorted(ok.step.unique()) == [0, 1]
    assert (ok.concurrency == ok.step.map(dict(enumerate(LEVELS)))).all()

    analyze = subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(out)],
                             capture_output=True, text=True, timeout=120, check=False)
    assert analyze.returncode == 0, analyze.stderr[-3000:]
    analysis = json.loads((out / "analysis.json").read_text())
    assert [s["concurrency"] for s in analysis["steps"]] == LEVELS
    assert all(s["n_ok"] > 0 for s in analysis["steps"]), analysis["steps"]


def test_a_run_stopped_before_its_last_step_ends_is_interrupted_with_the_step_cut(tiny_profile,
                                                                                  tmp_path):
    out = tmp_path / "cut"
    _headless_locust(tiny_profile, out, stop_at_level=LEVELS[1])  # Ctrl-C as step 1 begins
    manifest = read_manifest(out)
    assert manifest["status"] == "interrupted"
    steps = manifest["steps"]
    assert [s["concurrency"] for s in steps] == LEVELS
    assert steps[1]["t_end"] - steps[1]["t_start"] < 2.5, steps[1]   # cut short
    # The Ctrl-C came as step 0's window was being completed: that work was not lost.
    assert steps[0]["inflight_mean"] is not None and "client_limited" in steps[1], steps
    requests = read_table(out / "requests.parquet", REQUESTS)
    assert manifest["records"]["rows"] == len(requests) > 0
