"""Plain data into config models; what does not fit becomes a one-line InputError.

:func:`validate` runs a pydantic model of :mod:`loadlab.config` over a dict (parsed
YAML, or a CLI's flags) and turns the first validation error into an
:class:`~loadlab.errors.InputError` (exit 2) naming

- the source: the file, or nothing for flags;
- the field: pydantic's error location, dotted (``load.concurrency``, ``sweep.arms.on``),
  or the flag it came from when ``names`` maps field names to flags (``names[""]``
  names the whole model, for errors about several fields);
- the fix: the one the validator attached, else built from the model: the allowed keys
  for an unknown one, the field's description for a missing or mistyped one.

:func:`load_scenario` reads a scenario YAML file that way, then checks what only the
file system can tell (the workload profile exists; relative paths are resolved against
the file's folder). Nothing is started until all of this passed.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from loadlab.config import LoadPlan, Scenario
from loadlab.errors import InputError

M = TypeVar("M", bound=BaseModel)
SCENARIOS_DIR = Path(__file__).resolve().parents[1] / "scenarios"
# LoadPlan fields -> the flags `loadlab run` and `loadlab sim replay` take for them
PLAN_FLAGS = {"": "plan", "concurrency": "--concurrency", "rate": "--rate", "burstiness": "--burstiness",
              "step_duration_s": "--step-duration", "warmup_s": "--warmup",
              "time_scale": "--time-scale", "max_in_flight": "--max-in-flight",
              "trace": "--trace-replay", "search": "--search"}


def validate(model: type[M], data: Any, *, source: str | Path | None = None,
             names: dict[str, str] | None = None) -> M:
    """``model.model_validate(data)``, errors as InputError (see the module docstring)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, model, source, names or {}) from None


def plan_from_flags(**fields: Any) -> LoadPlan:
    """A LoadPlan from flag values (None = not given); errors name the flag."""
    return validate(LoadPlan, {k: v for k, v in fields.items() if v is not None}, names=PLAN_FLAGS)


def input_error(exc: ValidationError, model: type[BaseModel], source: str | Path | None,
                names: dict[str, str]) -> InputError:
    errors = exc.errors(include_url=False)
    err = errors[0]
    loc = tuple(str(p) for p in err["loc"])
    field = ".".join(loc) or names.get("", model.__name__.lower())
    if loc and loc[0] in names:
        field = ".".join((names[loc[0]], *loc[1:]))
    ctx = err.get("ctx") or {}
    fix = ctx.get("fix") or _default_fix(model, loc, err["type"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return InputError(f"{err['msg']}{more}", source=source, field=field, fix=fix)


def _default_fix(model: type[BaseModel], loc: tuple[str, ...], kind: str) -> str | None:
    parent, info = _walk(model, loc)
    if kind == "extra_forbidden":
        allowed = ", ".join(parent.model_fields) if parent else "none"
        return f"remove it; allowed here: {allowed}"
    if info is not None and info.description:
        return f"{loc[-1]}: {info.description}"
    return None


def _walk(model: type[BaseModel], loc: tuple[str, ...]) -> tuple[type[BaseModel] | None, Any]:
    """The model holding the last named field of ``loc``, and that field's FieldInfo."""
    current: type[BaseModel] | None = model
    parent, info = None, None
    for part in loc:
        if current is None or part not in current.model_fields:
            if current is not None:  # a key the model does not know: current holds it
                parent, info = current, None
            continue  # a dict key or list index: stay with the same field
        parent, info = current, current.model_fields[part]
        current = _model_in(info.annotation)
    return parent, info


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``X | None`` or ``Annotated[X, ...]``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def scenario_path(name: str) -> Path:
    """A scenario file by path, or a shipped scenario by name (``demo`` -> scenarios/demo.yaml)."""
    path = Path(name)
    shipped = SCENARIOS_DIR / f"{name}.yaml"
    if not path.exists() and not _looks_like_path(name) and shipped.is_file():
        return shipped
    return path


def load_scenario(path: str | Path) -> Scenario:
    """Read and check a scenario file (see the module docstring); InputError if anything is off."""
    path = Path(path)
    try:
        text = path.read_text()
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
    data.setdefault("name", path.stem)
    scenario = validate(Scenario, data, source=path)
    if scenario.target.launch == "sim":
        _check_sim_flags(scenario, path)
    return _resolve_files(scenario, path)


def _check_sim_flags(scenario: Scenario, path: Path) -> None:
    """Every flag of every point must be one ``loadlab sim serve`` takes."""
    from loadlab.sim.cli import serve

    known = {p.name for p in serve.params} - {"model_tag", "host", "port"}
    arms = scenario.sweep.arms if scenario.sweep and scenario.sweep.arms else {}
    matrix = scenario.sweep.matrix if scenario.sweep and scenario.sweep.matrix else {}
    places = [("flags", scenario.flags), ("sweep.matrix", matrix),
              *((f"sweep.arms.{name}", arm) for name, arm in arms.items())]
    for where, flags in places:
        for name in flags:
            if name not in known:
                raise InputError(f"the simulator has no flag --{name.replace('_', '-')}", source=path,
                                 field=f"{where}.{name}",
                                 fix=f"use one of: {', '.join(sorted(known))}")


def _resolve_files(scenario: Scenario, path: Path) -> Scenario:
    """Relative profile and trace paths against the scenario's folder; the profile must load."""
    from loadlab.workload import load_profile

    here = path.parent
    profile = scenario.workload.profile
    if _looks_like_path(profile) and not Path(profile).is_absolute() and (here / profile).exists():
        profile = str(here / profile)
    trace = scenario.load.trace
    if trace is not None and not Path(trace).is_absolute() and (here / trace).exists():
        trace = str(here / trace)
    if trace is None:
        try:
            load_profile(profile)
        except InputError as exc:
            raise InputError(exc.message, source=path, field="workload.profile", fix=exc.fix) from None
    elif not Path(trace).is_file():
        raise InputError(f"trace file {trace!r} not found", source=path, field="load.trace",
                         fix="give a path relative to the scenario file, or an absolute one")
    return scenario.model_copy(update={
        "workload": scenario.workload.model_copy(update={"profile": profile}),
        "load": scenario.load.model_copy(update={"trace": trace}),
    })


def _looks_like_path(name: str) -> bool:
    return "/" in name or name.endswith((".yaml", ".yml", ".json"))
