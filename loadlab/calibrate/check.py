"""Predicted against measured, per closed-loop level: the calibration's replay of each level
(:mod:`loadlab.calibrate.simulate`, the front end drawn per request at its users) against
the client's TTFT, ITL and E2E medians of the real run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from loadlab.calibrate.runs import Run, read_run
from loadlab.calibrate.simulate import simulate_level
from loadlab.sim.engine.calibration import Calibration
from loadlab.sim.engine.step_model import Delays, calibrated_step_time

METRICS = ("ttft", "itl", "e2e")
REPLICAS = 4     # replays pooled per level, each with its own seed of the jitter


def check_runs(cal: Calibration, paths: Sequence[str | Path]) -> pd.DataFrame:
    """The per-level table of :func:`check_levels` for the run folders ``paths``."""
    return check_levels(cal, [read_run(p) for p in paths])


def check_levels(cal: Calibration, runs: Sequence[Run]) -> pd.DataFrame:
    """One row per level: run, profile, concurrency, and for TTFT, ITL and E2E p50 the
    measured and predicted seconds and the relative error (predicted / measured - 1).
    The prediction pools :data:`REPLICAS` replays of the level, each with its own seed of the
    calibration's jitter (steps and front end): one replay's p50 moves with its draws (TTFT's
    at a few users by 20% and more on the CPU host), and the real level is one draw of its
    server's."""
    rows = []
    for run in runs:
        for level in run.levels:
            traces = [simulate_level(run.settings, level, calibrated_step_time(cal, seed),
                                     Delays(cal, seed)) for seed in range(REPLICAS)]
            row: dict[str, object] = {"run": Path(run.path).name, "profile": level.profile,
                                      "concurrency": level.concurrency}
            predicted = {
                "ttft": np.median(np.concatenate([t.ttft_s for t in traces])),
                "itl": np.nanmedian(np.concatenate([t.itl_p50_s for t in traces])),
                "e2e": np.median(np.concatenate([t.e2e_s for t in traces]))}
            for name in METRICS:
                real = level.client[f"{name}_p50_s"]
                row[f"{name}_real_ms"] = round(real * 1e3, 2)
                row[f"{name}_sim_ms"] = round(float(predicted[name]) * 1e3, 2)
                row[f"{name}_err"] = float(predicted[name]) / real - 1
            rows.append(row)
    return pd.DataFrame(rows)


def summarize(table: pd.DataFrame) -> dict[str, float]:
    """Median and largest absolute relative error over levels, per metric."""
    out: dict[str, float] = {}
    for name in METRICS:
        err = table[f"{name}_err"].abs()
        out[f"{name}_p50_median_abs_err"] = round(float(err.median()), 4)
        out[f"{name}_p50_max_abs_err"] = round(float(err.max()), 4)
    return out


def format_table(table: pd.DataFrame) -> list[str]:
    """Lines of the per-level table, errors in percent, and the medians over levels."""
    head = f"{'run':<20} {'users':>5}" + "".join(
        f" {name + ' p50 real/sim ms':>24} {'err':>7}" for name in METRICS)
    lines = [head]
    for row in table.itertuples():
        cells = "".join(
            f" {getattr(row, f'{n}_real_ms'):>11.1f} /{getattr(row, f'{n}_sim_ms'):>10.1f}"
            f" {getattr(row, f'{n}_err'):>+7.1%}" for n in METRICS)
        lines.append(f"{row.run[:20]:<20} {row.concurrency:>5}{cells}")
    medians = "".join(f" {'median |err|':>24} {table[f'{n}_err'].abs().median():>7.1%}"
                      for n in METRICS)
    lines.append(f"{'':<20} {'':>5}{medians}")
    return lines
