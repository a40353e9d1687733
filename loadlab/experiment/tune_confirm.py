"""``loadlab tune --confirm``: one real A/B, the current configuration against the best,
and the prediction set beside what was measured.

The A/B is a sweep of two arms (:func:`loadlab.experiment.runner.run_sweep`) on the
server the run launched (``loadlab run --launch vllm`` semantics: a fresh server per arm,
the run's flags plus the arm's, the run's CPU split), with the tune's workload and levels,
so the measured knee and figures are read the same way as the predicted ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict

from loadlab.errors import InputError, LoadlabError
from loadlab.experiment.runner import run_sweep
from loadlab.experiment.tune import (
    FIGURES,
    TUNE_JSON,
    Outcome,
    TuneResult,
    align,
    arms_scenario,
    fmt,
    judge,
    knee_text,
)
from loadlab.experiment.verdicts import analyze_point
from loadlab.runstore.jsonfile import replace_text
from loadlab.runstore.manifest import SweepManifest, load_manifest

CONFIRM_DIR = "confirm"


def confirm(result: TuneResult, progress: Callable[[str], None]) -> list[tuple[Outcome, Outcome]]:
    """Run the A/B into ``result.out/confirm``; (predicted, measured) per arm, current
    first. Also written to tune.json under ``confirm``."""
    best = result.best
    if best.refused or not best.changes:
        raise InputError("the current configuration ranks first: there is no change to confirm",
                         field="--confirm", fix="search other values, or drop --confirm")
    if not result.base.launched:
        raise InputError("the run loaded a URL, so loadlab cannot start its server",
                         field="--confirm", fix=f"edit the model path in "
                         f"{result.out / 'tune.yaml'} and run `loadlab sweep` on it")
    current = next(o for o in result.outcomes if o.name == "current")
    scenario = arms_scenario(result.scenario, result.base, [best])
    folder = result.out / CONFIRM_DIR
    sweep = run_sweep(scenario, folder, progress=progress)
    manifest = load_manifest(folder)
    assert isinstance(manifest, SweepManifest)
    failed = [p.name for p in manifest.points if p.status != "complete" or not p.dir]
    if failed:
        raise LoadlabError(f"the A/B's points {', '.join(failed)} did not complete; their "
                           f"reasons are in {folder / 'manifest.json'}")
    pairs = []
    for predicted in (current, best):
        record = next(p for p in manifest.points if p.name == predicted.name)
        measured = Outcome(predicted.name, predicted.changes, folder=str(folder / str(record.dir)))
        analysis = analyze_point(folder / str(record.dir), result.scenario.load.slo)
        judge(measured, analysis.as_json(), bool(result.slo), result.top_level)
        pairs.append((predicted, measured))
    data = json.loads((result.out / TUNE_JSON).read_text())
    data["confirm"] = {"sweep": str(sweep.out), "arms": [
        {"name": p.name, "predicted": asdict(p), "measured": asdict(m)} for p, m in pairs]}
    replace_text(result.out / TUNE_JSON, json.dumps(data, indent=2) + "\n")
    return pairs


def confirm_table(pairs: list[tuple[Outcome, Outcome]], top: float) -> list[str]:
    """Predicted against measured, one row per arm: ``predicted / measured`` in each cell."""
    head = ["config", "knee", "SLO level", "capacity",
            *(f"{k[:-3].replace('_', ' ')} @{fmt(top)} ms" for k in FIGURES)]
    rows: list[list[str]] = []
    for p, m in pairs:
        row = [p.name, f"{knee_text(p)} / {knee_text(m)}", f"{fmt(p.slo_level)} / "
               f"{fmt(m.slo_level)}", f"{fmt(p.capacity)} / {fmt(m.capacity)}"]
        row += [f"{fmt(p.figures.get(k))} / {fmt(m.figures.get(k))}" for k in FIGURES]
        rows.append(row)
    return align([head, *rows])
