"""The knee's bootstrap: the detector columns of many resampled copies of a run, all at once.

Per step, resampled with replacement (as many draws as there are pieces):

- the scrape intervals: each interval's increments of the queue-time, TTFT and ITL
  histograms' ``_sum`` and ``_count`` (one row per endpoint and interval) give
  ``server_queue_mean_ms``, ``server_ttft_mean_ms``, ``server_itl_mean_ms`` (sum / count)
  and ``waiting_little`` (queue-time sum / window);
- the waiting gauge's snapshots give ``waiting_occupancy`` and ``waiting_mean``;
- the successful requests' client TTFTs give ``ttft_p50_ms`` (client-only runs vote on it).

A column a step has no pieces for keeps the step table's value; so does one the table
has as NaN. How, so that an hour-long run (30 steps of ~33k requests, 480 intervals)
costs milliseconds, not the 9 s of a loop of 6,000 medians:

1. Intervals and snapshots: a (resamples, n) matrix of drawn indices, turned into counts
   per resample, so every resample's sums are one matrix product counts @ pieces.
2. The median of n values resampled needs no indices. With the values sorted
   x_0 <= ... <= x_{n-1}, a draw is x at floor(n U), U uniform, and floor is monotone, so
   the k-th smallest of n draws is x at floor(n U_(k)), U_(k) the k-th smallest of n
   uniforms: U_(k) ~ Beta(k, n + 1 - k); the next, U_(k+1) = U_(k) + (1 - U_(k)) V with
   V ~ Beta(1, n - k) (the least of the n - k uniforms above it). The median is the middle
   order statistic (odd n) or the mean of the two middle ones (even n), as ``np.median``:
   the same distribution as the median of a resample, at O(1) per resample.

Seeded (``numpy.random.default_rng(seed)``, steps in table order): the same run and seed
give the same resamples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from loadlab.analyze.detectors import column
from loadlab.analyze.samples import increments
from loadlab.analyze.steps import RunData
from loadlab.analyze.windows import resolve_family, snapshots

HIST_ROLES = (("queue_time", "server_queue_mean_ms"), ("ttft", "server_ttft_mean_ms"),
              ("itl", "server_itl_mean_ms"))
RESAMPLED = ("server_queue_mean_ms", "server_ttft_mean_ms", "server_itl_mean_ms", "waiting_little",
             "waiting_occupancy", "waiting_mean", "ttft_p50_ms")


@dataclass
class Pieces:
    """Per step, what is resampled: histogram increments per scrape interval (rows;
    columns: sum and count of each of :data:`HIST_ROLES`, NaN for a family the run
    lacks), waiting-gauge snapshots, and the sorted client TTFTs."""

    hist: list[np.ndarray]
    waiting: list[np.ndarray]
    ttft: list[np.ndarray]


def resample(run: RunData, table: pd.DataFrame, n: int, seed: int) -> dict[str, np.ndarray]:
    """The :data:`RESAMPLED` columns of ``n`` resamples: arrays of shape (n, steps)."""
    rng = np.random.default_rng(seed)
    pieces = step_pieces(run, table)
    cols = {c: np.tile(column(table, c), (n, 1)) for c in RESAMPLED}
    length = (table["t_end"] - table["t_start"]).to_numpy(dtype=float)
    for i in range(len(table)):
        h = pieces.hist[i]
        if len(h):
            tot = _counts(rng, n, len(h)) @ h            # (n, 6): sums per resample
            with np.errstate(invalid="ignore", divide="ignore"):
                for k, (_, col) in enumerate(HIST_ROLES):
                    if not np.isnan(cols[col][0, i]):
                        s, c = tot[:, 2 * k], tot[:, 2 * k + 1]
                        cols[col][:, i] = np.where(c > 0, s / c * 1e3, np.nan)
            if not np.isnan(cols["waiting_little"][0, i]) and length[i] > 0:
                cols["waiting_little"][:, i] = tot[:, 0] / length[i]
        w = pieces.waiting[i]
        if len(w) and not np.isnan(cols["waiting_occupancy"][0, i]):
            counts = _counts(rng, n, len(w))
            cols["waiting_occupancy"][:, i] = counts @ (w >= 1) / len(w)
            cols["waiting_mean"][:, i] = counts @ w / len(w)
        t = pieces.ttft[i]
        if len(t):
            cols["ttft_p50_ms"][:, i] = median_resamples(rng, t, n) * 1e3
    return cols


def median_resamples(rng: np.random.Generator, x_sorted: np.ndarray, n: int) -> np.ndarray:
    """Medians of ``n`` resamples with replacement of ``x_sorted`` (ascending; step 2)."""
    m = len(x_sorted)
    k = (m + 1) // 2                                  # the lower middle, 1-based
    u = rng.beta(k, m + 1 - k, n)
    lo = x_sorted[np.minimum((m * u).astype(np.int64), m - 1)]
    if m % 2:
        return lo
    u2 = u + (1 - u) * rng.beta(1, m - k, n)
    return (lo + x_sorted[np.minimum((m * u2).astype(np.int64), m - 1)]) / 2


def step_pieces(run: RunData, table: pd.DataFrame) -> Pieces:
    hist_t, hist = _histogram_increments(run.metrics)
    family = resolve_family(run.metrics, "waiting") if not run.metrics.empty else None
    snaps = snapshots(run.metrics, family) if family else pd.DataFrame({"t": [], "value": []})
    snaps = snaps.sort_values("t", kind="stable")
    snap_t, snap_v = snaps["t"].to_numpy(dtype=float), snaps["value"].to_numpy(dtype=float)
    req = run.requests
    ok = (req["status"] == "ok").to_numpy(dtype=bool) if len(req) else np.zeros(0, dtype=bool)
    step = req["step"].to_numpy()[ok] if len(req) else np.zeros(0)
    sent = req["t_sent"].to_numpy(dtype=float)[ok] if len(req) else np.zeros(0)
    ttft = req["ttft_s"].to_numpy(dtype=float)[ok] if len(req) else np.zeros(0)
    out = Pieces([], [], [])
    for w in table.itertuples(index=False):
        a, b = np.searchsorted(hist_t, [w.t_start, w.t_end], side="right")  # t_start < t <= t_end
        out.hist.append(hist[a:b])
        a, b = np.searchsorted(snap_t, [w.t_start, w.t_end], side="left")  # t_start <= t < t_end
        out.waiting.append(snap_v[a:b])
        sel = ttft[(step == w.step) & (sent >= w.t_start) & (sent < w.t_end)]
        out.ttft.append(np.sort(sel[~np.isnan(sel)]))
    return out


def _histogram_increments(metrics: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Scrape times (sorted) and, per (endpoint, interval), the increments of each
    :data:`HIST_ROLES` family's sum and count: 0 where a family had none that interval,
    NaN columns for a family the run lacks."""
    series: dict[tuple[str, str], pd.Series] = {}
    for role, _ in HIST_ROLES:
        family = resolve_family(metrics, role) if not metrics.empty else None
        for kind in ("sum", "count"):
            if family:
                inc = increments(metrics, family, f"{family}_{kind}")
                series[(role, kind)] = inc.set_index(["endpoint", "t"])["value"]
    if not series:
        return np.zeros(0), np.zeros((0, 2 * len(HIST_ROLES)))
    frame = pd.DataFrame(series).fillna(0.0).reset_index().sort_values("t", kind="stable")
    cols = [frame[(role, kind)].to_numpy(dtype=float) if (role, kind) in frame
            else np.full(len(frame), np.nan) for role, _ in HIST_ROLES for kind in ("sum", "count")]
    return frame["t"].to_numpy(dtype=float), np.column_stack(cols)


def _counts(rng: np.random.Generator, n: int, m: int) -> np.ndarray:
    """(n, m) float: how often each of m pieces is drawn in each of n resamples of m draws."""
    idx = rng.integers(0, m, (n, m)) + (np.arange(n) * m)[:, None]
    return np.bincount(idx.ravel(), minlength=n * m).reshape(n, m).astype(float)
