"""The report's words and numbers: verdict rows, headline cards, number formats.

Plain data for the page template (strings and numbers; the template escapes
them). Nothing here draws or renders. A missing figure reads "—", never 0, and a
point without an analysis still gets its row, saying why.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loadlab.analyze.display import cause_text
from loadlab.report.inputs import Point, RunSet

DASH = "—"
CAUSES = {
    "seq_cap": "Sequence cap",
    "kv_exhausted": "KV cache exhausted",
    "token_budget": "Token budget",
    "head_blocked": "Head of line blocked",
    "undetermined": "Undetermined",
    "dashboard_caliber": "Dashboard caliber",
    "client_limited": "Load generator limited",
    "frontend_starved": "Front end starved",
    "server_errors": "Server errors",
    "routing_imbalance": "Routing imbalance",
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


def judged_up_to(point: Point) -> float | None:
    """Without a knee, the highest level judged: the analyzer's ``lower``, else the top step."""
    knee = point.section("knee")
    lower = to_float(knee.get("lower"))
    return lower if lower is not None else max_level(point)


def knee_text(point: Point) -> str:
    """The knee bracket: "(8, 16]", "≤ 4 (first step)", "none up to 32"."""
    knee = point.section("knee")
    if not knee:
        return DASH
    unit = point.unit
    if not knee.get("found"):
        top = judged_up_to(point)
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
    top = judged_up_to(point)
    if not knee.get("found") and point.section("cause").get("name") == "client_limited":
        return (f"No knee: the load generator could not apply the load (judged up to "
                f"{level(top, point.unit)} {unit_words}).")
    if not knee.get("found"):
        return (f"No knee up to {level(top, point.unit)} {unit_words}: the queue stayed short "
                f"at every level judged ({conf} confidence).")
    lower, upper = knee.get("lower"), knee.get("upper")
    if lower is None:
        return (f"Stalled from the first step ({level(upper, point.unit)} {unit_words}; "
                f"{conf} confidence): try lower levels.")
    return (f"Knee between {level(lower, point.unit)} and {level(upper, point.unit)} "
            f"{unit_words} ({conf} confidence).")


def cause_detail(point: Point) -> str:
    """The figures that show the cause, in the console's words (analyze.display), name left out."""
    cause = point.section("cause")
    if not cause.get("name") or not cause.get("facts"):   # the words are built from the facts
        return ""
    text = cause_text(cause)
    return text.split(" — ", 1)[1] if " — " in text else ""


def knee_reach(point: Point) -> tuple[bool, float] | None:
    """Sort key of how far a point went before stalling: no knee beats any knee, then level."""
    knee = point.section("knee")
    if not knee:
        return None
    if not knee.get("found"):
        top = judged_up_to(point)
        return (True, top) if top is not None else None
    upper = to_float(knee.get("upper"))
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
        text = figure_text(value) if isinstance(value, (int, float)) else str(value)
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
    return float(row["out_tok_s"]), to_float(row.get(point.level_column))


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
            flags=[f"{key}={flag_text(p.flags.get(key))}" for key in varying if key in p.flags],
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
    with_peak = [(value, p) for p in done if (value := peak(p)[0]) is not None]
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
        Kpi(
            "Knee",
            knee_text(p),
            f"{level_axis(p.unit)} · {knee.get('confidence') or DASH} confidence",
            "bad" if knee.get("found") else ("good" if knee else ""),
        ),
        Kpi(
            "Cause", cause_label(cause.get("name")) if cause else DASH, str(cause.get("knob") or "")
        ),
        Kpi("SLO-limited level", slo_text(p), slo_targets(p)),
        Kpi(
            "Peak throughput",
            num(value, unit="tok/s"),
            f"at {level(at, p.unit)}" if at is not None else "",
        ),
        Kpi(
            "Requests",
            num(ok),
            f"{num(errors)} errors" + (f" · status {p.status}" if p.status != "complete" else ""),
            "bad" if errors else "",
        ),
    ]


def figure_text(v: Any) -> str:
    """A figure from the analysis: 3 significant digits, ranges "a – b", dicts "k v, ..."."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return num(v) if abs(v) >= 100 or not math.isfinite(v) else f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return " – ".join(figure_text(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k} {figure_text(x)}" for k, x in v.items() if x is not None) or DASH
    return str(v)


def flag_text(v: Any) -> str:
    """A flag or manifest value as text (lists and dicts as JSON)."""
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str, sort_keys=True)
    return str(v)


def when(t: Any) -> str | None:
    """Unix seconds as a UTC timestamp (None when not a number)."""
    if not isinstance(t, (int, float)):
        return None
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def max_level(point: Point) -> float | None:
    """The highest load level the point's steps reached (None without steps)."""
    steps = point.steps
    col = point.level_column
    if steps.empty or col not in steps or steps[col].isna().all():
        return None
    return float(steps[col].max())


def to_float(x: Any) -> float | None:
    """A finite float, or None for anything else (None, NaN, text)."""
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
