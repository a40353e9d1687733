"""The real-vLLM calibration benchmark's host-speed correction (benchmarks/hostspeed.py):
a run made on a host 1.5x slower than the fit's is predicted 1.5x fast, and scaled to the
fit's host speed by the meter's reading it is predicted right.

The runs are `sim replay --calibration`: the "slow host" run's every constant (step terms,
front end, turnaround) is the fit server's times 1.5, which is what a host running at
two thirds of its speed does to a CPU-bound server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from loadlab.calibrate.check import check_levels
from loadlab.calibrate.fit import fit
from loadlab.calibrate.runs import read_run
from loadlab.cli.sim import sim
from loadlab.sim.engine.calibration import Calibration, StepTerms

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from hostspeed import COLUMNS, GATE, at_speed, level_speeds, off_gate, reference_speed

PROFILES = Path(__file__).resolve().parents[1] / "vllm" / "profiles"
SERVER = {"max_num_seqs": 8, "max_num_batched_tokens": 256, "block_size": 32,
          "num_gpu_blocks_override": 512, "max_model_len": 1024}
SLOW = 1.5


def calibration(scale: float) -> Calibration:
    return Calibration(
        step=StepTerms(fixed_s=4e-3 * scale, per_request_s=0.4e-3 * scale,
                       per_prefill_token_s=25e-6 * scale, per_context_token_s=1e-6 * scale),
        front_s=6e-3 * scale, front_per_in_flight_s=1e-3 * scale, turnaround_s=3e-3 * scale,
        server=SERVER)


def replay(root: Path, name: str, scale: float, profile: str, levels: str) -> Path:
    calibration(scale).save(root / f"{name}.yaml")
    result = CliRunner().invoke(sim, [
        "replay", "--calibration", str(root / f"{name}.yaml"),
        "--profile", str(PROFILES / f"{profile}.yaml"), "--concurrency", levels,
        "--step-duration", "20", "--warmup", "3", "--interval", "0.5", "--out", str(root / name)])
    assert result.exit_code == 0, result.output
    return root / name


def meter_samples(run: Path, rate: float) -> list[str]:
    """Meter lines (t0, t1, units, cpu_s) every 0.25 s over ``run``'s steps at ``rate``
    units per CPU-second, the meter getting half the CPU."""
    steps = json.loads((run / "manifest.json").read_text())["steps"]
    t, end, lines = steps[0]["t_start"], steps[-1]["t_end"], []
    while t + 0.25 <= end:
        lines.append(f"{t:.3f},{t + 0.25:.3f},{rate * 0.125:.3f},0.125")
        t += 0.25
    return lines


def test_a_slow_host_run_is_predicted_right_at_one_host_speed(tmp_path):
    fit_runs = [replay(tmp_path, "fit-prefill", 1.0, "tiny-prefill", "1,2"),
                replay(tmp_path, "fit-short", 1.0, "tiny-short", "1,2,4,8")]
    slow = replay(tmp_path, "slow-long", SLOW, "tiny-long", "2,6")
    cal = fit([read_run(p) for p in fit_runs])

    raw = check_levels(cal, [read_run(slow)])
    for metric in ("itl", "e2e"):   # predicted as if the host ran at the fit's speed
        assert (raw[f"{metric}_err"] < -0.25).all(), raw.to_string()

    # the fit's host did 1,000 units a CPU-second, the slow host two thirds of that
    meter = tmp_path / "hostspeed-0.csv"
    meter.write_text("\n".join(meter_samples(slow, 1000 / SLOW)) + "\n")
    speeds = level_speeds(pd.read_csv(meter, names=COLUMNS), read_run(slow))
    assert speeds == {users: pytest.approx(1000 / SLOW, rel=1e-4) for users in (2, 6)}
    scaled = check_levels(cal, [at_speed(read_run(slow), speeds, ref=1000.0)])
    for metric in ("ttft", "itl", "e2e"):
        assert scaled[f"{metric}_err"].abs().max() < 0.15, scaled.to_string()


def test_a_level_the_meter_did_not_see_is_refused(tmp_path):
    run = replay(tmp_path, "run", 1.0, "tiny-short", "1,2")
    with pytest.raises(ValueError, match="no host speed for 2 users"):
        at_speed(read_run(run), {1: 1000.0}, ref=1000.0)


def test_the_gate_keeps_levels_near_the_fit_speed_and_flags_the_rest():
    ref = reference_speed([{1: 900.0, 4: 1000.0}, {1: 1100.0, 8: np.nan}])
    assert ref == pytest.approx(1000.0)
    lo, hi = GATE
    off = off_gate({1: lo * ref, 4: hi * ref, 8: 0.99 * lo * ref, 16: 1.01 * hi * ref,
                    32: np.nan}, ref)
    assert sorted(off) == [8, 16, 32]           # unseen by the meter: measured again too
    assert off[8] == pytest.approx(0.99 * lo) and off[16] == pytest.approx(1.01 * hi)
