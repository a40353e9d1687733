"""A/B deltas: bootstrap intervals that cover what they should, on synthetic and simulated data."""

from __future__ import annotations

import numpy as np
import pytest

from loadlab.report.ab import bootstrap_change, compare_arms
from loadlab.report.inputs import load


def _p50(rows: np.ndarray) -> np.ndarray:
    return np.percentile(rows, 50, axis=-1)


def test_interval_covers_a_known_doubling_and_excludes_zero():
    rng = np.random.default_rng(1)
    a = rng.lognormal(mean=4.0, sigma=0.5, size=400)
    b = 2 * rng.lognormal(mean=4.0, sigma=0.5, size=400)
    low, high = bootstrap_change(a, b, _p50, np.random.default_rng(0))
    assert 0 < low < 1.0 < high        # +100% inside, 0 outside


def test_interval_of_two_samples_of_one_distribution_includes_zero():
    rng = np.random.default_rng(2)
    a, b = rng.exponential(1.0, size=300), rng.exponential(1.0, size=300)
    low, high = bootstrap_change(a, b, _p50, np.random.default_rng(0))
    assert low < 0 < high


def test_empty_arm_has_no_interval():
    low, high = bootstrap_change(np.array([]), np.array([1.0, 2.0]), _p50, np.random.default_rng(0))
    assert np.isnan(low) and np.isnan(high)


def test_raising_the_sequence_cap_shows_where_it_binds(ab_sweep):
    runs = load(ab_sweep)
    arm = compare_arms(runs.point("max_num_seqs=8"), runs.point("max_num_seqs=32"))
    by_level = {lv.level: {d.metric: d for d in lv.deltas} for lv in arm.levels}
    assert sorted(by_level) == [2, 4, 8, 16, 32]
    # below the smaller cap both servers behave alike: no verdict either way
    assert by_level[4]["ttft_p99_ms"].verdict == "same"
    # past it, the capped server queues: the larger cap cuts TTFT and raises throughput
    ttft = by_level[16]["ttft_p99_ms"]
    assert ttft.verdict == "better" and ttft.high < -0.5
    assert ttft.low <= ttft.change <= ttft.high
    assert by_level[16]["out_tok_s"].verdict == "better"
    assert by_level[16]["out_tok_s"].base == pytest.approx(
        runs.point("max_num_seqs=8").steps.set_index("concurrency").loc[16, "out_tok_s"])
