"""Scenario files: found by path or by a shipped name, read into :class:`Scenario`.

:func:`read_scenario` parses the YAML, validates it (errors name the file and the
dotted field, :mod:`loadlab.spec.validate`) and resolves relative profile and trace
paths against the file's folder. What needs the layers above (the workload profile
loads, a simulator point's flags exist) is checked by
:func:`loadlab.experiment.scenarios.load_scenario` before anything starts.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from loadlab.errors import InputError
from loadlab.spec.datafiles import data_dir
from loadlab.spec.scenario import Scenario, folder_name
from loadlab.spec.validate import validate

SCENARIOS_DIR = data_dir("scenarios")


def scenario_path(name: str) -> Path:
    """A scenario file by path, or a shipped scenario by name (``demo`` -> scenarios/demo.yaml)."""
    path = Path(name)
    shipped = SCENARIOS_DIR / f"{name}.yaml"
    if not path.exists() and not _looks_like_path(name) and shipped.is_file():
        return shipped
    return path


def read_scenario(path: str | Path) -> Scenario:
    """Read a scenario file into its model, relative paths resolved; InputError if anything
    is off."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise InputError(f"byte {exc.object[exc.start]:#04x} is not UTF-8", source=path,
                         field=f"line {line}", fix="save the file as UTF-8") from None
    except OSError as exc:
        shipped = ", ".join(sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml")))
        raise InputError(f"cannot read the scenario: {exc.strerror or exc}", source=path,
                         fix=f"check the path, or name a shipped scenario: {shipped}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InputError(problem, source=path, field=where,
                         fix="fix the YAML syntax (indentation, colons, quotes)") from None
    if not isinstance(data, dict):
        raise InputError("a scenario is a mapping of keys (target, load, ...)", source=path,
                         fix="see scenarios/demo.yaml for the layout")
    data.setdefault("name", folder_name(path.stem))
    return _resolve_files(validate(Scenario, data, source=path), path)


def _resolve_files(scenario: Scenario, path: Path) -> Scenario:
    """Relative profile, trace and calibration paths against the scenario's folder; the
    traces must exist."""
    here = path.parent
    profile = scenario.workload.profile
    if _looks_like_path(profile) and not Path(profile).is_absolute() and (here / profile).exists():
        profile = str(here / profile)
    trace = scenario.load.trace
    if trace is not None and not Path(trace).is_absolute() and (here / trace).exists():
        trace = str(here / trace)
    if trace is not None and not Path(trace).is_file():
        raise InputError(f"trace file {trace!r} not found", source=path, field="load.trace",
                         fix="give a path relative to the scenario file, or an absolute one")
    calibration = scenario.what_if.calibration
    if calibration is not None and not Path(calibration).is_absolute():
        calibration = str(here / calibration)
    recorded = scenario.what_if.trace
    if recorded is not None and not Path(recorded).is_absolute() and (here / recorded).exists():
        recorded = str(here / recorded)
    if recorded is not None and not Path(recorded).exists():
        raise InputError(f"recorded run {recorded!r} not found", source=path,
                         field="what_if.trace",
                         fix="give a run folder relative to the scenario file, or an absolute one")
    return scenario.model_copy(update={
        "what_if": scenario.what_if.model_copy(
            update={"calibration": calibration, "trace": recorded}),
        "workload": scenario.workload.model_copy(update={"profile": profile}),
        "load": scenario.load.model_copy(update={"trace": trace}),
    })


def _looks_like_path(name: str) -> bool:
    return "/" in name or name.endswith((".yaml", ".yml", ".json"))
