"""Per-window statistics of METRICS and SCRAPES: the analyzer's view of what the collector stored.

Inputs: a METRICS DataFrame (raw samples as collected, direct or from
Prometheus: the two look the same) and *windows*, either ``(t_start, t_end)``
pairs or a DataFrame with ``t_start``/``t_end`` columns whose other columns
(step, concurrency, ...) are carried into the result. One result row per window
and group; ``by`` names the labels to keep apart (``"endpoint"`` counts as a
label), everything else is summed; ``where`` keeps only samples whose labels
match (``{"reason": "capacity"}``).

- :func:`counter_windows`: increase and rate per window. Per series (endpoint,
  metric, labels) the baseline is the last sample at or before ``t_start`` (else
  the first inside), the end the last at or before ``t_end``. A decrease is a
  counter reset (server restart): the new value is what accrued since, as in
  Prometheus' ``increase()`` (without its extrapolation). rate = increase /
  time between those two samples, summed over series.
- :func:`histogram_windows`: bucket increases per window (each ``_bucket`` series
  as a counter), their sum over the group, then count, sum, mean and quantiles
  by linear interpolation inside the bucket that holds the rank, as Prometheus'
  ``histogram_quantile`` does (lower bound 0 for the first bucket; a rank in the
  +Inf bucket returns the highest finite bound).
- :func:`histogram_buckets`: the same bucket increases, one row per bound.
- :func:`gauge_windows`: per snapshot (endpoint, scrape time) the series of a
  group are summed (several engines -> one figure), then mean, median, p95, min, max,
  last and occupancy P(x >= 1) over the snapshots inside the window. Default
  ``by=("endpoint",)``: replicas are not added up.
- :func:`coverage_windows`: expected scrapes = window length / interval; coverage =
  successful scrapes / expected (at most 1), with attempts, misses and the most
  frequent error cause.
- :func:`rows_in`: any table's rows per window by a time column (requests by send time),
  found with one sort for all windows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import lru_cache
from itertools import chain
from typing import TypeAlias

import numpy as np
import pandas as pd

from loadlab.collect import catalog

Windows: TypeAlias = pd.DataFrame | Sequence[tuple[float, float]]
DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99)
SAMPLE_COLUMNS = ["t", "endpoint", "metric", "labels", "value"]


def resolve_family(metrics: pd.DataFrame, role: str) -> str | None:
    """The family carrying ``role`` in this frame (current name preferred), or None."""
    present = set(metrics["family"].unique())
    for family in catalog.families_for_role(role):
        if family in present:
            return family
    return None


def rows_in(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[np.ndarray]:
    """Per window [start, end): the positions of the rows whose ``t`` falls in it, in row
    order (NaN in none)."""
    order = np.argsort(t, kind="stable")
    ts = t[order]
    lo, hi = np.searchsorted(ts, starts, side="left"), np.searchsorted(ts, ends, side="left")
    return [np.sort(order[a:b]) for a, b in zip(lo, hi)]


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float:
    """Prometheus-style quantile of cumulative bucket counts (``bounds`` ascending, +Inf last)."""
    b = np.asarray(bounds, dtype=float)
    c = np.maximum.accumulate(np.asarray(cumulative, dtype=float))  # tolerate scrape skew
    if len(b) == 0 or c[-1] <= 0 or not 0 <= q <= 1:
        return float("nan")
    rank = q * c[-1]
    i = int(np.searchsorted(c, rank, side="left"))
    i = min(i, len(b) - 1)
    if np.isinf(b[i]):
        return float(b[i - 1]) if i > 0 else float("nan")
    lower = 0.0 if i == 0 else b[i - 1]
    below = 0.0 if i == 0 else c[i - 1]
    if i == 0 and b[0] <= 0:
        return float(b[0])
    in_bucket = c[i] - below
    if in_bucket <= 0:
        return float(b[i])
    return float(lower + (b[i] - lower) * (rank - below) / in_bucket)


def counter_windows(metrics: pd.DataFrame, family: str, windows: Windows, *,
                    by: Sequence[str] = (), where: Mapping[str, str] | None = None,
                    metric: str | None = None) -> pd.DataFrame:
    """Increase, rate (per second) and resets of a counter family per window."""
    wins = _windows(windows)
    data = select(metrics, family, where=where, metric=metric)
    parts = []
    for key, (t, v) in _series(data):
        inc, drops = _cumulative_increase(v)
        wid, ib, ie = _spans(t, wins)
        dt = t[ie] - t[ib]
        delta = inc[ie] - inc[ib]
        rate = np.divide(delta, dt, out=np.full(len(wid), np.nan), where=dt > 0)
        parts.append({"wid": wid, **_group(key, by, len(wid)), "delta": delta,
                      "rate_per_s": rate, "resets": drops[ie] - drops[ib]})
    cols = ["delta", "rate_per_s", "resets"]
    return _finish(wins, _rows(parts, ["wid", *by, *cols]), by, dict.fromkeys(cols, "sum"), cols)


def histogram_windows(metrics: pd.DataFrame, family: str, windows: Windows, *,
                      by: Sequence[str] = (), where: Mapping[str, str] | None = None,
                      quantiles: Iterable[float] = DEFAULT_QUANTILES) -> pd.DataFrame:
    """Count, sum, mean and quantiles of a histogram family's observations per window."""
    quantiles = tuple(quantiles)
    wins = _windows(windows)
    frame = _histogram_deltas(metrics, family, wins, by, where, buckets=bool(quantiles))
    qcols = [f"p{round(q * 100, 3):g}" for q in quantiles]
    cols = ["count", "sum", "mean", *qcols]
    rows = []
    for gkey, g in frame.groupby(["wid", *by], sort=False, dropna=False):
        gkey = gkey if isinstance(gkey, tuple) else (gkey,)
        row = dict(zip(["wid", *by], gkey))
        count = g.loc[g.kind == "_count", "delta"].sum()
        total = g.loc[g.kind == "_sum", "delta"].sum()
        row.update(count=count, sum=total, mean=total / count if count > 0 else np.nan)
        if quantiles:
            buckets = g[g.kind == "_bucket"].groupby("le")["delta"].sum().sort_index()
            for q, col in zip(quantiles, qcols):
                row[col] = histogram_quantile(q, buckets.index.to_numpy(), buckets.to_numpy())
        rows.append(row)
    return _finish(wins, rows, by, None, cols)


def histogram_buckets(
    metrics: pd.DataFrame,
    family: str,
    windows: Windows,
    *,
    by: Sequence[str] = (),
    where: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Cumulative bucket increases per window: one row per upper bound ``le`` (float).

    For shares the summary statistics do not give, e.g. the fraction of engine
    steps that filled the token budget from ``vllm:iteration_tokens_total``.
    """
    wins = _windows(windows)
    frame = _histogram_deltas(metrics, family, wins, by, where)
    buckets = frame[frame.kind == "_bucket"]
    rows = (buckets.groupby(["wid", *by, "le"], sort=True, dropna=False)["delta"].sum()
            .reset_index().rename(columns={"delta": "count"}))
    return _finish(wins, rows.to_dict("records"), by, None, ["le", "count"])


def gauge_windows(metrics: pd.DataFrame, family: str, windows: Windows, *,
                  by: Sequence[str] = ("endpoint",), where: Mapping[str, str] | None = None,
                  ) -> pd.DataFrame:
    """Mean, median (p50), p95, min, max, last and occupancy P(x >= 1) of a gauge per window."""
    wins = _windows(windows)
    cols = ["n", "mean", "p50", "p95", "min", "max", "last", "occupancy"]
    snaps = snapshots(metrics, family, by=[b for b in by if b != "endpoint"], where=where)
    if snaps.empty:
        return _finish(wins, [], by, None, cols)
    rows = []
    for w in wins.itertuples(index=False):
        inside = snaps[(snaps.t >= w.t_start) & (snaps.t < w.t_end)]
        groups = inside.groupby(list(by), sort=True) if by else [((), inside)]
        for gkey, g in groups:
            if g.empty:
                continue
            gkey = gkey if isinstance(gkey, tuple) else (gkey,)
            x = g.sort_values("t")["value"].to_numpy()
            rows.append({"wid": w.wid, **dict(zip(by, gkey)), "n": len(x), "mean": x.mean(),
                         "p50": float(np.median(x)), "p95": float(np.percentile(x, 95)),
                         "min": x.min(), "max": x.max(),
                         "last": x[-1], "occupancy": float((x >= 1).mean())})
    return _finish(wins, rows, by, None, cols)


def snapshots(metrics: pd.DataFrame, family: str, *, by: Sequence[str] = (),
              where: Mapping[str, str] | None = None, metric: str | None = None) -> pd.DataFrame:
    """Per (endpoint, scrape time, ``by`` labels): the family's series summed, as ``value``.

    Sorted by those keys; series lacking a ``by`` label are left out.
    """
    data = select(metrics, family, where=where, metric=metric)
    frame = pd.DataFrame(
        {"endpoint": _plain(data["endpoint"]), "t": data["t"].to_numpy(dtype=float)}
    )
    for name in by:
        frame[name] = _label_values(data["labels"], name)
    frame["value"] = data["value"].to_numpy(dtype=float)
    return frame.groupby(["endpoint", "t", *by], sort=True)["value"].sum().reset_index()


def coverage_windows(scrapes: pd.DataFrame, windows: Windows, interval_s: float, *,
                     by: Sequence[str] = ("endpoint",)) -> pd.DataFrame:
    """Share of the expected scrapes per window that succeeded, with the main error."""
    wins = _windows(windows)
    rows = []
    for w in wins.itertuples(index=False):
        inside = scrapes[(scrapes.t >= w.t_start) & (scrapes.t < w.t_end)]
        expected = max((w.t_end - w.t_start) / interval_s, 1e-9)
        groups = inside.groupby(list(by), sort=True) if by else [((), inside)]
        for gkey, g in groups:
            gkey = gkey if isinstance(gkey, tuple) else (gkey,)
            missed = int((g.error == "missed tick").sum())
            errors = g.error.dropna()
            rows.append({"wid": w.wid, **dict(zip(by, gkey)), "expected": expected,
                         "attempts": len(g) - missed, "ok": int(g.ok.sum()), "missed": missed,
                         "coverage": min(1.0, float(g.ok.sum()) / expected),
                         "main_error": errors.mode().iloc[0] if len(errors) else None})
    return _finish(wins, rows, by, None,
                   ["expected", "attempts", "ok", "missed", "coverage", "main_error"])


# ---------------------------------------------------------------- helpers


def _histogram_deltas(
    metrics: pd.DataFrame,
    family: str,
    wins: pd.DataFrame,
    by: Sequence[str],
    where: Mapping[str, str] | None,
    buckets: bool = True,
) -> pd.DataFrame:
    """Per window, group, kind (_bucket/_sum/_count) and bound: the increase of each series
    (``buckets`` False: of ``_sum`` and ``_count`` only, most of a histogram's series left out)."""
    parts = []
    data = select(metrics, family, where=where)
    if not buckets:
        data = data[(data["metric"] != f"{family}_bucket").to_numpy(dtype=bool)]
    for key, (t, v) in _series(data):
        inc, _ = _cumulative_increase(v)
        labels = dict(_labels(key[2]))
        le = labels.pop("le", None)
        wid, ib, ie = _spans(t, wins)
        n = len(wid)
        parts.append({"wid": wid, **_group((key[0], key[1], _canon(labels)), by, n),
                      "kind": [key[1][len(family):]] * n,
                      "le": np.full(n, np.nan if le is None else float(le)),
                      "delta": inc[ie] - inc[ib]})
    columns = ["wid", *by, "kind", "le", "delta"]
    frame = _rows(parts, columns)
    return frame if isinstance(frame, pd.DataFrame) else pd.DataFrame(frame, columns=columns)


def _windows(windows: Windows) -> pd.DataFrame:
    if isinstance(windows, pd.DataFrame):
        frame = windows.reset_index(drop=True).copy()
    else:
        frame = pd.DataFrame(list(windows), columns=["t_start", "t_end"])
    frame["wid"] = np.arange(len(frame))
    return frame


def select(metrics: pd.DataFrame, family: str, *, where: Mapping[str, str] | None = None,
           metric: str | None = None) -> pd.DataFrame:
    """The samples of one family (and sample name), as t, endpoint, metric, labels, value.

    Only those five columns are copied, row positions found on the family column alone:
    taking every column of a 5M-row frame of Arrow strings per call cost ~1 s.
    """
    rows = np.flatnonzero((metrics["family"] == family).to_numpy(dtype=bool))
    data = metrics[SAMPLE_COLUMNS].iloc[rows]
    if metric is not None:
        data = data[(data["metric"] == metric).to_numpy(dtype=bool)]
    if where:
        match = [s for s in data["labels"].unique()
                 if all(_labels(s).get(k) == v for k, v in where.items())]
        data = data[data["labels"].isin(match).to_numpy(dtype=bool)]
    return data


def _series(
    data: pd.DataFrame,
) -> Iterator[tuple[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]]:
    """(endpoint, metric, labels) -> (t, value) sorted by time, series in key order.

    One sort of the whole selection (series id, then time) instead of a groupby and a
    sort per series; rows with a missing key are left out, as groupby leaves them.
    """
    codes, names = zip(
        *(pd.factorize(data[c], sort=True) for c in ("endpoint", "metric", "labels"))
    )
    sid = np.zeros(len(data), dtype=np.int64)
    for c, n in zip(codes, names):
        sid = sid * max(len(n), 1) + c
    keep = np.flatnonzero(np.logical_and.reduce([c >= 0 for c in codes]))
    t = data["t"].to_numpy(dtype=float)[keep]
    v = data["value"].to_numpy(dtype=float)[keep]
    sid = sid[keep]
    order = np.lexsort((t, sid))
    t, v, sid = t[order], v[order], sid[order]
    starts = np.flatnonzero(np.diff(sid, prepend=-1))
    ends = np.append(starts[1:], len(sid))
    for a, b in zip(starts, ends):
        endpoint, metric, labels = (str(n[c[keep[order[a]]]]) for c, n in zip(codes, names))
        yield (endpoint, metric, labels), (t[a:b], v[a:b])


def _cumulative_increase(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Running increase of a counter (resets handled) and running count of resets."""
    d = np.diff(v, prepend=v[:1])
    reset = d < 0
    step = np.where(reset, v, d)
    step[0] = 0.0
    return np.cumsum(step), np.cumsum(reset)


def _spans(t: np.ndarray, wins: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows with data, and the indices of their baseline and end samples.

    The end is the last sample at or before ``t_end``, the baseline the last at or before
    ``t_start`` (else the first); a window whose two samples coincide has no data.
    """
    ie = np.searchsorted(t, wins["t_end"].to_numpy(dtype=float), side="right") - 1
    ib = np.maximum(np.searchsorted(t, wins["t_start"].to_numpy(dtype=float), side="right") - 1, 0)
    ok = (ie >= 0) & (ib < ie)
    return wins["wid"].to_numpy()[ok], ib[ok], ie[ok]


@lru_cache(maxsize=65536)
def _parsed(labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(json.loads(labels).items())) if labels else ()


def _labels(labels: str) -> dict[str, str]:
    return dict(_parsed(labels))


def _canon(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":"))


def _label_values(labels: pd.Series, name: str) -> np.ndarray:
    """Each row's value of one label (None where absent), parsing each distinct set once."""
    codes, uniques = pd.factorize(labels)
    values = np.array([_labels(u).get(name) for u in uniques] + [None], dtype=object)
    return values[codes]  # code -1 (missing labels) reads the trailing None


def _plain(column: pd.Series) -> np.ndarray:
    """A string column's values as an object array (categorical or not)."""
    return column.to_numpy(dtype=object)


def _group(key: tuple[str, str, str], by: Sequence[str], n: int) -> dict[str, list[str | None]]:
    """The ``by`` columns of ``n`` rows of one series."""
    endpoint, _, labels = key
    parsed = _labels(labels)
    return {name: [endpoint if name == "endpoint" else parsed.get(name)] * n for name in by}


def _rows(parts: list[dict], columns: list[str]) -> pd.DataFrame | list:
    """Each series' columns (arrays, or lists for strings) as one frame in series order.

    ``[]`` when no series had data. Lists are joined as lists so the frame infers the
    column types a frame of row dicts would.
    """
    parts = [p for p in parts if len(p["wid"])]
    if not parts:
        return []
    return pd.DataFrame(
        {
            c: list(chain.from_iterable(p[c] for p in parts))
            if isinstance(parts[0][c], list)
            else np.concatenate([p[c] for p in parts])
            for c in columns
        }
    )


def _finish(wins: pd.DataFrame, rows: list[dict] | pd.DataFrame, by: Sequence[str],
            agg: dict[str, str] | None, cols: list[str]) -> pd.DataFrame:
    """Sum rows per window and group (when ``agg``), then attach the window columns."""
    frame = (
        rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, columns=["wid", *by, *cols])
    )
    if agg is not None and not frame.empty:
        frame = frame.groupby(["wid", *by], sort=True, dropna=False).agg(agg).reset_index()
    out = wins.merge(frame, on="wid", how="left")
    return out.drop(columns="wid").reset_index(drop=True)
