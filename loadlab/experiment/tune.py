"""``loadlab tune``: which flag change moves the knee, predicted by replaying the run's server.

From a run folder: its server (:mod:`loadlab.experiment.tune_base`), its request lengths
(:mod:`loadlab.experiment.tune_workload`) and its plan, the levels extended by doubling up
to ``max_level`` (default four times the run's top) so a knee beyond the run's top level
can be found. Every candidate of the grid (:mod:`loadlab.experiment.tune_space`) that fits
the user's limits is replayed in virtual time as one point of a scenario, exactly as
``loadlab sweep --what-if`` replays it (:func:`loadlab.experiment.whatif.run_whatif_point`),
and judged by the analyzer with the run's SLO.

Ranking: the *capacity* first, the highest level before the knee (the analyzer's lower
bracket; the top level tried when no knee formed) and, with an SLO, no higher than the
highest level meeting it (:mod:`loadlab.analyze.slo`); ties go to the lower TTFT p99, ITL
p99, TTFT p50 and ITL p50 at the run's own top level. Written to ``out``: ``tune.json``,
``tune.yaml`` (a scenario of the current configuration against the top candidates,
for ``loadlab sweep``, ``--what-if`` or live) and each replay's run folder under
``whatif/``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loadlab.analyze.slo import parse_slo
from loadlab.analyze.steps import load_run
from loadlab.errors import InputError
from loadlab.experiment.tune_base import (
    ServerBase,
    extrapolation_note,
    isolation,
    loadgen,
    server_base,
)
from loadlab.experiment.tune_space import SEARCHABLE, Candidate, Limits, candidates, refusal
from loadlab.experiment.tune_workload import recorded_lengths, recorded_workload
from loadlab.experiment.verdicts import analyze_point
from loadlab.experiment.whatif import run_whatif_point, sim_config
from loadlab.runstore.jsonfile import replace_text
from loadlab.runstore.layout import MANIFEST
from loadlab.sim.engine.hardware import resolve
from loadlab.spec.plan import LoadPlan, Slo
from loadlab.spec.scenario import Point, Scenario, Sweep, folder_name

TUNE_JSON, TUNE_YAML = "tune.json", "tune.yaml"
FIGURES = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class TuneRequest:
    """What to search and within which limits (``None``: taken from the run)."""

    grid: dict[str, list[Any]]
    memory: float | None = None
    longest_prompt: int | None = None
    slo: str | None = None
    top: int = 3
    max_candidates: int = 24
    max_level: float | None = None
    model: str | None = None
    gpu: str | None = None
    calibration: Path | None = None


@dataclass
class Outcome:
    """One candidate: refused with a reason, or its predicted (or measured) figures."""

    name: str
    changes: dict[str, Any]
    flags: dict[str, Any] = field(default_factory=dict)
    refused: str | None = None
    capacity: float | None = None
    knee_lower: float | None = None
    knee_upper: float | None = None
    knee_found: bool = False
    slo_level: float | None = None
    cause: str | None = None
    figures: dict[str, float | None] = field(default_factory=dict)   # at the run's top level
    folder: str | None = None


@dataclass
class TuneResult:
    out: Path
    run_dir: Path
    top_level: float
    levels: list[float]
    slo: dict[str, float]
    limits: Limits
    outcomes: list[Outcome]          # ranked; refused ones last
    cut: int
    notes: list[str]
    scenario: Scenario
    base: ServerBase

    @property
    def best(self) -> Outcome:
        return self.outcomes[0]

    def as_dict(self) -> dict[str, Any]:
        return {"run": str(self.run_dir), "top_level": self.top_level, "levels": self.levels,
                "slo": self.slo, "limits": asdict(self.limits), "cut": self.cut,
                "notes": self.notes, "what_if": self.scenario.what_if.model_dump(mode="json"),
                "candidates": [asdict(o) for o in self.outcomes]}


def tune(run_dir: Path, req: TuneRequest, out: Path,
         progress: Progress = lambda _: None) -> TuneResult:
    """Replay every candidate of ``req`` for the run in ``run_dir``; write to ``out``."""
    if not (run_dir / MANIFEST).is_file():
        raise InputError("not a run folder (no manifest.json)", source=run_dir, field="RUN",
                         fix="pass a folder `loadlab run` or `loadlab sim replay` wrote")
    if (out / TUNE_JSON).exists() or (out / "whatif").exists():
        raise InputError("already holds a tune (a replay into a run folder adds to its tables)",
                         source=out, field="--out", fix="give a new --out, or remove this one")
    run = load_run(run_dir)
    base = server_base(run, req.model, req.gpu, req.calibration)
    slo = tune_slo(req.slo, run_dir, run.manifest)
    plan, top = tune_plan(run.manifest, req.max_level, run_dir)
    plan = plan.model_copy(update={"slo": slo})     # a sweep of the written scenario judges alike
    prompts, _ = recorded_lengths(run.requests)
    limits = Limits(req.memory, req.longest_prompt or int(prompts.max(initial=1)))
    workload = recorded_workload(run_dir, run.requests, out,
                                 int((run.manifest.get("workload") or {}).get("seed") or 0))
    scenario = Scenario(name=folder_name(f"tune-{run_dir.name}"),
                        description=f"loadlab tune of {run_dir.name}", target=base.target,
                        flags=base.flags, workload=workload, load=plan,
                        loadgen=loadgen(run.manifest), isolation=isolation(run.manifest),
                        what_if=base.what_if)
    current = _resolved(scenario, Point("current", base.point_flags({}, {})), None)
    if isinstance(current, str):
        raise InputError(f"the run's own configuration does not resolve: {current}",
                         source=run_dir / MANIFEST, field="server",
                         fix="pass --model/--gpu of a simulator profile that holds it")
    grid, cut = candidates(req.grid, current, req.max_candidates)
    notes = list(base.notes)
    beyond = extrapolation_note(scenario.what_if.calibration, grid, current)
    if beyond:
        notes.append(beyond)
    if cut:
        notes.append(f"{cut} more configurations cut at the cap of {req.max_candidates} "
                     "(raise --max-candidates or narrow --search)")
    for note in notes:
        progress(f"note: {note}")
    outcomes = []
    for i, cand in enumerate(grid, 1):
        outcome = _replay(scenario, base, cand, current, limits, slo, top, out)
        progress(f"[{i}/{len(grid)}] {line(outcome)}")
        outcomes.append(outcome)
    ranked = rank(outcomes)
    result = TuneResult(out, run_dir, top, [float(x) for x in plan.concurrency or plan.rate or []],
                        slo.targets() if slo else {}, limits, ranked, cut, notes, scenario, base)
    replace_text(out / TUNE_JSON, json.dumps(result.as_dict(), indent=2) + "\n")
    write_scenario(out / TUNE_YAML, top_scenario(result, req.top), result)
    return result


def tune_plan(manifest: dict[str, Any], max_level: float | None,
              run_dir: Path) -> tuple[LoadPlan, float]:
    """The run's levels, doubled past its top up to ``max_level``; and the top level."""
    steps = manifest.get("steps") or []
    closed = any(s.get("concurrency") is not None for s in steps)
    levels = sorted({float(s["concurrency"] if closed else s["target_rate"]) for s in steps
                     if s.get("concurrency" if closed else "target_rate") is not None})
    if not levels:
        raise InputError("the run has no concurrency or rate steps", source=run_dir / MANIFEST,
                         field="steps", fix="tune a step load (--concurrency or --rate)")
    top = levels[-1]
    ceiling = max_level if max_level is not None else 4 * top
    while levels[-1] * 2 <= ceiling:
        levels.append(levels[-1] * 2)
    if levels[-1] < ceiling:
        levels.append(ceiling)
    plan = manifest.get("plan") or {}
    duration = float(plan.get("step_duration_s") or 60.0)
    common: dict[str, Any] = {"step_duration_s": duration, "warmup_s": plan.get("warmup_s")}
    if closed:
        return LoadPlan(concurrency=sorted({math.ceil(x) for x in levels}), **common), top
    return LoadPlan(rate=levels, burstiness=plan.get("burstiness") or 1.0, **common), top


def tune_slo(text: str | None, run_dir: Path, manifest: dict[str, Any]) -> Slo | None:
    """``--slo``, else the SLO the run was analysed with, else its plan's."""
    if text is None:
        try:
            targets = json.loads((run_dir / "analysis.json").read_text())["slo"]["targets"]
        except (OSError, ValueError, KeyError, TypeError):
            targets = None
        if targets:
            text = ",".join(f"{k}={v:g}" for k, v in targets.items())
        elif (manifest.get("plan") or {}).get("slo"):
            text = ",".join(f"{k}={v:g}" for k, v in manifest["plan"]["slo"].items()
                            if v is not None)
    fields: dict[str, float] = {}
    for target in parse_slo(text):
        name = f"{target.metric}_p{target.q:g}_s"
        if name not in Slo.model_fields:
            raise InputError(f"{target.name}: a scenario holds p50, p90 and p99 only",
                             field="--slo", fix="use p50, p90 or p99, e.g. ttft_p99_ms=500")
        fields[name] = target.limit_s
    return Slo(**fields) if fields else None


def _resolved(scenario: Scenario, point: Point, limits: Limits | None) -> dict[str, Any] | str:
    """A point's resolved server flags, or why it cannot run (vLLM's refusals, the limits)."""
    try:
        flags = resolve(sim_config(scenario, point).configs[0]).server_flags()
    except InputError as exc:
        return exc.message
    reason = refusal(flags, limits) if limits is not None else None
    return reason if reason else flags


def _replay(scenario: Scenario, base: ServerBase, cand: Candidate, current: dict[str, Any],
            limits: Limits, slo: Slo | None, top: float, out: Path) -> Outcome:
    point = Point(cand.name, base.point_flags(cand.changes, current))
    resolved = _resolved(scenario, point, limits)
    outcome = Outcome(cand.name, cand.changes)
    if isinstance(resolved, str):
        outcome.refused = resolved
        return outcome
    outcome.flags = {k: resolved[k] for k in (*SEARCHABLE, "num_gpu_blocks")}
    folder = out / "whatif" / cand.name
    run_whatif_point(scenario, point, folder, None)
    judge(outcome, analyze_point(folder, slo).as_json(), slo is not None, top)
    outcome.folder = str(folder)
    return outcome


def judge(outcome: Outcome, analysis: dict[str, Any], with_slo: bool, top: float) -> None:
    """Fill ``outcome`` from an analysis: capacity, knee, SLO level, figures at ``top``."""
    knee, steps = analysis["knee"], analysis["steps"]
    outcome.knee_found = bool(knee.get("found"))
    outcome.knee_lower, outcome.knee_upper = knee.get("lower"), knee.get("upper")
    tried = max((s["level"] for s in steps), default=0.0)
    capacity = (outcome.knee_lower or 0.0) if outcome.knee_found else tried
    if with_slo:
        outcome.slo_level = (analysis.get("slo") or {}).get("max_level_meeting")
        capacity = min(capacity, outcome.slo_level or 0.0)
    outcome.capacity = capacity
    outcome.cause = (analysis.get("cause") or {}).get("name")
    at: dict[str, Any] = next((s for s in steps if s["level"] == top), {})
    outcome.figures = {k: at.get(k) for k in FIGURES}


def rank(outcomes: list[Outcome]) -> list[Outcome]:
    """Highest capacity first; ties to the lower latencies at the top level; refused last."""
    def key(o: Outcome) -> tuple[float, ...]:
        if o.refused:
            return (math.inf,)
        lat = [v if v is not None and not math.isnan(v) else math.inf
               for v in (o.figures.get(k) for k in ("ttft_p99_ms", "itl_p99_ms",
                                                    "ttft_p50_ms", "itl_p50_ms"))]
        return (-(o.capacity or 0.0), *lat)
    return sorted(outcomes, key=key)


def top_scenario(result: TuneResult, k: int) -> Scenario:
    """The current configuration against the ``k`` best others, as a sweep's A/B arms."""
    best = [o for o in result.outcomes if not o.refused and o.changes][:k]
    return arms_scenario(result.scenario, result.base, best)


def arms_scenario(scenario: Scenario, base: ServerBase, arms: list[Outcome]) -> Scenario:
    """``scenario`` with the arms current + ``arms`` (their changed flags), baseline current;
    with no other arm (every candidate refused) the current configuration alone."""
    sweep = Sweep(arms={"current": {}, **{o.name: o.changes for o in arms}},
                  baseline="current") if arms else None
    return scenario.model_copy(update={"sweep": sweep, "what_if": base.written_what_if()})


def write_scenario(path: Path, scenario: Scenario, result: TuneResult) -> None:
    """The scenario file, with a header saying where its arms come from."""
    body = yaml.safe_dump(scenario.model_dump(mode="json", exclude_defaults=True),
                          sort_keys=False)
    head = [f"# loadlab tune of {result.run_dir}: the current configuration against the "
            "best-ranked candidates.",
            "# Predicted in virtual time; see tune.json. Run it live: loadlab sweep "
            f"{path.name}, or again in virtual time with --what-if."]
    head += [f"# note: {n}" for n in result.notes]
    path.write_text("\n".join(head) + "\n" + body, encoding="utf-8")


def fmt(v: Any) -> str:
    """A figure for the console: whole numbers from 100 up, three digits below."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if not isinstance(v, float):
        return str(v)
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def knee_text(o: Outcome) -> str:
    if not o.knee_found:
        return f"none <= {fmt(o.capacity)}" if o.slo_level is None else "none"
    return f"({fmt(o.knee_lower)}, {fmt(o.knee_upper)}]"


def line(o: Outcome) -> str:
    """One candidate in a sentence, for the progress lines."""
    if o.refused:
        return f"{o.name}: refused: {o.refused}"
    figs = ", ".join(f"{k[:-3].replace('_', ' ')} {fmt(o.figures.get(k))} ms" for k in FIGURES)
    return f"{o.name}: capacity {fmt(o.capacity)}, knee {knee_text(o)}, {figs}"


def table(result: TuneResult) -> list[str]:
    """The ranked table, one row per candidate."""
    head = ["rank", "config", "capacity", "knee", "SLO level", "cause",
            *(f"{k[:-3].replace('_', ' ')} ms" for k in FIGURES)]
    rows = []
    for i, o in enumerate(result.outcomes, 1):
        if o.refused:
            rows.append(["-", o.name, "refused", o.refused, "", "", "", "", "", ""])
            continue
        rows.append([str(i), o.name, fmt(o.capacity), knee_text(o), fmt(o.slo_level),
                     o.cause or "-", *(fmt(o.figures.get(k)) for k in FIGURES)])
    return align([head, *rows])


def align(rows: list[list[str]], widest: int = 60) -> list[str]:
    """Rows as padded columns; a cell longer than ``widest`` (a refusal's reason) overflows
    its column instead of widening it."""
    widths = [max((len(r[c]) for r in rows if len(r[c]) < widest), default=0)
              for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
