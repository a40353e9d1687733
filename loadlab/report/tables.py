"""The report's tables: per-step figures, capacity, the manifest, client-limited steps.

Plain strings for the page template (it escapes them), computed from the analysis
and the manifest; nothing new is measured here.
"""

from __future__ import annotations

from typing import Any

from loadlab.analyze.display import COLUMNS
from loadlab.report.inputs import Point
from loadlab.report.summary import DASH, figure_text, flag_text, level, level_axis, to_float, when

# Per-step columns the page shows, by the analyzer's names; headers and number formats are
# the console's (analyze.display.COLUMNS), so both say the same. The load level, the step
# and its state are drawn separately.
STEP_KEYS = (
    "n_ok",
    "n_err",
    "out_tok_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "queue_share",
    "inflight",
    "running_max",
    "running_itl",
    "waiting_mean",
    "waiting_max",
    "kv_max",
    "preemptions",
    "prefix_hit_rate",
    "goodput_rps",
)
_CONSOLE = {key: (header, fmt) for key, header, fmt in COLUMNS}


def step_table(point: Point) -> tuple[list[str], list[dict[str, Any]]]:
    """Headers and rows of the per-step table (columns the analysis has), stalled rows flagged."""
    steps = point.steps
    if steps.empty:
        return [], []
    cols = [k for k in STEP_KEYS if k in steps and steps[k].notna().any()]
    stalled = set(stalled_step_numbers(point))
    limited = set(point.manifest.get("client_limited_steps") or [])
    rows = []
    for _, r in steps.iterrows():
        lvl = to_float(r.get(point.level_column))
        flags = ["stalled"] if int(r["step"]) in stalled else []
        if r.get("state") == "client_limited" or int(r["step"]) in limited:
            flags.append("client-limited")
        rows.append({"step": int(r["step"]), "level": level(lvl, point.unit), "flags": flags,
                     "cells": [_cell(r.get(k), _CONSOLE[k][1]) for k in cols]})
    return ["step", level_axis(point.unit), *[_CONSOLE[k][0] for k in cols]], rows


def _cell(value: Any, fmt: str) -> str:
    number = to_float(value)
    return DASH if number is None else fmt.format(number)


def stalled_step_numbers(point: Point) -> list[int]:
    """Steps the analyzer judged stalled (its ``state`` column), else those at or past the knee."""
    steps = point.steps
    if steps.empty:
        return []
    if "state" in steps:
        return [int(s) for s in steps.loc[steps["state"] == "stalled", "step"]]
    upper = to_float(point.section("knee").get("upper"))
    levels = steps[point.level_column].astype(float) if point.level_column in steps else None
    if upper is None or levels is None:
        return []
    return [int(s) for s in steps.loc[levels >= upper, "step"]]


def manifest_sections(point: Point) -> list[tuple[str, list[tuple[str, str]]]]:
    """The manifest as titled key/value lists: server flags, target, workload, host, timing."""
    m = point.manifest
    target = m.get("target") or {}
    sections = [
        ("Server flags", _pairs(point.flags or m.get("server") or {})),
        ("Target", _pairs({k: v for k, v in target.items() if k != "launch"})
         + _pairs({"argv": " ".join(map(str, (target.get("launch") or {}).get("argv") or []))})),
        ("Workload", _pairs(m.get("workload") or {})),
        ("Versions", _pairs(m.get("versions") or {})),
        ("Host and isolation", _pairs({**(m.get("host") or {}), "isolation": m.get("isolation")})),
        ("Run", _pairs({"kind": m.get("kind"), "status": m.get("status"), "error": m.get("error"),
                        "stop_reason": m.get("stop_reason"), "created": when(m.get("created")),
                        "finished": when(m.get("finished")),
                        "client_limited_steps": m.get("client_limited_steps")})),
    ]
    return [(title, pairs) for title, pairs in sections if pairs]


def client_limited_notes(point: Point) -> list[str]:
    """Each client-limited step with the load generator's own reasons."""
    notes = []
    for s in point.manifest.get("steps") or []:
        if s.get("client_limited"):
            why = "; ".join(map(str, s.get("client_limited_reasons") or [])) or "no reason given"
            lvl = s.get("concurrency") if s.get("concurrency") is not None else s.get("target_rate")
            notes.append(f"step {s.get('step')} ({level(lvl, point.unit)}): {why}")
    return notes


def capacity_rows(point: Point) -> list[tuple[str, str]]:
    """analysis.json ``capacity`` as key/value text, numbers rounded, ranges as "a – b"."""
    return [(str(k), figure_text(v)) for k, v in point.section("capacity").items() if v is not None]


def _pairs(d: dict[str, Any]) -> list[tuple[str, str]]:
    return [(str(k), flag_text(v)) for k, v in d.items() if v not in (None, "", [], {})]
