"""The per-step table: what the client and the server showed at each load level.

For each step window in ``manifest.json`` the measured part starts after the step's
warm-up cut. Client side (requests.parquet): requests begun in the measured window
(binned by ``t_sent``, else ``t_issued`` for a request that never got on the wire),
their TTFT/ITL/E2E percentiles, and throughput from the output tokens of requests that
*finished* in it; the load generator's own figures for the step (``client_limited``,
``achieved_ratio``, send and loop lag) are copied from the manifest when it has them;
failed requests are counted by the side that failed (:mod:`loadlab.analyze.failures`).
Server side (metrics.parquet, direct or Prometheus, V1 or V0 names): gauge means, p95
and maxima of running, waiting and KV usage (and running's median: at a sequence cap
running reads the cap most of the time, whatever drains pull its mean down), the waiting
queue's occupancy P(waiting >= 1), counter increases (preemptions, prefix-cache hits,
prompt and generated tokens per second), and from histogram deltas the server's own mean
TTFT, queue time and inter-token latency, and the engine steps
(``vllm:iteration_tokens_total`` observations) with the tokens generated per step,
``decode_per_step``: the decode batch averaged over engine steps, as the scheduler's own
refusals are counted, where gauges and ITL weigh each second alike (a long prefill's
slow steps fill seconds, not steps). ``queue_share`` = queue-time sum / TTFT sum over
the window, and ``waiting_little`` = queue-time sum / window length: by Little's law the
time-mean number of requests waiting, read from a counter, so a lagging gauge cannot
hide it. Beside the gauges, the running count read from counters, the share of stale
zero readings and the client's own in-flight count (:mod:`loadlab.analyze.gauge_lag`),
and the share of expected scrapes that came back (``coverage``).

This module computes; :mod:`loadlab.analyze.display` renders. It names no cause.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze.failures import step_counts, with_failures
from loadlab.analyze.gauge_lag import client_inflight, gauge_lag
from loadlab.analyze.schema_check import check_requests
from loadlab.analyze.tables import METRIC_COLUMNS, chunk_span_s, read_metrics, read_requests
from loadlab.analyze.warnings import drop_nan
from loadlab.analyze.windows import (
    counter_windows,
    coverage_windows,
    gauge_windows,
    histogram_windows,
    resolve_family,
    rows_in,
    snapshots,
)
from loadlab.errors import InputError
from loadlab.runstore import read_manifest, read_table
from loadlab.runstore.layout import MANIFEST, SCRAPES_TABLE
from loadlab.runstore.schema import SCRAPES

GAUGES = {"running": "running", "waiting": "waiting", "kv": "kv_usage"}
# Manifest step keys of the load generator copied into the table as they are.
CLIENT_KEYS = ("achieved_ratio", "achieved_rate", "inflight_mean", "send_lag_p99_s",
               "loop_lag_max_s", "client_cpu_max_worker")


@dataclass
class RunData:
    """One run folder, read once: manifest and the three tables (empty when absent;
    requests and metrics in the columns the analyzer reads, :mod:`loadlab.analyze.tables`)."""

    run_dir: Path
    manifest: dict[str, Any]
    requests: pd.DataFrame
    metrics: pd.DataFrame
    scrapes: pd.DataFrame
    notes: list[str] = field(default_factory=list)   # what reading left out, for warnings

    @property
    def closed_loop(self) -> bool:
        return not any(s.get("target_rate") is not None for s in self.manifest.get("steps") or [])


def load_run(run_dir: str | Path) -> RunData:
    """Read a run folder; InputError (exit 2) names the file when the manifest is missing or bad."""
    run_dir = Path(run_dir)
    path = run_dir / MANIFEST
    try:
        manifest = read_manifest(run_dir)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"manifest.json is not valid JSON ({exc})", source=path,
                         fix="restore it from the run, or re-run the load") from None
    if not manifest:
        raise InputError(
            "no manifest.json here",
            source=run_dir,
            fix="point at a run folder written by `loadlab run` or `loadlab sim replay`",
        )
    if not isinstance(manifest, dict) or not isinstance(manifest.get("steps", []), list):
        raise InputError("manifest.json has no list of steps", source=path, field="steps",
                         fix="restore it from the run, or re-run the load")
    parts = check_requests(run_dir, manifest)
    metrics, notes = drop_nan(read_metrics(run_dir, columns=METRIC_COLUMNS))
    return RunData(
        run_dir,
        manifest,
        with_failures(read_requests(run_dir, skip=parts.skip)),
        metrics,
        read_table(run_dir / SCRAPES_TABLE, SCRAPES),
        parts.warnings + notes,
    )


def measured_windows(manifest: dict) -> pd.DataFrame:
    """Step windows with the warm-up cut applied (t_start moved past warm-up)."""
    steps = manifest.get("steps") or []
    rows = []
    for s in steps:
        try:
            start = float(s["t_start"]) + float(s.get("warmup_s") or 0.0)
            end = float(s["t_end"]) if s.get("t_end") is not None else start
            step = int(s["step"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"step entry {s!r} lacks a usable {exc}", source=MANIFEST,
                             field="steps", fix="restore the manifest from the run") from None
        rows.append(
            {
                "step": step,
                "concurrency": s.get("concurrency"),
                "target_rate": s.get("target_rate"),
                "client_cpu_cores": s.get("client_cpu_cores"),
                "t_start": start,
                "t_end": max(end, start),
            }
        )
    return pd.DataFrame(rows, columns=["step", "concurrency", "target_rate", "client_cpu_cores",
                                       "t_start", "t_end"])


def step_table(run_dir: str | Path) -> pd.DataFrame:
    """One row per step of the run folder; NaN where a source had no data."""
    return build_step_table(load_run(run_dir))


def build_step_table(run: RunData) -> pd.DataFrame:
    """The per-step table of an already loaded run (see the module docstring)."""
    wins = measured_windows(run.manifest)
    table = wins.copy()
    table["level"] = table["concurrency"].where(table["concurrency"].notna(), table["target_rate"])
    client = _client_columns(run.requests, wins)
    table = pd.concat([table, pd.DataFrame(client, index=table.index)], axis=1)
    _client_manifest(table, run.manifest.get("steps") or [])
    metrics = run.metrics
    if not metrics.empty and not wins.empty:
        span = wins[["t_start", "t_end"]]
        _server_columns(table, metrics, run.requests, span)
        interval = (run.manifest.get("metrics") or {}).get("interval_s")
        table["coverage"] = _coverage(run.scrapes, metrics, span, interval)
    else:
        table["inflight"] = client_inflight(binned(run.requests), wins)
    return table


def _server_columns(table: pd.DataFrame, metrics: pd.DataFrame, requests: pd.DataFrame,
                    span: pd.DataFrame) -> None:
    n = len(span)
    for name, role in GAUGES.items():
        family = resolve_family(metrics, role)
        stats = gauge_windows(metrics, family, span, by=()) if family else None
        for stat in ("mean", "p95", "max"):
            table[f"{name}_{stat}"] = _col(stats, stat, n)
        if name == "running":
            table["running_p50"] = _col(stats, "p50", n)
        if name == "waiting":
            table["waiting_occupancy"] = _col(stats, "occupancy", n)
            table["waiting_snapshots"] = _col(stats, "n", n)
    table["kv_queued"] = kv_while_queued(metrics, span)
    table["preemptions"] = _counter(metrics, "preemptions", span, "delta")
    hits = _counter(metrics, "prefix_hits", span, "delta")
    queries = _counter(metrics, "prefix_queries", span, "delta")
    with np.errstate(invalid="ignore", divide="ignore"):
        table["prefix_hit_rate"] = np.where(queries > 0, hits / queries, np.nan)
    table["prompt_tok_rate"] = _counter(metrics, "prompt_tokens", span, "rate_per_s")
    generation = _counter_stats(metrics, "generation_tokens", span)
    table["gen_tok_rate"] = _col(generation, "rate_per_s", n)
    table["counter_resets"] = _col(generation, "resets", n)
    table["cached_tok_rate"] = _cached_rate(metrics, span)
    length = (span["t_end"] - span["t_start"]).to_numpy(dtype=float)
    hist = {role: _histogram(metrics, role, span)
            for role in ("ttft", "queue_time", "itl", "iteration_tokens")}
    # Engine steps per window: vLLM observes ``vllm:iteration_tokens_total`` once per step.
    table["engine_steps"] = hist["iteration_tokens"]["count"]
    with np.errstate(invalid="ignore", divide="ignore"):
        table["decode_per_step"] = np.where(table["engine_steps"] > 0,
                                            _col(generation, "delta", n) / table["engine_steps"],
                                            np.nan)
    table["server_ttft_mean_ms"] = hist["ttft"]["mean"] * 1e3
    table["server_queue_mean_ms"] = hist["queue_time"]["mean"] * 1e3
    table["server_itl_mean_ms"] = hist["itl"]["mean"] * 1e3
    with np.errstate(invalid="ignore", divide="ignore"):
        ttft_sum = hist["ttft"]["sum"]
        table["queue_share"] = np.where(ttft_sum > 0, hist["queue_time"]["sum"] / ttft_sum, np.nan)
        table["waiting_little"] = np.where(length > 0, hist["queue_time"]["sum"] / length, np.nan)
    lag = gauge_lag(metrics, binned(requests), span)
    table["running_itl"] = lag["running_itl"].to_numpy()
    table["gauge_stale"] = lag["stale_share"].to_numpy()
    table["inflight"] = lag["inflight_client"].to_numpy()


def kv_while_queued(metrics: pd.DataFrame, span: pd.DataFrame) -> np.ndarray:
    """Per window: the median KV usage over the scrapes that saw a request waiting (NaN
    without one). What was free when admission was refused, as near as /metrics come: the
    step's mean mixes in the quiet moments, its max the moments a long request runs."""
    kv, waiting = resolve_family(metrics, "kv_usage"), resolve_family(metrics, "waiting")
    out = np.full(len(span), np.nan)
    if not kv or not waiting:
        return out
    both = snapshots(metrics, kv).merge(
        snapshots(metrics, waiting).rename(columns={"value": "waiting"}), on=["endpoint", "t"])
    queued = both[both["waiting"] >= 1]
    for i, w in enumerate(span.itertuples(index=False)):
        inside = queued["value"][(queued["t"] >= w.t_start) & (queued["t"] < w.t_end)]
        if len(inside):
            out[i] = float(inside.median())
    return out


def _client_manifest(table: pd.DataFrame, steps: list[dict]) -> None:
    """Copy the load generator's per-step keys (a1) where the manifest has them."""
    by_step = {s.get("step"): s for s in steps}
    for key in CLIENT_KEYS:
        values = [_num(by_step.get(s, {}).get(key)) for s in table["step"]]
        table[key] = np.where(np.isnan(values), table[key], values) if key in table else values
    flags = [by_step.get(s, {}).get("client_limited") for s in table["step"]]
    table["client_limited_manifest"] = [None if f is None else bool(f) for f in flags]
    table["client_limited_reasons"] = [list(by_step.get(s, {}).get("client_limited_reasons") or [])
                                       for s in table["step"]]


def binned(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests with ``t_sent`` filled from ``t_issued`` where the request never went out."""
    if "t_issued" in requests and requests["t_sent"].isna().any():
        requests = requests.assign(t_sent=requests["t_sent"].fillna(requests["t_issued"]))
    return requests


def _client_columns(requests: pd.DataFrame, wins: pd.DataFrame) -> list[dict[str, float]]:
    """:func:`_client_stats` of every window, the rows of each found by one sort (not a
    filter of the whole frame per step: 30 of those cost ~1 s on an hour's 1M rows)."""
    starts, ends = wins["t_start"].to_numpy(dtype=float), wins["t_end"].to_numpy(dtype=float)
    step = requests["step"].to_numpy()
    ok = (requests["status"] == "ok").to_numpy(dtype=bool)
    sent = rows_in(binned(requests)["t_sent"].to_numpy(dtype=float), starts, ends)
    done_ok = np.flatnonzero(ok)
    done = rows_in(requests["t_done"].to_numpy(dtype=float)[done_ok], starts, ends)
    return [_client_stats(requests.iloc[rows[step[rows] == w.step]], requests.iloc[done_ok[d]], w)
            for rows, d, w in zip(sent, done, wins.itertuples(index=False))]


def _client_stats(sent: pd.DataFrame, done: pd.DataFrame, w: Any) -> dict[str, float]:
    """Client figures of one window: ``sent``, the step's requests binned in it; ``done``,
    the successful requests (any step) that finished in it."""
    ok = sent[sent.status == "ok"]
    length = max(w.t_end - w.t_start, 1e-9)
    aborted = int((sent.status == "aborted").sum())
    return {
        "n_sent": len(sent),
        "n_ok": len(ok),
        "n_aborted": aborted,
        "n_err": int(len(sent) - len(ok) - aborted),
        "send_rps": len(sent) / length,
        "send_lag_p99_s": _pct(sent.send_lag_s, 99),
        "rps": len(done) / length,
        "out_tok_s": float(done.output_tokens.fillna(0).sum()) / length,
        "ttft_p50_ms": _pct(ok.ttft_s, 50) * 1e3,
        "ttft_p99_ms": _pct(ok.ttft_s, 99) * 1e3,
        "ttft_mean_ms": _mean(ok.ttft_s) * 1e3,
        "itl_p50_ms": _pct(ok.itl_p50_s, 50) * 1e3,
        "itl_p99_ms": _pct(ok.itl_p99_s, 99) * 1e3,
        "e2e_p50_s": _pct(ok.e2e_s, 50),
        "e2e_mean_s": _mean(ok.e2e_s),
        "prompt_tokens_mean": _mean(ok.prompt_tokens),
        "output_tokens_mean": _mean(ok.output_tokens),
        "burst_share": burst_share(ok),
        **step_counts(sent),
    }


def burst_share(ok: pd.DataFrame, within_s: float = 0.002) -> float:
    """Share of streams of several chunks that all arrived within ``within_s``.

    A server whose API process is starved (vLLM on too few cores) can hold a stream back
    and deliver it whole: its own TTFT histogram does not see that, the user does.
    Spans come from ``itl_mean_s`` and ``n_chunks`` (:func:`~loadlab.analyze.tables.chunk_span_s`).
    """
    spans = chunk_span_s(ok[ok.n_chunks > 1]).dropna().to_numpy(dtype=float)
    return float((spans < within_s).mean()) if len(spans) else float("nan")


def _coverage(scrapes: pd.DataFrame, metrics: pd.DataFrame, span: pd.DataFrame,
              interval_s: float | None) -> np.ndarray:
    """Share of the expected scrapes per step that came back (mean over endpoints)."""
    if not interval_s:
        times = np.sort(metrics["t"].unique())
        interval_s = float(np.median(np.diff(times))) if len(times) > 2 else None
    if not interval_s:
        return np.full(len(span), np.nan)
    if scrapes.empty:  # sim replay and Prometheus reads: the samples present are the scrapes
        scrapes = (metrics[["t", "endpoint"]].drop_duplicates()
                   .assign(ok=True, error=None))
    cov = coverage_windows(scrapes, span, float(interval_s), by=())
    return cov["coverage"].to_numpy(dtype=float)


def _histogram(metrics: pd.DataFrame, role: str, span: pd.DataFrame) -> dict[str, np.ndarray]:
    family = resolve_family(metrics, role)
    n = len(span)
    if family is None:
        return {k: np.full(n, np.nan) for k in ("mean", "sum", "count")}
    stats = histogram_windows(metrics, family, span, quantiles=())
    return {k: _col(stats, k, n) for k in ("mean", "sum", "count")}


def _pct(values: pd.Series, q: float) -> float:
    x = values.dropna().to_numpy(dtype=float)
    return float(np.percentile(x, q)) if len(x) else float("nan")


def _mean(values: pd.Series) -> float:
    x = values.dropna().to_numpy(dtype=float)
    return float(x.mean()) if len(x) else float("nan")


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _col(stats: pd.DataFrame | None, column: str, n: int) -> np.ndarray:
    if stats is None or stats.empty:
        return np.full(n, np.nan)
    return stats[column].to_numpy(dtype=float)


def _cached_rate(metrics: pd.DataFrame, span: pd.DataFrame) -> np.ndarray:
    """Prompt tokens per second served from the prefix cache: ``vllm:prompt_tokens_cached``
    where the server has it, else ``vllm:prompt_tokens_by_source{source="local_cache_hit"}``
    (vLLM exposes both; a server with only the split is read from it)."""
    rate = _counter(metrics, "prompt_tokens_cached", span, "rate_per_s")
    if not np.all(np.isnan(rate)):
        return rate
    split = _counter_stats(metrics, "prompt_tokens_by_source", span, {"source": "local_cache_hit"})
    return _col(split, "rate_per_s", len(span))


def _counter_stats(metrics: pd.DataFrame, role: str, span: pd.DataFrame,
                   where: dict[str, str] | None = None) -> pd.DataFrame | None:
    """:func:`counter_windows` of the role's family (None: the server has no such family)."""
    family = resolve_family(metrics, role)
    return None if family is None else counter_windows(metrics, family, span, where=where)


def _counter(metrics: pd.DataFrame, role: str, span: pd.DataFrame, column: str) -> np.ndarray:
    return _col(_counter_stats(metrics, role, span), column, len(span))
