"""Quantile tables and summaries of token counts (the derived figures profiles hold).

``quantile_table(values, probs)``: numpy linear-interpolation percentiles at ``probs``
(default ``PROBS``: 0 to 0.99 in steps of 0.005, then 0.9925 ... 0.9995 and 1), made
non-decreasing and rounded to 0.01 token. ``summary(values)``: n, mean, p10..p99, max.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from loadlab.workload.model import Summary, Table

PROBS: list[float] = [round(k * 0.005, 4) for k in range(199)] + [
    0.9925,
    0.995,
    0.9975,
    0.999,
    0.9995,
    1.0,
]
SUMMARY_P = (10, 25, 50, 75, 90, 99)


def quantile_table(values: np.ndarray, probs: Sequence[float] = PROBS) -> Table:
    v = np.percentile(values, np.asarray(probs) * 100.0)
    return Table(p=list(probs), v=[round(float(x), 2) for x in np.maximum.accumulate(v)])


def summary(values: np.ndarray) -> Summary:
    ps = np.percentile(values, SUMMARY_P)
    return Summary(
        n=int(values.size),
        mean=round(float(values.mean()), 2),
        **{f"p{p}": round(float(x), 2) for p, x in zip(SUMMARY_P, ps)},
        max=float(values.max()),
    )
