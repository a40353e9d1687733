"""A fleet's panel: the fleet's knee beside the sum of its replicas' capacities.

Each replica's capacity is what it ran (mean running) at its own first stalled level, the
analyzer's ``capacity.at_knee`` (:mod:`loadlab.analyze.fleet`); summed, it is what the
replicas together held before each queued. A fleet knee well below that sum says the
fleet stalled while some replica still had room: the router's doing, not the replicas'
(``routing_imbalance``). A fleet knee near it says the replicas filled together: more
replicas, or bigger ones, move the knee. The KV formula's capacity summed over the
replicas (``imbalance.fleet_capacity``) is drawn too, as the pool arithmetic's ceiling.
"""

from __future__ import annotations

import plotly.graph_objects as go

from loadlab.report.inputs import Point
from loadlab.report.plotkit import BLUE, GREEN, RED, SERIES, Canvas, esc
from loadlab.report.summary import figure_text, knee_text, share, to_float

SUM_ROW = "replicas at their knees, summed"
KNEE_ROW = "fleet knee"
FORMULA_ROW = "KV formula, summed"


def fleet_rows(point: Point) -> list[tuple[str, str]]:
    """The panel's table: the fleet's knee, the capacities and each replica's line
    ([] for one server)."""
    replicas = point.analysis.replicas if point.analysis else None
    if not replicas:
        return []
    imb = point.section("imbalance")
    total = imb.get("replica_capacity_sum")
    bound = "≥ " if imb.get("replica_capacity_bound") == "at least" else ""
    rows = [(KNEE_ROW, knee_text(point)),
            (SUM_ROW, f"{bound}{figure_text(total)}" if total is not None else "—"),
            (FORMULA_ROW, figure_text(imb.get("fleet_capacity"))
             if imb.get("fleet_capacity") is not None else "—"),
            ("stalled steps imbalanced", share(to_float(imb.get("stalled_share"))))]
    for r in replicas:
        cap = r.capacity.model_extra or {}
        knee = r.knee
        where = (f"knee ({figure_text(knee.lower)}, {figure_text(knee.upper)}]"
                 if knee.found and knee.upper is not None else "no knee")
        ran = cap.get("at_knee")
        held = (f"{'≥ ' if cap.get('at_knee_bound') == 'at least' else ''}"
                f"{figure_text(ran)} running" if ran is not None else "running unknown")
        pool = f" (pool {r.pool})" if r.pool else ""
        rows.append((f"replica {r.endpoint}{pool}",
                     f"{where}, {held}, cause {r.cause.name}, "
                     f"{share(to_float(r.imbalance_share))} of the stranded queue"))
    return rows


def fleet_capacity(point: Point) -> go.Figure | None:
    """Each replica's capacity at its knee stacked into their sum, beside the fleet's knee
    bracket and the summed KV formula (None for one server or without the figures)."""
    replicas = point.analysis.replicas if point.analysis else None
    if not replicas or point.unit != "concurrency":
        return None
    c = Canvas()
    start = 0.0
    for k, r in enumerate(replicas):
        ran = to_float((r.capacity.model_extra or {}).get("at_knee"))
        if ran is None:
            return None
        c.trace(x=[start, start + ran], y=[SUM_ROW, SUM_ROW], mode="lines", name=esc(r.endpoint),
                line={"color": SERIES[k % len(SERIES)], "width": 14},
                hovertemplate=esc(f"{r.endpoint}: {ran:.1f} running at its knee")
                + "<extra></extra>")
        start += ran
    knee = point.section("knee")
    lower, upper = to_float(knee.get("lower")), to_float(knee.get("upper"))
    if knee.get("found") and upper is not None:
        span = [lower if lower is not None else 0.0, upper]
        c.trace(x=span, y=[KNEE_ROW, KNEE_ROW], mode="lines+markers", showlegend=False,
                line={"color": RED, "width": 10}, marker={"size": 12, "color": RED},
                hovertemplate="%{x:,.0f} concurrent<extra></extra>")
    elif lower is not None:
        c.trace(x=[lower], y=[KNEE_ROW], mode="markers+text", showlegend=False,
                marker={"size": 14, "color": GREEN, "symbol": "triangle-right"},
                text=[esc(f"none up to {lower:g}")], textposition="middle left",
                hovertemplate="%{x:,.0f}<extra></extra>")
    formula = to_float(point.section("imbalance").get("fleet_capacity"))
    if formula is not None:
        c.trace(x=[formula], y=[FORMULA_ROW], mode="markers", showlegend=False,
                marker={"size": 14, "color": BLUE, "symbol": "diamond"},
                hovertemplate="%{x:,.1f}<extra></extra>")
    c.xaxis(1, title={"text": "concurrent requests"}, rangemode="tozero")
    c.yaxis(1, rangemode="normal", showgrid=False,
            categoryorder="array", categoryarray=[FORMULA_ROW, SUM_ROW, KNEE_ROW])
    return c.figure(height=260, hovermode="closest", margin={"l": 230, "t": 48})

