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
    lo, hi, k = (np.array(a, np.int64) for a in (lo, hi, k))   # copies: updated in place
    found = np.zeros(len(k), np.int64)
    zeros = np.zeros(n + 1, np.int64)
    for bit in range(max(n - 1, 1).bit_length() - 1, -1, -1):
        one = (rank >> bit) & 1 == 1
        np.cumsum(~one, out=zeros[1:])
        zl, zh = zeros[lo], zeros[hi]
        in_window = zh - zl
        right = k >= in_window             # fewer than k + 1 zeros in the window: a one
        left = ~right
        found <<= 1                        # the bits, high to low
        found += right
        k -= in_window * right
        # the window one level down: among the zeros (first), or past them among the ones;
        # arithmetic on the masks, not np.where or masked stores (half the time)
        lo += zeros[n] - zl
        lo *= right
        lo += zl * left
        hi += zeros[n] - zh
        hi *= right
        hi += zh * left
        rank = np.concatenate((rank[~one], rank[one]))   # the next level: zeros first, stably
    return values[order[found]]
