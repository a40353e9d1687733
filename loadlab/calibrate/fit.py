"""Fit one server's step-time model to its real runs by least squares.

Observations, per closed-loop level of every run (:mod:`loadlab.calibrate.runs`): vLLM's
mean prefill time and mean inter-token latency. The engine replays the level
(:mod:`loadlab.calibrate.simulate`) and sums each request's step features over its
prefill and its decode steps; with a step time linear in its terms those means are linear
in the terms, so a non-negative least squares on relative errors fits them. The batches
the replay forms depend a little on the step time itself (who arrives before a step
starts), so the fit is repeated from its own answer a few times.

A term stays only when the data supports it: one that no step exercises, one the fit
sets to zero, or one whose removal moves the RMS relative error by less than
:data:`SUPPORT_RMS` is dropped, and named with its reason in the calibration. The front
end and the turnaround are per-level differences of measured means (``Level.front_s``,
``Level.turnaround_s``), each a line in the requests in flight (the closed loop's users)
whose slope stays only when it explains at least half their spread over three or more
levels.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from loadlab.calibrate.check import check_levels, summarize
from loadlab.calibrate.runs import Level, Run, read_run
from loadlab.calibrate.simulate import simulate_level
from loadlab.sim.engine.calibration import TERMS, Calibration, StepTerms
from loadlab.sim.engine.step_model import calibrated_step_time

ITERATIONS = 3
SUPPORT_RMS = 0.005     # a term worth less than half a percent of RMS error is not kept
SLOPE_R2 = 0.5


def fit_runs(paths: Sequence[str | Path]) -> Calibration:
    """The calibration of the server behind the run folders ``paths`` (one server)."""
    runs = [read_run(p) for p in paths]
    levels = [(run, level) for run in runs for level in run.levels]
    dropped: dict[str, str] = {}
    front = _line([lv for _, lv in levels], "front", dropped)
    turn = _line([lv for _, lv in levels], "turnaround", dropped)
    terms = StepTerms(fixed_s=min(lv.hist["itl_s"] for _, lv in levels))
    for _ in range(ITERATIONS):
        rows, targets = _observations(levels, terms)
        coef, step_dropped = least_squares(np.array(rows), np.array(targets))
        terms = StepTerms(**dict(zip(TERMS, coef, strict=True)))
    cal = Calibration(step=terms, front_s=front[0], front_per_in_flight_s=front[1],
                      turnaround_s=turn[0], turnaround_per_in_flight_s=turn[1],
                      dropped={**step_dropped, **dropped}, runs=[str(r.path) for r in runs],
                      server=runs[0].server)
    cal.fit_errors = summarize(check_levels(cal, runs))
    return cal


def _observations(levels: list[tuple[Run, Level]],
                  terms: StepTerms) -> tuple[list[np.ndarray], list[float]]:
    """Feature rows and measured means: mean prefill and mean ITL per level."""
    step_time = calibrated_step_time(Calibration(step=terms))
    rows, targets = [], []
    for run, level in levels:
        measured = Calibration(step=terms, front_s=level.front_s, turnaround_s=level.turnaround_s)
        trace = simulate_level(run.settings, level, step_time, measured.front, measured.turnaround)
        if not len(trace.ttft_s):
            continue
        rows.append(trace.prefill_x.mean(axis=0))
        targets.append(level.hist["prefill_s"])
        if trace.decode_gaps.sum() > 0:
            rows.append(trace.decode_x.sum(axis=0) / trace.decode_gaps.sum())
            targets.append(level.hist["itl_s"])
    return rows, targets


def least_squares(features: np.ndarray, measured: np.ndarray) -> tuple[list[float], dict[str, str]]:
    """Non-negative coefficients of :data:`TERMS` minimising the RMS relative error, and
    the terms dropped (see the module docstring). Only a zero drops the fixed term."""
    weighted = features / measured[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    dropped = {TERMS[j]: "no step of the fit runs exercises it"
               for j in range(len(TERMS)) if scale[j] == 0}
    keep = [j for j in range(len(TERMS)) if scale[j] > 0]

    def solve(cols: list[int]) -> tuple[np.ndarray, float]:
        x, _ = nnls(weighted[:, cols] / scale[cols], np.ones(len(measured)))
        x = x / scale[cols]
        return x, float(np.sqrt(np.mean((weighted[:, cols] @ x - 1.0) ** 2)))

    x, rms = solve(keep)
    for j, value in zip(list(keep), x, strict=True):
        if value == 0:
            keep.remove(j)
            dropped[TERMS[j]] = "the fit sets it to zero (the data asks for a negative value)"
    x, rms = solve(keep)
    while len(keep) > 1:
        trials = {j: solve([k for k in keep if k != j])[1] for j in keep if j != 0}
        j, rms_without = min(trials.items(), key=lambda item: item[1])
        if rms_without - rms >= SUPPORT_RMS:
            break
        keep.remove(j)
        dropped[TERMS[j]] = (f"without it the RMS error moves {rms_without - rms:+.2%} "
                             f"(< {SUPPORT_RMS:.1%}): these runs do not support it")
        x, rms = solve(keep)
    coef = [0.0] * len(TERMS)
    for j, value in zip(keep, x, strict=True):
        coef[j] = float(value)
    return coef, dropped


def _line(levels: list[Level], name: str, dropped: dict[str, str]) -> tuple[float, float]:
    """(intercept, slope per request in flight) of ``Level.<name>_s`` over the levels'
    users; the slope is dropped (and named) when it explains under half their spread."""
    rate = np.array([lv.concurrency for lv in levels], float)
    value = np.array([getattr(lv, f"{name}_s") for lv in levels])
    mean = float(value.mean())
    field = f"{name}_per_in_flight_s"
    spread = float(((value - mean) ** 2).sum())
    if len(levels) >= 3 and np.ptp(rate) > 0 and spread > 0:
        slope, intercept = np.polyfit(rate, value, 1)
        r2 = 1 - float(((value - (intercept + slope * rate)) ** 2).sum()) / spread
        if r2 >= SLOPE_R2:
            return max(0.0, float(intercept)), float(slope)
        dropped[field] = f"the requests in flight explain {r2:.0%} of its spread (< {SLOPE_R2:.0%})"
    else:
        dropped[field] = "it does not vary, or fewer than three levels ran different numbers"
    return mean, 0.0
