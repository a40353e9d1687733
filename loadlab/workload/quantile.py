"""Inverse-CDF tables as functions: ``QuantileFn(table)(u)`` and its inverse ``cdf(x)``.

Linear interpolation between table points, evaluated with bisect: the sampler calls
it a few times per request, where numpy's per-call dispatch would cost more.
"""

from __future__ import annotations

from bisect import bisect_right

from loadlab.workload.model import Table


class QuantileFn:
    """Inverse CDF from a table, evaluated with bisect (no numpy in the hot path)."""

    def __init__(self, table: Table) -> None:
        self.p = list(table.p)
        self.v = list(table.v)

    def __call__(self, u: float) -> float:
        k = bisect_right(self.p, u) - 1
        if k >= len(self.p) - 1:
            return self.v[-1]
        p0, p1 = self.p[k], self.p[k + 1]
        return self.v[k] + (self.v[k + 1] - self.v[k]) * (u - p0) / (p1 - p0)

    def cdf(self, x: float) -> float:
        """Probability at ``x``: the inverse of the table (the middle of a flat run)."""
        lo, hi = bisect_right(self.v, x - 1e-9), bisect_right(self.v, x)
        if lo != hi:  # x is a table value, held over [p[lo], p[hi - 1]]
            return (self.p[lo] + self.p[hi - 1]) / 2
        if hi == 0:
            return 0.0
        if hi >= len(self.v):
            return 1.0
        v0, v1 = self.v[hi - 1], self.v[hi]
        return self.p[hi - 1] + (self.p[hi] - self.p[hi - 1]) * (x - v0) / (v1 - v0)
