"""The k-th smallest of many windows of one array at once: a wavelet matrix.

A replay's request emits at successive step ends, so the gaps between its tokens are a
window of its replica's step gaps, and the ITL quantiles it records read four order
statistics of that window (numpy's linear interpolation between two ranks, twice) and
its maximum. Sorting every request's window was half of building a 10-minute replay's
requests table (benchmarks/README.md, "Sixth pass"). The wavelet matrix answers every
window's k-th smallest with one vectorised pass per bit of the values' ranks (~14 for
the ~10k steps of a 10-minute replay): the same element a sort would put at k, so the
same value.
"""

from __future__ import annotations

import numpy as np


def kth_smallest(values: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 k: np.ndarray) -> np.ndarray:
    """``np.sort(values[lo[i]:hi[i]])[k[i]]`` for every i (0 <= k[i] < hi[i] - lo[i])."""
    n = len(values)
    order = np.argsort(values, kind="stable")
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    lo, hi, k = (np.asarray(a, np.int64) for a in (lo, hi, k))
    found = np.zeros(len(k), np.int64)
    zeros = np.zeros(n + 1, np.int64)
    for bit in range(max(n - 1, 1).bit_length() - 1, -1, -1):
        one = (rank >> bit) & 1 == 1
        np.cumsum(~one, out=zeros[1:])
        zl, zh = zeros[lo], zeros[hi]
        right = k >= zh - zl               # fewer than k + 1 zeros in the window: a one
        found[right] |= 1 << bit
        k = np.where(right, k - (zh - zl), k)
        lo = np.where(right, zeros[n] + lo - zl, zl)
        hi = np.where(right, zeros[n] + hi - zh, zh)
        rank = np.concatenate((rank[~one], rank[one]))   # the next level: zeros first, stably
    return values[order[found]]
