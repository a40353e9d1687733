"""Render a run or sweep folder into one self-contained HTML file.

The page is a jinja2 template with autoescape on (every string from a run folder
is data: a point name, a flag value or an error text holding ``<script>`` shows as
text). plotly.js is inlined once; each chart is the JSON of a plotly figure in one
``application/json`` block, drawn by a few lines of script. A Content-Security-Policy
forbids every network fetch, so the file behaves the same opened from disk, offline.
"""

from __future__ import annotations

import datetime as dt
import json
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import plotly.graph_objects as go
import yaml
from plotly.offline import get_plotlyjs

from loadlab.errors import InputError
from loadlab.report import figures, summary, tables
from loadlab.report.ab import ArmComparison, compare_arms
from loadlab.report.fleet_panel import fleet_capacity, fleet_rows
from loadlab.report.inputs import Point, RunSet, load
from loadlab.report.series import timeline
from loadlab.runstore.layout import REPORT
from loadlab.version import __version__

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("loadlab.report", "templates"),
                          autoescape=True, undefined=jinja2.StrictUndefined,
                          trim_blocks=True, lstrip_blocks=True)


@dataclass
class PointView:
    """Everything the template shows for one point."""

    row: summary.VerdictRow
    point: Point
    sentence: str
    cause_detail: str
    evidence: list[str]
    ranked: list[str]
    warnings: list[str]
    client_limited: list[str]
    step_headers: list[str]
    step_rows: list[dict[str, Any]]
    capacity: list[tuple[str, str]]
    manifest: list[tuple[str, list[tuple[str, str]]]]
    figures: list[str] = field(default_factory=list)   # ids of the charts drawn for it
    lanes: list[str] = field(default_factory=list)     # ids of a fleet's replica lanes
    fleet: list[tuple[str, str]] = field(default_factory=list)   # a fleet's panel rows


@dataclass
class ArmView:
    comparison: ArmComparison
    figure: str


def write_report(root: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of a run or sweep folder (default ``<root>/report.html``); return
    its path. A place that cannot be written (a read-only run folder, a full disk) is an
    InputError naming it: the user chooses another with ``--out``."""
    runset = load(root)
    path = Path(out) if out else runset.root / REPORT
    html = render(runset)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(html, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        with suppress(OSError):      # half a file (a full disk) is not left behind
            tmp.unlink(missing_ok=True)
        fix = "give --out a file in a writable folder" if out else "give --out FILE"
        raise InputError(f"cannot write the report here ({exc.strerror or exc})", source=path,
                         fix=fix) from None
    return path


def render(runset: RunSet) -> str:
    """The report page of ``runset`` as one HTML string."""
    charts: dict[str, go.Figure] = {}
    views = [
        _point_view(row, p, charts) for row, p in zip(summary.verdict_rows(runset), runset.points)
    ]
    analysed = [p for p in runset.points if p.analysis and not p.steps.empty]
    if runset.kind == "sweep" and len(analysed) > 1:
        charts["comparison-chart"] = figures.overlay(analysed)
    arms = []
    for k, arm in enumerate(_arms(runset)):
        charts[f"ab-chart-{k + 1}"] = figures.ab_deltas(arm)
        arms.append(ArmView(comparison=arm, figure=f"ab-chart-{k + 1}"))
    return _ENV.get_template("report.html.j2").render(
        title=_title(runset),
        runset=runset,
        kpis=summary.kpis(runset),
        rows=[v.row for v in views],
        views=views,
        arms=arms,
        has_comparison="comparison-chart" in charts,
        header=_header(runset),
        scenario=yaml.safe_dump(
            json.loads(json.dumps(runset.manifest["scenario"], default=str)), sort_keys=False
        )
        if runset.manifest.get("scenario")
        else "",
        level=summary.level,
        num=summary.num,
        pct=summary.pct,
        share=summary.share,
        version=__version__,
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        plotly_js=get_plotlyjs(),
        figures_json=_figures_json(charts),
    )


def _point_view(row: summary.VerdictRow, p: Point, charts: dict[str, go.Figure]) -> PointView:
    cause = p.section("cause")
    headers, rows = tables.step_table(p)
    view = PointView(
        row=row, point=p, sentence=summary.knee_sentence(p), cause_detail=summary.cause_detail(p),
        evidence=summary.evidence_lines(cause), ranked=summary.ranked_causes(cause),
        warnings=list(p.analysis.warnings) if p.analysis else [],
        client_limited=tables.client_limited_notes(p), step_headers=headers, step_rows=rows,
        capacity=tables.capacity_rows(p),
        manifest=tables.manifest_sections(p))
    if p.analysis and not p.steps.empty:
        _add(charts, view, f"{row.anchor}-load", figures.load_curves(p))
    if p.run_dir is not None and p.manifest:
        tl = timeline(p.run_dir, p.manifest)
        if not tl.empty:
            _add(charts, view, f"{row.anchor}-timeline", figures.timeline(p, tl))
    for k, replica in enumerate((p.analysis.replicas or []) if p.analysis else []):
        if p.run_dir is not None and p.manifest:
            lane = timeline(p.run_dir, p.manifest, endpoint=replica.endpoint)
            if not lane.empty:   # one lane per replica of a fleet: its own queue and KV
                _add(charts, view, f"{row.anchor}-replica-{k}",
                     figures.timeline(p, lane, title=figures.replica_title(replica)))
                view.lanes.append(f"{row.anchor}-replica-{k}")
    view.fleet = fleet_rows(p)
    panel = fleet_capacity(p) if view.fleet else None
    if panel is not None:
        _add(charts, view, f"{row.anchor}-fleet", panel)
    capacity = figures.capacity(p) if p.analysis else None
    if capacity is not None:
        _add(charts, view, f"{row.anchor}-capacity", capacity)
    return view


def _add(charts: dict[str, go.Figure], view: PointView, chart_id: str, fig: go.Figure) -> None:
    charts[chart_id] = fig
    view.figures.append(chart_id)


def _arms(runset: RunSet) -> list[ArmComparison]:
    """Each analysed point against the baseline (the first point of an A/B without one)."""
    name = runset.baseline or (
        runset.points[0].name if runset.mode == "ab" and runset.points else None
    )
    base = runset.point(name) if name else None
    if base is None or not base.analysis or base.run_dir is None:
        return []
    return [compare_arms(base, p) for p in runset.points
            if p is not base and p.analysis and p.run_dir is not None and p.unit == base.unit]


def _title(runset: RunSet) -> str:
    scenario = runset.manifest.get("scenario") or {}
    return str(scenario.get("name") or runset.root.resolve().name)


def _header(runset: RunSet) -> list[tuple[str, str]]:
    """Facts under the title: kind, status, model, GPU, when."""
    first = next((p.manifest for p in runset.points if p.manifest), runset.manifest)
    target, server = first.get("target") or {}, first.get("server") or {}
    facts = [("kind", "sweep" if runset.kind == "sweep" else str(first.get("kind") or "run")),
             ("status", runset.status if runset.kind == "sweep" else runset.points[0].status),
             ("model", target.get("model") or server.get("model")), ("GPU", server.get("gpu")),
             ("workload", (first.get("workload") or {}).get("profile")),
             ("started", summary.when(runset.manifest.get("created")))]
    if runset.kind == "sweep":
        facts.insert(1, ("mode", runset.mode))
    return [(k, str(v)) for k, v in facts if v]


def _figures_json(charts: dict[str, go.Figure]) -> str:
    """One JSON object {chart id: figure}; '<' escaped so no text can close the script block."""
    body = ",".join(f"{json.dumps(key)}:{fig.to_json()}" for key, fig in charts.items())
    return ("{" + body + "}").replace("<", "\\u003c")
