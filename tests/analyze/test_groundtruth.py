"""The analyzer against ground truth from the simulator's own engine state.

Every cause the simulator can produce, at 1 s and 15 s scrapes, jittered step times,
two seeds: the knee within one step of the truth and the right cause. The truth comes
from the engine (groundtruth.py); the analyzer sees only the run folder.
``benchmarks/groundtruth_matrix.py`` runs the larger matrix and prints its confusion matrix.
"""

from __future__ import annotations

import pytest
from groundtruth import SCENARIOS, run_scenario

from loadlab.analyze.analysis import analyze_run

CASES = [(name, interval, seed) for name in SCENARIOS for interval, seed in ((1.0, 0), (15.0, 1))]


def within_one_step(levels: tuple[float, ...], got: float | None, truth: float | None) -> bool:
    """Both None (no knee), or at most one level apart in the plan."""
    if got is None or truth is None:
        return got is None and truth is None
    return abs(levels.index(got) - levels.index(truth)) <= 1


@pytest.mark.parametrize("name,interval,seed", CASES)
def test_knee_and_cause_match_the_engine(tmp_path, name, interval, seed):
    sc = SCENARIOS[name]
    truth = run_scenario(sc, tmp_path, seed=seed, metrics_interval_s=interval)
    assert truth.cause == name.removesuffix("_open"), truth  # the limit it was built to bind
    analysis = analyze_run(tmp_path)
    knee = analysis.knee
    got = knee.upper if knee.found else None
    assert within_one_step(sc.levels, got, truth.upper), (knee, truth)
    assert analysis.cause.name == truth.cause, (analysis.cause.ranked, truth)
    assert analysis.verdict.startswith("knee between" if truth.upper else "never stalled")
