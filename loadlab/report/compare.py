"""`loadlab compare BASE NEW`: did the knee or the SLO-limited level drop?

A gate for nightly runs. BASE and NEW are run folders or sweep folders (each
point's analysis.json is read). Points are matched by name; two single runs (or
a single run and a one-point sweep) are compared directly whatever their names.

Per point, two figures are compared:

- the knee's *reach*: its upper bound (first stalled level) when a knee was
  found, else the highest level tried ("no knee up to L"). A knee in NEW at or
  below the level up to which BASE had none regresses whatever the margin (BASE's
  knee lies somewhere above: the drop is real, its size unknown);
- the SLO-limited level: the highest level meeting the SLOs (only when BASE set
  SLOs; "none met" counts as 0).

A figure *regresses* when NEW's value is below BASE's by more than the margin
(default 10%): ``new < base * (1 - margin)``. A point BASE analysed that is
missing from NEW, or failed there, regresses too (nothing shows it held). A point
that ran but cannot be judged (analysis.json or a part file damaged) is bad input.

Exit codes: 0 no regression; 1 at least one regression; 2 bad input (not a run
or sweep folder, an analysis or a part file unreadable, a bad --margin, load units
that differ, no point in common). Nothing is written into either folder: a point
without analysis.json is analysed in memory (:func:`loadlab.report.inputs.analysis_of`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadlab.errors import InputError
from loadlab.report.inputs import Point, RunSet, load
from loadlab.report.summary import knee_reach, knee_text, slo_text

OK, REGRESSION = 0, 1
FAILED = ("failed", "skipped")
DEFAULT_MARGIN = 0.10


@dataclass
class Figure:
    """One compared figure of one point."""

    base: float | None
    new: float | None
    base_text: str
    new_text: str
    change: float | None             # new / base - 1
    regressed: bool


@dataclass
class PointResult:
    name: str                        # BASE's point name
    status: str                      # "ok" | "regression" | "missing" | "failed"
    unit: str
    knee: Figure | None
    slo_level: Figure | None         # None when BASE set no SLO
    reasons: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    base: str
    new: str
    margin: float
    points: list[PointResult]
    only_in_new: list[str]
    skipped: list[str]               # BASE points without a verdict (failed there)

    @property
    def regressed(self) -> bool:
        return any(p.status != "ok" for p in self.points)

    @property
    def exit_code(self) -> int:
        return REGRESSION if self.regressed else OK

    def to_json(self) -> dict[str, Any]:
        return {"schema": 1, "base": self.base, "new": self.new, "margin": self.margin,
                "regression": self.regressed, "exit_code": self.exit_code,
                "points": [asdict(p) for p in self.points], "only_in_new": self.only_in_new,
                "skipped_in_base": self.skipped}


def parse_margin(text: str) -> float:
    """"10%" or "0.1" -> 0.1; InputError naming --margin otherwise."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise InputError(f"{text!r} is not a margin", field="--margin",
                         fix="give a percentage below 100, such as 10%, or a fraction such as 0.1")
    return value


def compare(
    base_dir: str | Path, new_dir: str | Path, margin: float = DEFAULT_MARGIN
) -> Comparison:
    """Compare every analysed BASE point with its NEW counterpart."""
    base, new = load(base_dir), load(new_dir)
    pairs, only_new = _pairs(base, new)
    results, skipped = [], []
    for b, n in pairs:
        _readable(b)
        if not b.analysis:
            skipped.append(b.name)
            continue
        if n is not None:
            _readable(n)
        results.append(_compare_point(b, n, margin))
    if not results:
        raise InputError("no analysed point of BASE has a counterpart to compare", source=base_dir,
                         fix="compare runs of the same scenario (points are matched by name)")
    return Comparison(base=str(base_dir), new=str(new_dir), margin=margin, points=results,
                      only_in_new=only_new, skipped=skipped)


def format_text(c: Comparison) -> str:
    """The comparison for a terminal: one line per point, then the verdict."""
    lines = []
    for p in c.points:
        parts = [f"{p.name}: {p.status}"]
        if p.knee:
            parts.append(f"knee {p.knee.base_text} -> {p.knee.new_text}{_change(p.knee.change)}")
        if p.slo_level:
            parts.append(f"SLO-limited {p.slo_level.base_text} -> {p.slo_level.new_text}"
                         f"{_change(p.slo_level.change)}")
        lines.append("  ".join(parts))
        lines += [f"    {r}" for r in p.reasons]
    for name in c.only_in_new:
        lines.append(f"{name}: only in NEW (not compared)")
    for name in c.skipped:
        lines.append(f"{name}: no verdict in BASE (not compared)")
    bad = sum(p.status != "ok" for p in c.points)
    verdict = f"REGRESSION in {bad} of {len(c.points)} points" if bad else "no regression"
    lines.append(f"{verdict} (margin {c.margin:.0%})")
    return "\n".join(lines)


def _pairs(base: RunSet, new: RunSet) -> tuple[list[tuple[Point, Point | None]], list[str]]:
    if len(base.points) == 1 and len(new.points) == 1 and "run" in (base.kind, new.kind):
        return [(base.points[0], new.points[0])], []
    if base.kind != new.kind:
        raise InputError(
            f"BASE is a {base.kind} folder and NEW a {new.kind} folder with several points",
            source=new.root,
            fix="compare a sweep with a sweep of the same scenario",
        )
    names = {p.name for p in base.points}
    return ([(b, new.point(b.name)) for b in base.points],
            [p.name for p in new.points if p.name not in names])


def _compare_point(b: Point, n: Point | None, margin: float) -> PointResult:
    if n is None:
        return PointResult(b.name, "missing", b.unit, None, None, ["point missing from NEW"])
    if not n.analysis:
        why = n.error or "; ".join(n.problems) or "no analysis"
        return PointResult(b.name, "failed", b.unit, None, None, [f"NEW has no verdict: {why}"])
    _require(b)
    _require(n)
    if b.unit != n.unit:
        raise InputError(f"point {b.name!r} is load by {b.unit} in BASE but by {n.unit} in NEW",
                         source=n.run_dir, fix="compare runs with the same kind of load steps")
    reasons: list[str] = []
    knee = _knee(b, n, margin)
    if knee.regressed:
        reasons.append(f"knee fell from {knee.base_text} to {knee.new_text}"
                       f"{_change(knee.change)}, beyond the {margin:.0%} margin")
    slo = None
    if b.section("slo").get("targets"):
        slo = _figure(_slo_level(b), _slo_level(n), slo_text(b), slo_text(n), margin)
        if slo.regressed:
            reasons.append(f"SLO-limited level fell from {slo.base_text} to {slo.new_text}"
                           f"{_change(slo.change)}, beyond the {margin:.0%} margin")
        if b.section("slo").get("targets") != n.section("slo").get("targets"):
            reasons.append("note: the SLO targets differ between BASE and NEW")
    status = "regression" if knee.regressed or (slo is not None and slo.regressed) else "ok"
    if status == "ok" and n.status not in ("complete",):
        reasons.append(f"note: NEW point status is {n.status}")
    return PointResult(b.name, status, b.unit, knee, slo, reasons)


def _readable(p: Point) -> None:
    """A point that ran but whose verdict cannot be read is bad input, not a regression."""
    if p.problems and p.status not in FAILED:
        raise InputError(p.problems[0])


def _require(p: Point) -> None:
    if not p.section("knee"):
        raise InputError("analysis.json has no knee", source=p.run_dir, field="knee",
                         fix=f"rerun `loadlab analyze {p.run_dir}`")


def _knee(b: Point, n: Point, margin: float) -> Figure:
    """The knee's reach compared; a knee where BASE had none up to its top level regresses."""
    rb, rn = knee_reach(b), knee_reach(n)
    fig = _figure(rb[1] if rb else None, rn[1] if rn else None, knee_text(b), knee_text(n), margin)
    if rb and rn and rb[0] and not rn[0] and rn[1] <= rb[1]:
        fig.regressed = True
    return fig


def _slo_level(p: Point) -> float:
    best = p.section("slo").get("max_level_meeting")
    return float(best) if isinstance(best, (int, float)) else 0.0


def _figure(base: float | None, new: float | None, base_text: str, new_text: str,
            margin: float) -> Figure:
    change = new / base - 1 if base and new is not None else None
    regressed = base is not None and (new is None or new < base * (1 - margin))
    return Figure(base=base, new=new, base_text=base_text, new_text=new_text, change=change,
                  regressed=bool(regressed))


def _change(change: float | None) -> str:
    return f" ({change:+.0%})" if change is not None else ""

