"""The window statistics as they were before they were vectorised: the reference the
equivalence tests hold the fast versions to (per-series, per-window Python loops,
pandas filters per window, JSON labels parsed per series). Not used by loadlab.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

import numpy as np
import pandas as pd

from loadlab.analyze.windows import DEFAULT_QUANTILES, Windows, histogram_quantile


def counter_windows(metrics: pd.DataFrame, family: str, windows: Windows, *,
                    by: Sequence[str] = (), where: Mapping[str, str] | None = None,
                    metric: str | None = None) -> pd.DataFrame:
    """Increase, rate (per second) and resets of a counter family per window."""
    wins = _windows(windows)
    data = _select(metrics, family, where, metric)
    rows = []
    for key, series in _series(data):
        t, v = series
        inc, drops = _cumulative_increase(v)
        for w in wins.itertuples(index=False):
            span = _span(t, w.t_start, w.t_end)
            if span is None:
                continue
            ib, ie = span
            rate = (inc[ie] - inc[ib]) / (t[ie] - t[ib]) if t[ie] > t[ib] else np.nan
            rows.append({"wid": w.wid, **_group(key, by), "delta": inc[ie] - inc[ib],
                         "rate_per_s": rate, "resets": int(drops[ie] - drops[ib])})
    cols = ["delta", "rate_per_s", "resets"]
    return _finish(wins, rows, by, dict.fromkeys(cols, "sum"), cols)


def histogram_windows(metrics: pd.DataFrame, family: str, windows: Windows, *,
                      by: Sequence[str] = (), where: Mapping[str, str] | None = None,
                      quantiles: Iterable[float] = DEFAULT_QUANTILES) -> pd.DataFrame:
    """Count, sum, mean and quantiles of a histogram family's observations per window."""
    quantiles = tuple(quantiles)
    wins = _windows(windows)
    frame = _histogram_deltas(metrics, family, wins, by, where)
    qcols = [f"p{round(q * 100, 3):g}" for q in quantiles]
    cols = ["count", "sum", "mean", *qcols]
    rows = []
    for gkey, g in frame.groupby(["wid", *by], sort=False, dropna=False):
        gkey = gkey if isinstance(gkey, tuple) else (gkey,)
        row = dict(zip(["wid", *by], gkey))
        count = g.loc[g.kind == "_count", "delta"].sum()
        total = g.loc[g.kind == "_sum", "delta"].sum()
        buckets = g[g.kind == "_bucket"].groupby("le")["delta"].sum().sort_index()
        row.update(count=count, sum=total, mean=total / count if count > 0 else np.nan)
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
    """Mean, median, p95, min, max, last and occupancy P(x >= 1) of a gauge per window."""
    wins = _windows(windows)
    data = _select(metrics, family, where, None)
    cols = ["n", "mean", "p50", "p95", "min", "max", "last", "occupancy"]
    if data.empty:
        return _finish(wins, [], by, None, cols)
    frame = data[["t", "endpoint", "labels", "value"]].copy()
    for name in by:
        if name != "endpoint":
            values = {s: _labels(s).get(name) for s in frame["labels"].unique()}
            frame[name] = frame["labels"].map(values)
    snaps = frame.groupby(["endpoint", "t", *[b for b in by if b != "endpoint"]],
                          sort=True)["value"].sum().reset_index()
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


def _histogram_deltas(metrics: pd.DataFrame, family: str, wins: pd.DataFrame,
                      by: Sequence[str], where: Mapping[str, str] | None) -> pd.DataFrame:
    """Per window, group, kind (_bucket/_sum/_count) and bound: the increase of each series."""
    deltas = []
    for key, (t, v) in _series(_select(metrics, family, where, None)):
        inc, _ = _cumulative_increase(v)
        labels = dict(_labels(key[2]))
        le = labels.pop("le", None)
        group = _group((key[0], key[1], _canon(labels)), by)
        for w in wins.itertuples(index=False):
            span = _span(t, w.t_start, w.t_end)
            if span is not None:
                deltas.append({"wid": w.wid, **group, "kind": key[1][len(family):],
                               "le": np.nan if le is None else float(le),
                               "delta": inc[span[1]] - inc[span[0]]})
    return pd.DataFrame(deltas, columns=["wid", *by, "kind", "le", "delta"])


def _windows(windows: Windows) -> pd.DataFrame:
    if isinstance(windows, pd.DataFrame):
        frame = windows.reset_index(drop=True).copy()
    else:
        frame = pd.DataFrame(list(windows), columns=["t_start", "t_end"])
    frame["wid"] = np.arange(len(frame))
    return frame


def _select(metrics: pd.DataFrame, family: str, where: Mapping[str, str] | None,
            metric: str | None) -> pd.DataFrame:
    data = metrics[metrics["family"] == family]
    if metric is not None:
        data = data[data["metric"] == metric]
    if where:
        match = {s: all(_labels(s).get(k) == v for k, v in where.items())
                 for s in data["labels"].unique()}
        data = data[data["labels"].map(match).to_numpy(dtype=bool)]
    return data


def _series(
    data: pd.DataFrame,
) -> Iterable[tuple[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]]:
    """(endpoint, metric, labels) -> (t, value) sorted by time."""
    for key, g in data.groupby(["endpoint", "metric", "labels"], sort=True):
        g = g.sort_values("t")
        yield key, (g["t"].to_numpy(dtype=float), g["value"].to_numpy(dtype=float))


def _cumulative_increase(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Running increase of a counter (resets handled) and running count of resets."""
    d = np.diff(v, prepend=v[:1])
    reset = d < 0
    step = np.where(reset, v, d)
    step[0] = 0.0
    return np.cumsum(step), np.cumsum(reset)


def _span(t: np.ndarray, t_start: float, t_end: float) -> tuple[int, int] | None:
    """Indices of the baseline and end samples of a window, or None if no data."""
    ie = int(np.searchsorted(t, t_end, side="right")) - 1
    if ie < 0:
        return None
    ib = int(np.searchsorted(t, t_start, side="right")) - 1
    ib = max(ib, 0)
    if ib >= ie:
        return None
    return ib, ie


@lru_cache(maxsize=65536)
def _parsed(labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(json.loads(labels).items())) if labels else ()


def _labels(labels: str) -> dict[str, str]:
    return dict(_parsed(labels))


def _canon(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":"))


def _group(key: tuple[str, str, str], by: Sequence[str]) -> dict[str, str | None]:
    endpoint, _, labels = key
    parsed = _labels(labels)
    return {name: endpoint if name == "endpoint" else parsed.get(name) for name in by}


def _finish(wins: pd.DataFrame, rows: list[dict], by: Sequence[str],
            agg: dict[str, str] | None, cols: list[str]) -> pd.DataFrame:
    """Sum rows per window and group (when ``agg``), then attach the window columns."""
    frame = pd.DataFrame(rows, columns=["wid", *by, *cols])
    if agg is not None and not frame.empty:
        frame = frame.groupby(["wid", *by], sort=True, dropna=False).agg(agg).reset_index()
    out = wins.merge(frame, on="wid", how="left")
    return out.drop(columns="wid").reset_index(drop=True)


def stale_share(
    metrics: pd.DataFrame, running: str, tokens: str, windows: pd.DataFrame
) -> np.ndarray:
    """Per window: share of busy-on-both-sides snapshots in which ``running`` read 0."""
    gauge = _snapshots(metrics, running, running)
    counter = _snapshots(metrics, tokens, f"{tokens}_total")
    both = gauge.merge(counter, on=["endpoint", "t"], suffixes=("_gauge", "_tokens"))
    result = np.full(len(windows), np.nan)
    if both.empty:
        return result
    busy, zero, times = [], [], []
    for _, g in both.groupby("endpoint", sort=False):
        g = g.sort_values("t")
        rose = np.diff(g["value_tokens"].to_numpy()) > 0
        inner = rose[:-1] & rose[1:]          # rose before and after each inner snapshot
        busy.append(inner)
        zero.append(g["value_gauge"].to_numpy()[1:-1] == 0)
        times.append(g["t"].to_numpy()[1:-1])
    busy_a, zero_a, t = np.concatenate(busy), np.concatenate(zero), np.concatenate(times)
    for i, w in enumerate(windows.itertuples(index=False)):
        inside = busy_a & (t >= w.t_start) & (t < w.t_end)
        if inside.any():
            result[i] = float(zero_a[inside].mean())
    return result


def client_inflight(requests: pd.DataFrame, windows: pd.DataFrame) -> np.ndarray:
    """Per window: time-mean count of requests sent and not done (not done yet = until the end)."""
    result = np.full(len(windows), np.nan)
    if requests.empty:
        return result
    sent = requests["t_sent"].to_numpy(dtype=float)
    done = requests["t_done"].to_numpy(dtype=float)
    done = np.where(np.isnan(done), np.inf, done)
    for i, w in enumerate(windows.itertuples(index=False)):
        length = w.t_end - w.t_start
        if length > 0:
            overlap = np.minimum(done, w.t_end) - np.maximum(sent, w.t_start)
            result[i] = float(np.clip(overlap, 0.0, None).sum() / length)
    return result


def _snapshots(metrics: pd.DataFrame, family: str, metric: str) -> pd.DataFrame:
    """(endpoint, t, value) with the series of one family summed per scrape."""
    data = metrics[(metrics["family"] == family) & (metrics["metric"] == metric)]
    return data.groupby(["endpoint", "t"], sort=True)["value"].sum().reset_index()
