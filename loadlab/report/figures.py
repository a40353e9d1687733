"""The report's interactive charts, as plotly figures (the page renders them).

- :func:`load_curves`: one point's throughput, TTFT and ITL percentiles against load,
  the knee bracket shaded, the SLO-limited level and client-limited steps marked.
- :func:`timeline`: running, waiting, the client's in-flight count and KV usage over
  time, each load step a band (stalled steps tinted), the max_num_seqs cap drawn, so
  "KV 26% but requests waiting" shows at a glance.
- :func:`overlay`: every point's throughput and TTFT p99 against load, knee marked.
- :func:`ab_deltas`: an arm's change against the baseline per level, with its
  bootstrap interval, on a log axis of new / base labelled in percent.
- :func:`capacity`: the capacity formula, its practical range and vLLM's own figure
  beside the measured knee.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from loadlab.report.ab import ArmComparison
from loadlab.report.inputs import Point
from loadlab.report.plotkit import (
    BLUE,
    GREEN,
    GREY,
    MUTED,
    ORANGE,
    PURPLE,
    RED,
    SERIES,
    Canvas,
    esc,
    level_axes,
    log_ticks,
    pos,
    ratio_axis,
    ref,
    short,
    value_axis,
)
from loadlab.report.series import Timeline
from loadlab.report.summary import level, level_axis, max_level
from loadlab.report.tables import stalled_step_numbers
from loadlab.runstore.analysis_model import ReplicaVerdict

PERCENTILE_COLORS = {"ttft": {50: "#38bdf8", 90: "#6366f1", 95: "#8b5cf6", 99: "#9333ea"},
                     "itl": {50: "#34d399", 90: "#10b981", 95: "#059669", 99: "#047857"}}
KNEE_FILL = "rgba(220,38,38,0.10)"
_PCT = re.compile(r"^(ttft|itl)_p(\d+)_ms$")
_TARGET = re.compile(r"^(ttft|itl)_p(\d+(?:\.\d+)?)_(ms|s)$")    # SLO names: ttft_p99_ms, itl_p90_s


def load_curves(point: Point) -> go.Figure:
    """Throughput | TTFT | ITL against load for one point, knee bracket shaded."""
    steps = point.steps.sort_values(point.level_column)
    x = steps[point.level_column].to_numpy(dtype=float)
    c = Canvas(cols=3, titles=("Output throughput (tok/s)", "Time to first token (ms)",
                               "Inter-token latency (ms)"))
    c.trace(1, x=x, y=steps["out_tok_s"], name="output tok/s", mode="lines+markers",
            line={"color": BLUE, "width": 2.5}, hovertemplate="%{y:,.0f} tok/s<extra></extra>")
    log_y = {}
    for col, metric in ((2, "ttft"), (3, "itl")):
        columns = _percentile_columns(steps, metric)
        for q, column in columns:
            c.trace(col, x=x, y=steps[column], name=f"{metric.upper()} p{q}", mode="lines+markers",
                    line={"color": PERCENTILE_COLORS[metric].get(q, MUTED), "width": 2,
                          "dash": "solid" if q >= 90 else "dot"},
                    hovertemplate=f"p{q} %{{y:,.1f}} ms<extra></extra>")
        values = (
            steps[[name for _, name in columns]].to_numpy(dtype=float).ravel()
            if columns
            else np.array([])
        )
        log_y[col] = value_axis(c, values, col)
    c.yaxis(1, rangemode="tozero")
    _client_limited(c, point, steps, x)
    log_x = level_axes(c, x, level_axis(point.unit), cols=3)
    _knee_marks(c, point, log_x)
    _slo_marks(c, point, log_x, log_y)
    return c.figure(height=380, hovermode="x unified", margin={"t": 84}, legend={"y": 1.2})


def replica_title(replica: ReplicaVerdict) -> str:
    """A fleet lane's title: the replica, its pool, and its own knee."""
    knee = replica.knee
    where = (f"knee ({short(knee.lower or 0)}, {short(knee.upper)}]"
             if knee.found and knee.upper is not None else "no knee")
    pool = f" (pool {replica.pool})" if replica.pool else ""
    return f"replica {replica.endpoint}{pool}: {where}, cause {replica.cause.name}"


def timeline(point: Point, tl: Timeline, title: str | None = None) -> go.Figure:
    """Queue and KV usage over time with the step bands (``title``: a fleet's lane)."""
    c = Canvas(secondary_y=True)
    stalled_steps = set(stalled_step_numbers(point))
    for k, band in enumerate(tl.bands):
        stalled = band.step in stalled_steps
        c.vrect(1, band.t_start, band.t_end,
                "rgba(220,38,38,0.07)" if stalled else ("#f3f4f6" if k % 2 else "white"))
        if band.t_measured > band.t_start:
            c.vrect(1, band.t_start, band.t_measured, "rgba(156,163,175,0.18)")
        c.note(_band_label(band.level, point.unit), RED if stalled else MUTED,
               x=(band.t_start + band.t_end) / 2, y=1.0, xref="x", yref="paper", xanchor="center")
    if tl.inflight is not None:
        c.trace(x=tl.t, y=tl.inflight, name="in flight (client)", mode="lines",
                line={"color": GREY, "width": 1.5, "dash": "dot", "shape": "hv"})
    styles = {"running": (BLUE, None), "waiting": (RED, "rgba(220,38,38,0.15)")}
    for name, (color, fill) in styles.items():
        if name in tl.gauges:
            filled: dict[str, Any] = {"fill": "tozeroy", "fillcolor": fill} if fill else {}
            c.trace(x=tl.t, y=tl.gauges[name], name=name, mode="lines",
                    line={"color": color, "width": 2, "shape": "hv"}, **filled)
    if "kv" in tl.gauges:
        c.trace(
            secondary=True,
            x=tl.t,
            y=tl.gauges["kv"] * 100,
            name="KV usage %",
            mode="lines",
            line={"color": PURPLE, "width": 1.5},
            fill="tozeroy",
            fillcolor="rgba(147,51,234,0.08)",
            hovertemplate="%{y:.1f}%<extra>KV usage</extra>",
        )
    cap = _max_num_seqs(point)
    if cap is not None and cap <= 2 * _peak_count(tl):
        c.hline(1, cap, BLUE, "dash")
        c.note(f"max_num_seqs = {cap:g}", BLUE, x=0, y=cap, xref=ref("x", 1, True), yref="y")
    c.xaxis(1, title={"text": "seconds since the first step (grey: warm-up, not measured)"})
    c.yaxis(1, title={"text": "requests"}, rangemode="tozero")
    c.yaxis(1, secondary=True, title={"text": "KV cache usage %"}, range=[0, 100], showgrid=False,
            color=PURPLE, tickmode="linear", tick0=0, dtick=25)
    if title:
        return c.figure(height=300, margin={"t": 84}, title={"text": esc(title), "x": 0})
    return c.figure(height=340, margin={"t": 64})


def overlay(points: Sequence[Point]) -> go.Figure:
    """Every point's throughput and TTFT p99 against load, each knee a diamond."""
    c = Canvas(cols=2, titles=("Output throughput (tok/s)", "TTFT p99 (ms)"))
    xs, ttft = [], []
    for k, p in enumerate(points):
        steps = p.steps.sort_values(p.level_column)
        x = steps[p.level_column].to_numpy(dtype=float)
        xs.extend(x)
        color = SERIES[k % len(SERIES)]
        upper = _knee_upper(p)
        at = steps[steps[p.level_column] == upper]
        for col, column in ((1, "out_tok_s"), (2, "ttft_p99_ms")):
            if column not in steps:
                continue
            c.trace(col, x=x, y=steps[column], name=esc(p.name), legendgroup=str(k),
                    showlegend=col == 1, mode="lines+markers", line={"color": color, "width": 2},
                    hovertemplate="%{y:,.0f}")
            if not at.empty:
                c.trace(
                    col,
                    x=[upper],
                    y=[at[column].iloc[0]],
                    legendgroup=str(k),
                    showlegend=False,
                    mode="markers",
                    name="knee",
                    hovertemplate="knee<extra></extra>",
                    marker={
                        "symbol": "diamond",
                        "size": 13,
                        "color": color,
                        "line": {"color": "white", "width": 1.5},
                    },
                )
        if "ttft_p99_ms" in steps:
            ttft.extend(steps["ttft_p99_ms"].to_numpy(dtype=float))
    level_axes(c, np.asarray(xs, dtype=float), level_axis(points[0].unit), cols=2)
    c.yaxis(1, rangemode="tozero")
    value_axis(c, np.asarray(ttft, dtype=float), 2)
    return c.figure(height=400, hovermode="closest", margin={"t": 84}, legend={"y": 1.2})


def ab_deltas(arm: ArmComparison) -> go.Figure:
    """Each metric's new / base per level, with its interval; green better, red worse."""
    labels = [d.label for d in arm.levels[0].deltas] if arm.levels else []
    cols = max(len(labels), 1)
    c = Canvas(cols=cols, titles=labels, spacing=0.07)
    colors = {"better": GREEN, "worse": RED, "same": GREY, "unknown": GREY}
    x = np.array([lv.level for lv in arm.levels], dtype=float)
    for col, label in enumerate(labels, start=1):
        ds = [next(d for d in lv.deltas if d.label == label) for lv in arm.levels]
        ratio = np.array([1 + d.change for d in ds])
        low, high = np.array([1 + d.low for d in ds]), np.array([1 + d.high for d in ds])
        c.trace(
            col,
            x=x,
            y=ratio,
            mode="markers",
            showlegend=False,
            name=esc(label),
            marker={"size": 10, "color": [colors[d.verdict] for d in ds]},
            customdata=np.stack([(ratio - 1) * 100, (low - 1) * 100, (high - 1) * 100], axis=-1),
            error_y={
                "type": "data",
                "symmetric": False,
                "color": MUTED,
                "thickness": 1.5,
                "array": high - ratio,
                "arrayminus": ratio - low,
            },
            hovertemplate="%{customdata[0]:+.1f}% [%{customdata[1]:+.1f}, %{customdata[2]:+.1f}]"
            "<extra></extra>",
        )
        c.hline(col, 1, MUTED, "solid")
        ratio_axis(c, np.concatenate([ratio, low, high]), col)
    level_axes(c, x, level_axis(arm.unit), cols=cols)
    return c.figure(height=300, hovermode="closest")


def capacity(point: Point) -> go.Figure | None:
    """Formula, practical range and vLLM's estimate against the measured knee (None if no
    figures)."""
    cap = point.section("capacity")
    knee = point.section("knee")
    closed = point.unit == "concurrency"        # a rate knee is not on the concurrency axis
    no_knee = closed and bool(knee) and not knee.get("found")
    rows = [("formula", cap.get("formula_max_concurrency"), BLUE),
            ("practical (60-70%)", cap.get("practical_range"), GREEN),
            ("vLLM kv_cache_max_concurrency", cap.get("vllm_kv_cache_max_concurrency"), PURPLE),
            ("measured knee", cap.get("measured_knee") if closed and not no_knee else None, RED)]
    c = Canvas()
    values: list[float] = []
    reach = max_level(point) if no_knee else None
    if reach is not None:
        values.append(reach)
        c.trace(x=[reach], y=["measured: no knee"], mode="markers+text", showlegend=False,
                marker={"size": 14, "color": GREEN, "symbol": "triangle-right"},
                text=[esc(f"none up to {reach:g}")], textposition="middle left",
                hovertemplate="%{x:,.1f}<extra></extra>")
    for name, value, color in reversed(rows):
        span = _span(value)
        if span is None:
            continue
        values += list(span)
        ranged = span[1] > span[0]
        c.trace(x=list(span) if ranged else [span[0]], y=[name, name] if ranged else [name],
                mode="lines+markers" if ranged else "markers", showlegend=False,
                line={"color": color, "width": 10},
                marker={"size": 12 if ranged else 14, "color": color,
                        "symbol": "circle" if ranged else "diamond"},
                hovertemplate="%{x:,.1f}<extra></extra>")
    if not values:
        return None
    positive = np.array([v for v in values if v > 0])
    log = len(positive) > 0 and positive.max() / positive.min() > 20
    ticks = log_ticks(positive) if log else None
    c.xaxis(1, type="log" if log else "linear", title={"text": "concurrent requests"},
            **({"tickvals": ticks, "ticktext": [short(t) for t in ticks]} if ticks else {}))
    c.yaxis(1, rangemode="normal", showgrid=False)
    return c.figure(height=230, hovermode="closest", margin={"l": 210, "t": 24})


def _span(value: Any) -> tuple[float, float] | None:
    """A number, [lo, hi] or {"lower"/"low", "upper"/"high"} as (lo, hi)."""
    if isinstance(value, dict):
        value = [
            v
            for v in (value.get("lower", value.get("low")), value.get("upper", value.get("high")))
            if v is not None
        ]
    if isinstance(value, (list, tuple)):
        nums = [float(v) for v in value if isinstance(v, (int, float))]
        return (min(nums), max(nums)) if nums else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
        return float(value), float(value)
    return None


def _percentile_columns(steps: pd.DataFrame, metric: str) -> list[tuple[int, str]]:
    found = [(int(m.group(2)), c) for c in steps.columns
             if (m := _PCT.match(c)) and m.group(1) == metric and not steps[c].isna().all()]
    return sorted(found)


def _knee_upper(point: Point) -> float | None:
    upper = point.section("knee").get("upper")
    return float(upper) if isinstance(upper, (int, float)) else None


def _knee_marks(c: Canvas, point: Point, log_x: bool) -> None:
    """The knee bracket (last good, first stalled] shaded on every panel, its upper end drawn."""
    knee = point.section("knee")
    upper, lower = knee.get("upper"), knee.get("lower")
    if not knee.get("found") or not isinstance(upper, (int, float)):
        return
    for col in (1, 2, 3):
        if isinstance(lower, (int, float)):
            c.vrect(col, lower, upper, KNEE_FILL)
        c.vline(col, upper, RED, "dash")
    c.note("knee", RED, x=pos(upper, log_x), y=1.0, xref="x", yref=ref("y", 1, True),
           yanchor="top", xshift=4)


def _slo_marks(c: Canvas, point: Point, log_x: bool, log_y: dict[int, bool]) -> None:
    """The highest level meeting the SLOs (vertical) and each latency target (horizontal)."""
    slo = point.section("slo")
    best = slo.get("max_level_meeting")
    if isinstance(best, (int, float)):
        for col in (1, 2, 3):
            c.vline(col, best, GREEN, "dot")
        c.note(
            "SLO met", GREEN, x=pos(best, log_x), y=0.0, xref="x", yref=ref("y", 1, True), xshift=4
        )
    for key, target in (slo.get("targets") or {}).items():
        m = _TARGET.match(str(key))
        if m and isinstance(target, (int, float)):
            col = 2 if m.group(1) == "ttft" else 3
            ms = target * (1e3 if m.group(3) == "s" else 1.0)
            c.hline(col, ms, GREEN, "dot")
            c.note(f"SLO p{m.group(2)}", GREEN, x=0, y=pos(ms, log_y[col]),
                   xref=ref("x", col, True), yref=ref("y", col), xshift=4)


def _client_limited(c: Canvas, point: Point, steps: pd.DataFrame, x: np.ndarray) -> None:
    """Cross the throughput of steps where the load generator fell short of the asked load."""
    limited = set(point.manifest.get("client_limited_steps") or [])
    if "client_limited" in steps:
        limited |= set(steps.loc[steps["client_limited"].fillna(False).astype(bool), "step"])
    mask = steps["step"].isin(limited).to_numpy()
    if mask.any():
        c.trace(1, x=x[mask], y=steps["out_tok_s"].to_numpy()[mask], mode="markers",
                name="client-limited step", hovertemplate="client-limited<extra></extra>",
                marker={"symbol": "x-thin-open", "size": 16, "color": ORANGE,
                        "line": {"width": 2.5, "color": ORANGE}})


def _peak_count(tl: Timeline) -> float:
    series = [v for k, v in tl.gauges.items() if k != "kv"] + (
        [tl.inflight] if tl.inflight is not None else []
    )
    peaks = [float(np.nanmax(v)) for v in series if len(v) and np.isfinite(v).any()]
    return max(peaks + [1.0])


def _band_label(value: float, unit: str) -> str:
    return level(value, unit) if unit == "rate" else f"c={value:g}"


def _max_num_seqs(point: Point) -> float | None:
    for source in (point.flags, point.manifest.get("server") or {}):
        value = source.get("max_num_seqs")
        if isinstance(value, (int, float)):
            return float(value)
    return None
