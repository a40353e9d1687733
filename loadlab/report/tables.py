"""The report's tables: per-step figures, capacity, the manifest, client-limited steps.

Plain strings for the page template (it escapes them), computed from the analysis
and the manifest; nothing new is measured here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadlab.report.inputs import Point
from loadlab.report.summary import figure_text, flag_text, level, level_axis, num, to_float, when


@dataclass
class Column:
    """A per-step table column: the analysis key, its header and how to print a value."""

    key: str
    header: str
    fmt: Callable[[Any], str]


def _fixed(digits: int, scale: float = 1.0) -> Callable[[Any], str]:
    return lambda x: num(None if x is None else float(x) * scale, digits)


STEP_COLUMNS = [
    Column("n_ok", "ok", _fixed(0)), Column("n_err", "errors", _fixed(0)),
    Column("out_tok_s", "out tok/s", _fixed(0)), Column("ttft_p50_ms", "TTFT p50 ms", _fixed(0)),
    Column("ttft_p99_ms", "TTFT p99 ms", _fixed(0)), Column("itl_p50_ms", "ITL p50 ms", _fixed(1)),
    Column("inflight", "in flight", _fixed(1)), Column("running_max", "running max", _fixed(0)),
    Column("waiting_max", "waiting max", _fixed(0)), Column("kv_max", "KV max %", _fixed(1, 100)),
    Column("preemptions", "preempt", _fixed(0)), Column("prefix_hit_rate", "prefix hit %", _fixed(0, 100)),
    Column("goodput_rps", "goodput req/s", _fixed(2)),
]


def step_table(point: Point) -> tuple[list[str], list[dict[str, Any]]]:
    """Headers and rows of the per-step table (columns the analysis has), stalled rows flagged."""
    steps = point.steps
    if steps.empty:
        return [], []
    cols = [c for c in STEP_COLUMNS if c.key in steps and not steps[c.key].isna().all()]
    stalled = set(stalled_step_numbers(point))
    limited = set(point.manifest.get("client_limited_steps") or [])
    rows = []
    for _, r in steps.iterrows():
        lvl = to_float(r.get(point.level_column))
        flags = ["stalled"] if int(r["step"]) in stalled else []
        if r.get("state") == "client_limited" or int(r["step"]) in limited:
            flags.append("client-limited")
        rows.append({"step": int(r["step"]), "level": level(lvl, point.unit), "flags": flags,
                     "cells": [c.fmt(to_float(r.get(c.key))) for c in cols]})
    return ["step", level_axis(point.unit), *[c.header for c in cols]], rows


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
