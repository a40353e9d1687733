"""Plain Locust is a way in: ``locust -f loadlab/loadgen/locustfile.py --headless`` with
LOADLAB_CONCURRENCY writes a run folder (rows, manifest with one window per step) that
``loadlab analyze`` judges, as it judges one of ``loadlab run``.

Locust runs in a subprocess (it gevent-patches whatever imports it; tests/conftest.py),
against the built-in simulator; the test waits for each process to exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from loadlab.runstore import REQUESTS, read_manifest, read_table
from loadlab.sim.serve.testing import running_sim

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadlab" / "loadgen" / "locustfile.py"
LEVELS = [2, 4]


def test_headless_locust_steps_land_in_a_manifest_that_analyze_judges(tiny_profile, tmp_path):
    out = tmp_path / "locust"
    env = {**os.environ, "LOADLAB_MODEL": "m", "LOADLAB_PROFILE": str(tiny_profile),
           "LOADLAB_CONCURRENCY": ",".join(map(str, LEVELS)), "LOADLAB_STEP_DURATION": "3",
           "LOADLAB_WARMUP": "1", "LOADLAB_OUT": str(out)}
    with running_sim(served_model_name="m", max_num_seqs=2, time_scale=5) as url:
        argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", url,
                "--only-summary"]
        locust = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                                check=False)
    assert locust.returncode == 0, locust.stderr[-3000:]

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
