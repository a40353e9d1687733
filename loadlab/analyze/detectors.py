"""Per-step stall detectors and the fits they use: pure functions of the step table.

A detector votes per step: True (a persistent queue dominates), False, or None (its
inputs are missing). Parameters (module constants):

- ``queue`` (server histograms, counter deltas): the queue-time share of TTFT is at least
  QUEUE_SHARE (0.5) and the mean queue time is at least QUEUE_MIN_STEPS (2) engine steps
  (mean ITL): an arrival otherwise waits up to one step for the step in progress.
- ``occupancy`` (waiting gauge): P(waiting >= 1) over the step's snapshots >= OCCUPANCY
  (0.5), or >= OCCUPANCY_DENSE (0.6) where the step has DENSE_SNAPSHOTS (20) or more.
  The gauge is read in time, the stall is defined in engine steps (the scheduler refuses
  the head in at least half of them: :mod:`loadlab.analyze.measured`), and steps that
  leave requests waiting run longer than the rest (a full token budget of prefill, a
  drained batch refilling), so the time share runs above the step share. On the held-out
  tuning seeds, with 1 s scrapes, a bar of 0.5 called 12 of 445 unstalled steps stalled
  and 0.6 called 1, missing 1 of 305 stalled ones; with 4-6 scrapes a step the share moves
  in quarters and fifths, and 0.6 (three of five) missed 7 of 378 stalled steps. No
  vote where the running gauge read 0 in more than STALE_MAX (a quarter) of the
  snapshots taken while tokens flowed (``gauge_stale``, :mod:`loadlab.analyze.gauge_lag`):
  an API server short of CPU publishes its gauges late, and a waiting gauge that reads 0
  then says nothing about the queue.
- ``little`` (Little's law): time-mean waiting count (the larger of queue-time sum /
  window, a counter immune to gauge lag, and the gauge's mean) >= LITTLE_MIN (0.5), at
  any load. A V1 engine takes new requests into its waiting queue between steps and the
  next ``schedule()`` admits them unless a limit binds (``vllm/v1/core/sched/scheduler.py``),
  so a queue-free engine's time-mean waiting is ~0 however many requests are in flight;
  0.5 is a queue of one present half the time (the knee's own definition of a stall). A
  floor that grew with in-flight (5% of it) missed the one-deep queue right above a cap
  of 64 and put the knee a step late.
- A light queue vetoes a stall (:func:`light_queue`): with fewer than DENSE_SNAPSHOTS
  scrapes a step, where more than a fifth of them saw no queue (occupancy below
  LIGHT_OCCUPANCY, 0.8) and the time-mean waiting count is below LIGHT_QUEUE (2), the step
  is not stalled whatever the detectors' majority. With 4-6 scrapes a step, three queued
  scrapes of five carry the occupancy vote, and a queue of a request or two that each
  next step admits (an open loop's arrivals wait for the step in progress) fills them as
  a refused head does; a one-deep queue above a cap is seen in (nearly) every scrape (a
  gateway test's capped replica: 4 of 5, refused in 93% of the engine steps). On the
  held-out tuning seeds (the spent validation8 to validation13, 1,200), at 15 s scrapes
  108 unstalled steps were called stalled against 12 stalled ones missed, and 16 runs
  the scheduler never stalled got a knee and a cause; the veto gave cause right 1,103 ->
  1,114 (13 fixed, 11 of them runs now judged never stalled; 2 broken: measured budgets
  whose knee moved up a level, onto the measured one, where no cause scored) and knee
  within one level 1,189 -> 1,196 (bars of 1 and 1.5: +4 and +7; 3: +13; 5: +10, breaking
  5 more); an occupancy bar of 1 (any scrape without a queue) or 0.8 gave the same.
  In a closed loop the queue must also be under LIGHT_SHARE (a fifth) of the requests in
  flight: above a cap of 4, six users queue two at most, and a real vLLM's 5 s step
  (tests/vllm/test_analyzer_vllm.py, 7 scrapes) averaged 1.66 waiting, seen in 5 scrapes
  of 7; the veto put its knee a level late. On the tuning seeds (validation8 to
  validation15, 1,600) a fifth left cause right as it was and moved one knee two levels early
  (a tenth: knee within one level 4 fewer; a quarter: as a fifth, with less margin).
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

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
from scipy.stats import theilslopes

from loadlab.analyze.windows import rows_in

QUEUE_SHARE = 0.5
QUEUE_MIN_STEPS = 2.0
OCCUPANCY = 0.5
OCCUPANCY_DENSE = 0.6
DENSE_SNAPSHOTS = 20
STALE_MAX = 0.25
LITTLE_MIN = 0.5
LIGHT_QUEUE = 2.0
LIGHT_OCCUPANCY = 0.8
LIGHT_SHARE = 0.2
HINGE_MARGIN = 0.5
HINGE_GRID = 0.05
ACHIEVED = 0.9
TTFT_JUMP = 3.0
SLOPE_ALPHA = 0.90
SLOPE_MAX_POINTS = 400
# The step-table columns :func:`votes` reads.
VOTE_COLUMNS = (
    "level",
    "t_start",
    "t_end",
    "inflight",
    "rps",
    "server_queue_mean_ms",
    "server_ttft_mean_ms",
    "server_itl_mean_ms",
    "itl_p50_ms",
    "ttft_p50_ms",
    "waiting_occupancy",
    "waiting_snapshots",
    "gauge_stale",
)
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
    psi, sse = hinge_psi(c, w[None, :])
    total = float(((w - w.mean()) ** 2).sum())
    r2 = 1.0 - float(sse[0]) / total if total > 0 else 1.0
    return HingeFit(float(psi[0]), r2)


def hinge_psi(c: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``w`` (B, len(c); no NaN): the psi of the grid 0, HINGE_GRID, ... max(c)
    that minimises the squared error of w = max(0, c - psi) (the lowest among equals), and
    that error.

    The same answer as evaluating the whole grid, at a few points per level: between two
    consecutive levels the error is a quadratic in psi (the levels above psi are fixed),
    so the best grid point there is one of the two beside the quadratic's vertex, or an
    end of the interval. Only those candidates are evaluated, by the same arithmetic.
    """
    grid = np.arange(0.0, c.max() + HINGE_GRID, HINGE_GRID)
    edges = np.unique(np.concatenate([[0.0], c[(c > 0) & (c < grid[-1])], [grid[-1]]]))
    above = c[None, :] >= edges[1:, None]                  # (intervals, levels): active above psi
    n_above = above.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        vertex = ((c - w) @ above.T.astype(float)) / n_above  # (B, intervals); NaN when none above
    ends = np.concatenate([np.searchsorted(grid, edges[:-1], side="left"),
                           np.searchsorted(grid, edges[1:], side="right") - 1])
    near = np.searchsorted(grid, np.nan_to_num(vertex, nan=grid[-1]))
    ends = np.append(ends, 0)                              # one candidate even when max(c) is 0
    cand = np.concatenate([np.broadcast_to(ends, (len(w), len(ends))), near - 1, near], axis=1)
    cand = np.sort(np.clip(cand, 0, len(grid) - 1), axis=1)
    pred = np.maximum(0.0, c[None, None, :] - grid[cand][:, :, None])
    sse = ((pred - w[:, None, :]) ** 2).sum(axis=2)
    best = np.argmin(sse, axis=1)                          # first of equals: the lowest psi
    rows = np.arange(len(w))
    return grid[cand[rows, best]], sse[rows, best]


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


def votes(
    cols: pd.DataFrame | Mapping[str, np.ndarray],
    closed: bool,
    waiting: np.ndarray,
    psi: float | np.ndarray | None,
    growth: list[Slope | None] | None = None,
) -> dict[str, np.ndarray]:
    """Every detector's votes: 1.0 stalled, 0.0 not, NaN no vote (inputs missing).

    ``cols``: the step table, or a mapping of its columns as arrays whose last axis is
    the step (the bootstrap passes (resamples, steps) arrays beside the table's own
    1-D ones); ``waiting``: the waiting level per step; ``psi``: the hinge's effective
    cap (one, or one per resample), None without a fit. Votes come out in the shape
    all inputs broadcast to.
    """
    get = partial(column, cols)
    with np.errstate(invalid="ignore"):
        step_ms = _first(get("server_itl_mean_ms"), get("itl_p50_ms"))
        queue, ttft = get("server_queue_mean_ms"), get("server_ttft_mean_ms")
        inflight, levels = get("inflight"), get("level")
        floor = np.where(np.isnan(step_ms), 0.0, QUEUE_MIN_STEPS * step_ms)
        out = {
            "queue": _vote(
                ~np.isnan(queue) & (ttft > 0), (queue >= QUEUE_SHARE * ttft) & (queue >= floor)
            ),
            "occupancy": _vote(
                ~np.isnan(get("waiting_occupancy")) & ~(get("gauge_stale") > STALE_MAX),
                get("waiting_occupancy") >= np.where(
                    occupancy_decides(cols), OCCUPANCY_DENSE, OCCUPANCY),
            ),
        }
        out["little"] = _vote(~np.isnan(waiting), waiting >= LITTLE_MIN)
        if closed:
            cap = np.full(1, np.nan) if psi is None else np.asarray(psi, dtype=float)[..., None]
            out["hinge"] = _vote(~np.isnan(waiting) & ~np.isnan(cap), levels - cap >= HINGE_MARGIN)
        else:
            window = get("t_end") - get("t_start")
            out["growth"] = np.array(
                [
                    np.nan if g is None else float(_grows(g, span, infl))
                    for g, span, infl in zip(growth or [None] * len(levels), window, inflight)
                ]
            )
            rps = get("rps")
            out["achieved"] = _vote(~np.isnan(rps) & ~np.isnan(levels), rps < ACHIEVED * levels)
        server = np.any(
            ~np.isnan(np.stack(np.broadcast_arrays(out["queue"], out["occupancy"], out["little"]))),
            axis=(0, -1),
        )                  # per resample: any server detector voted
        if closed and not np.all(server):
            out["ttft_jump"] = np.where(
                server[..., None], np.nan, ttft_jump(get("ttft_p50_ms"), get("itl_p50_ms"))
            )
    shape = np.broadcast_shapes(*(v.shape for v in out.values()))
    return {k: np.broadcast_to(v, shape) for k, v in out.items()}


def light_queue(cols: pd.DataFrame | Mapping[str, np.ndarray], waiting: np.ndarray,
                closed: bool) -> np.ndarray:
    """Per step: too few scrapes for occupancy to decide alone (:func:`occupancy_decides`),
    more than a fifth of them saw no queue (occupancy below LIGHT_OCCUPANCY), and the
    time-mean waiting count (``waiting``, as ``little`` reads it) is below LIGHT_QUEUE and,
    in a closed loop, below LIGHT_SHARE of the requests in flight: no stall, whatever the
    detectors' majority (:func:`loadlab.analyze.knee.state_codes`)."""
    occupancy = column(cols, "waiting_occupancy")
    bar = LIGHT_QUEUE if not closed else np.fmin(
        LIGHT_QUEUE, LIGHT_SHARE * np.nan_to_num(column(cols, "inflight"), nan=np.inf))
    return (~occupancy_decides(cols) & (np.nan_to_num(occupancy, nan=1.0) < LIGHT_OCCUPANCY)
            & (np.nan_to_num(waiting, nan=np.inf) < bar))


def occupancy_decides(cols: pd.DataFrame | Mapping[str, np.ndarray]) -> np.ndarray:
    """Per step: the waiting gauge was read DENSE_SNAPSHOTS times or more, enough for its
    share of queued scrapes to be the step's state alone (:mod:`loadlab.analyze.knee`,
    step 3)."""
    return column(cols, "waiting_snapshots") >= DENSE_SNAPSHOTS


def step_votes(table: pd.DataFrame, closed: bool, waiting: np.ndarray, hinge: HingeFit | None,
               growth: list[Slope | None] | None = None) -> pd.DataFrame:
    """One row per step, one column per detector (True / False / None)."""
    found = votes(table, closed, waiting, None if hinge is None else hinge.psi, growth)
    return pd.DataFrame(
        {k: [None if np.isnan(x) else bool(x) for x in v] for k, v in found.items()},
        index=table.index,
        dtype=object,
    )


def ttft_jump(ttft: np.ndarray, itl: np.ndarray) -> np.ndarray:
    """Votes (as :func:`votes`): client TTFT p50 at least TTFT_JUMP x the lowest step's and
    2 ITLs above it."""
    if ttft.shape[-1] == 0:
        return ttft.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)    # a row of NaN: no vote, as wanted
        base = np.nanmin(ttft, axis=-1, keepdims=True)
        gap = 2 * np.nan_to_num(np.nanmedian(itl, axis=-1, keepdims=True))
    return _vote(~np.isnan(ttft), (ttft >= TTFT_JUMP * base) & (ttft >= base + gap))


def inflight_slopes(
    requests: pd.DataFrame, table: pd.DataFrame, dt: float = 1.0
) -> list[Slope | None]:
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
    ok = (requests["status"] == "ok").to_numpy(dtype=bool)
    sent, ttft = (
        requests["t_sent"].to_numpy(dtype=float)[ok],
        requests["ttft_s"].to_numpy(dtype=float)[ok],
    )
    starts, ends = table["t_start"].to_numpy(dtype=float), table["t_end"].to_numpy(dtype=float)
    out: list[bool | None] = []
    for rows, start, end in zip(rows_in(sent, starts, ends), starts, ends):
        fit = theil_sen(sent[rows] - start, ttft[rows])
        if fit is None:
            out.append(None)
            continue
        rise = fit.slope * (end - start)
        out.append(bool(fit.low > 0 and rise > 0.5 * float(np.nanmedian(ttft[rows]))))
    return out


def _vote(known: np.ndarray, stalled: np.ndarray) -> np.ndarray:
    return np.where(known, np.asarray(stalled, dtype=float), np.nan)


def _grows(fit: Slope, span: float, inflight: float) -> bool:
    rise = fit.slope * span
    return bool(fit.low > 0 and rise >= max(1.0, 0.1 * np.nan_to_num(inflight)))


def column(table: pd.DataFrame | Mapping[str, np.ndarray], col: str) -> np.ndarray:
    """A numeric column as floats (NaN where absent or not a number); a mapping's arrays
    as they are (all columns present)."""
    if not isinstance(table, pd.DataFrame):
        return np.asarray(table[col], dtype=float)
    if col not in table:
        return np.full(len(table), np.nan)
    return pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=float)


def _first(*arrays: np.ndarray) -> np.ndarray:
    """Element-wise the first of the arrays that is not NaN."""
    out = np.full(1, np.nan)
    for x in reversed(arrays):
        out = np.where(np.isnan(x), out, x)
    return out
