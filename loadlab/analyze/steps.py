"""The per-step table: what the client and the server showed at each load level.

For each step window in ``manifest.json`` the measured part starts after the
step's warm-up cut. Client side (requests.parquet): requests *sent* in the
measured window (by ``t_sent``, else ``t_issued`` for those that never connected),
their TTFT/ITL/E2E percentiles, and throughput from the output tokens of requests
that *finished* in it. Server side (metrics.parquet, direct or
Prometheus, V1 or V0 names): gauge means and maxima of running, waiting and KV
usage, and counter increases of preemptions and prefix-cache hits. Gauges are
one-step snapshots that can lag (real-vllm.md), so maxima are shown beside means, and
beside them the running count read from counters, the share of stale zero readings and
the client's own in-flight count (:mod:`loadlab.analyze.gauge_lag`).

This is the raw material for knee detection and diagnosis; it names no cause.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from loadlab.analyze.gauge_lag import client_inflight, gauge_lag
from loadlab.analyze.tables import chunk_span_s, read_metrics, read_requests
from loadlab.analyze.windows import counter_windows, gauge_windows, resolve_family
from loadlab.errors import InputError
from loadlab.runstore import read_manifest

GAUGES = {"running": "running", "waiting": "waiting", "kv": "kv_usage"}


def measured_windows(manifest: dict) -> pd.DataFrame:
    """Step windows with the warm-up cut applied (t_start moved past warm-up)."""
    steps = manifest.get("steps") or []
    rows = []
    for s in steps:
        start = float(s["t_start"]) + float(s.get("warmup_s") or 0.0)
        end = float(s["t_end"])
        rows.append({"step": int(s["step"]), "concurrency": s.get("concurrency"),
                     "target_rate": s.get("target_rate"), "client_cpu_cores": s.get("client_cpu_cores"),
                     "t_start": start, "t_end": max(end, start)})
    return pd.DataFrame(rows, columns=["step", "concurrency", "target_rate", "client_cpu_cores",
                                       "t_start", "t_end"])


def step_table(run_dir: str | Path) -> pd.DataFrame:
    """One row per step of the run folder; NaN where a source had no data."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    if not manifest:
        raise InputError("no manifest.json here", source=run_dir,
                         fix="point at a run folder written by `loadlab run` or `loadlab sim replay`")
    wins = measured_windows(manifest)
    requests = read_requests(run_dir)
    metrics = read_metrics(run_dir)
    table = wins.copy()
    client = [_client_stats(requests, w) for w in wins.itertuples(index=False)]
    table = pd.concat([table, pd.DataFrame(client, index=table.index)], axis=1)
    if not metrics.empty and not wins.empty:
        span = wins[["t_start", "t_end"]]
        for name, role in GAUGES.items():
            family = resolve_family(metrics, role)
            stats = gauge_windows(metrics, family, span, by=()) if family else None
            table[f"{name}_mean"] = _col(stats, "mean", len(wins))
            table[f"{name}_max"] = _col(stats, "max", len(wins))
        table["preemptions"] = _counter(metrics, "preemptions", span, len(wins))
        hits = _counter(metrics, "prefix_hits", span, len(wins))
        queries = _counter(metrics, "prefix_queries", span, len(wins))
        with np.errstate(invalid="ignore", divide="ignore"):
            table["prefix_hit_rate"] = np.where(queries > 0, hits / queries, np.nan)
        lag = gauge_lag(metrics, requests, span)
        table["running_itl"] = lag["running_itl"].to_numpy()
        table["gauge_stale"] = lag["stale_share"].to_numpy()
        table["inflight"] = lag["inflight_client"].to_numpy()
    else:
        table["inflight"] = client_inflight(requests, wins)
    return table


def _client_stats(requests: pd.DataFrame, w: object) -> dict[str, float]:
    # A request that never reached the wire (refused, connect timeout) has no t_sent:
    # binned by when it was issued, so failures count instead of vanishing.
    t = requests.t_sent.fillna(requests.t_issued)
    sent = requests[(requests.step == w.step) & (t >= w.t_start) & (t < w.t_end)]
    ok = sent[sent.status == "ok"]
    done = requests[(requests.status == "ok") & (requests.t_done >= w.t_start)
                    & (requests.t_done < w.t_end)]
    length = max(w.t_end - w.t_start, 1e-9)
    return {
        "n_ok": len(ok),
        "n_aborted": int((sent.status == "aborted").sum()),
        "n_err": int(len(sent) - len(ok) - (sent.status == "aborted").sum()),
        "rps": len(done) / length,
        "out_tok_s": float(done.output_tokens.fillna(0).sum()) / length,
        "ttft_p50_ms": _pct(ok.ttft_s, 50) * 1e3,
        "ttft_p99_ms": _pct(ok.ttft_s, 99) * 1e3,
        "itl_p50_ms": _pct(ok.itl_p50_s, 50) * 1e3,
        "e2e_p50_s": _pct(ok.e2e_s, 50),
        "burst_share": burst_share(ok),
    }


def burst_share(ok: pd.DataFrame, within_s: float = 0.002) -> float:
    """Share of streams of several chunks that all arrived within ``within_s``.

    A server whose API process is starved (vLLM on too few cores) can hold a stream back
    and deliver it whole: its own TTFT histogram does not see that, the user does.
    Spans come from ``itl_mean_s`` and ``n_chunks`` (:func:`~loadlab.analyze.tables.chunk_span_s`).
    """
    spans = chunk_span_s(ok[ok.n_chunks > 1]).dropna().to_numpy(dtype=float)
    return float((spans < within_s).mean()) if len(spans) else float("nan")


def _pct(values: pd.Series, q: float) -> float:
    x = values.dropna().to_numpy(dtype=float)
    return float(np.percentile(x, q)) if len(x) else float("nan")


def _col(stats: pd.DataFrame | None, column: str, n: int) -> np.ndarray:
    if stats is None or stats.empty:
        return np.full(n, np.nan)
    return stats[column].to_numpy(dtype=float)


def _counter(metrics: pd.DataFrame, role: str, span: pd.DataFrame, n: int) -> np.ndarray:
    family = resolve_family(metrics, role)
    if family is None:
        return np.full(n, np.nan)
    return _col(counter_windows(metrics, family, span), "delta", n)


COLUMNS = [  # (column, header, format)
    ("step", "step", "{:.0f}"), ("concurrency", "users", "{:.0f}"), ("target_rate", "rate", "{:.1f}"),
    ("n_ok", "ok", "{:.0f}"), ("n_err", "err", "{:.0f}"),
    ("n_aborted", "aborted", "{:.0f}"), ("out_tok_s", "out tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"), ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.1f}"), ("burst_share", "bursts", "{:.2f}"),
    ("running_mean", "running", "{:.1f}"),
    ("running_max", "run max", "{:.0f}"), ("running_itl", "run (ITL)", "{:.1f}"),
    ("gauge_stale", "stale 0s", "{:.2f}"), ("inflight", "in flight", "{:.1f}"),
    ("waiting_mean", "waiting", "{:.1f}"),
    ("waiting_max", "wait max", "{:.0f}"), ("kv_mean", "KV use", "{:.2f}"), ("kv_max", "KV max", "{:.2f}"),
    ("preemptions", "preempt", "{:.0f}"), ("prefix_hit_rate", "prefix hit", "{:.2f}"),
    ("client_cpu_cores", "client cpu", "{:.2f}"),
]


def format_step_table(table: pd.DataFrame) -> str:
    """Plain-text table for a terminal; columns with no data at all are left out."""
    cols = [c for c in COLUMNS if c[0] in table and table[c[0]].notna().any()]
    cells = [[h for _, h, _ in cols]]
    for row in table.itertuples(index=False):
        cells.append([_fmt(getattr(row, c), f) for c, _, f in cols])
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells)


def _fmt(value: object, fmt: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return fmt.format(float(value))
