"""Turn a trace into a profile's derived figures (no raw rows leave this module).

Steps and defaults
1. Length tables: numpy linear-interpolation percentiles of input and output lengths
   at ``PROBS`` (0 to 0.99 in steps of 0.005, then 0.9925 ... 0.9995 and 1), rounded
   to 0.01 token; summaries hold n, mean, p10..p99 and max. Weighted pmfs (ServeGen)
   use the step inverse CDF instead.
2. Correlation: when |Spearman| or |Pearson of ln-lengths| is at least
   ``PAIR_THRESHOLD`` (0.3), keep ``PAIR_COUNT`` (1,500) rank pairs drawn without
   replacement (seeded), each rank quantised to a ``PAIR_GRID`` (1,000) grid.
3. Arrivals: rate = (n - 1) / span; CV of inter-arrival gaps; gamma shape 1/CV^2,
   or Poisson when |CV - 1| < 0.1 (shape capped at 10,000 for periodic traces); index of
   dispersion of counts in full 1 s and 60 s bins; busiest minute / mean. Timestamps on a
   coarse grid (more than half the gaps exactly 0) are first spread uniformly (seeded)
   inside each grid slot, the grid being the median non-zero gap, since zero gaps describe
   the logger, not users.
4. Prefix (traces with prefix-block hash ids): sessions fitted by
   :mod:`loadlab.workload.session_fit`; tables from :mod:`loadlab.workload.tables`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from loadlab.workload.model import (
    Arrivals,
    ArrivalStats,
    Joint,
    Lengths,
    Prefix,
    ProfileModel,
    Source,
    Summary,
    Table,
)
from loadlab.workload.session_fit import fit_prefix
from loadlab.workload.tables import PROBS, SUMMARY_P, quantile_table, summary
from loadlab.workload.traces import TraceData

PAIR_THRESHOLD = 0.3
PAIR_COUNT = 1500
PAIR_GRID = 1000
MIN_CV = 0.01  # near-periodic traces: cap the gamma shape at 1 / MIN_CV^2 = 10,000


def pmf_quantile(values: np.ndarray, weights: np.ndarray, probs: Sequence[float]) -> np.ndarray:
    """Step inverse CDF of a weighted pmf: the smallest value whose CDF reaches p."""
    order = np.argsort(values)
    vals, w = values[order], weights[order]
    cdf = np.cumsum(w) / w.sum()
    idx = np.searchsorted(cdf, np.asarray(probs) - 1e-12, side="left")
    return vals[np.minimum(idx, vals.size - 1)]


def pmf_table(values: np.ndarray, weights: np.ndarray) -> Table:
    v = pmf_quantile(values, weights, PROBS).astype(float)
    v[0] = float(values.min())
    return Table(p=PROBS, v=[float(x) for x in v])


def pmf_summary(values: np.ndarray, weights: np.ndarray, n: float) -> Summary:
    ps = pmf_quantile(values, weights, [p / 100 for p in SUMMARY_P])
    mean = float((values * weights).sum() / weights.sum())
    return Summary(
        n=round(n),
        mean=round(mean, 2),
        **{f"p{p}": float(x) for p, x in zip(SUMMARY_P, ps)},
        max=float(values[weights > 0].max()),
    )


def _ranks(x: np.ndarray) -> np.ndarray:
    """Mid-ranks in (0, 1): ties share the middle of their run."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    first = np.searchsorted(sorted_x, sorted_x, side="left")
    last = np.searchsorted(sorted_x, sorted_x, side="right")
    r = np.empty(x.size)
    r[order] = (first + last) / 2.0 / x.size
    return r


def correlations(inp: np.ndarray, out: np.ndarray) -> tuple[float, float]:
    """(Spearman, Pearson of ln-lengths). A side of one length (a fixed-length benchmark
    load) carries no dependence to measure: 0 for both, where numpy would divide by a zero
    deviation and give NaN."""
    if np.ptp(inp) == 0 or np.ptp(out) == 0:
        return 0.0, 0.0
    spearman = float(np.corrcoef(_ranks(inp), _ranks(out))[0, 1])
    log_pearson = float(np.corrcoef(np.log(inp), np.log(out))[0, 1])
    return spearman, log_pearson


def rank_pairs(inp: np.ndarray, out: np.ndarray, seed: int = 0) -> Joint:
    """Empirical copula of a seeded subsample: ranks are taken within the subsample, so
    each side is uniform on the grid and the marginals come only from the tables."""
    gen = np.random.default_rng(seed)
    pick = np.sort(gen.choice(inp.size, size=min(PAIR_COUNT, inp.size), replace=False))
    ri = np.minimum((_ranks(inp[pick]) * PAIR_GRID).astype(int), PAIR_GRID - 1)
    ro = np.minimum((_ranks(out[pick]) * PAIR_GRID).astype(int), PAIR_GRID - 1)
    spearman, _ = correlations(inp, out)
    return Joint(
        grid=PAIR_GRID,
        pairs=[[int(i), int(o)] for i, o in zip(ri, ro)],
        spearman=round(spearman, 4),
    )


def fit_lengths(trace: TraceData, paired: bool | None = None) -> Lengths:
    inp, out = trace.input_tokens.astype(float), trace.output_tokens.astype(float)
    if paired is None:
        paired = inp.size > 2 and max(abs(c) for c in correlations(inp, out)) >= PAIR_THRESHOLD
    return Lengths(
        input=quantile_table(inp),
        output=quantile_table(out),
        input_summary=summary(inp),
        output_summary=summary(out),
        joint=rank_pairs(inp, out) if paired else None,
    )


def _spread_grid(ts: np.ndarray, seed: int = 0) -> tuple[np.ndarray, float | None]:
    ts = np.sort(ts)
    gaps = np.diff(ts)
    if gaps.size < 2 or np.mean(gaps == 0) <= 0.5:
        return ts, None
    grid = float(np.median(gaps[gaps > 0]))
    jitter = np.random.default_rng(seed).uniform(0.0, grid, ts.size)
    return np.sort(ts + jitter), grid


def _dispersion(ts: np.ndarray, width: float) -> float | None:
    """Variance / mean of request counts in full bins of ``width`` seconds (1 for Poisson)."""
    counts = _counts_per(ts, width)
    if counts.size < 2 or counts.mean() <= 0:
        return None
    return round(float(counts.var() / counts.mean()), 3)


def fit_arrivals(timestamps_s: np.ndarray | None) -> Arrivals:
    if timestamps_s is None or timestamps_s.size < 3 or np.ptp(timestamps_s) <= 0:
        return Arrivals(
            process="none", stats=ArrivalStats(note="the source has no usable timestamps")
        )
    ts, grid = _spread_grid(timestamps_s - timestamps_s.min())
    ts = ts - ts[0]
    span = float(ts[-1])
    rate = (ts.size - 1) / span
    gaps = np.diff(ts)
    cv = float(gaps.std() / gaps.mean())
    per_minute = _counts_per(ts, 60.0)
    note = (
        f"timestamps lie on a {grid:.3g} s grid; "
        "requests were spread uniformly inside each slot before fitting"
        if grid
        else None
    )
    stats = ArrivalStats(
        span_s=round(span, 3),
        dispersion_1s=_dispersion(ts, 1.0),
        dispersion_60s=_dispersion(ts, 60.0),
        peak_minute_over_mean=round(float(per_minute.max() / per_minute.mean()), 3)
        if per_minute.size
        else None,
        note=note,
    )
    if abs(cv - 1.0) < 0.1:
        return Arrivals(process="poisson", rate_per_s=round(rate, 5), cv=round(cv, 4), stats=stats)
    return Arrivals(
        process="gamma",
        rate_per_s=round(rate, 5),
        cv=round(cv, 4),
        gamma_shape=round(1.0 / max(cv, MIN_CV) ** 2, 6),
        stats=stats,
    )


def _counts_per(ts: np.ndarray, width: float) -> np.ndarray:
    bins = int(ts[-1] // width)
    return (
        np.bincount((ts[ts < bins * width] // width).astype(int), minlength=bins)
        if bins
        else np.array([])
    )


def fit_profile(
    trace: TraceData, name: str, description: str, source: Source, paired: bool | None = None
) -> ProfileModel:
    """A complete profile from a trace; ``paired=None`` decides from the correlation."""
    prefix = Prefix(kind="none")
    if trace.hash_ids:
        prefix = fit_prefix(trace.hash_ids, trace.input_tokens, trace.block_tokens or 1,
                            trace.timestamps_s)
    return ProfileModel(
        name=name,
        description=description,
        source=source,
        lengths=fit_lengths(trace, paired),
        arrivals=fit_arrivals(trace.timestamps_s),
        prefix=prefix,
    )
