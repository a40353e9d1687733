"""The report's words and numbers: verdict rows, headline cards, step and manifest tables.

Plain data for the page template (strings and numbers; the template escapes
them). Nothing here draws or renders. A missing figure reads "—", never 0, and a
point without an analysis still gets its row, saying why.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from loadlab.report.inputs import Point, RunSet

DASH = "—"
CAUSES = {
    "seq_cap": "Sequence cap",
    "kv_exhausted": "KV cache exhausted",
    "token_budget": "Token budget",
    "prefix_held": "Prefix blocks held",
    "dashboard_caliber": "Dashboard caliber",
    "client_limited": "Load generator limited",
    "frontend_starved": "Front end starved",
    "none": "No stall",
    "unknown": "Unknown",
}


@dataclass
class Kpi:
    """A headline card."""

    label: str
    value: str
    sub: str = ""
    tone: str = ""                   # "" | "good" | "bad" | "warn"


@dataclass
class VerdictRow:
    """One point in the verdict table."""

    name: str
    anchor: str
    status: str
    error: str | None
    flags: list[str]                 # the flags that set this point apart
    knee: str
    cause: str
    cause_name: str
    knob: str
    confidence: str
    slo_level: str
    peak: str
    problems: list[str] = field(default_factory=list)
    what_if: bool = False
    baseline: bool = False


def num(x: Any, digits: int = 0, unit: str = "") -> str:
    """A number for people: thousands separated, "—" when missing."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return DASH
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    text = f"{x:,.{digits}f}"
    return f"{text} {unit}".rstrip() if unit else text


def pct(change: float | None) -> str:
    """A relative change as a signed percentage: "+12.5%", "—" when unknown."""
    if change is None or not math.isfinite(change):
        return DASH
    return f"{change * 100:+.1f}%"


def share(x: float | None) -> str:
    """A 0..1 share as a percentage: "37%", "—" when unknown."""
    if x is None or not math.isfinite(x):
        return DASH
    return f"{x * 100:.0f}%"


def level(x: Any, unit: str) -> str:
    """A load level: "16" users or "2.5 req/s"."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return DASH
    if unit == "rate":
        return f"{float(x):g} req/s"
    return f"{float(x):g}"


def level_axis(unit: str) -> str:
    return "request rate (req/s)" if unit == "rate" else "concurrent users"


def knee_text(point: Point) -> str:
    """The knee bracket: "(8, 16]", "≤ 4 (first step)", "none up to 32"."""
    knee = point.section("knee")
    if not knee:
        return DASH
    unit = point.unit
    if not knee.get("found"):
        top = max_level(point)
        return f"none up to {level(top, unit)}" if top is not None else "none"
    lower, upper = knee.get("lower"), knee.get("upper")
    if lower is None:
        return f"≤ {level(upper, unit)} (first step)"
    return f"({level(lower, unit)}, {level(upper, unit)}]"


def knee_sentence(point: Point) -> str:
    """One line: where the knee is and how sure, for a person."""
    knee = point.section("knee")
    if not knee:
        return "No verdict: the run has no analysis."
    unit_words = "concurrent users" if point.unit == "concurrency" else "req/s"
    conf = knee.get("confidence") or "unknown"
    if not knee.get("found"):
        top = max_level(point)
        return (f"No knee up to {level(top, point.unit)} {unit_words}: the queue stayed short "
                f"at every level tried ({conf} confidence).")
    lower, upper = knee.get("lower"), knee.get("upper")
    if lower is None:
        return (f"Stalled from the first step ({level(upper, point.unit)} {unit_words}; "
                f"{conf} confidence): try lower levels.")
    return (f"Knee between {level(lower, point.unit)} and {level(upper, point.unit)} "
            f"{unit_words} ({conf} confidence).")


def knee_reach(point: Point) -> tuple[bool, float] | None:
    """Sort key of how far a point went before stalling: no knee beats any knee, then level."""
    knee = point.section("knee")
    if not knee:
        return None
    if not knee.get("found"):
        top = max_level(point)
        return (True, top) if top is not None else None
    upper = _float(knee.get("upper"))
    return (False, upper) if upper is not None else None


def cause_label(name: str | None) -> str:
    return CAUSES.get(name or "", name or DASH)


def evidence_lines(cause: dict[str, Any]) -> list[str]:
    """The cause's evidence, one line per figure: "running max: 8 (step 3) · 8 (step 4)"."""
    lines: dict[str, list[str]] = {}
    for e in cause.get("evidence") or []:
        if not isinstance(e, dict):
            lines.setdefault(str(e), [])
            continue
        value = e.get("value")
        text = _figure(value) if isinstance(value, (int, float)) else str(value)
        if e.get("step") is not None:
            text += f" (step {e['step']})"
        lines.setdefault(str(e.get("what")), []).append(text)
    return [f"{what}: {' · '.join(values)}" if values else what for what, values in lines.items()]


def ranked_causes(cause: dict[str, Any]) -> list[str]:
    """Candidates that scored above zero, best first ("Sequence cap 1.00")."""
    ranked = [r for r in cause.get("ranked") or [] if isinstance(r, dict)]
    return [f"{cause_label(r.get('name'))} {num(r.get('score'), 2)}" for r in ranked
            if isinstance(r.get("score"), (int, float)) and r["score"] > 0]


def slo_text(point: Point) -> str:
    slo = point.section("slo")
    if not slo.get("targets"):
        return "no SLO set"
    best = slo.get("max_level_meeting")
    return level(best, point.unit) if best is not None else "none met"


def slo_targets(point: Point) -> str:
    targets = point.section("slo").get("targets") or {}
    return ", ".join(f"{k} ≤ {v:g}" if isinstance(v, (int, float)) else f"{k}: {v}"
                     for k, v in targets.items())


def peak(point: Point) -> tuple[float | None, float | None]:
    """Highest output tokens/s of any step, and the level it was reached at."""
    steps = point.steps
    if steps.empty or "out_tok_s" not in steps or steps["out_tok_s"].isna().all():
        return None, None
    row = steps.loc[steps["out_tok_s"].idxmax()]
    return float(row["out_tok_s"]), _float(row.get(point.level_column))


def peak_text(point: Point) -> str:
    value, at = peak(point)
    if value is None:
        return DASH
    return f"{num(value)} tok/s @ {level(at, point.unit)}"


def verdict_rows(runset: RunSet) -> list[VerdictRow]:
    varying = varying_flags(runset.points)
    rows = []
    for k, p in enumerate(runset.points):
        cause = p.section("cause")
        rows.append(VerdictRow(
            name=p.name, anchor=anchor(k), status=p.status, error=p.error,
            flags=[f"{key}={_flag_value(p.flags.get(key))}" for key in varying if key in p.flags],
            knee=knee_text(p), cause=cause_label(cause.get("name")) if cause else DASH,
            cause_name=str(cause.get("name") or ""), knob=str(cause.get("knob") or ""),
            confidence=str(p.section("knee").get("confidence") or DASH), slo_level=slo_text(p),
            peak=peak_text(p), problems=list(p.problems), what_if=p.what_if,
            baseline=runset.baseline == p.name))
    return rows


def anchor(index: int) -> str:
    """A point section's id (names may hold anything; ids must not)."""
    return f"point-{index + 1}"


def varying_flags(points: Iterable[Point]) -> list[str]:
    """Flag names set to different values by different points (none for a single point)."""
    points = list(points)
    keys = sorted({k for p in points for k in p.flags})
    return [k for k in keys
            if len({json.dumps(p.flags[k], default=str) for p in points if k in p.flags}) > 1]


def kpis(runset: RunSet) -> list[Kpi]:
    """Headline cards: the single run's verdict, or the sweep's best points."""
    if runset.kind == "run":
        return _run_kpis(runset.points[0])
    done = [p for p in runset.points if p.analysis]
    failed = [p for p in runset.points if p.status == "failed"]
    cards = [Kpi("Points analysed", f"{len(done)} of {len(runset.points)}",
                 f"{len(failed)} failed" if failed else f"sweep {runset.status}",
                 "bad" if failed else ("warn" if runset.status != "complete" else "good"))]
    ranked = [(reach, p) for p in done if (reach := knee_reach(p)) is not None]
    if ranked:
        best = max(ranked, key=lambda x: x[0])[1]
        cards.append(Kpi("Highest knee", knee_text(best), best.name))
    with_peak = [(peak(p)[0], p) for p in done if peak(p)[0] is not None]
    if with_peak:
        value, best = max(with_peak, key=lambda x: x[0])
        cards.append(Kpi("Peak throughput", num(value, unit="tok/s"), best.name))
    slo = [p for p in done if p.section("slo").get("max_level_meeting") is not None]
    if slo:
        best = max(slo, key=lambda p: float(p.section("slo")["max_level_meeting"]))
        cards.append(Kpi("Highest SLO-limited level", slo_text(best), best.name))
    return cards


def _run_kpis(p: Point) -> list[Kpi]:
    knee, cause = p.section("knee"), p.section("cause")
    value, at = peak(p)
    steps = p.steps
    ok = int(steps["n_ok"].sum()) if "n_ok" in steps else 0
    errors = int(steps["n_err"].sum()) if "n_err" in steps else 0
    return [
        Kpi("Knee", knee_text(p), f"{level_axis(p.unit)} · {knee.get('confidence') or DASH} confidence",
            "bad" if knee.get("found") else ("good" if knee else "")),
        Kpi("Cause", cause_label(cause.get("name")) if cause else DASH, str(cause.get("knob") or "")),
        Kpi("SLO-limited level", slo_text(p), slo_targets(p)),
        Kpi("Peak throughput", num(value, unit="tok/s"), f"at {level(at, p.unit)}" if at is not None else ""),
        Kpi("Requests", num(ok), f"{num(errors)} errors" + (f" · status {p.status}" if p.status != "complete" else ""),
            "bad" if errors else ""),
    ]


@dataclass
class Column:
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
        lvl = _float(r.get(point.level_column))
        flags = ["stalled"] if int(r["step"]) in stalled else []
        if r.get("state") == "client_limited" or int(r["step"]) in limited:
            flags.append("client-limited")
        rows.append({"step": int(r["step"]), "level": level(lvl, point.unit), "flags": flags,
                     "cells": [c.fmt(_float(r.get(c.key))) for c in cols]})
    return ["step", level_axis(point.unit), *[c.header for c in cols]], rows


def stalled_step_numbers(point: Point) -> list[int]:
    """Steps the analyzer judged stalled (its ``state`` column), else those at or past the knee."""
    steps = point.steps
    if steps.empty:
        return []
    if "state" in steps:
        return [int(s) for s in steps.loc[steps["state"] == "stalled", "step"]]
    upper = _float(point.section("knee").get("upper"))
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
    return [(str(k), _figure(v)) for k, v in point.section("capacity").items() if v is not None]


def _figure(v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return num(v) if abs(v) >= 100 or not math.isfinite(v) else f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return " – ".join(_figure(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k} {_figure(x)}" for k, x in v.items() if x is not None) or DASH
    return str(v)


def _pairs(d: dict[str, Any]) -> list[tuple[str, str]]:
    return [(str(k), _flag_value(v)) for k, v in d.items() if v not in (None, "", [], {})]


def _flag_value(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str, sort_keys=True)
    return str(v)


def when(t: Any) -> str | None:
    if not isinstance(t, (int, float)):
        return None
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def max_level(point: Point) -> float | None:
    steps = point.steps
    col = point.level_column
    if steps.empty or col not in steps or steps[col].isna().all():
        return None
    return float(steps[col].max())


def _float(x: Any) -> float | None:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
