"""Shared look and helpers of the report's plotly charts.

- one template (font, grid, legend on top), one palette;
- :func:`esc`: run data (point names, flags) HTML-escaped before it enters a figure,
  since plotly renders a subset of HTML in labels and a point name is data, not markup;
- :class:`Canvas`: a row of subplots whose traces, axes, shapes and notes are
  collected as dicts and validated once (see its docstring for why);
- axis helpers: load levels on a log axis when they form a geometric ladder, values
  on a log axis with 1-2-5 ticks when they span a decade, ratios labelled as percent.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

INK, MUTED, GRID = "#1f2937", "#6b7280", "#e5e7eb"
BLUE, RED, PURPLE, GREEN, ORANGE, GREY = (
    "#2563eb",
    "#dc2626",
    "#9333ea",
    "#16a34a",
    "#ea580c",
    "#9ca3af",
)
SERIES = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#db2777", "#65a30d", "#78716c"]
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
TEMPLATE = go.layout.Template(layout=go.Layout(
    font={"family": FONT, "size": 12, "color": INK}, paper_bgcolor="white", plot_bgcolor="white",
    colorway=SERIES, hovermode="x unified", margin={"l": 56, "r": 24, "t": 48, "b": 48},
    legend={"orientation": "h", "yanchor": "bottom", "y": 1.06, "x": 0, "font": {"size": 11}},
    xaxis={"gridcolor": GRID, "linecolor": "#d1d5db", "zeroline": False, "ticks": "outside",
           "tickcolor": "#d1d5db"},
    yaxis={"gridcolor": GRID, "linecolor": "#d1d5db", "zeroline": False, "rangemode": "tozero"},
))
RATIO_TICKS = (0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 0.8, 1.25, 2, 5, 10, 20, 50, 100, 1000)


def esc(text: Any) -> str:
    """Run data as plotly label text: escaped, so a name cannot become markup."""
    return html.escape(str(text), quote=False)


def ref(axis: str, col: int, domain: bool = False) -> str:
    """Axis reference of subplot column ``col`` ("x", "y2", "x3 domain")."""
    return f"{axis}{'' if col == 1 else col}{' domain' if domain else ''}"


class Canvas:
    """One row of subplots built as plain dicts, turned into a plotly figure once.

    plotly lays the subplots out (``make_subplots``); traces, axis settings, shapes and
    notes are then collected as dicts and validated together by :meth:`figure`. Adding
    them one ``add_trace(row=, col=)`` / ``add_vline`` at a time re-validates the figure
    on every call: 15x slower, seconds per sweep point.
    """

    def __init__(self, cols: int = 1, titles: Sequence[str] = (), secondary_y: bool = False,
                 spacing: float = 0.08) -> None:
        specs = [[{"secondary_y": secondary_y}] * cols]
        grid = make_subplots(rows=1, cols=cols, specs=specs, horizontal_spacing=spacing,
                             subplot_titles=[esc(t) for t in titles] or None)
        self.layout: dict[str, Any] = grid.to_dict()["layout"]
        self.layout.pop("template", None)
        self.data: list[dict[str, Any]] = []
        self.shapes: list[dict[str, Any]] = []
        self.notes: list[dict[str, Any]] = list(self.layout.pop("annotations", []))
        self.secondary_y = secondary_y

    def trace(self, col: int = 1, secondary: bool = False, **trace: Any) -> None:
        """A scatter trace (``trace`` as go.Scatter's keywords) on subplot ``col``."""
        yaxis = "y2" if secondary and self.secondary_y else ref("y", col)
        self.data.append({"type": "scatter", "xaxis": ref("x", col), "yaxis": yaxis, **trace})

    def xaxis(self, col: int, **props: Any) -> None:
        self.layout.setdefault(f"xaxis{'' if col == 1 else col}", {}).update(props)

    def yaxis(self, col: int, secondary: bool = False, **props: Any) -> None:
        key = "yaxis2" if secondary and self.secondary_y else f"yaxis{'' if col == 1 else col}"
        self.layout.setdefault(key, {}).update(props)

    def vrect(self, col: int, x0: float, x1: float, fill: str) -> None:
        self.shapes.append({"type": "rect", "xref": ref("x", col), "yref": ref("y", col, True),
                            "x0": x0, "x1": x1, "y0": 0, "y1": 1, "fillcolor": fill,
                            "line": {"width": 0}, "layer": "below"})

    def vline(self, col: int, x: float, color: str, dash: str, width: float = 1.5) -> None:
        self.shapes.append({"type": "line", "xref": ref("x", col), "yref": ref("y", col, True),
                            "x0": x, "x1": x, "y0": 0, "y1": 1,
                            "line": {"color": color, "width": width, "dash": dash}})

    def hline(self, col: int, y: float, color: str, dash: str, width: float = 1.0) -> None:
        self.shapes.append({"type": "line", "xref": ref("x", col, True), "yref": ref("y", col),
                            "x0": 0, "x1": 1, "y0": y, "y1": y,
                            "line": {"color": color, "width": width, "dash": dash}})

    def note(self, text: str, color: str, **where: Any) -> None:
        """Text at ``where`` (x, y, xref, yref, anchors, shifts); escaped here."""
        self.notes.append(
            {
                "text": esc(text),
                "showarrow": False,
                "font": {"color": color, "size": 11},
                "xanchor": "left",
                "yanchor": "bottom",
                **where,
            }
        )

    def figure(self, **layout: Any) -> go.Figure:
        """The validated figure, with the shared template and ``layout`` on top."""
        return go.Figure(data=self.data, layout={**self.layout, "shapes": self.shapes,
                                                 "annotations": self.notes, "template": TEMPLATE,
                                                 **layout})


def pos(value: float, log: bool) -> float:
    """Annotation coordinate of a data value (plotly wants log10 of it on a log axis)."""
    return float(np.log10(value)) if log and value > 0 else float(value)


def level_axes(canvas: Canvas, x: np.ndarray, title: str, cols: int) -> bool:
    """Log axis for geometric level ladders, ticks at the levels tried; returns whether log."""
    levels = sorted({float(v) for v in x if np.isfinite(v) and v > 0})
    log = len(levels) > 2 and levels[-1] / levels[0] >= 8
    for col in range(1, cols + 1):
        canvas.xaxis(col, type="log" if log else "linear", tickvals=levels,
                     ticktext=[f"{v:g}" for v in levels], title={"text": esc(title)})
    return log


def value_axis(canvas: Canvas, values: np.ndarray, col: int) -> bool:
    """A y axis from 0, or log with 1-2-5 ticks when the values span a decade; returns
    whether log."""
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) == 0 or values.max() / values.min() < 10:
        canvas.yaxis(col, rangemode="tozero")
        return False
    ticks = log_ticks(values)
    canvas.yaxis(
        col, type="log", rangemode="normal", tickvals=ticks, ticktext=[short(t) for t in ticks]
    )
    return True


def ratio_axis(canvas: Canvas, values: np.ndarray, col: int) -> None:
    """Log axis of new / base, ticks named as percent changes (x0.5 = -50%, x2 = +100%)."""
    values = values[np.isfinite(values) & (values > 0)]
    lo = float(np.clip(min(values.min(), 0.8) if len(values) else 0.8, 1e-3, 0.8))
    hi = float(np.clip(max(values.max(), 1.25) if len(values) else 1.25, 1.25, 1e3))
    span = np.log10(hi / lo)
    ticks = [1.0]
    for t in sorted(RATIO_TICKS, key=lambda t: abs(np.log10(t))):   # nearest 0 first
        if lo / 1.1 <= t <= hi * 1.1 and all(abs(np.log10(t / u)) >= span / 7 for u in ticks):
            ticks.append(t)
    ticks.sort()
    canvas.yaxis(col, type="log", range=[np.log10(lo / 1.15), np.log10(hi * 1.15)], tickvals=ticks,
                 ticktext=[f"{(t - 1) * 100:+.0f}%" if t != 1 else "0" for t in ticks])


def log_ticks(values: np.ndarray) -> list[float]:
    """1-2-5 ticks over the values' range (1-10-100 when that spans more than 3 decades)."""
    lo, hi = float(values.min()), float(values.max())
    marks = (1, 2, 5) if hi / lo <= 1e3 else (1,)
    ticks = [m * 10.0**e for e in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
             for m in marks]
    return [t for t in ticks if lo / 1.5 <= t <= hi * 1.5]


def short(v: float) -> str:
    """1-2-5 tick text: 0.5, 20, 500, 2k, 10k."""
    return f"{v / 1000:g}k" if v >= 1000 else f"{v:g}"
