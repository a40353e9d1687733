"""`loadlab sim calibrate` on a REAL vLLM (tiny model, CPU): a short step load, the fit,
and a replay with ``--calibration``. Structure only (no timing asserts: the server's
step times on 2 shared cores move by tens of percent); the held-out accuracy is
benchmarks/calibrate_tiny_vllm.py's.

The run is a ``--target`` run (the server's flags unknown to it), so calibrate first
refuses it, naming ``server.max_num_seqs``; with the flags written into the manifest, as
that refusal says, the fit goes through.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from realvllm import SEQ_CAP
from test_analyzer_vllm import PROFILES, load_argv, run_load

from loadlab.sim.engine.calibration import load

pytestmark = pytest.mark.vllm


def test_calibrate_a_real_run_then_replay_with_it(vllm_server, tmp_path):
    target = vllm_server(**SEQ_CAP)
    run = run_load(load_argv(target, tmp_path / "run", "tiny-short", [1, 2, 4], 6.0, 1.5),
                   tmp_path / "run", 200)
    cal_path = tmp_path / "server.yaml"
    calibrate = [sys.executable, "-m", "loadlab", "sim", "calibrate", str(run), "--out",
                 str(cal_path)]
    refused = subprocess.run(calibrate, capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "server.max_num_seqs" in refused.stderr, refused.stderr

    manifest = json.loads((run / "manifest.json").read_text())
    manifest["server"] = target.server_settings()
    (run / "manifest.json").write_text(json.dumps(manifest))
    fitted = subprocess.run(calibrate, capture_output=True, text=True, check=False)
    assert fitted.returncode == 0, fitted.stderr
    assert "median |err|" in fitted.stdout and "jitter:" in fitted.stdout
    cal = load(cal_path)
    assert cal.step.fixed_s + cal.step.per_request_s > 0
    # measured on the 1-user level (1.0 is the default where there is none)
    assert 0.8 < cal.mean_over_median < 2.0 and cal.mean_over_median != 1.0
    assert all(v >= 0 for v in cal.step.values()) and cal.front_s >= 0
    assert set(cal.fit_errors) >= {"ttft_p50_median_abs_err", "e2e_p50_median_abs_err"}
    assert cal.server["num_gpu_blocks_override"] == 512 and cal.server["max_num_seqs"] == 4

    replay = tmp_path / "replay"
    done = subprocess.run([sys.executable, "-m", "loadlab", "sim", "replay", "--calibration",
                           str(cal_path), "--profile", str(PROFILES / "tiny-short.yaml"),
                           "--concurrency", "1,4", "--step-duration", "10", "--out", str(replay)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    server = json.loads((replay / "manifest.json").read_text())["server"]
    assert server["calibration"]["path"] == str(cal_path)
    assert server["calibration"]["fit_errors"] == cal.fit_errors
    assert (server["max_num_seqs"], server["num_gpu_blocks"], server["block_size"]) == (4, 512, 32)
