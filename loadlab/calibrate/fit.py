"""Fit one server's step-time model to its real runs by least squares.

Observations, per closed-loop level of every run (:mod:`loadlab.calibrate.runs`): vLLM's
mean prefill time and mean inter-token latency. The engine replays the level
(:mod:`loadlab.calibrate.simulate`) and sums each request's step features over its
prefill and its decode steps; with a step time linear in its terms those means are linear
in the terms, so a non-negative least squares on relative errors fits them. The batches
the replay forms depend a little on the step time itself (who arrives before a step
starts), so the fit is repeated from its own answer a few times. Those means carry the
server's own jitter: they are divided by the one-user levels' mean over median
(:func:`mean_over_median`), so the terms give a step's median, and the replay draws each
step about it with that mean (:func:`loadlab.sim.engine.step_model.calibrated_step_time`),
as every later replay of the calibration does.

A term stays only when the data supports it (:mod:`loadlab.calibrate.terms`): one that
no step exercises, one the fit loads cannot tell apart from another (per context token
from per request when every request has the same lengths), one the fit sets to zero, or
one without which the levels, each left
out of the fit in turn, are predicted about as well, is dropped, and named with its
reason in the calibration. The front
end and the turnaround are per-level differences of measured means (``Level.front_s``,
``Level.turnaround_s``), each a line in the requests in flight (the closed loop's users)
whose slope stays only when it explains at least half their spread over three or more
levels; the front end has a step besides, once another request is in flight (:func:`_front`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from loadlab.calibrate.check import REPLICAS, check_levels, summarize
from loadlab.calibrate.runs import Level, Run, read_run
from loadlab.calibrate.simulate import simulate_level
from loadlab.calibrate.terms import least_squares
from loadlab.sim.engine.calibration import TERMS, Calibration, StepTerms
from loadlab.sim.engine.step_model import Delays, calibrated_step_time

ITERATIONS = 3
SLOPE_R2 = 0.5


def fit_runs(paths: Sequence[str | Path]) -> Calibration:
    """The calibration of the server behind the run folders ``paths`` (one server)."""
    return fit([read_run(p) for p in paths])


def fit(runs: Sequence[Run]) -> Calibration:
    """The calibration of the server behind ``runs``, read already (a caller may have
    rescaled their times first, e.g. to one host speed)."""
    return fit_with_table(runs)[0]


def fit_with_table(runs: Sequence[Run]) -> tuple[Calibration, pd.DataFrame]:
    """:func:`fit`, and the per-level table on ``runs`` its fit errors summarize
    (:func:`loadlab.calibrate.check.check_levels`): a caller that prints it needs no second
    replay of every level."""
    skew = mean_over_median([level for run in runs for level in run.levels])
    levels = [(run, level) for run in runs for level in run.levels]
    dropped: dict[str, str] = {}
    front = _front([lv for _, lv in levels], dropped)
    turn = _line([lv for _, lv in levels], "turnaround", dropped)
    terms = StepTerms(fixed_s=min(lv.hist["itl_s"] for _, lv in levels) / skew)
    for _ in range(ITERATIONS):
        rows, targets, groups = _observations(levels, terms, skew)
        coef, step_dropped = least_squares(np.array(rows), np.array(targets), TERMS,
                                           np.array(groups))
        terms = StepTerms(**dict(zip(TERMS, coef, strict=True)))
    cal = Calibration(step=terms, front_s=front[0], front_per_in_flight_s=front[1],
                      front_busy_s=front[2],
                      turnaround_s=turn[0], turnaround_per_in_flight_s=turn[1],
                      dropped={**step_dropped, **dropped}, runs=[str(r.path) for r in runs],
                      server=runs[0].server, mean_over_median=skew)
    table = check_levels(cal, runs)
    cal.fit_errors = summarize(table)
    return cal, table


def mean_over_median(levels: Sequence[Level]) -> float:
    """vLLM's histograms give the fit means, while the check, and a user, read medians. With
    one request running alone every step is alike, so there its mean gap over the client's
    median gap is the server's own jitter (1.07-1.16 on the CPU host of
    benchmarks/README.md). A step model without jitter, fitted to means, would add it to
    every step and predict medians that much high, so the fit's targets are divided by it
    (the front end and turnaround are differences of means, left as they are).
    1.0 without a one-user level."""
    alone = [lv.hist["itl_s"] / lv.client["itl_p50_s"] for lv in levels
             if lv.concurrency == 1 and lv.client["itl_p50_s"] > 0]
    return float(np.median(alone)) if alone else 1.0


def _observations(levels: list[tuple[Run, Level]], terms: StepTerms,
                  skew: float) -> tuple[list[np.ndarray], list[float], list[int]]:
    """Feature rows and measured means over ``skew`` (:func:`mean_over_median`): mean
    prefill and mean ITL per level, and the index of the level each row comes from (the
    unit the term choice leaves out). Each level's rows pool the replays the check pools
    (:data:`~loadlab.calibrate.check.REPLICAS` seeds of the jitter): one replay's batches,
    and so its rows, move with its draws."""
    rows, targets, groups = [], [], []
    for index, (run, level) in enumerate(levels):
        measured = Calibration(step=terms, front_s=level.front_s, turnaround_s=level.turnaround_s,
                               mean_over_median=skew)
        traces = [simulate_level(run.settings, level, calibrated_step_time(measured, seed),
                                 Delays(measured, seed)) for seed in range(REPLICAS)]
        prefill = np.concatenate([t.prefill_x for t in traces])
        if not len(prefill):
            continue
        rows.append(prefill.mean(axis=0))
        targets.append(level.hist["prefill_s"] / skew)
        groups.append(index)
        gaps = sum(t.decode_gaps.sum() for t in traces)
        if gaps > 0:
            rows.append(sum(t.decode_x.sum(axis=0) for t in traces) / gaps)
            targets.append(level.hist["itl_s"] / skew)
            groups.append(index)
    return rows, targets, groups


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


def _front(levels: list[Level], dropped: dict[str, str]) -> tuple[float, float, float]:
    """(intercept, slope per request in flight, step while another is in flight) of
    ``Level.front_s`` over the levels' users. The step: alone, the API server has the CPU
    to itself; beside a stepping engine it shares it (on the CPU host a one-user level's
    front end was 6-10 ms, four users' 19-37 ms, sixteen users' 34-56 ms: a jump, then a
    slope), so one line through all levels is high at one user and low just past it. The
    step needs one-user levels and others; the slope is judged as :func:`_line` judges it,
    over the levels with others in flight. Non-negative least squares."""
    users = np.array([lv.concurrency for lv in levels], float)
    value = np.array([lv.front_s for lv in levels])
    busy = users > 1
    if busy.all() or not busy.any():
        dropped["front_busy_s"] = ("the fit runs need levels of one user and of more to tell "
                                   "the API server alone from beside the engine")
        return (*_line(levels, "front", dropped), 0.0)
    crowd = [lv for lv, b in zip(levels, busy, strict=True) if b]
    _, slope = _line(crowd, "front", dropped)
    columns = [np.ones_like(users), busy.astype(float)] + ([users] if slope else [])
    coef, _ = nnls(np.column_stack(columns), value)
    return float(coef[0]), float(coef[2]) if slope else 0.0, float(coef[1])
