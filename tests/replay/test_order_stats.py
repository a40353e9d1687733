"""Windows' order statistics and the ITL figures read from them equal a sort's, exactly."""

from __future__ import annotations

import numpy as np
import pytest

from loadlab.replay.order_stats import kth_smallest
from loadlab.replay.records import gap_quantiles, window_gap_quantiles


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000])
def test_kth_smallest_is_the_sorted_windows_element(n: int) -> None:
    rng = np.random.default_rng(n)
    values = rng.exponential(size=n).round(2)          # rounded: ties among them
    lo = rng.integers(0, n, 400)
    hi = np.minimum(n, lo + 1 + rng.integers(0, n, 400))
    k = (rng.random(400) * (hi - lo)).astype(np.int64)
    want = [np.sort(values[a:b])[c] for a, b, c in zip(lo, hi, k, strict=True)]
    asked = [a.copy() for a in (lo, hi, k)]
    assert kth_smallest(values, lo, hi, k).tolist() == want
    assert all(np.array_equal(a, b) for a, b in zip(asked, (lo, hi, k), strict=True))  # untouched


def test_window_quantiles_equal_the_sorted_gaps_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    timelines = [np.cumsum(rng.exponential(0.03, size=n)) for n in (300, 5, 120)]
    timeline = rng.integers(0, 3, 500)
    size = np.array([len(t) for t in timelines])[timeline]
    count = 2 + (rng.random(500) * (size - 1)).astype(np.int64)
    first = (rng.random(500) * (size - count + 1)).astype(np.int64)
    got = window_gap_quantiles(timelines, timeline, first, count)
    want = gap_quantiles([timelines[t][f:f + c] for t, f, c in
                          zip(timeline, first, count, strict=True)])
    assert np.array_equal(got, np.stack(want))
