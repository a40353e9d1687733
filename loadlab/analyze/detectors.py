"""Per-step stall detectors and the fits they use: pure functions of the step table.

A detector votes per step: True (a persistent queue dominates), False, or None (its
inputs are missing). Parameters (module constants):

- ``queue`` (server histograms, counter deltas): the queue-time share of TTFT is at least
  QUEUE_SHARE (0.5) and the mean queue time is at least QUEUE_MIN_STEPS (2) engine steps
  (mean ITL): an arrival otherwise waits up to one step for the step in progress.
- ``occupancy`` (waiting gauge): P(waiting >= 1) over the step's snapshots >= OCCUPANCY (0.5).
- ``little`` (Little's law): time-mean waiting count (the larger of queue-time sum /
  window, a counter immune to gauge lag, and the gauge's mean) >= max(LITTLE_MIN (0.5),
  LITTLE_FRACTION (5%) of the client's in-flight count).
- ``hinge`` (closed loop, across steps): least squares of waiting = max(0, c - psi) over
  psi (grid of 0.05); a step votes stalled when c - psi >= HINGE_MARGIN (0.5). psi
  estimates the effective cap.
- ``growth`` (open loop): Theil-Sen slope of the client's in-flight count within the
  step (1 s samples, 90% interval): the lower bound is above 0 and the rise over the
  step is at least max(1, 10% of the mean in-flight): the queue grows without bound.
- ``achieved`` (open loop): requests finished per second < ACHIEVED (0.9) x offered.
- ``ttft_jump`` (client only, used when the run has no server metrics): client TTFT
  p50 >= TTFT_JUMP (3) x the lowest step's and at least 2 ITLs above it.

Cross-checks, shown but never voting: :func:`two_segment` (throughput plateau: linear
then flat, the break that minimises squared error, reported when it explains at least
half the residual of one line) and the TTFT trend (Theil-Sen slope of client TTFT over
send time within a step, "rising" when its lower bound is above 0 and the rise over the
step exceeds half the median TTFT; GuideLLM's over-saturation test).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import theilslopes

QUEUE_SHARE = 0.5
QUEUE_MIN_STEPS = 2.0
OCCUPANCY = 0.5
LITTLE_MIN = 0.5
LITTLE_FRACTION = 0.05
HINGE_MARGIN = 0.5
HINGE_GRID = 0.05
ACHIEVED = 0.9
TTFT_JUMP = 3.0
SLOPE_ALPHA = 0.90
SLOPE_MAX_POINTS = 400
SERVER = ("queue", "occupancy", "little", "hinge")
OPEN = ("queue", "occupancy", "little", "growth", "achieved")


@dataclass(frozen=True)
class HingeFit:
    psi: float          # effective cap: waiting = max(0, c - psi)
    r2: float           # share of the waiting variance explained


@dataclass(frozen=True)
class Slope:
    slope: float
    low: float
    high: float


@dataclass(frozen=True)
class Plateau:
    level: float | None  # first level of the flat segment; None when one line fits as well
    gain: float          # SSE reduction against one straight line (0..1)


def hinge_fit(levels: np.ndarray, waiting: np.ndarray) -> HingeFit | None:
    """Least-squares psi of waiting = max(0, c - psi); None with fewer than 2 points."""
    ok = ~(np.isnan(levels) | np.isnan(waiting))
    c, w = levels[ok], waiting[ok]
    if len(c) < 2:
        return None
    grid = np.arange(0.0, c.max() + HINGE_GRID, HINGE_GRID)
    pred = np.maximum(0.0, c[None, :] - grid[:, None])
    sse = ((pred - w[None, :]) ** 2).sum(axis=1)
    best = int(np.argmin(sse))
    total = float(((w - w.mean()) ** 2).sum())
    r2 = 1.0 - float(sse[best]) / total if total > 0 else 1.0
    return HingeFit(float(grid[best]), r2)


def theil_sen(x: np.ndarray, y: np.ndarray) -> Slope | None:
    """Theil-Sen slope of y over x with its SLOPE_ALPHA interval; None below 3 points.

    Its cost is quadratic in the points: above SLOPE_MAX_POINTS an evenly spaced subset
    (in x order) is used."""
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0:
        return None
    if len(x) > SLOPE_MAX_POINTS:
        order = np.argsort(x, kind="stable")
        keep = order[np.linspace(0, len(x) - 1, SLOPE_MAX_POINTS).astype(int)]
        x, y = x[keep], y[keep]
    slope, _, low, high = theilslopes(y, x, alpha=SLOPE_ALPHA)
    return Slope(float(slope), float(low), float(high))


def two_segment(levels: np.ndarray, y: np.ndarray) -> Plateau:
    """Linear then flat (continuous at the break): the break level that fits best."""
    ok = ~(np.isnan(levels) | np.isnan(y))
    x, v = levels[ok], y[ok]
    if len(x) < 3:
        return Plateau(None, 0.0)
    line = np.polyfit(x, v, 1)
    sse_line = float(((np.polyval(line, x) - v) ** 2).sum())
    best: tuple[float, float | None] = (sse_line, None)
    for xb in x[1:-1]:
        design = np.column_stack([np.ones_like(x), np.minimum(x, xb)])
        coef, *_ = np.linalg.lstsq(design, v, rcond=None)
        sse = float(((design @ coef - v) ** 2).sum())
        if sse < best[0]:
            best = (sse, float(xb))
    gain = 1.0 - best[0] / sse_line if sse_line > 0 else 0.0
    return Plateau(best[1] if gain >= 0.5 else None, gain)


def queue_vote(queue_ms: float, ttft_ms: float, step_ms: float) -> bool | None:
    if np.isnan(queue_ms) or np.isnan(ttft_ms) or ttft_ms <= 0:
        return None
    floor = QUEUE_MIN_STEPS * step_ms if not np.isnan(step_ms) else 0.0
    return bool(queue_ms >= QUEUE_SHARE * ttft_ms and queue_ms >= floor)


def little_vote(waiting: float, inflight: float) -> bool | None:
    if np.isnan(waiting):
        return None
    scale = 0.0 if np.isnan(inflight) else LITTLE_FRACTION * inflight
    return bool(waiting >= max(LITTLE_MIN, scale))


def occupancy_vote(occupancy: float) -> bool | None:
    return None if np.isnan(occupancy) else bool(occupancy >= OCCUPANCY)


def step_votes(table: pd.DataFrame, closed: bool, waiting: np.ndarray, hinge: HingeFit | None,
               growth: list[Slope | None] | None = None) -> pd.DataFrame:
    """One row per step, one column per detector (True / False / None)."""
    step_ms = _first(table, "server_itl_mean_ms", "itl_p50_ms")
    votes: dict[str, list[bool | None]] = {
        "queue": [queue_vote(q, t, s) for q, t, s in zip(column(table, "server_queue_mean_ms"),
                                                         column(table, "server_ttft_mean_ms"), step_ms)],
        "occupancy": [occupancy_vote(o) for o in column(table, "waiting_occupancy")],
        "little": [little_vote(w, i) for w, i in zip(waiting, column(table, "inflight"))],
    }
    levels = table["level"].to_numpy(dtype=float)
    if closed:
        votes["hinge"] = [None if hinge is None or np.isnan(w) else bool(c - hinge.psi >= HINGE_MARGIN)
                          for c, w in zip(levels, waiting)]
    else:
        window = (table["t_end"] - table["t_start"]).to_numpy(dtype=float)
        votes["growth"] = [None if g is None else _grows(g, span, infl)
                           for g, span, infl in zip(growth or [None] * len(table), window,
                                                    column(table, "inflight"))]
        votes["achieved"] = [None if np.isnan(r) or np.isnan(c) else bool(r < ACHIEVED * c)
                             for r, c in zip(column(table, "rps"), levels)]
    server = any(v is not None for name in ("queue", "occupancy", "little") for v in votes[name])
    if not server and closed:
        votes["ttft_jump"] = ttft_jump(table)
    return pd.DataFrame(votes, index=table.index, dtype=object)


def ttft_jump(table: pd.DataFrame) -> list[bool | None]:
    ttft = column(table, "ttft_p50_ms")
    itl = column(table, "itl_p50_ms")
    if np.all(np.isnan(ttft)):
        return [None] * len(table)
    base = np.nanmin(ttft)
    gap = 2 * np.nan_to_num(np.nanmedian(itl) if not np.all(np.isnan(itl)) else 0.0)
    return [None if np.isnan(t) else bool(t >= TTFT_JUMP * base and t >= base + gap) for t in ttft]


def inflight_slopes(requests: pd.DataFrame, table: pd.DataFrame, dt: float = 1.0) -> list[Slope | None]:
    """Per step, Theil-Sen slope of the client's in-flight count sampled every ``dt`` s."""
    sent = requests["t_sent"].to_numpy(dtype=float)
    done = requests["t_done"].to_numpy(dtype=float)
    done = np.where(np.isnan(done), np.inf, done)
    order_s, order_d = np.sort(sent[~np.isnan(sent)]), np.sort(done)
    out: list[Slope | None] = []
    for w in table.itertuples(index=False):
        t = np.arange(w.t_start, w.t_end, dt)
        count = (np.searchsorted(order_s, t, side="right")
                 - np.searchsorted(order_d, t, side="right")).astype(float)
        out.append(theil_sen(t - w.t_start, count))
    return out


def ttft_trend(requests: pd.DataFrame, table: pd.DataFrame) -> list[bool | None]:
    """Per step: does the client's TTFT rise within the step (cross-check only)?"""
    ok = requests[requests["status"] == "ok"]
    out: list[bool | None] = []
    for w in table.itertuples(index=False):
        inside = ok[(ok.t_sent >= w.t_start) & (ok.t_sent < w.t_end)]
        fit = theil_sen(inside.t_sent.to_numpy(dtype=float) - w.t_start,
                        inside.ttft_s.to_numpy(dtype=float))
        if fit is None:
            out.append(None)
            continue
        rise = fit.slope * (w.t_end - w.t_start)
        out.append(bool(fit.low > 0 and rise > 0.5 * float(inside.ttft_s.median())))
    return out


def _grows(fit: Slope, span: float, inflight: float) -> bool:
    rise = fit.slope * span
    return bool(fit.low > 0 and rise >= max(1.0, 0.1 * np.nan_to_num(inflight)))


def column(table: pd.DataFrame, col: str) -> np.ndarray:
    """A numeric column as floats (NaN where absent or not a number)."""
    if col not in table:
        return np.full(len(table), np.nan)
    return pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=float)


def _first(table: pd.DataFrame, *cols: str) -> np.ndarray:
    out = np.full(len(table), np.nan)
    for col in reversed(cols):
        x = column(table, col)
        out = np.where(np.isnan(x), out, x)
    return out
