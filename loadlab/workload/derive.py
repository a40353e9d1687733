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
   or Poisson when |CV - 1| < 0.1 (shape capped at 10,000 for periodic traces); index of dispersion of counts in full 1 s and 60 s
   bins; busiest minute / mean. Timestamps on a coarse grid (more than half the gaps
   exactly 0) are first spread uniformly (seeded) inside each grid slot, the grid
   being the median non-zero gap, since zero gaps describe the logger, not users.
4. Prefix (traces with prefix-block hash ids): leading block positions whose modal id
   is in >= 90% of requests form the common prefix; a request's shared prefix is the
   leading run of its blocks that occur in two or more requests (x block tokens, capped
   at its length); requests are grouped by their first block after the common part.
   Groups of two or more give ``group_sizes``, ``group_share``, ``group_window`` (n),
   ``group_prefix_tokens`` (per group, the median shared prefix of its members, at
   least the common prefix) and ``grouped_tail_tokens`` (per grouped request, input
   minus its group's prefix, at least 1); lone requests give ``ungrouped_input``. Paired
   profiles get each row's grouped flag as a third rank-pair element, with input ranks
   taken within the row's kind. Reuse figures are computed in trace order with an
   infinite cache.
"""

from __future__ import annotations

from collections import Counter
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
from loadlab.workload.traces import TraceData

PROBS: list[float] = [round(k * 0.005, 4) for k in range(199)] + [
    0.9925,
    0.995,
    0.9975,
    0.999,
    0.9995,
    1.0,
]
PAIR_THRESHOLD = 0.3
PAIR_COUNT = 1500
PAIR_GRID = 1000
COMMON_SHARE = 0.9
MIN_CV = 0.01  # near-periodic traces: cap the gamma shape at 1 / MIN_CV^2 = 10,000
_SUMMARY_P = (10, 25, 50, 75, 90, 99)


def quantile_table(values: np.ndarray) -> Table:
    v = np.percentile(values, np.asarray(PROBS) * 100.0)
    return Table(p=PROBS, v=[round(float(x), 2) for x in np.maximum.accumulate(v)])


def summary(values: np.ndarray) -> Summary:
    ps = np.percentile(values, _SUMMARY_P)
    return Summary(
        n=int(values.size),
        mean=round(float(values.mean()), 2),
        **{f"p{p}": round(float(x), 2) for p, x in zip(_SUMMARY_P, ps)},
        max=float(values.max()),
    )


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
    ps = pmf_quantile(values, weights, [p / 100 for p in _SUMMARY_P])
    mean = float((values * weights).sum() / weights.sum())
    return Summary(
        n=round(n),
        mean=round(mean, 2),
        **{f"p{p}": float(x) for p, x in zip(_SUMMARY_P, ps)},
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
    """(Spearman, Pearson of ln-lengths)."""
    spearman = float(np.corrcoef(_ranks(inp), _ranks(out))[0, 1])
    log_pearson = float(np.corrcoef(np.log(inp), np.log(out))[0, 1])
    return spearman, log_pearson


def rank_pairs(
    inp: np.ndarray, out: np.ndarray, grouped: np.ndarray | None = None, seed: int = 0
) -> Joint:
    """Empirical copula of a seeded subsample: ranks are taken within the subsample, so
    each side is uniform on the grid and the marginals come only from the tables.
    ``grouped`` adds each row's prefix-group flag as a third element."""
    gen = np.random.default_rng(seed)
    pick = np.sort(gen.choice(inp.size, size=min(PAIR_COUNT, inp.size), replace=False))
    ri = _ranks(inp[pick])
    if (
        grouped is not None
    ):  # the sampler maps grouped and lone input ranks through different tables
        flags = grouped[pick]
        for kind in (flags, ~flags):
            if kind.any():
                ri[kind] = _ranks(inp[pick][kind])
    ri = np.minimum((ri * PAIR_GRID).astype(int), PAIR_GRID - 1)
    ro = np.minimum((_ranks(out[pick]) * PAIR_GRID).astype(int), PAIR_GRID - 1)
    cols = [ri, ro] if grouped is None else [ri, ro, grouped[pick].astype(int)]
    spearman, _ = correlations(inp, out)
    return Joint(
        grid=PAIR_GRID,
        pairs=[[int(c[k]) for c in cols] for k in range(pick.size)],
        spearman=round(spearman, 4),
    )


def fit_lengths(
    trace: TraceData, paired: bool | None = None, grouped: np.ndarray | None = None
) -> Lengths:
    inp, out = trace.input_tokens.astype(float), trace.output_tokens.astype(float)
    if paired is None:
        paired = inp.size > 2 and max(abs(c) for c in correlations(inp, out)) >= PAIR_THRESHOLD
    return Lengths(
        input=quantile_table(inp),
        output=quantile_table(out),
        input_summary=summary(inp),
        output_summary=summary(out),
        joint=rank_pairs(inp, out, grouped) if paired else None,
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
        f"timestamps lie on a {grid:.3g} s grid; requests were spread uniformly inside each slot before fitting"
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


def fit_prefix(
    hash_ids: list[list[int]], input_tokens: np.ndarray, block: int
) -> tuple[Prefix, np.ndarray]:
    """Prefix structure and, per request, whether it is in a group of two or more."""
    n = len(hash_ids)
    occurrences = Counter(b for ids in hash_ids for b in set(ids))
    common = 0
    while True:
        at_k = Counter(ids[common] for ids in hash_ids if len(ids) > common)
        if not at_k or at_k.most_common(1)[0][1] < COMMON_SHARE * n:
            break
        common += 1
    shared_tokens = np.zeros(n)
    keys: list[int | None] = []
    for r, ids in enumerate(hash_ids):
        run = 0
        while run < len(ids) and occurrences[ids[run]] >= 2:
            run += 1
        shared_tokens[r] = min(run * block, int(input_tokens[r]))
        keys.append(ids[common] if len(ids) > common and occurrences[ids[common]] >= 2 else None)
    grouped = np.array([k is not None for k in keys])
    stats = _reuse_stats(hash_ids, input_tokens, block)
    common_tokens = common * block
    if not grouped.any():
        kind = "shared" if common_tokens else "none"
        return Prefix(
            kind=kind, block_tokens=block, common_tokens=common_tokens, stats=stats
        ), grouped
    members: dict[int, list[int]] = {}
    for r, k in enumerate(keys):
        if k is not None:
            members.setdefault(k, []).append(r)
    inputs = input_tokens.astype(float)
    sizes = np.array([len(m) for m in members.values()], dtype=float)
    group_prefix = np.array(
        [max(float(np.median(shared_tokens[m])), common_tokens) for m in members.values()]
    )
    tails = np.concatenate(
        [np.maximum(inputs[m] - g, 1.0) for m, g in zip(members.values(), group_prefix)]
    )
    prefix = Prefix(
        kind="groups",
        block_tokens=block,
        common_tokens=common_tokens,
        group_share=round(float(grouped.mean()), 4),
        group_count=len(members),
        group_window=n,
        group_sizes=quantile_table(sizes),
        group_prefix_tokens=quantile_table(group_prefix),
        grouped_tail_tokens=quantile_table(tails),
        ungrouped_input=quantile_table(inputs[~grouped]) if (~grouped).sum() >= 2 else None,
        stats=stats,
    )
    return prefix, grouped


def _reuse_stats(
    hash_ids: list[list[int]], input_tokens: np.ndarray, block: int
) -> dict[str, float]:
    """Block reuse and token-level prefix hits replayed in trace order, infinite cache."""
    seen: set[int] = set()
    reused = hit_tokens = total_blocks = 0
    for r, ids in enumerate(hash_ids):
        lead = 0
        while lead < len(ids) and ids[lead] in seen:
            lead += 1
        reused += sum(1 for b in ids if b in seen)
        hit_tokens += min(lead * block, int(input_tokens[r]))
        total_blocks += len(ids)
        seen.update(ids)
    return {
        "block_reuse_ratio": round(reused / total_blocks, 4),
        "token_prefix_hit_ratio": round(hit_tokens / float(input_tokens.sum()), 4),
        "requests": float(len(hash_ids)),
    }


def fit_profile(
    trace: TraceData, name: str, description: str, source: Source, paired: bool | None = None
) -> ProfileModel:
    """A complete profile from a trace; ``paired=None`` decides from the correlation."""
    prefix, grouped = Prefix(kind="none"), None
    if trace.hash_ids:
        prefix, flags = fit_prefix(trace.hash_ids, trace.input_tokens, trace.block_tokens or 1)
        grouped = flags if prefix.kind == "groups" else None
    lengths = fit_lengths(trace, paired, grouped)
    return ProfileModel(
        name=name,
        description=description,
        source=source,
        lengths=lengths,
        arrivals=fit_arrivals(trace.timestamps_s),
        prefix=prefix,
    )
